"""Which rows each step consumes, as arithmetic, so resume is arithmetic too.

``DataOrder`` gives the global rows of step ``s`` as a pure function of (seed, phase plan,
global_batch, s): each source has its own endless stream of rows (epoch ``e`` of source
``src`` is a permutation seeded by (seed, src, e), or its quality curriculum), phases
interleave the streams by their weights (``schedule.MixturePattern``) and each source's
stream continues across phases, so an annealing phase does not replay rows the stable phase
already used. Rank ``r`` of ``world`` gets rows ``r::world`` of the step's global batch, so
no row is ever given to two ranks, and the checkpointed data state is just a step number
(plus the fingerprint): resume works on any world size.
"""

from __future__ import annotations

import zlib
from collections import OrderedDict

import numpy as np

from training.data.shards import PackedDataset
from training.schedule import MixturePattern, PhasePlan, curriculum_order


class DataChangedError(RuntimeError):
    """The checkpoint's data order cannot be reproduced: other shards, seed or global batch."""


def _stable_hash(name: str) -> int:
    return zlib.crc32(name.encode())


class SourceStream:
    """An endless stream over one source's rows: epoch e is a permutation seeded by
    (seed, source, e), or the quality curriculum. ``take(n-th rows)`` -> global row ids."""

    def __init__(self, rows: np.ndarray, name: str, seed: int, quality: np.ndarray, curriculum: str, buckets: int):
        self.rows, self.name, self.seed = rows, name, seed
        self.quality, self.curriculum, self.buckets = quality, curriculum, buckets
        self._perms: OrderedDict[int, np.ndarray] = OrderedDict()

    def _perm(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            rng = np.random.default_rng([self.seed, _stable_hash(self.name), epoch])
            self._perms[epoch] = curriculum_order(self.quality, rng, self.curriculum, self.buckets)
            if len(self._perms) > 2:
                self._perms.popitem(last=False)
        return self._perms[epoch]

    def take(self, nth: np.ndarray) -> np.ndarray:
        n = len(self.rows)
        epoch, pos = np.divmod(nth, n)
        out = np.empty(len(nth), dtype=np.int64)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = self.rows[self._perm(int(e))[pos[sel]]]
        return out


class DataOrder:
    """Which global rows each step consumes. Pure arithmetic; see the module docstring.

    ``step`` (steps already consumed) is its only state, the position a checkpoint records.
    """

    def __init__(self, dataset: PackedDataset, plans: list[PhasePlan], seed: int, global_batch: int, curriculum: str = "none", buckets: int = 4):
        self.dataset, self.plans, self.seed, self.global_batch = dataset, plans, seed, global_batch
        self.step = 0
        k = len(dataset.sources)
        self.streams = [
            SourceStream(rows, name, seed, dataset.row_quality[rows], curriculum, buckets)
            for name, rows in ((n, np.flatnonzero(dataset.row_source == i)) for i, n in enumerate(dataset.sources))
        ]
        self.patterns = [MixturePattern.from_weights(p.weights, dataset.sources) for p in plans]
        # Rows each source had given out before each phase: its streams continue across phases.
        self.offsets = [np.zeros(k, dtype=np.int64)]
        for plan, pat in zip(plans, self.patterns):
            self.offsets.append(self.offsets[-1] + pat.consumed(plan.steps * global_batch, k))

    @property
    def total_steps(self) -> int:
        return self.plans[-1].end

    def phase_index(self, step: int) -> int:
        for i, p in enumerate(self.plans):
            if p.start <= step < p.end:
                return i
        raise IndexError(f"step {step} is past the end of the schedule ({self.total_steps} steps)")

    def step_rows(self, step: int) -> np.ndarray:
        """The global batch of ``step``: ``global_batch`` global row ids."""
        i = self.phase_index(step)
        gb = self.global_batch
        positions = (step - self.plans[i].start) * gb + np.arange(gb, dtype=np.int64)
        src, nth = self.patterns[i].slots(positions)
        nth = nth + self.offsets[i][src]
        out = np.empty(gb, dtype=np.int64)
        for s in np.unique(src):
            sel = src == s
            out[sel] = self.streams[s].take(nth[sel])
        return out

    def rank_rows(self, step: int, rank: int, world: int) -> np.ndarray:
        """Rank ``rank``'s share of the step: rows ``rank::world`` of the global batch."""
        return self.step_rows(step)[rank::world]

    def state(self, step: int) -> dict:
        """The data state after ``step`` completed steps: integers plus the fingerprint."""
        k = len(self.dataset.sources)
        if step >= self.total_steps:
            i, done = len(self.plans) - 1, self.plans[-1].steps
        else:
            i = self.phase_index(step)
            done = step - self.plans[i].start
        used = self.offsets[i] + self.patterns[i].consumed(done * self.global_batch, k)
        sizes = np.array([len(s.rows) for s in self.streams])
        return {
            "step": step,
            "phase": self.plans[i].name,
            "phase_step": done,
            "rows_consumed": step * self.global_batch,
            "global_batch": self.global_batch,
            "seed": self.seed,
            "fingerprint": self.dataset.fingerprint,
            "source_rows_consumed": {s: int(n) for s, n in zip(self.dataset.sources, used)},
            "source_epochs": {s: int(n // max(m, 1)) for s, n, m in zip(self.dataset.sources, used, sizes)},
        }

    def state_dict(self) -> dict:
        return self.state(self.step)

    def load_state_dict(self, state: dict) -> None:
        # Only the position: whether the order is still the checkpoint's (``check_resume``)
        # is settled when the checkpoint is chosen, since it decides which phase plan applies.
        self.step = state["step"]

    def check_resume(self, state: dict, allow_data_change: bool) -> None:
        """See ``check_resume``."""
        check_resume(state, self.dataset, self.seed, self.global_batch, allow_data_change)


def check_resume(state: dict, dataset: PackedDataset, seed: int, global_batch: int, allow_data_change: bool) -> bool:
    """Refuse to resume onto a different shard set (unless allowed) or a different order.

    Returns True when the shard set changed (and that was allowed).
    """
    changed = state["fingerprint"] != dataset.fingerprint
    if changed and not allow_data_change:
        raise DataChangedError(
            f"the shards in {dataset.root} are not the ones this checkpoint was trained on "
            f"(fingerprint {dataset.fingerprint[:12]} != {state['fingerprint'][:12]}); "
            "set data.allow_data_change: true to continue on the new data anyway"
        )
    for key, value in (("global_batch", global_batch), ("seed", seed)):
        if state[key] != value:
            raise DataChangedError(
                f"checkpoint was trained with {key}={state[key]} but the config says {value}; "
                "the data order depends on it, so resuming would not be exact"
            )
    return changed
