"""Which rows each step consumes, as arithmetic, so resume is arithmetic too.

``DataOrder`` gives the global rows of step ``s`` as a pure function of (seed, phase plan,
global_batch, order settings, s). Phases interleave per-source streams by their weights
(``schedule.MixturePattern``) and each source's stream continues across phases, so an
annealing phase does not replay rows the stable phase already used. Rank ``r`` of ``world``
gets rows ``r::world`` of the step's global batch, so no row is ever given to two ranks, and
the checkpointed data state is just a step number (plus the fingerprint and the order
settings): resume works on any world size.

A source's stream (``order: blocks``, the default) reads *blocks*, a shard's Parquet row
groups, whole: epoch ``e`` is a permutation of the blocks seeded by (seed, lane, e), cut into
windows of ``window`` blocks; a window's rows are shuffled together (seeded by (seed, lane,
e, window)) and each source takes its own rows of the window in that shuffled order. That is
a bounded shuffle buffer written as arithmetic: at any step the rows in use come from the
current window of each source, so a reader decodes each block about once (``window`` blocks
per lane in memory) instead of a whole row group for every random row. All sources walk the
same block order, so with a natural mix a block that holds rows of several sources is
decoded once for all of them.

``lanes``: the global batch's positions ``i`` go to lane ``i % lanes``, each lane a stream
of its own over its own share of the blocks (fixed by the seed). The order never depends on
the world size, so resume is exact on any world size; with ``lanes`` a multiple of the world
size, rank ``r`` (rows ``r::world``) also only ever reads its own lanes' blocks (with one
lane every rank decodes every block of the current windows: bytes decoded per byte trained
on grow with the world size).

``order: rows`` (and any quality curriculum) is the row-level order: epoch ``e`` of source
``src`` is a permutation of its rows seeded by (seed, src, e), or its quality curriculum.
Exact, but every random row costs a block decode once the data outgrows the cache.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict

import numpy as np

from training.data.shards import DataError, PackedDataset
from training.schedule import MixturePattern, PhasePlan, curriculum_order, row_weights

#: rng stream tags, so the lane split, epoch and window permutations never share a seed
_LANES, _EPOCH, _WINDOW = 0x1A4E, 0xE90C, 0x3D0B


class DataChangedError(RuntimeError):
    """The checkpoint's data order cannot be reproduced: other shards, seed or global batch."""


def _stable_hash(name: str) -> int:
    return zlib.crc32(name.encode())


class SourceStream:
    """Row-level order: an endless stream over one source's rows; epoch e is a permutation
    seeded by (seed, source, e), or the quality curriculum. ``take(src, nth)`` -> global row ids."""

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

    def take(self, src: int, nth: np.ndarray) -> np.ndarray:
        n = len(self.rows)
        epoch, pos = np.divmod(nth, n)
        out = np.empty(len(nth), dtype=np.int64)
        for e in np.unique(epoch):
            sel = epoch == e
            out[sel] = self.rows[self._perm(int(e))[pos[sel]]]
        return out


