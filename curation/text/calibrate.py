"""Per-language rule calibration (FineWeb-2's method), below the stage layer: no Ray, no run.

FineWeb-2 (Penedo et al. 2025) chose each language's threshold for a rule so that the language
loses about the share of its documents that English loses to the same rule. Given, per
language, the distribution of the rule's signal, that is a quantile: for a ``<`` rule (drop
below the threshold) the value under which the English share of the language's documents lies,
for a ``>`` rule the value above which it lies. What this module holds:

- ``FieldSpec``: one calibrated threshold (``stage.field`` or ``stage.field.n`` for an n-gram
  size), the signal column it is compared with, the comparison (``<`` or ``>``) and the
  histogram's range.
- ``histogram(values, spec, bins)``: a fixed-size histogram whose counts answer the rule's
  comparison exactly at every bin edge (``searchsorted`` positions: ``side="right"`` for
  ``<``, ``"left"`` for ``>``), so histograms of blocks of shards add up and the share a
  chosen edge drops is exact, not interpolated. NaN (undefined signal) never fires, as in
  the rules, and is left out.
- ``choose(hist, docs, spec, target, prefer)``: the edge whose drop share is closest to
  ``target`` (ties broken towards ``prefer``, the language's preset value, so a language
  whose documents never come near the rule keeps what it had).
- ``top_words`` / ``merge_top``: a bounded top-k word count (a count of each block's most
  frequent words, kept to ``k`` per language when merged: heavy hitters survive, the tail is
  forgotten) and ``stop_words(counts, n)``: the most frequent words as a stop-word list for a
  language that has none.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: histogram bins per threshold (edges = bins + 1)
BINS = 2000
#: the range of a signal's histogram where it is not a share in [0, 1]
RANGES = {"gopher_mean_word_length": (0.0, 50.0), "fineweb_newline_per_word": (0.0, 10.0)}


@dataclass(frozen=True)
class FieldSpec:
    """One threshold to calibrate: ``stage`` type, ``field`` (and ``key``: the n-gram size of
    a dict field), the ``signal`` column and the comparison that drops (``<`` or ``>``)."""

    stage: str
    field: str
    key: str | None
    signal: str
    op: str
    lo: float = 0.0
    hi: float = 1.0

    @property
    def name(self) -> str:
        return f"{self.stage}.{self.field}" + (f".{self.key}" if self.key is not None else "")


def spec(stage: str, field: str, key: str | None, signal: str, op: str) -> FieldSpec:
    if op not in ("<", ">"):
        raise ValueError(f"{stage}.{field}: only < and > rules are calibrated, not {op!r}")
    lo, hi = RANGES.get(signal, (0.0, 1.0))
    return FieldSpec(stage, field, key, signal, op, lo, hi)


def edges(s: FieldSpec, bins: int = BINS) -> np.ndarray:
    return np.linspace(s.lo, s.hi, bins + 1)


def histogram(values: np.ndarray, s: FieldSpec, bins: int = BINS) -> np.ndarray:
    """Counts (``bins + 2``) of each value's position among the edges; NaN left out."""
    v = np.asarray(values, np.float64)
    v = v[~np.isnan(v)]
    pos = np.searchsorted(edges(s, bins), v, side="right" if s.op == "<" else "left")
    return np.bincount(pos, minlength=bins + 2).astype(np.int64)


def dropped(values: np.ndarray, op: str, threshold: float) -> int:
    """How many values the rule drops at ``threshold`` (NaN never)."""
    v = np.asarray(values, np.float64)
    v = v[~np.isnan(v)]
    return int((v < threshold).sum() if op == "<" else (v > threshold).sum())


def drop_counts(hist: np.ndarray, s: FieldSpec) -> np.ndarray:
    """Per edge ``k``: the documents the rule drops at threshold ``edges[k]``."""
    h = np.asarray(hist, np.int64)
    if s.op == "<":  # v < edges[k]  <=>  searchsorted(right) <= k
        return np.cumsum(h)[:-1]
    # v > edges[k]  <=>  searchsorted(left) > k
    return np.cumsum(h[::-1])[::-1][1:]


def choose(hist: np.ndarray, docs: int, s: FieldSpec, target: float, prefer: float | None = None,
           bins: int = BINS) -> tuple[float, float]:
    """(threshold, share of ``docs`` it drops): the bin edge whose drop share is closest to
    ``target``; among equally close edges the one nearest ``prefer`` (else the loosest)."""
    e = edges(s, bins)
    share = drop_counts(hist, s) / max(docs, 1)
    gap = np.abs(share - target)
    best = np.flatnonzero(gap <= gap.min() + 1e-12)
    if prefer is not None and np.isfinite(prefer):
        k = best[np.argmin(np.abs(e[best] - prefer))]
    else:
        k = best[0] if s.op == "<" else best[-1]
    return round(float(e[k]), 6), float(share[k])


# -- corpus-derived stop words ----------------------------------------------------------------


def top_words(words: pa.Array, k: int) -> dict[str, int]:
    """The ``k`` most frequent of ``words`` with their counts (ties by the word)."""
    if not len(words):
        return {}
    vc = pc.value_counts(words)
    # Arrow sorts strings by UTF-8 bytes, which is code-point order: the same ties as Python's
    top = pa.table({"values": vc.field("values"), "counts": vc.field("counts")})
    top = top.take(pc.sort_indices(top, [("counts", "descending"), ("values", "ascending")])[:k])
    return dict(zip(top.column("values").to_pylist(), top.column("counts").to_pylist()))


def merge_top(a: dict[str, int], b: dict[str, int], k: int) -> dict[str, int]:
    """Two bounded counts added, kept to the ``k`` most frequent (a word a block left out
    counts 0 there: the sketch under-counts the tail, never the heavy hitters of every block)."""
    out = dict(a)
    for w, c in b.items():
        out[w] = out.get(w, 0) + c
    return dict(sorted(out.items(), key=lambda kv: (-kv[1], kv[0]))[:k])


def stop_words(counts: dict[str, int], n: int) -> list[str]:
    """The ``n`` most frequent words of a language (its corpus-derived stop words)."""
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]]
