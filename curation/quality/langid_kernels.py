"""The compiled walk behind ``langid.sample_texts``: the byte bounds of ``sample_text``'s
windows in UTF-8 text, and the windows gathered, without decoding whole texts."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def _char_byte(b, p, hi, c, target):
    """From byte ``p`` of character number ``c`` (``p`` < ``hi``), the byte where character
    number ``target`` >= ``c`` starts (``hi`` past the end), and the characters counted.

    A character is at least one byte, so character ``target`` starts no earlier than
    ``target - c`` bytes on: those bytes are counted in one go (characters start at bytes
    that are not 10xxxxxx) and the walk goes on from there, once on ASCII text, a few times
    on multi-byte text. (Counting in 32-byte blocks with a test after each, then byte by byte,
    cost 3x on the long bench pages: a fifth of langid's time besides CLD2.)"""
    while c < target and p < hi:
        e = min(hi, p + (target - c))
        cont = np.uint32(0)
        for j in range(p, e):  # vectorised: no branch inside
            cont += np.uint32((b[j] >> 6) == 2)
        c += (e - p) - np.int64(cont)
        p = e
    while p < hi and (b[p] >> 6) == 2:  # inside a character: to where the next one starts
        p += 1
    return p, c


@njit(cache=True, nogil=True)
def window_bytes(b, off, rows, nchars, chars, windows):
    """``sample_text(text, chars, windows)`` of the texts ``rows`` (``b[off[r]:off[r + 1]]``,
    ``nchars[r]`` characters) as UTF-8: (offsets per row, bytes). A text of at most ``chars``
    characters is itself; a longer one, ``windows`` windows of ``chars // windows``
    characters starting at ``int(i * step)``, ``step = (n - width) / (windows - 1)`` (the same
    float arithmetic as Python), joined by newlines."""
    width = max(1, chars // windows)
    total = 0
    for k in range(len(rows)):  # an upper bound: every window's characters at 4 bytes each
        r = rows[k]
        size = off[r + 1] - off[r]
        total += size if nchars[r] <= chars else min(size, 4 * width * windows + windows)
    out = np.empty(total, np.uint8)
    out_off = np.zeros(len(rows) + 1, np.int64)
    w = 0
    for k in range(len(rows)):
        r = rows[k]
        lo, hi = off[r], off[r + 1]
        n = nchars[r]
        if n <= chars:
            out[w:w + hi - lo] = b[lo:hi]
            w += hi - lo
            out_off[k + 1] = w
            continue
        step = (n - width) / (windows - 1) if windows > 1 else 0.0
        p, c = lo, 0
        for i in range(windows):
            p, c = _char_byte(b, p, hi, c, int(i * step))
            s = p
            p, c = _char_byte(b, p, hi, c, int(i * step) + width)
            if i:
                out[w] = 10  # "\n"
                w += 1
            out[w:w + p - s] = b[s:p]
            w += p - s
        out_off[k + 1] = w
    return out_off, out[:w]
