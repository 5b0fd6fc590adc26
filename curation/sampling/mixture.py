"""The mix, decided without a per-document plan anywhere.

A source ``s`` with ``A`` available tokens and target ``T`` is repeated ``full = T // A``
whole epochs, plus a partial epoch of ``rem = T - full * A`` tokens. Every document has a key
``u = xxh3_64(seed, source, id)``; the partial epoch takes documents in ascending ``(u, id)``
while they fit in ``rem`` — the same as walking a seeded random permutation, so the realised
total is within one document of the target. The cut point ``(u, id)`` per source is found from
merged per-shard histograms of ``u``'s 4-bit digits (documents and tokens per digit), refined
digit by digit only while the chosen bin is large, then from the few documents left in it
(``curation.sampling.radix.narrow`` with ``choose_bin``). A
map task then knows each of its documents' copies from (seed, source, id, cut) alone.

Output order: each shard's copies of a source, in emission order (epoch by epoch, each epoch
in a seeded order), get the position ``(tokens before + half its own) / source's tokens in the
shard``; output rows are sorted by position. Every shard's copies spread evenly over [0, 1),
so any prefix of the output holds each source within (number of upstream shards) documents
of its share.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xxhash

from curation.hashing import GOLDEN, fmix64
from curation.sampling.radix import KeyPrefix


def source_targets(available: dict[str, int], weights: dict[str, float], total: float,
                   max_epochs: float) -> dict[str, float]:
    """Target tokens per source: ``w * total``, capped at ``max_epochs`` epochs of the source;
    what a capped source cannot give is redistributed over the others in proportion to their
    weights (repeatedly, as they may hit their cap in turn)."""
    wsum = sum(w for s, w in weights.items() if w > 0)
    w = {s: weights.get(s, 0.0) / wsum for s in available}
    cap = {s: max_epochs * available[s] for s in available}
    target = {s: w[s] * total for s in available}
    capped: set[str] = set()
    while True:
        over = [s for s in available if s not in capped and target[s] > cap[s]]
        if not over:
            return target
        for s in over:
            capped.add(s)
            target[s] = cap[s]
        free = [s for s in available if s not in capped and w[s] > 0]
        free_w = sum(w[s] for s in free)
        if not free or free_w <= 0:
            return target
        rest = total - sum(target[s] for s in capped)
        for s in free:
            target[s] = rest * w[s] / free_w


def doc_keys(seed: int, source: str, ids: list[str]) -> np.ndarray:
    """The uint64 key ``u`` of each document (one C hash call per document)."""
    salt = f"{seed}\x00{source}\x00"
    return np.fromiter((xxhash.xxh3_64_intdigest((salt + i).encode()) for i in ids), dtype=np.uint64, count=len(ids))


class Prefix(KeyPrefix):
    """The high 4-bit digits of ``u`` fixed so far."""

    BITS = 4
    KEY_BITS = 64


BINS = Prefix.bins()  # 16: a shard's histogram is 2 x 16 numbers per source, small at 1e5 shards


def histogram(u: np.ndarray, tokens: np.ndarray, prefix: Prefix) -> tuple[list[int], list[int]]:
    """(documents, tokens) per value of the next digit of ``u``, among keys with ``prefix``."""
    m, b = prefix.next_digit(u)
    return (np.bincount(b, minlength=BINS).tolist(),
            np.bincount(b, weights=tokens[m].astype(np.float64), minlength=BINS).astype(np.int64).tolist())


def choose_bin(tokens: np.ndarray, budget: int) -> tuple[int, slice]:
    """The bin where ascending cumulative tokens pass ``budget`` (``0 <= budget < tokens.sum()``),
    and the bins below it (all taken)."""
    cum = np.cumsum(tokens)
    b = int(np.searchsorted(cum, budget, side="right"))
    return b, slice(0, b)


@dataclass(frozen=True)
class Cut:
    """The partial epoch of a source: documents with ``(u, id) < (u_cut, id_cut)`` (``None``:
    none), plus the ``extra`` ones (u, id) after the cut that first-fit filled the gap with."""

    u: int | None = None
    id: str = ""
    extra: tuple[tuple[int, str], ...] = ()

    def after(self, u: np.ndarray, ids: list[str], bound: tuple[int, str] | None = None) -> np.ndarray:
        """Documents with (u, id) >= the cut (> ``bound`` when given)."""
        cu, cid, strict = (self.u, self.id, False) if bound is None else (bound[0], bound[1], True)
        if cu is None:
            return np.ones(len(u), bool)
        out = u > np.uint64(cu)
        for j in np.flatnonzero(u == np.uint64(cu)).tolist():
            out[j] = ids[j] > cid if strict else ids[j] >= cid
        return out

    def selected(self, u: np.ndarray, ids: list[str]) -> np.ndarray:
        if self.u is None:
            return np.zeros(len(u), bool)
        sel = ~self.after(u, ids)
        if self.extra:
            extra = set(self.extra)
            for j in np.flatnonzero(~sel & np.isin(u, np.array([e[0] for e in self.extra], np.uint64))).tolist():
                sel[j] = (int(u[j]), ids[j]) in extra
        return sel


def final_cut(candidates: list[tuple[int, str, int]], budget: int) -> tuple[Cut, int]:
    """From (u, id, tokens) of every document of the chosen bin, take them in ascending (u, id)
    while they fit ``budget``: the cut at the first that does not fit, and the tokens taken."""
    taken = 0
    for u, i, t in sorted(candidates):
        if taken + t > budget:
            return Cut(int(u), i), taken
        taken += t
    return Cut(None), taken  # pragma: no cover - the bin holds more than the budget by construction


def first_fit(candidates: list[tuple[int, str, int]], gap: int, end: tuple[int, str] | None
              ) -> tuple[list[tuple[int, str]], int, int, bool]:
    """Walk (u, id, tokens) after the cut in ascending (u, id) up to ``end`` (None: to the end),
    taking every document that still fits ``gap`` (the old first-fit fill of a seeded
    permutation). Returns (taken (u, id), tokens taken, gap left, whether the walk reached
    ``end`` with room left, i.e. more candidates past it may still fit)."""
    taken, tok = [], 0
    for u, i, t in sorted(candidates):
        if end is not None and (u, i) > end:
            break
        if t <= gap:
            taken.append((u, i))
            tok += t
            gap -= t
    return taken, tok, gap, end is not None and gap > 0


def emission_positions(u: np.ndarray, tokens: np.ndarray, copies: np.ndarray,
                       seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For one shard's documents of one source (keys ``u``, ``tokens``, number of ``copies``
    each): (document index, epoch) of every copy in emission order, and its position in
    [0, 1). Epoch ``e`` lists its documents by ``fmix64(u + e * GOLDEN ^ seed)``."""
    doc = np.repeat(np.arange(len(u)), copies)
    epoch = (np.arange(len(doc)) - np.repeat(np.cumsum(copies) - copies, copies)).astype(np.int64)
    if not len(doc):
        return doc, epoch, np.zeros(0)
    order_key = fmix64(u[doc] + epoch.astype(np.uint64) * np.uint64(GOLDEN) ^ np.uint64(seed))
    order = np.lexsort((order_key, epoch))
    doc, epoch = doc[order], epoch[order]
    t = tokens[doc].astype(np.float64)
    cum = np.cumsum(t)
    pos = (cum - t / 2) / cum[-1] if cum[-1] > 0 else (np.arange(len(t)) + 0.5) / len(t)
    return doc, epoch, pos