class BlockStream:
    """One lane's blocks as one endless stream per source (see the module docstring).

    ``take(src, nth)``: the global rows of source ``src``'s n-th rows in this lane. Pure
    arithmetic over the block index; small LRUs keep the current epochs' block orders and the
    current windows' shuffled rows.
    """

    def __init__(self, dataset: PackedDataset, blocks: np.ndarray, seed: int, lane: int, window: int):
        self.ds, self.blocks, self.seed, self.lane, self.window = dataset, np.sort(blocks), seed, lane, window
        k = len(dataset.sources)
        starts = dataset.block_starts
        # rows of each source in each of this lane's blocks
        rows = np.concatenate([np.arange(starts[b], starts[b + 1]) for b in self.blocks]) if len(self.blocks) else np.zeros(0, np.int64)
        local = np.repeat(np.arange(len(self.blocks)), starts[self.blocks + 1] - starts[self.blocks])
        self.counts = np.zeros((len(self.blocks), k), dtype=np.int64)
        np.add.at(self.counts, (local, dataset.row_source[rows]), 1)
        self.source_rows = self.counts.sum(axis=0)
        self._epochs: OrderedDict[int, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._windows: OrderedDict[tuple[int, int], list[np.ndarray]] = OrderedDict()
        self._max_windows = 2 * k + 2

    def _epoch(self, e: int) -> tuple[np.ndarray, np.ndarray]:
        """(block order, rows of each source before each window: (windows + 1, sources))."""
        if e not in self._epochs:
            perm = np.random.default_rng([self.seed, _EPOCH, self.lane, e]).permutation(len(self.blocks))
            per_window = np.add.reduceat(self.counts[perm], np.arange(0, len(perm), self.window), axis=0)
            cum = np.concatenate([np.zeros((1, self.counts.shape[1]), np.int64), np.cumsum(per_window, axis=0)])
            self._epochs[e] = (self.blocks[perm], cum)
            if len(self._epochs) > 3:
                self._epochs.popitem(last=False)
        else:
            self._epochs.move_to_end(e)
        return self._epochs[e]

    def _rows(self, e: int, w: int) -> list[np.ndarray]:
        """Window ``w`` of epoch ``e``: its rows shuffled together, split by source."""
        key = (e, w)
        if key not in self._windows:
            order, _ = self._epoch(e)
            starts = self.ds.block_starts
            rows = np.concatenate([np.arange(starts[b], starts[b + 1]) for b in order[w * self.window : (w + 1) * self.window]])
            rows = rows[np.random.default_rng([self.seed, _WINDOW, self.lane, e, w]).permutation(len(rows))]
            src = self.ds.row_source[rows]
            self._windows[key] = [rows[src == s] for s in range(len(self.ds.sources))]
            if len(self._windows) > self._max_windows:
                self._windows.popitem(last=False)
        else:
            self._windows.move_to_end(key)
        return self._windows[key]

    def take(self, src: int, nth: np.ndarray) -> np.ndarray:
        n = int(self.source_rows[src])
        if n == 0:
            raise DataError(f"lane {self.lane} has no rows of source {self.ds.sources[src]!r}: use fewer data.lanes")
        epoch, pos = np.divmod(nth, n)
        out = np.empty(len(nth), dtype=np.int64)
        for e in np.unique(epoch).tolist():
            sel = np.flatnonzero(epoch == e)
            _, cum = self._epoch(e)
            win = np.searchsorted(cum[:, src], pos[sel], side="right") - 1
            for w in np.unique(win).tolist():
                here = sel[win == w]
                out[here] = self._rows(e, w)[src][pos[here] - cum[w, src]]
        return out


def split_lanes(dataset: PackedDataset, lanes: int, seed: int) -> list[np.ndarray]:
    """The blocks of each lane: a seeded permutation of the blocks cut into ``lanes`` runs of
    about equal rows (fixed for the run, so each lane's epoch has a fixed length)."""
    nb = dataset.num_blocks
    if lanes > nb:
        raise DataError(f"data.lanes ({lanes}) is more than the data's {nb} blocks (row groups)")
    perm = np.random.default_rng([seed, _LANES]).permutation(nb)
    sizes = np.diff(dataset.block_starts)[perm]
    before = np.cumsum(sizes) - sizes
    lane = np.minimum(before * lanes // max(int(sizes.sum()), 1), lanes - 1)
    return [perm[lane == i] for i in range(lanes)]


class DataOrder:
    """Which global rows each step consumes. Pure arithmetic; see the module docstring.

    ``step`` (steps already consumed) is its only state, the position a checkpoint records.
    ``order``: "blocks" (bounded reads) or "rows"; a curriculum always orders rows.
    """

    def __init__(self, dataset: PackedDataset, plans: list[PhasePlan], seed: int, global_batch: int, curriculum: str = "none",
                 buckets: int = 4, order: str = "blocks", window: int = 8, lanes: int = 1):
        self.dataset, self.plans, self.seed, self.global_batch = dataset, plans, seed, global_batch
        self.step = 0
        self.kind = "rows" if curriculum != "none" or order == "rows" else "blocks"
        self.window, self.lanes = window, lanes if self.kind == "blocks" else 1
        if global_batch % self.lanes:
            raise DataError(f"train.global_batch ({global_batch}) must be a multiple of data.lanes ({self.lanes})")
        k = len(dataset.sources)
        if self.kind == "blocks":
            self.streams = [BlockStream(dataset, blocks, seed, i, window) for i, blocks in enumerate(split_lanes(dataset, self.lanes, seed))]
        else:
            self.streams = [_RowStreams([
                SourceStream(rows, name, seed, dataset.row_quality[rows], curriculum, buckets)
                for name, rows in ((n, np.flatnonzero(dataset.row_source == i)) for i, n in enumerate(dataset.sources))
            ])]
        # Phase weights are token shares; the patterns interleave rows.
        rows = np.bincount(dataset.row_source, minlength=k)
        tpr = {s: dataset.content_tokens[i] / rows[i] for i, s in enumerate(dataset.sources) if rows[i]}
        self.patterns = [MixturePattern.from_weights(row_weights(p.weights, tpr), dataset.sources) for p in plans]
        # Rows each source had given out (per lane) before each phase: streams continue across phases.
        per_lane = global_batch // self.lanes
        self.offsets = [np.zeros(k, dtype=np.int64)]
        for plan, pat in zip(plans, self.patterns):
            self.offsets.append(self.offsets[-1] + pat.consumed(plan.steps * per_lane, k))
        self._lock = threading.Lock()

    @property
    def settings(self) -> dict:
        """What besides seed and global batch the order depends on (checked on resume)."""
        if self.kind == "rows":
            return {"kind": "rows"}
        return {"kind": "blocks", "window": self.window, "lanes": self.lanes}

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
        gb, lanes = self.global_batch, self.lanes
        pos = np.arange(gb, dtype=np.int64)
        lane = pos % lanes
        # each lane's own position in this phase (with one lane: the global position)
        positions = (step - self.plans[i].start) * (gb // lanes) + pos // lanes
        src, nth = self.patterns[i].slots(positions)
        nth = nth + self.offsets[i][src]
        out = np.empty(gb, dtype=np.int64)
        with self._lock:
            for ln in np.unique(lane).tolist():
                for s in np.unique(src[lane == ln]).tolist():
                    sel = (lane == ln) & (src == s)
                    out[sel] = self.streams[ln].take(s, nth[sel])
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
        used = (self.offsets[i] + self.patterns[i].consumed(done * (self.global_batch // self.lanes), k)) * self.lanes
        sizes = np.bincount(self.dataset.row_source, minlength=k)
        return {
            "step": step,
            "phase": self.plans[i].name,
            "phase_step": done,
            "rows_consumed": step * self.global_batch,
            "global_batch": self.global_batch,
            "seed": self.seed,
            "order": self.settings,
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
        check_resume(state, self.dataset, self.seed, self.global_batch, allow_data_change, self.settings)


class _RowStreams:
    """The row-level streams of every source, behind the lane interface (one lane)."""

    def __init__(self, streams: list[SourceStream]):
        self.streams = streams

    def take(self, src: int, nth: np.ndarray) -> np.ndarray:
        return self.streams[src].take(src, nth)


def order_settings(order: str, curriculum: str, window: int, lanes: int) -> dict:
    """``DataOrder.settings`` from the config, before any data is read."""
    if order == "rows" or curriculum != "none":
        return {"kind": "rows"}
    return {"kind": "blocks", "window": window, "lanes": lanes}


def check_resume(state: dict, dataset: PackedDataset, seed: int, global_batch: int, allow_data_change: bool,
                 settings: dict | None = None) -> bool:
    """Refuse to resume onto a different shard set (unless allowed) or a different order.

    ``settings``: the order's (``DataOrder.settings``); a checkpoint without them was written
    by the row-level order. Returns True when the shard set changed (and that was allowed).
    """
    changed = state["fingerprint"] != dataset.fingerprint
    if changed and not allow_data_change:
        raise DataChangedError(
            f"the shards in {dataset.path} are not the ones this checkpoint was trained on "
            f"(fingerprint {dataset.fingerprint[:12]} != {state['fingerprint'][:12]}); "
            "set data.allow_data_change: true to continue on the new data anyway"
        )
    for key, value in (("global_batch", global_batch), ("seed", seed)):
        if state[key] != value:
            raise DataChangedError(
                f"checkpoint was trained with {key}={state[key]} but the config says {value}; "
                "the data order depends on it, so resuming would not be exact"
            )
    if settings is not None:
        was = state.get("order", {"kind": "rows"})
        if was != settings:
            hint = ("set data.order: rows" if was.get("kind") == "rows"
                    else f"set data.order: blocks, data.shuffle_blocks: {was.get('window')}, data.lanes: {was.get('lanes')}")
            raise DataChangedError(
                f"checkpoint was trained with the data order {was} but the config gives {settings}; "
                f"resuming would not be exact ({hint} to continue it)"
            )
    return changed
