"""Compiled (numba) kernels for fastText supervised inference over a whole Arrow batch.

One pass over each document's bytes: split words at fastText's whitespace, hash each word
with fastText's FNV-1a, look it up in an open-addressing table, add its row and the row of the
bigram it closes. Measured here (``tests/benchmarks/bench_quality.py --only throughput``):
the numpy version of the same arithmetic needed ~25 array passes per batch and reached ~10k
docs/s per core; a per-byte loop only pays off compiled.

Token sequence per document, as fastText sees ``prepare_text(doc)``: its words, one
``__nl__`` token per whitespace run that holds a line break, then ``</s>``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

FNV_OFFSET = 2166136261
FNV_PRIME = 16777619
NGRAM_MULT = 116049371


@njit(cache=True, nogil=True)
def _is_ws(c):
    # fastText's word separators: ' ', '\n', '\r', '\t', '\v', '\f', '\0'
    return c == 32 or c == 10 or c == 13 or c == 9 or c == 11 or c == 12 or c == 0


@njit(cache=True, nogil=True)
def fnv_hash(buf, lo, hi):
    """fastText's word hash: FNV-1a (32-bit) over the bytes taken as *signed* chars."""
    # numba widens uint32 arithmetic to 64 bits: keep the low 32 bits at each step
    h = np.uint64(FNV_OFFSET)
    for i in range(lo, hi):
        c = np.uint64(buf[i])
        if c >= 128:
            c |= np.uint64(0xFFFFFF00)
        h = ((h ^ c) * np.uint64(FNV_PRIME)) & np.uint64(0xFFFFFFFF)
    return np.uint32(h)


@njit(cache=True, nogil=True)
def hash_spans(buf, offsets):
    """Hash of each span ``buf[offsets[i]:offsets[i+1]]``."""
    n = len(offsets) - 1
    out = np.empty(n, np.uint32)
    for i in range(n):
        out[i] = fnv_hash(buf, offsets[i], offsets[i + 1])
    return out


@njit(cache=True, nogil=True)
def build_table(hashes, size):
    """Open-addressing table (linear probing) from 32-bit hash to the first id that has it."""
    mask = np.int64(size - 1)  # slots are int64: numba types uint32 + int as float64
    tab_h = np.zeros(size, np.uint32)
    tab_id = np.full(size, -1, np.int64)
    for i in range(len(hashes)):
        h = hashes[i]
        s = np.int64(h) & mask
        while tab_id[s] >= 0 and tab_h[s] != h:
            s = (s + 1) & mask
        if tab_id[s] < 0:
            tab_h[s] = h
            tab_id[s] = i
    return tab_h, tab_id


@njit(cache=True, nogil=True)
def _lookup(tab_h, tab_id, mask, h):
    s = np.int64(h) & mask
    while True:
        t = tab_id[s]
        if t < 0 or tab_h[s] == h:
            return t
        s = (s + 1) & mask


@njit(cache=True, nogil=True)
def _add_token(h, prev_h, has_prev, tab_h, tab_id, mask, proj, nwords, bucket, bigrams, acc):
    """Add a token's own row (if in the vocabulary) and the row of the bigram ending at it;
    return how many rows were added."""
    rows = 0
    t = _lookup(tab_h, tab_id, mask, h)
    if t >= 0:
        for k in range(acc.shape[0]):
            acc[k] += proj[t, k]
        rows += 1
    if bigrams and has_prev:
        # fastText: hashes enter as int32 sign-extended to uint64
        a = np.uint64(np.int64(np.int32(prev_h)))
        b = np.uint64(np.int64(np.int32(h)))
        row = nwords + np.int64((a * np.uint64(NGRAM_MULT) + b) % np.uint64(bucket))
        for k in range(acc.shape[0]):
            acc[k] += proj[row, k]
        rows += 1
    return rows


@njit(cache=True, nogil=True)
def mean_logits(buf, offsets, tab_h, tab_id, proj, nwords, bucket, bigrams, nl_hash, eos_hash):
    """Per document, the mean over its input rows of ``proj`` (labels' logits before softmax).

    ``offsets`` has one more entry than there are documents (Arrow string offsets, rebased to
    ``buf``); ``proj`` is ``W_in @ W_out.T`` (or one column of logit differences)."""
    n = len(offsets) - 1
    ncol = proj.shape[1]
    mask = np.int64(len(tab_h) - 1)
    out = np.zeros((n, ncol), np.float64)
    acc = np.zeros(ncol, np.float64)
    for d in range(n):
        acc[:] = 0.0
        rows = 0
        prev = np.uint32(0)
        has_prev = False
        pending_nl = False
        i, end = offsets[d], offsets[d + 1]
        while i < end:
            c = buf[i]
            if _is_ws(c):
                if c == 10:
                    pending_nl = True
                i += 1
                continue
            if pending_nl:
                rows += _add_token(nl_hash, prev, has_prev, tab_h, tab_id, mask, proj, nwords, bucket, bigrams, acc)
                prev, has_prev, pending_nl = nl_hash, True, False
            j = i + 1
            while j < end and not _is_ws(buf[j]):
                j += 1
            h = fnv_hash(buf, i, j)
            rows += _add_token(h, prev, has_prev, tab_h, tab_id, mask, proj, nwords, bucket, bigrams, acc)
            prev, has_prev = h, True
            i = j
        if pending_nl:
            rows += _add_token(nl_hash, prev, has_prev, tab_h, tab_id, mask, proj, nwords, bucket, bigrams, acc)
            prev, has_prev = nl_hash, True
        rows += _add_token(eos_hash, prev, has_prev, tab_h, tab_id, mask, proj, nwords, bucket, bigrams, acc)
        if rows > 0:
            for k in range(ncol):
                out[d, k] = acc[k] / rows
    return out
