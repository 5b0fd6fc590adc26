"""Gopher quality counters over the bytes of a batch (``GopherQualityFilter``'s hash and
ellipsis counts, bullet and ellipsis lines), each one compiled pass with ``str`` semantics."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from curation.text.arrow import text_bytes
from curation.text.segments import Segments


def hashes_and_ellipses(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per text: how many "#", and how many "..." or "…" (as ``str.count``), in one
    compiled pass over the bytes."""
    b, doff, _, _ = text_bytes(texts)
    return _hashes_and_ellipses(b, doff)


def bullet_and_ellipsis_lines(texts: pa.Array, lines: Segments) -> tuple[np.ndarray, np.ndarray]:
    """Per line of ``lines`` (``split_lines(texts)``): starts with "•" or "-" after its
    leading whitespace; ends with "..." or "…" before its trailing whitespace."""
    b, _, _, _ = text_bytes(texts)
    return _bullet_and_ellipsis_lines(b, lines.byte_start, lines.byte_len)


@njit(cache=True, nogil=True)
def space_after(b, i, e):
    """Bytes of the Python whitespace character (``str.isspace``) starting at ``i``, 0 if
    none; ``e``: end of the span."""
    c = b[i]
    if c < 0x80:
        return 1 if (9 <= c <= 13 or 28 <= c <= 32) else 0
    if c == 0xC2 and i + 1 < e and (b[i + 1] == 0x85 or b[i + 1] == 0xA0):
        return 2
    if i + 2 < e:
        c1, c2 = b[i + 1], b[i + 2]
        if c == 0xE1 and c1 == 0x9A and c2 == 0x80:  # U+1680
            return 3
        if c == 0xE2 and c1 == 0x80 and (c2 <= 0x8A or c2 == 0xA8 or c2 == 0xA9 or c2 == 0xAF):
            return 3  # U+2000-200A, 2028, 2029, 202F (c2 >= 0x80 in valid UTF-8)
        if c == 0xE2 and c1 == 0x81 and c2 == 0x9F:  # U+205F
            return 3
        if c == 0xE3 and c1 == 0x80 and c2 == 0x80:  # U+3000
            return 3
    return 0


@njit(cache=True, nogil=True)
def space_width(b, i, e, kind):
    """``space_after`` behind a per-byte table (``kind``: 0 no whitespace, 1 an ASCII
    whitespace byte, 2 a byte that may lead a multi-byte one): one load decides for almost
    every byte of a word scan."""
    t = kind[b[i]]
    if t == 1:
        return 1
    if t == 2:
        return space_after(b, i, e)
    return 0


@njit(cache=True, nogil=True)
def space_before(b, s, k):
    """Bytes of the Python whitespace character ending just before ``k`` (span from ``s``),
    0 if none."""
    if k - 1 >= s and b[k - 1] < 0x80:
        return space_after(b, k - 1, k)
    if k - 2 >= s and b[k - 2] == 0xC2:
        return space_after(b, k - 2, k)
    if k - 3 >= s and b[k - 3] >= 0xE0:  # a three-byte character ending at k
        return space_after(b, k - 3, k)
    return 0


@njit(cache=True, nogil=True)
def _ellipsis_at(b, i, e):
    """Whether "..." or "…" starts at ``i`` (before ``e``)."""
    if i + 2 >= e:
        return False
    return ((b[i] == 0x2E and b[i + 1] == 0x2E and b[i + 2] == 0x2E)
            or (b[i] == 0xE2 and b[i + 1] == 0x80 and b[i + 2] == 0xA6))


@njit(cache=True, nogil=True)
def _hashes_and_ellipses(b, doff):
    """Per text: ``text.count("#")`` and ``text.count("...") + text.count("…")`` (counted
    without overlaps, as ``str.count`` does), in one pass."""
    n = len(doff) - 1
    hashes = np.zeros(n, np.int64)
    ellipses = np.zeros(n, np.int64)
    for d in range(n):
        i = doff[d]
        end = doff[d + 1]
        while i < end:
            c = b[i]
            if c == 0x23:
                hashes[d] += 1
            elif (c == 0x2E or c == 0xE2) and _ellipsis_at(b, i, end):  # the test first: a call per byte cost 3x
                ellipses[d] += 1
                i += 3
                continue
            i += 1
    return hashes, ellipses


@njit(cache=True, nogil=True)
def _line_marks(b, s, e):
    """For the line ``b[s:e]``: ``line.lstrip().startswith(("•", "-"))`` and
    ``line.rstrip().endswith(("...", "…"))``."""
    i = s
    while i < e:
        w = space_after(b, i, e)
        if w == 0:
            break
        i += w
    bullet = False
    if i < e:
        bullet = b[i] == 0x2D or (b[i] == 0xE2 and i + 2 < e and b[i + 1] == 0x80 and b[i + 2] == 0xA2)
    k = e
    while k > i:
        w = space_before(b, i, k)
        if w == 0:
            break
        k -= w
    return bullet, k - 3 >= i and _ellipsis_at(b, k - 3, k)


