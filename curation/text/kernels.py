"""Compiled (numba) loops under ``curation.text.words``' word splitter.

Each replaces a chain of numpy passes over every byte or word where a profile showed the
passes cost more than the work (``tests/benchmarks/bench_pipeline.py``): matching spans
against special-case keys touched ~10 arrays per word to reject almost all of them; here a
word costs one table probe. Semantics are those of the numpy code they replaced, which the
filter tests pin against spaCy's and datatrove's outputs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


@njit(cache=True, nogil=True)
def mix64(x):
    """splitmix64 finaliser (same as ``words._mix64``)."""
    z = x + np.uint64(_GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def short_key(b, s, n):
    """64-bit key of the bytes ``b[s:s+n]`` (n <= 16): the bytes, little-endian in two words,
    mixed with the length (``words._short_key`` of one span)."""
    lo = np.uint64(0)
    hi = np.uint64(0)
    for k in range(min(n, 8)):
        lo |= np.uint64(b[s + k]) << np.uint64(8 * k)
    for k in range(8, n):
        hi |= np.uint64(b[s + k]) << np.uint64(8 * (k - 8))
    return mix64(lo ^ mix64(hi + np.uint64(n)))


@njit(cache=True, nogil=True)
def short_keys(b, start, n_bytes):
    out = np.empty(len(start), np.uint64)
    for i in range(len(start)):
        out[i] = short_key(b, start[i], min(n_bytes[i], 16))
    return out


@njit(cache=True, nogil=True)
def find_keys(b, start, n_bytes, sorted_keys, order, sieve):
    """Spans ``b[start:start+n]`` equal to one of the keys: (span indices, key indices).

    ``sieve`` over (first byte, last byte, length) rules out almost every span before its
    key is computed; the key is then looked up by binary search."""
    m = len(start)
    idx = np.empty(m, np.int64)
    hit = np.empty(m, np.int64)
    found = 0
    nk = len(sorted_keys)
    for i in range(m):
        n = n_bytes[i]
        if n <= 0 or n > 16 or nk == 0:
            continue
        s = start[i]
        slot = (np.int64(b[s]) << 13) | (np.int64(b[s + n - 1]) << 5) | min(n, 31)
        if not sieve[slot]:
            continue
        key = short_key(b, s, n)
        j = np.searchsorted(sorted_keys, key)
        if j < nk and sorted_keys[j] == key:
            idx[found] = i
            hit[found] = order[j]
            found += 1
    return idx[:found], hit[:found]


@njit(cache=True, nogil=True)
def spans_from_starts(starts, ends):
    """Word spans from a start mask (length B) and a chunk-end mask (length B + 1): a word
    runs from a start to the next start or chunk end."""
    B = len(starts)
    n = 0
    for i in range(B):
        if starts[i]:
            n += 1
    out_s = np.empty(n, np.int64)
    out_e = np.empty(n, np.int64)
    k = -1
    for i in range(B + 1):
        bound = ends[i] or (i < B and starts[i])
        if bound and k >= 0 and out_e[k] < 0:
            out_e[k] = i
        if i < B and starts[i]:
            k += 1
            out_s[k] = i
            out_e[k] = -1
    return out_s, out_e


@njit(cache=True, nogil=True)
def span_bit_counts(cls, start, end, bit):
    """Per span ``[start, end)``: how many bytes have class ``bit`` set."""
    out = np.zeros(len(start), np.int64)
    for i in range(len(start)):
        c = 0
        for j in range(start[i], end[i]):
            if cls[j] & bit:
                c += 1
        out[i] = c
    return out


@njit(cache=True, nogil=True)
def span_char_counts(b, start, end):
    """Per span of UTF-8 bytes: characters (bytes that are not continuation bytes)."""
    out = np.zeros(len(start), np.int64)
    for i in range(len(start)):
        c = 0
        for j in range(start[i], end[i]):
            if (b[j] & 0xC0) != 0x80:
                c += 1
        out[i] = c
    return out


@njit(cache=True, nogil=True)
def byte_classes(b, ascii_class, cp_class, cp_known):
    """Class bits of every byte: ASCII from ``ascii_class``, every byte of a multi-byte
    character from ``cp_class`` of its code point. Returns (classes, code points not yet in
    ``cp_known``); the caller classifies those and calls again (rare after the first batch)."""
    n = len(b)
    out = np.empty(n, np.uint16)
    missing = np.empty(0, np.int64)
    n_missing = 0
    i = 0
    while i < n:
        c = b[i]
        if c < 0x80:
            out[i] = ascii_class[c]
            i += 1
            continue
        if c >= 0xF0:
            nb, cp = 4, np.int64(c & 0x07)
        elif c >= 0xE0:
            nb, cp = 3, np.int64(c & 0x0F)
        elif c >= 0xC0:
            nb, cp = 2, np.int64(c & 0x1F)
        else:  # a stray continuation byte (not in valid UTF-8)
            out[i] = 0
            i += 1
            continue
        nb = min(nb, n - i)
        for k in range(1, nb):
            cp = (cp << 6) | (b[i + k] & 0x3F)
        cp = min(cp, len(cp_known) - 1)
        v = np.uint16(0)
        if cp_known[cp]:
            v = cp_class[cp]
        else:
            if n_missing == len(missing):
                grown = np.empty(max(16, 2 * n_missing), np.int64)
                grown[:n_missing] = missing[:n_missing]
                missing = grown
            missing[n_missing] = cp
            n_missing += 1
        for k in range(nb):
            out[i + k] = v
        i += nb
    return out, missing[:n_missing]


@njit(cache=True, nogil=True)
def replace_spans(tok_start, tok_end, t, k, cut_at, cut_owner):
    """Word spans after replacements: replacement r turns words ``t[r] .. t[r]+k[r]-1`` into
    the pieces of their joint span cut at its ``cut_at`` offsets (``cut_owner`` == r, sorted
    by owner then offset). Words a merge absorbs vanish; of two replacements at one word the
    later wins."""
    m = len(tok_start)
    R = len(t)
    lo = np.zeros(R + 1, np.int64)
    for j in range(len(cut_owner)):
        lo[cut_owner[j] + 1] += 1
    for r in range(R):
        lo[r + 1] += lo[r]
    rep_of = np.full(m, -1, np.int64)
    absorbed = np.zeros(m, np.bool_)
    for r in range(R):
        for j in range(1, k[r]):
            absorbed[t[r] + j] = True
    for r in range(R):
        rep_of[t[r]] = r
    total = 0
    for i in range(m):
        r = rep_of[i]
        if r >= 0:
            total += 1 + lo[r + 1] - lo[r]
        elif not absorbed[i]:
            total += 1
    out_s = np.empty(total, np.int64)
    out_e = np.empty(total, np.int64)
    w = 0
    for i in range(m):
        r = rep_of[i]
        if r >= 0:
            a = tok_start[i]
            for j in range(lo[r], lo[r + 1]):
                out_s[w] = a
                out_e[w] = cut_at[j]
                a = cut_at[j]
                w += 1
            out_s[w] = a
            out_e[w] = tok_end[i + k[r] - 1]
            w += 1
        elif not absorbed[i]:
            out_s[w] = tok_start[i]
            out_e[w] = tok_end[i]
            w += 1
    return out_s, out_e


@njit(cache=True, nogil=True)
def gather_ranges(src, starts, lengths):
    """``src[starts[i]:starts[i] + lengths[i]]`` for every i, concatenated."""
    total = 0
    for i in range(len(starts)):
        total += lengths[i]
    out = np.empty(total, src.dtype)
    w = 0
    for i in range(len(starts)):
        s = starts[i]
        for j in range(lengths[i]):
            out[w + j] = src[s + j]
        w += lengths[i]
    return out


@njit(cache=True, nogil=True)
def chunks_with_high_bytes(b, c_start):
    """Per chunk: whether a byte >= 0x80 lies between its start and the next chunk's start
    (a non-ASCII character in it, or non-ASCII whitespace after it)."""
    n = len(c_start)
    out = np.zeros(n, np.bool_)
    for i in range(n):
        end = c_start[i + 1] if i + 1 < n else len(b)
        for j in range(c_start[i], end):
            if b[j] >= 0x80:
                out[i] = True
                break
    return out
