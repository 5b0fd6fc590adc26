"""Exact top-k from merged histograms (curation.quality.topk): the kept set equals a full sort
of every score, ties at the cut broken by (id, shard, row), whatever the gather cap."""

from __future__ import annotations

import numpy as np
import pytest

from curation.quality.topk import LEVELS, Prefix, choose_bin, cut, score_keys
from curation.sampling.radix import Search, narrow


def _top_k(shards: list[np.ndarray], k: int, cap: int) -> tuple[set, int]:
    """The stage's selection over in-memory shards; returns (kept (shard, row) set, passes)."""
    valid = [s[~np.isnan(s)] for s in shards]

    def refine(level, prefixes):
        hist = np.sum([prefixes["top"].histogram(score_keys(v)) for v in valid], axis=0)
        return {"top": (hist, hist)}

    hist = np.sum([Prefix().histogram(score_keys(v)) for v in valid], axis=0)
    search = Search(Prefix(), k, hist, hist)
    passes = 1 + narrow({"top": search}, choose_bin, refine, cap)
    prefix, need = search.prefix, search.need
    cands = []
    for i, s in enumerate(shards):
        rows = np.flatnonzero(~np.isnan(s))
        rows = rows[prefix.matches(score_keys(s[rows]))]
        cands += [(float(s[r]), f"doc{i:03d}-{r:05d}", f"s{i:03d}", int(r)) for r in rows.tolist()]
    threshold, boundary = cut(cands, need)
    kept = set()
    for i, s in enumerate(shards):
        for r, x in enumerate(s.tolist()):
            if x == x and (x > threshold or (x == threshold and (f"doc{i:03d}-{r:05d}", f"s{i:03d}", r) <= boundary)):
                kept.add((i, r))
    return kept, passes


@pytest.mark.parametrize("cap", [3, 1000, 10**9])
def test_top_k_equals_a_full_sort_with_ties_and_nans(cap):
    rng = np.random.default_rng(0)
    shards = []
    for i in range(7):
        s = rng.beta(5, 2, size=3000).astype(np.float32)
        s[rng.random(3000) < 0.2] = np.float32(0.8125)  # a big tie
        s[rng.random(3000) < 0.05] = np.nan  # no text
        s[:3] = [0.0, 1.0, 1e-12]
        shards.append(s)
    docs = sorted(((-float(x), f"doc{i:03d}-{r:05d}", f"s{i:03d}", r), (i, r))
                  for i, s in enumerate(shards) for r, x in enumerate(s.tolist()) if x == x)
    for k in (1, 17, 4000, 8123, len(docs)):
        kept, passes = _top_k(shards, k, cap)
        assert kept == {d[1] for d in docs[:k]}, (k, cap)
        if cap == 3 and k == 8123:
            assert passes == LEVELS  # the tie fills a whole key: every byte refined
