"""Everything that is a pure function of the step number.

- ``LRSchedule``: piecewise LR made of segments (constant / linear / cosine / 1-sqrt) with a
  linear warm-up on top. Built from the whole-run schedule (cosine or WSD) or from the
  phases' own LR segments.
- ``plan_phases``: mixture phases resolved to step ranges and normalised source weights
  (``Phases``).
- ``MixturePattern``: per-source row counts as arithmetic. Weights are quantised once to
  integers summing to ``PERIOD``; a fixed interleaving of that many slots (Webster /
  Sainte-Lague order, so every source is spread evenly) repeats forever. Position p of a
  phase belongs to source ``pattern[p % PERIOD]`` and is that source's
  ``(p // PERIOD) * W[src] + rank[p % PERIOD]``-th row: O(1), no state, no drift.
- ``seq_len_at``: sequence-length warm-up (start, 2*start, ... seq_len).
- ``curriculum_order``: quality-ascending or quality-bucketed order of a source's rows.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from training.config import TrainConfig

#: Slots in one period of a mixture pattern: weights are resolved to 1/PERIOD.
PERIOD = 10_000


@dataclass(frozen=True)
class Segment:
    """LR over steps [start, end): ``shape`` from ``lr_start`` to ``lr_end``."""

    start: int
    end: int
    shape: str
    lr_start: float
    lr_end: float

    def value(self, step: int) -> float:
        if self.shape == "constant" or self.end - self.start <= 1:
            return self.lr_start if self.shape == "constant" else self.lr_end
        # frac reaches 1 on the segment's last step, so a decay ends exactly at lr_end.
        frac = (step - self.start) / (self.end - self.start - 1)
        a, b = self.lr_start, self.lr_end
        if self.shape == "linear":
            return a + (b - a) * frac
        if self.shape == "cosine":
            return b + (a - b) * 0.5 * (1 + math.cos(math.pi * frac))
        if self.shape == "sqrt":  # the "1-sqrt" cool-down of WSD (Hägele et al. 2024)
            return b + (a - b) * (1 - math.sqrt(frac))
        raise ValueError(f"unknown LR shape {self.shape!r}")


@dataclass
class LRSchedule:
    """LR at any step: the segment covering it, times a linear warm-up ramp."""

    segments: list[Segment]
    warmup_steps: int = 0

    def __call__(self, step: int) -> float:
        seg = self.segments[-1]
        for s in self.segments:
            if s.start <= step < s.end:
                seg = s
                break
        lr = seg.value(min(step, seg.end - 1))
        if step < self.warmup_steps:
            lr *= (step + 1) / self.warmup_steps
        return lr

    def state_dict(self) -> dict:
        return {"warmup_steps": self.warmup_steps, "segments": [s.__dict__ for s in self.segments]}

    def load_state_dict(self, state: dict) -> None:
        self.segments = [Segment(**s) for s in state["segments"]]
        self.warmup_steps = state["warmup_steps"]


@dataclass(frozen=True)
class PhasePlan:
    """A phase resolved to global steps [start, end) and normalised weights (source -> w)."""

    name: str
    start: int
    end: int
    weights: dict[str, float]
    lr_shape: str | None = None
    lr_end_factor: float | None = None

    @property
    def steps(self) -> int:
        return self.end - self.start


class Phases(list[PhasePlan]):
    """The run's phase plans in step order; a checkpoint stores them (as ``plans``)."""

    def state_dict(self) -> list[dict]:
        return [asdict(p) for p in self]

    def load_state_dict(self, state: list[dict]) -> None:
        self[:] = [PhasePlan(**p) for p in state]


