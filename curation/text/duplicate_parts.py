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


def duplicate_lines_and_paragraphs(texts: pa.Array) -> tuple[np.ndarray, ...]:
    """``duplicate_parts(texts, 2, strip=True) + duplicate_parts(texts, 1)`` (paragraphs,
    then lines: parts, repeated parts, their characters) in one call: a paragraph that is
    one whole line (most, on web pages: the long bench pages average 55 paragraphs and 88
    lines) takes that line's hash instead of hashing its bytes again, and the paragraphs are
    cut from the lines' gaps, not from a second pass over the bytes (x1.3: 36 -> 26 us a long
    page)."""
    b, doff, _, _ = text_bytes(texts)
    if not len(b):
        z = np.zeros(len(texts), np.int64)
        return z + 1, z, z.copy(), z + 1, z.copy(), z.copy()
    return _lines_and_paragraphs(b, doff)


@njit(cache=True, nogil=True)
def _count_repeats(b, ps, pe, ph, k, table):
    """Parts among ``ps[:k], pe[:k]`` (hashes ``ph``) equal to an earlier one, and their
    characters; ``table`` is scratch space (returned, grown if it was too small)."""
    dups = 0
    dup_chars = 0
    if k < 2:
        return dups, dup_chars, table
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
                    dups += 1
                    c = 0
                    for x in range(ps[p], pe[p]):
                        c += (b[x] & 0xC0) != 0x80
                    dup_chars += c
                    break
            slot = (slot + 1) & mask
    return dups, dup_chars, table


@njit(cache=True, nogil=True)
def _grown(a, k):
    out = np.empty(2 * len(a), a.dtype)
    out[:k] = a[:k]
    return out


@njit(cache=True, nogil=True)
def _stripped(b, s, e):
    """``[s, e)`` without leading and trailing Python whitespace (``str.strip``)."""
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
    return s, e


@njit(cache=True, nogil=True)
def _cut(b, s, e, min_run, ps, pe):
    """The parts of ``b[s:e]`` cut at runs of ``min_run`` or more newlines (``re.split``),
    into ``ps``, ``pe`` (grown when full); returns (count, ps, pe)."""
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
        if k == len(ps):
            ps, pe = _grown(ps, k), _grown(pe, k)
        ps[k] = start
        pe[k] = i
        k += 1
        if i >= e:
            break
        while i < e and b[i] == 0x0A:  # the separator: the whole run
            i += 1
        start = i
    return k, ps, pe


@njit(cache=True, nogil=True)
def _paragraphs_of_lines(ls, le, k, s, e, qs, qe):
    """``_cut(b, s, e, 2, qs, qe)`` from the text's lines (``ls[:k]``, ``le[:k]``, cut at every
    run of newlines): the stripped text ``[s, e)`` starts and ends on a character that is not
    whitespace, so a run of two or more newlines inside it is the gap between two lines, whole.
    A loop over the lines, not a second one over the bytes."""
    m = 0
    start = s
    for j in range(k - 1):
        a = le[j]
        z = ls[j + 1]
        if z - a >= 2 and a >= s and z <= e:
            if m == len(qs):
                qs, qe = _grown(qs, m), _grown(qe, m)
            qs[m] = start
            qe[m] = a
            m += 1
            start = z
    if m == len(qs):
        qs, qe = _grown(qs, m), _grown(qe, m)
    qs[m] = start
    qe[m] = e
    return m + 1, qs, qe


@njit(cache=True, nogil=True)
def _keys(b, ps, pe, k, ph):
    """``_part_key`` of the first ``k`` parts, into ``ph`` (grown when short)."""
    if len(ph) < k:
        ph = np.empty(len(ps), np.uint64)
    for p in range(k):
        ph[p] = _part_key(b, ps[p], pe[p])
    return ph


@njit(cache=True, nogil=True)
def _lines_and_paragraphs(b, doff):
    n = len(doff) - 1
    out = np.zeros((6, n), np.int64)
    ls = np.empty(64, np.int64)  # lines of one text: start, end, hash
    le = np.empty(64, np.int64)
    lh = np.empty(64, np.uint64)
    qs = np.empty(64, np.int64)  # its paragraphs
    qe = np.empty(64, np.int64)
    qh = np.empty(64, np.uint64)
    table = np.empty(256, np.int64)
    for d in range(n):
        k, ls, le = _cut(b, doff[d], doff[d + 1], 1, ls, le)
        lh = _keys(b, ls, le, k, lh)
        s2, e2 = _stripped(b, doff[d], doff[d + 1])
        m, qs, qe = _paragraphs_of_lines(ls, le, k, s2, e2, qs, qe)
        if len(qh) < m:
            qh = np.empty(len(qs), np.uint64)
        j = 0  # lines are cut at every run of newlines: a paragraph starts where a line does
        for p in range(m):  # (or, the first, inside one after the strip)
            while j < k and ls[j] < qs[p]:
                j += 1
            if j < k and ls[j] == qs[p] and le[j] == qe[p]:
                qh[p] = lh[j]  # a paragraph of one whole line: that line's hash
            else:
                qh[p] = _part_key(b, qs[p], qe[p])
        out[0, d] = m
        out[3, d] = k
        out[1, d], out[2, d], table = _count_repeats(b, qs, qe, qh, m, table)
        out[4, d], out[5, d], table = _count_repeats(b, ls, le, lh, k, table)
    return out[0], out[1], out[2], out[3], out[4], out[5]


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
    ps = np.empty(64, np.int64)  # the parts of one text: start, end, hash
    pe = np.empty(64, np.int64)
    ph = np.empty(64, np.uint64)
    table = np.empty(256, np.int64)  # open addressing: index of a part, -1 empty
    for d in range(n):
        s, e = doff[d], doff[d + 1]
        if strip:  # str.strip(): Python's whitespace, Unicode spaces included
            s, e = _stripped(b, s, e)
        k, ps, pe = _cut(b, s, e, min_run, ps, pe)
        ph = _keys(b, ps, pe, k, ph)
        n_parts[d] = k
        dups[d], dup_chars[d], table = _count_repeats(b, ps, pe, ph, k, table)
    return n_parts, dups, dup_chars
