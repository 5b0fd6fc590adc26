"""Gopher's n-gram repetition signals, compiled (numba), one document at a time.

For each n: the chars of the most frequent n-gram times its count (``top``, datatrove's
``find_top_duplicate`` over ``" ".join`` n-grams), and the chars in duplicated n-grams found
by datatrove's left-to-right scan (``dup``, ``find_all_duplicate``: a repeat adds its chars
and jumps n words ahead, the skipped n-grams are not remembered).

An n-gram can only repeat where its (n-1)-gram prefix repeats, so each n only hashes and
counts the positions that repeated at n-1: after n = 3 or 4 few remain. Words are compared
by their 64-bit ids (``Words.hash``), n-grams by a rolling hash of those ids.

Measured (``tests/benchmarks/bench_pipeline.py``): the numpy version of this (sorting 64-bit
keys per n, pointer doubling for the scan) was a quarter of the whole filter chain's time.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from curation.hashing import GOLDEN

_POLY = 0x100000001B3
_GOLDEN = GOLDEN


@njit(cache=True, nogil=True)
def _slot(h, shift):
    # Fibonacci hashing: the top bits of h * golden ratio (word ids can have weak low bits)
    return np.int64((h * np.uint64(_GOLDEN)) >> np.uint64(shift))


@njit(cache=True, nogil=True)
def _count(slots, s):
    """How many times this round's n-gram in slot ``s`` occurred (the low half of its meta)."""
    return np.int64(slots[s, 1] & np.uint64(0xFFFFFFFF))


def repetition_chars(word_hash, word_len, offsets, min_n, max_n, top_ns=None, dup_ns=None):
    """Per document and n in min_n..max_n: ``top[d, n]`` and ``dup[d, n]`` (chars, as datatrove
    counts them: top n-grams joined by spaces, duplicated ones without); below min_n nothing
    is counted (every position stays a candidate). ``top_ns`` / ``dup_ns``: the sizes whose
    top / dup are wanted (default: every n); the others stay 0 and the dup scan skips them
    (Gopher reads top for 2-4 and dup for 5-10: the dup scan over every 2-gram was a fifth of
    the kernel's time)."""
    want_top = np.zeros(max_n + 1, np.bool_)
    want_dup = np.zeros(max_n + 1, np.bool_)
    for want, ns in ((want_top, top_ns), (want_dup, dup_ns)):
        want[np.array([n for n in (range(min_n, max_n + 1) if ns is None else ns) if n <= max_n], np.int64)] = True
    return _repetition_chars(word_hash, word_len, offsets, min_n, max_n, want_top, want_dup)


@njit(cache=True, nogil=True)
def _repetition_chars(word_hash, word_len, offsets, min_n, max_n, want_top, want_dup):
    n_docs = len(offsets) - 1
    top = np.zeros((n_docs, max_n + 1), np.int64)
    dup = np.zeros((n_docs, max_n + 1), np.int64)
    longest = 0
    for d in range(n_docs):
        longest = max(longest, offsets[d + 1] - offsets[d])
    bits = 1
    while (1 << bits) < 2 * max(longest, 1):
        bits += 1
    size = 1 << bits
    # int32 where it fits: a 10 MB document (~2M words) needs a 4M-slot table, 80 MB like this
    # a slot: its n-gram hash and (round << 32 | count) side by side, so that a probe and its
    # update touch one cache line (four parallel arrays: +7% on long pages); in use iff its
    # round is this round's ``gen``: no clearing between rounds
    slots = np.zeros((size, 2), np.uint64)
    seen = np.zeros(size, np.int32)  # visited by the scan iff seen == gen
    gen = 0
    cand = np.empty(max(longest, 1), np.int64)
    cand_slot = np.empty(max(longest, 1), np.int64)
    h = np.zeros(max(longest, 1), np.uint64)
    cum = np.zeros(longest + 1, np.int64)
    for d in range(n_docs):
        lo = offsets[d]
        m = offsets[d + 1] - lo
        for i in range(m):
            cum[i + 1] = cum[i] + word_len[lo + i]
            cand[i] = i
            h[i] = word_hash[lo + i]
        # the candidates of round n: positions with an n-gram (c + n <= m) whose (n-1)-gram
        # repeats (every one below min_n), h[c] the hash of that n-gram
        ncand = m
        for n in range(1, max_n + 1):
            if m < n:
                break
            if n < min_n:  # nothing counted: every position goes on, one word longer
                k = 0
                for j in range(ncand):
                    c = cand[j]
                    if c + n + 1 <= m:
                        h[c] = h[c] * np.uint64(_POLY) + word_hash[lo + c + n]
                        cand[k] = c
                        k += 1
                ncand = k
                continue
            if ncand == 0:  # nothing repeats: the top n-gram is the first one, seen once
                if want_top[n]:
                    top[d, n] = cum[n] - cum[0] + n - 1
                continue
            gen += 1
            # a table sized for this round's candidates (load <= 1/2), in the shared arrays
            rbits = 1
            while (1 << rbits) < 2 * ncand:
                rbits += 1
            mask = (1 << rbits) - 1
            shift = 64 - rbits
            g = np.uint64(gen) << np.uint64(32)
            for j in range(ncand):
                hc = h[cand[j]]
                s = _slot(hc, shift)
                while True:
                    meta = slots[s, 1]
                    if (meta >> np.uint64(32)) != np.uint64(gen):
                        slots[s, 0] = hc
                        slots[s, 1] = g | np.uint64(1)
                        break
                    if slots[s, 0] == hc:
                        slots[s, 1] = meta + np.uint64(1)
                        break
                    s = (s + 1) & mask
                cand_slot[j] = s
            # One pass over the candidates, in position order, for all three (each was a pass
            # of its own, and each pass pays a cache miss per candidate):
            # - top: the highest count, ties to the earliest first occurrence (Counter's
            #   most_common): a slot is first met at its first occurrence, so only a higher
            #   count replaces the best;
            # - dup: datatrove's left-to-right scan, visiting only n-grams seen twice or more;
            # - the next round's candidates: the positions whose n-gram repeats, one word longer.
            best_count, best_first = 1, 0
            total = 0
            idx = 0
            k = 0
            scan = want_dup[n]
            for j in range(ncand):
                c = cand[j]
                s = cand_slot[j]
                cs = _count(slots, s)
                if cs > best_count:
                    best_count, best_first = cs, c
                if cs >= 2:
                    if scan and c >= idx:
                        if seen[s] == gen:
                            total += cum[c + n] - cum[c]
                            idx = c + n
                        else:
                            seen[s] = gen
                            idx = c + 1
                    if c + n + 1 <= m:
                        h[c] = h[c] * np.uint64(_POLY) + word_hash[lo + c + n]
                        cand[k] = c
                        k += 1
            if want_top[n]:
                top[d, n] = (cum[best_first + n] - cum[best_first] + n - 1) * best_count
            if want_dup[n]:
                dup[d, n] = total
            ncand = k
    return top, dup