@njit(cache=True, nogil=True)
def _bullet_and_ellipsis_lines(b, start, length):
    """Per line (byte spans): ``line.lstrip().startswith(("•", "-"))`` and
    ``line.rstrip().endswith(("...", "…"))``."""
    m = len(start)
    bullet = np.zeros(m, np.bool_)
    ellipsis = np.zeros(m, np.bool_)
    for j in range(m):
        bullet[j], ellipsis[j] = _line_marks(b, start[j], start[j] + length[j])
    return bullet, ellipsis


def line_tallies(texts: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per text: its lines (``len(text.splitlines())``), bullet lines and lines ending in an
    ellipsis (as ``bullet_and_ellipsis_lines`` marks them), in one compiled pass that finds
    the lines itself: ``split_lines`` built Arrow strings of every line for three counts."""
    return page_tallies(texts)[:3]


def page_tallies(texts: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``line_tallies`` and ``hashes_and_ellipses`` in one pass over the bytes: lines, bullet
    lines, ellipsis lines, "#" and "..."/"…" per text (GopherQualityFilter reads all five;
    two passes cost a third more)."""
    b, doff, _, _ = text_bytes(texts)
    if not len(b):
        z = np.zeros(len(texts), np.int64)
        return z, z.copy(), z.copy(), z.copy(), z.copy()
    return _page_tallies(b, doff, _MARKS)


#: per byte: 0 nothing to look at, 1 a line break or the lead of one (\n \v \f \r \x1c-\x1e,
#: C2 of U+0085), 2 "#", 3 "." (an ellipsis), 4 E2 (U+2028/9 or "…")
_MARKS = np.zeros(256, np.uint8)
_MARKS[[0x0A, 0x0B, 0x0C, 0x0D, 0x1C, 0x1D, 0x1E, 0xC2]] = 1
_MARKS[0x23] = 2
_MARKS[0x2E] = 3
_MARKS[0xE2] = 4


@njit(cache=True, nogil=True)
def _page_tallies(b, doff, marks):
    n = len(doff) - 1
    lines = np.zeros(n, np.int64)
    bullets = np.zeros(n, np.int64)
    ellipsis_lines = np.zeros(n, np.int64)
    hashes = np.zeros(n, np.int64)
    ellipses = np.zeros(n, np.int64)
    for d in range(n):
        e = doff[d + 1]
        start = i = doff[d]
        while True:
            w = 0
            while i < e and marks[b[i]] == 0:  # one load decides for almost every byte
                i += 1
            if i < e:  # str.splitlines' breaks: \n \v \f \r (\r\n as one) \x1c-\x1e \x85 \u2028 \u2029
                c = b[i]
                t = marks[c]
                if t == 2:
                    hashes[d] += 1
                    i += 1
                    continue
                if (t == 3 or t == 4) and _ellipsis_at(b, i, e):  # "..." / "…": never a break
                    ellipses[d] += 1
                    i += 3
                    continue
                if t == 1:
                    if c == 0xC2:
                        w = 2 if i + 1 < e and b[i + 1] == 0x85 else 0
                    else:
                        w = 2 if c == 0x0D and i + 1 < e and b[i + 1] == 0x0A else 1
                elif t == 4 and i + 2 < e and b[i + 1] == 0x80 and (b[i + 2] == 0xA8 or b[i + 2] == 0xA9):
                    w = 3
                if w == 0:
                    i += 1
                    continue
            elif start == e:  # no piece after a final break (and none in "")
                break
            bullet, ellipsis = _line_marks(b, start, i)
            lines[d] += 1
            bullets[d] += bullet
            ellipsis_lines[d] += ellipsis
            if i >= e:
                break
            i += w
            start = i
    return lines, bullets, ellipsis_lines, hashes, ellipses


@njit(cache=True, nogil=True)
def word_tallies(offsets, symbol, alpha, lengths, stop_idx, n_stop_words):
    """Per document (words ``offsets[d]:offsets[d + 1]``), in one pass over the words: words
    that are not symbols and their characters, words with a letter, distinct stop words
    (``stop_idx`` >= 0: which one) and stop-word occurrences among the non-symbol words.
    (``GopherQualityFilter``'s counts: six numpy passes with a sort did this at 3x the time.)"""
    n = len(offsets) - 1
    n_real = np.zeros(n, np.int64)
    real_chars = np.zeros(n, np.int64)
    n_alpha = np.zeros(n, np.int64)
    n_stop = np.zeros(n, np.int64)
    n_stop_real = np.zeros(n, np.int64)
    last = np.full(max(n_stop_words, 1), -1, np.int64)  # the last document each stop word was seen in
    for d in range(n):
        for i in range(offsets[d], offsets[d + 1]):
            real = not symbol[i]
            if real:
                n_real[d] += 1
                real_chars[d] += lengths[i]
            if alpha[i]:
                n_alpha[d] += 1
            s = stop_idx[i]
            if s >= 0:
                if last[s] != d:
                    last[s] = d
                    n_stop[d] += 1
                if real:
                    n_stop_real[d] += 1
    return n_real, real_chars, n_alpha, n_stop, n_stop_real
