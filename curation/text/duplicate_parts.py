"""Repeated lines and paragraphs per document (Gopher's ``dup_line_*`` / ``dup_para_*``
signals), compiled: one pass over each text's bytes cuts it into parts and hashes each
part, and the parts equal to an earlier part of the same text are counted with their
characters (bytes compared on a hash match, so equal means equal).

``segments.split_newlines`` + ``segments.duplicate_stats`` compute the same through Arrow
string arrays and a dictionary encoding; they stay the reference the tests hold this to.
On bench_scale's pages (``tests/benchmarks/bench_chain.py``) those two, for paragraphs and
lines, were a sixth of the repetition filter's time.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from numba import njit

from curation.hashing import GOLDEN
from curation.text.arrow import text_bytes
from curation.text.counts import space_after, space_before

_GOLDEN = GOLDEN  # the project's golden-ratio constant (curation.hashing), compiled in


def duplicate_parts(texts: pa.Array, min_run: int = 1, strip: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per text: its parts, the parts equal to an earlier part of the text, and those parts'
    characters (code points).

    Parts are ``re.split("\\n{min_run,}", text)`` (empty parts count), of ``text.strip()``
    when ``strip``: ``min_run=1`` gives Gopher's lines (``re.split("\\n+")``), ``min_run=2``
    with ``strip`` its paragraphs."""
    b, doff, _, _ = text_bytes(texts)
    if not len(b):  # every text empty: one empty part each, none repeated
        z = np.zeros(len(texts), np.int64)
        return z + 1, z, z.copy()
    return _duplicate_parts(b, doff, min_run, strip)


@njit(cache=True, nogil=True)
def _part_key(b, s, e):
    """A 64-bit hash of the part ``b[s:e]``, eight bytes per multiply (a byte-at-a-time hash
    is a chain of multiplies as long as the text; equal hashes are then compared byte for
    byte, so a collision costs a comparison, never a wrong count)."""
    h = np.uint64(e - s) * np.uint64(_GOLDEN)
    i = s
    while i + 8 <= e:
        w = (np.uint64(b[i]) | (np.uint64(b[i + 1]) << np.uint64(8)) | (np.uint64(b[i + 2]) << np.uint64(16))
             | (np.uint64(b[i + 3]) << np.uint64(24)) | (np.uint64(b[i + 4]) << np.uint64(32))
             | (np.uint64(b[i + 5]) << np.uint64(40)) | (np.uint64(b[i + 6]) << np.uint64(48))
             | (np.uint64(b[i + 7]) << np.uint64(56)))
        h = (h ^ w) * np.uint64(_GOLDEN)
        h ^= h >> np.uint64(29)
        i += 8
    w = np.uint64(0)
    k = 0
    while i < e:
        w |= np.uint64(b[i]) << np.uint64(8 * k)
        i += 1
        k += 1
    h = (h ^ w) * np.uint64(_GOLDEN)
    return h ^ (h >> np.uint64(32))


@njit(cache=True, nogil=True)
def _duplicate_parts(b, doff, min_run, strip):
    n = len(doff) - 1
    n_parts = np.zeros(n, np.int64)
    dups = np.zeros(n, np.int64)
    dup_chars = np.zeros(n, np.int64)
    cap = 64
    ps = np.empty(cap, np.int64)  # the parts of one text: start, end, hash
    pe = np.empty(cap, np.int64)
    ph = np.empty(cap, np.uint64)
    table = np.empty(256, np.int64)  # open addressing: index of a part, -1 empty
    for d in range(n):
        s = doff[d]
        e = doff[d + 1]
        if strip:  # str.strip(): Python's whitespace, Unicode spaces included
            while s < e:
                w = space_after(b, s, e)
                if w == 0:
                    break
                s += w
            while e > s:
                w = space_before(b, s, e)
                if w == 0:
                    break
                e -= w
        k = 0
        start = s
        i = s
        while True:
            while i < e and b[i] != 0x0A:  # to the next newline
                i += 1
            if i < e:
                j = i
                while j < e and b[j] == 0x0A:
                    j += 1
                if j - i < min_run:  # a shorter run of newlines is part of the part
                    i = j
                    continue
            if k == cap:
                cap *= 2
                ps2 = np.empty(cap, np.int64)
                pe2 = np.empty(cap, np.int64)
                ph2 = np.empty(cap, np.uint64)
                ps2[:k] = ps[:k]
                pe2[:k] = pe[:k]
                ph2[:k] = ph[:k]
                ps, pe, ph = ps2, pe2, ph2
            ps[k] = start
            pe[k] = i
            ph[k] = _part_key(b, start, i)
            k += 1
            if i >= e:
                break
            while i < e and b[i] == 0x0A:  # the separator: the whole run
                i += 1
            start = i
        n_parts[d] = k
        if k < 2:
            continue
        size = 4
        while size < 2 * k:
            size *= 2
        if size > len(table):
            table = np.empty(size, np.int64)
        table[:size] = -1
        mask = size - 1
        for p in range(k):
            hp = ph[p]
            slot = np.int64(hp >> np.uint64(40)) & mask
            while True:
                q = table[slot]
                if q < 0:
                    table[slot] = p
                    break
                if ph[q] == hp and pe[q] - ps[q] == pe[p] - ps[p]:
                    same = True
                    off = ps[q] - ps[p]
                    for x in range(ps[p], pe[p]):
                        if b[x] != b[x + off]:
                            same = False
                            break
                    if same:
                        dups[d] += 1
                        c = 0
                        for x in range(ps[p], pe[p]):
                            c += (b[x] & 0xC0) != 0x80
                        dup_chars[d] += c
                        break
                slot = (slot + 1) & mask
    return n_parts, dups, dup_chars