def plan_phases(cfg: TrainConfig, source_rows: dict[str, int], source_tokens: dict[str, int] | None = None) -> Phases:
    """Resolve phases (or the single implicit one) to step ranges and weights.

    Weights are shares of content tokens (``row_weights`` turns them into row shares). A
    token budget becomes ``ceil(tokens / (global_batch * seq_len))`` steps. ``mix: null``
    means every source in proportion to its tokens (i.e. a plain shuffle of all rows).
    """
    tokens_per_step = cfg.train.global_batch * cfg.data.seq_len
    sizes = source_tokens if source_tokens and any(source_tokens.values()) else source_rows
    natural = {s: float(sizes.get(s, 0)) for s, n in source_rows.items() if n > 0 and sizes.get(s, 0) > 0}
    phases = cfg.phases
    if not phases:
        steps = cfg.train.steps or math.ceil(cfg.train.tokens / tokens_per_step)
        return Phases([PhasePlan("main", 0, steps, _normalise(natural, source_rows, "main"))])
    plans, start = [], 0
    for p in phases:
        steps = p.steps or math.ceil(p.tokens / tokens_per_step)
        weights = _normalise(p.mix if p.mix is not None else natural, source_rows, p.name)
        lr_shape = p.lr.shape if p.lr else None
        lr_end = p.lr.end_factor if p.lr else None
        plans.append(PhasePlan(p.name, start, start + steps, weights, lr_shape, lr_end))
        start += steps
    return Phases(plans)


def _normalise(weights: dict[str, float], source_rows: dict[str, int], phase: str) -> dict[str, float]:
    unknown = [s for s, w in weights.items() if w > 0 and source_rows.get(s, 0) == 0]
    if unknown:
        known = ", ".join(f"{s} ({n} rows)" for s, n in sorted(source_rows.items()))
        raise ValueError(f"phase {phase!r}: no rows for source(s) {unknown}; the data has: {known}")
    total = sum(w for w in weights.values() if w > 0)
    return {s: w / total for s, w in sorted(weights.items()) if w > 0}


def build_lr_schedule(cfg: TrainConfig, plans: list[PhasePlan]) -> LRSchedule:
    """The run's LR schedule: phase segments if the phases have them, else cosine / WSD."""
    peak, total = cfg.optim.lr, plans[-1].end
    sch = cfg.schedule
    min_lr = peak * sch.min_lr_factor
    if plans[0].lr_shape is not None:
        segments, lr = [], peak
        for p in plans:
            end_lr = lr if p.lr_end_factor is None else peak * p.lr_end_factor
            segments.append(Segment(p.start, p.end, p.lr_shape, lr, end_lr))
            lr = end_lr
        return LRSchedule(segments, sch.warmup_steps)
    if sch.kind == "cosine":
        w = min(sch.warmup_steps, total)
        segments = [Segment(0, w, "constant", peak, peak)] if w else []
        segments.append(Segment(w, total, "cosine", peak, min_lr))
        return LRSchedule(segments, sch.warmup_steps)
    decay = round(total * sch.decay_fraction)
    segments = [Segment(0, total - decay, "constant", peak, peak)] if decay < total else []
    if decay:
        segments.append(Segment(total - decay, total, sch.decay_shape, peak, min_lr))
    return LRSchedule(segments, sch.warmup_steps)


def branch_anneal(
    cfg: TrainConfig,
    plans: list[PhasePlan],
    schedule: LRSchedule,
    at_step: int,
    mix: dict[str, float],
    steps: int,
    source_rows: dict[str, int],
) -> tuple[Phases, LRSchedule]:
    """Branch an annealing phase off a (stable-phase) checkpoint at ``at_step``.

    The phases are cut at ``at_step`` (so the data that was already consumed stays
    exactly what it was and each source stream continues where it stopped), then one
    ``anneal`` phase of ``steps`` steps with ``mix`` follows. Its LR segment starts at the
    LR the original schedule had at ``at_step`` and decays to ``anneal.end_factor * lr``.
    """
    kept = [p for p in plans if p.start < at_step]
    kept = [PhasePlan(p.name, p.start, min(p.end, at_step), p.weights) for p in kept]
    anneal = PhasePlan("anneal", at_step, at_step + steps, _normalise(mix, source_rows, "anneal"))
    lr_start = schedule(at_step)
    segments = [
        Segment(s.start, min(s.end, at_step), s.shape, s.lr_start, s.lr_end)
        for s in schedule.segments
        if s.start < at_step
    ]
    segments.append(Segment(at_step, at_step + steps, cfg.anneal.shape, lr_start, cfg.optim.lr * cfg.anneal.end_factor))
    # The warm-up ramp only ever touches steps before the branch point, never the anneal.
    return Phases(kept + [anneal]), LRSchedule(segments, min(schedule.warmup_steps, at_step))


