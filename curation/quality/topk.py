"""Exact top-k of a score column spread over many shards, without gathering the scores.

Each score in [0, 1] gets a monotone 32-bit key, ``floor(score * 2^32)``. Shards send
256-bin histograms of one key byte at a time (top byte first, then the next byte among the
keys that share the chosen prefix...), the driver adds them and follows the bin holding the
k-th largest score (``curation.sampling.radix.narrow`` with ``choose_bin``). Once the chosen bin holds at most ``gather_cap`` scores (or all four
bytes are fixed), the shards send those few (score, id, row) triples and the driver sorts
them: exactly k documents are kept, ties at the cut broken by (id, shard, row). Memory on
the driver: a few 256-bin histograms plus at most ``gather_cap`` triples (more only when more
documents than that have the very same key — a massive tie)."""

from __future__ import annotations

import numpy as np

from curation.sampling.radix import KeyPrefix


def score_keys(scores: np.ndarray) -> np.ndarray:
    """Monotone uint32 key per finite score in [0, 1] (NaN rows must be removed first)."""
    k = np.floor(np.clip(scores.astype(np.float64), 0.0, 1.0) * 2.0 ** 32)
    return np.minimum(k, 2.0 ** 32 - 1).astype(np.uint64)


class Prefix(KeyPrefix):
    """Key bytes fixed so far (8-bit digits of the 32-bit score key)."""

    BITS = 8
    KEY_BITS = 32

    def histogram(self, keys: np.ndarray) -> np.ndarray:
        """Counts of the next key byte among ``keys`` with this prefix."""
        return np.bincount(self.next_digit(keys)[1], minlength=BINS)


BINS = Prefix.bins()  # 256
LEVELS = Prefix.levels()  # bytes of the key


def choose_bin(counts: np.ndarray, k: int) -> tuple[int, slice]:
    """(bin holding the k-th largest, the higher bins: all kept); ``1 <= k <= counts.sum()``."""
    above = np.cumsum(counts[::-1])  # above[i]: scores in the top i+1 bins
    i = int(np.searchsorted(above, k))  # first top-(i+1) block reaching k
    b = BINS - 1 - i
    return b, slice(b + 1, None)


def cut(candidates: list[tuple[float, str, str, int]], need: int) -> tuple[float, tuple[str, str, int]]:
    """From the (score, id, shard, row) of every document in the final bin, the ``need``-th
    best by score then (id, shard, row): returns (threshold score, boundary (id, shard, row)).
    A document is kept iff its score > threshold, or == threshold and (id, shard, row) <=
    boundary."""
    ranked = sorted(candidates, key=lambda c: (-c[0], c[1], c[2], c[3]))
    threshold = ranked[need - 1][0]
    tied = [c for c in ranked[:need] if c[0] == threshold]
    last = tied[-1]
    return threshold, (last[1], last[2], last[3])