def seq_len_at(cfg: TrainConfig, step: int) -> int:
    """Sequence length at ``step`` under the warm-up: start, 2*start, ..., seq_len, in equal stages."""
    w, full = cfg.data.seq_len_warmup, cfg.data.seq_len
    if w is None or step >= w.steps:
        return full
    lengths = []
    n = w.start
    while n < full:
        lengths.append(n)
        n *= 2
    return lengths[step * len(lengths) // w.steps]


def row_weights(token_weights: dict[str, float], tokens_per_row: dict[str, float]) -> dict[str, float]:
    """Row shares that give ``token_weights`` as shares of content tokens: a source whose rows
    hold fewer tokens (short documents closing rows early) is drawn more often. Rows of one
    source only (``pack`` per source) make this exact up to the rows' spread in fill."""
    w = {s: v / tokens_per_row[s] if tokens_per_row.get(s, 0) > 0 else v for s, v in token_weights.items()}
    total = sum(w.values())
    return {s: v / total for s, v in w.items()}


@dataclass
class MixturePattern:
    """Integer interleaving of sources for one phase (see the module docstring).

    ``sources`` are indices into the dataset's source list; ``counts[i]`` are integer
    weights summing to ``PERIOD``.
    """

    sources: np.ndarray  # (k,) source index
    counts: np.ndarray  # (k,) integer weights summing to PERIOD
    pattern: np.ndarray = field(init=False)  # (PERIOD,) position in `sources`
    rank: np.ndarray = field(init=False)  # (PERIOD,) how many earlier slots had the same source

    def __post_init__(self) -> None:
        k = len(self.sources)
        owner = np.repeat(np.arange(k), self.counts)
        seat = np.concatenate([np.arange(c) for c in self.counts]) if k else np.zeros(0, np.int64)
        # Webster order: seat j of source i has priority W_i / (2j + 1); highest first,
        # ties to the lower source index. A source's seats come out in j order, so `rank`
        # is just the seat number.
        priority = self.counts[owner] / (2.0 * seat + 1.0)
        order = np.lexsort((owner, -priority))
        self.pattern = owner[order]
        self.rank = seat[order]

    @classmethod
    def from_weights(cls, weights: dict[str, float], source_names: list[str]) -> MixturePattern:
        """Largest-remainder quantisation of normalised weights to integers summing to PERIOD."""
        names = sorted(weights)
        w = np.array([weights[n] for n in names], dtype=np.float64)
        exact = w / w.sum() * PERIOD
        counts = np.floor(exact).astype(np.int64)
        short = PERIOD - counts.sum()
        # Give the leftover slots to the largest remainders (ties: first name).
        for i in np.lexsort((np.arange(len(w)), -(exact - counts)))[:short]:
            counts[i] += 1
        keep = counts > 0
        idx = np.array([source_names.index(n) for n in names], dtype=np.int64)
        return cls(idx[keep], counts[keep])

    def slots(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(source index, n-th row of that source within this phase) for phase positions."""
        m = positions % PERIOD
        j = self.pattern[m]
        return self.sources[j], (positions // PERIOD) * self.counts[j] + self.rank[m]

    def consumed(self, n_positions: int, n_sources: int) -> np.ndarray:
        """Rows taken from every source (indexed by source index) by the first n positions."""
        out = np.zeros(n_sources, dtype=np.int64)
        full, rest = divmod(n_positions, PERIOD)
        out[self.sources] += full * self.counts
        np.add.at(out, self.sources[self.pattern[:rest]], 1)
        return out


def curriculum_order(quality: np.ndarray, rng: np.random.Generator, mode: str, buckets: int) -> np.ndarray:
    """A permutation of ``len(quality)`` rows: random, quality-ascending, or by ascending
    quality bucket (quantiles) with a random order inside each bucket. Ties (and rows
    without a quality) are broken by the random permutation, so the order still depends on
    the seed and epoch."""
    perm = rng.permutation(len(quality))
    if mode == "none":
        return perm
    q = np.nan_to_num(quality[perm], nan=-np.inf)
    if mode == "ascending":
        return perm[np.argsort(q, kind="stable")]
    finite = q[np.isfinite(q)]
    edges = np.quantile(finite, np.linspace(0, 1, buckets + 1)[1:-1]) if len(finite) else np.zeros(0)
    bucket = np.searchsorted(edges, q, side="right")
    return perm[np.argsort(bucket, kind="stable")]
