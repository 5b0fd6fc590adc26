"""Streaming packed shards, with resume as arithmetic.

``PackedDataset`` indexes a pack directory once: shards sorted by file name (rows per
shard from ``_manifest.jsonl``, or Parquet metadata without one), global row ids
``offset[shard] + row``, each row's ``source`` (and ``quality`` for a curriculum), and a
fingerprint of the shard set. Rows are read lazily by row group with a small LRU.

``DataOrder`` says which global rows step ``s`` consumes, as a pure function of
(seed, phase plan, global_batch, s): each source has its own endless stream of rows (epoch
``e`` of source ``src`` is a permutation seeded by (seed, src, e), or its quality curriculum),
phases interleave the streams by their weights (``schedule.MixturePattern``) and each
source's stream continues across phases, so an annealing phase does not replay rows the
stable phase already used. Rank ``r`` of ``world`` gets rows ``r::world`` of the step's
global batch, so no row is ever given to two ranks, and the checkpointed data state is
just a step number (plus the fingerprint): resume works on any world size.

``Prefetcher`` prepares each step's batch (reading, splitting into micro-batches, document
ids, RoPE positions, loss targets) on a background thread.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch

from training.attention import doc_ids_from_lens, positions_from_doc_ids
from training.schedule import MixturePattern, PhasePlan, curriculum_order

MANIFEST = "_manifest.jsonl"
PACK_REPORT = "_pack_report.json"  # written by refinery's pack stage once all shards are committed
IGNORE = -100  # target id the loss ignores (padding, cross-document predictions)


class DataError(ValueError):
    """Packed data the trainer cannot use as configured (row length, token ids, manifest)."""


class DataChangedError(RuntimeError):
    """The checkpoint's data order cannot be reproduced: other shards, seed or global batch."""


@dataclass(frozen=True)
class Shard:
    """One committed Parquet shard of a pack directory."""

    file: str  # relative to the pack directory
    path: Path
    rows: int
    size: int


def _tokenizer_id(path: str | None) -> str | None:
    """sha256 of a tokenizer card file, or of every file of a tokenizer dir (names + bytes)."""
    if not path:
        return None
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    if not files:
        raise FileNotFoundError(f"tokenizer {path}: no such file or directory")
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _list_shards(root: Path) -> list[Shard]:
    manifest = root / MANIFEST
    if manifest.exists():
        entries: dict[str, dict] = {}
        for n, line in enumerate(manifest.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                entries[rec["shard"]] = rec  # a re-committed shard: the last line wins
            except (ValueError, KeyError) as err:
                raise DataError(f"{manifest}:{n}: bad manifest line ({err})") from None
        # A pack that was re-run with other parameters can leave stale lines behind; its report
        # names the parameters hash of the shards that make up the current output.
        report = root / PACK_REPORT
        if report.exists():
            current = json.loads(report.read_text()).get("params_hash")
            if current:
                entries = {k: e for k, e in entries.items() if e.get("params_hash", current) == current}
        shards = []
        for rec in entries.values():
            if not rec.get("file"):
                continue  # a shard that committed no rows
            # refinery's stage manifests give paths relative to the run dir (the pack dir's
            # parent: "pack/xxx.parquet"); other writers relative to the pack dir itself.
            path = next((b / rec["file"] for b in (root, root.parent) if (b / rec["file"]).is_file()), None)
            if path is None:
                raise FileNotFoundError(f"{manifest}: shard {rec['shard']!r} lists {rec['file']}, which is missing")
            shards.append(Shard(rec["file"], path, int(rec["rows"]), path.stat().st_size))
    else:
        # No manifest: every Parquet file is taken as committed; row counts from the footers.
        shards = [
            Shard(p.name, p, pq.ParquetFile(p).metadata.num_rows, p.stat().st_size)
            for p in root.glob("*.parquet")
        ]
    shards = [s for s in shards if s.rows > 0]
    if not shards:
        raise FileNotFoundError(f"{root}: no packed Parquet shards found")
    return sorted(shards, key=lambda s: s.file)


@dataclass
class RowBatch:
    """Rows read from shards, in the order they were asked for."""

    ids: np.ndarray  # (n, seq_len + 1) int64
    doc_lens: list[np.ndarray]
    source_tokens: list[str | None]


class PackedDataset:
    """A pack directory: shard index, fingerprint, per-row source/quality, lazy row reads."""

    def __init__(self, path: str | Path, tokenizer: str | None = None, row_group_cache: int = 32, need_quality: bool = False):
        self.root = Path(path)
        if not self.root.is_dir():
            raise FileNotFoundError(f"data path {self.root} is not a directory (expected a pack output dir)")
        self.shards = _list_shards(self.root)
        counts = np.array([s.rows for s in self.shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(counts)])
        self.num_rows = int(self.offsets[-1])
        payload = {
            "shards": [[s.file, s.rows, s.size] for s in self.shards],
            "tokenizer": _tokenizer_id(tokenizer),
        }
        self.fingerprint = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        self._cache_size = row_group_cache
        self._cache: OrderedDict[tuple[int, int], dict] = OrderedDict()
        self._files: OrderedDict[int, tuple[pq.ParquetFile, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self._index_columns(need_quality)

    def _index_columns(self, need_quality: bool) -> None:
        """Per-row source index (and quality): one narrow column read per shard, once."""
        codes, quality, names = [], [], {}
        missing_quality = 0
        for shard in self.shards:
            pf = pq.ParquetFile(shard.path)
            schema_names = pf.schema_arrow.names
            if "source" in schema_names:
                col = pf.read(columns=["source"]).column("source").combine_chunks()
                col = pc.fill_null(col.cast(pa.string()), "unknown")
            else:
                col = pa.array(["unknown"] * shard.rows)
            enc = col.dictionary_encode()
            local = [names.setdefault(v, len(names)) for v in enc.dictionary.to_pylist()]
            codes.append(np.asarray(local, dtype=np.int32)[enc.indices.to_numpy(zero_copy_only=False)])
            if need_quality and "quality" in schema_names:
                q = pf.read(columns=["quality"]).column("quality").combine_chunks().cast(pa.float64())
                quality.append(q.to_numpy(zero_copy_only=False))
            else:
                missing_quality += need_quality
                quality.append(np.full(shard.rows, np.nan))
        #: False when a curriculum was asked for but some shards have no quality column.
        self.has_quality = not missing_quality
        # Source indices follow sorted names, so they do not depend on shard order.
        self.sources = sorted(names)
        remap = np.array([self.sources.index(n) for n in sorted(names, key=names.get)], dtype=np.int32)
        self.row_source = remap[np.concatenate(codes)]
        self.row_quality = np.concatenate(quality)

    def source_rows(self) -> dict[str, int]:
        """Rows per source."""
        counts = np.bincount(self.row_source, minlength=len(self.sources))
        return {s: int(n) for s, n in zip(self.sources, counts)}

    def _file(self, shard: int) -> tuple[pq.ParquetFile, np.ndarray]:
        """Open ParquetFile and the first row of each of its row groups (small LRU of handles)."""
        if shard in self._files:
            self._files.move_to_end(shard)
            return self._files[shard]
        pf = pq.ParquetFile(self.shards[shard].path)
        md = pf.metadata
        starts = np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])
        self._files[shard] = (pf, starts)
        if len(self._files) > 64:
            self._files.popitem(last=False)
        return pf, starts

    def _row_group(self, shard: int, rg: int) -> dict:
        key = (shard, rg)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        pf, _ = self._file(shard)
        names = pf.schema_arrow.names
        cols = [c for c in ("input_ids", "doc_lens", "source_tokens") if c in names]
        table = pf.read_row_group(rg, columns=cols)
        ids = table.column("input_ids").combine_chunks()
        width = np.diff(ids.offsets.to_numpy())
        if len(width) and (width != width[0]).any():
            raise DataError(f"{self.shards[shard].file} row group {rg}: rows have different lengths {sorted(set(width.tolist()))[:5]}")
        decoded = {
            "ids": ids.flatten().to_numpy(zero_copy_only=False).astype(np.int64).reshape(len(width), -1),
        }
        if "doc_lens" in names:
            dl = table.column("doc_lens").combine_chunks()
            decoded["dl_offsets"] = dl.offsets.to_numpy()
            decoded["dl_values"] = dl.flatten().to_numpy(zero_copy_only=False)
        if "source_tokens" in names:
            decoded["source_tokens"] = table.column("source_tokens").to_pylist()
        self._cache[key] = decoded
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return decoded

    def read_rows(self, rows: np.ndarray, pad_id: int) -> RowBatch:
        """Read global rows (any order). Thread-safe; row groups are cached."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise IndexError(f"row id out of range 0..{self.num_rows - 1}")
        shard_of = np.searchsorted(self.offsets, rows, side="right") - 1
        local = rows - self.offsets[shard_of]
        out_ids, out_dl, out_st = [None] * len(rows), [None] * len(rows), [None] * len(rows)
        with self._lock:
            for i, (sh, lr) in enumerate(zip(shard_of.tolist(), local.tolist())):
                _, starts = self._file(sh)
                rg = int(np.searchsorted(starts, lr, side="right") - 1)
                dec = self._row_group(sh, rg)
                j = lr - int(starts[rg])
                out_ids[i] = dec["ids"][j]
                if "dl_offsets" in dec:
                    o = dec["dl_offsets"]
                    out_dl[i] = dec["dl_values"][o[j] : o[j + 1]]
                else:  # no doc_lens column: one document up to the trailing padding
                    nonpad = np.flatnonzero(dec["ids"][j] != pad_id)
                    out_dl[i] = np.array([nonpad[-1] + 1 if len(nonpad) else 0])
                out_st[i] = dec["source_tokens"][j] if "source_tokens" in dec else None
        ids = np.stack(out_ids) if out_ids else np.zeros((0, 0), np.int64)
        return RowBatch(ids, out_dl, out_st)


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
    """Which global rows each step consumes. Pure arithmetic; see the module docstring."""

    def __init__(self, dataset: PackedDataset, plans: list[PhasePlan], seed: int, global_batch: int, curriculum: str = "none", buckets: int = 4):
        self.dataset, self.plans, self.seed, self.global_batch = dataset, plans, seed, global_batch
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


# ---------------------------------------------------------------------------------------
# Turning rows into model inputs


@dataclass
class MicroBatch:
    """One forward/backward: (b, T) inputs and targets (IGNORE where no loss), masking inputs."""

    inputs: torch.Tensor
    targets: torch.Tensor
    doc_ids: torch.Tensor | None
    positions: torch.Tensor | None

    def to(self, device: torch.device) -> MicroBatch:
        nb = device.type == "cuda"
        move = lambda t: None if t is None else t.to(device, non_blocking=nb)  # noqa: E731
        return MicroBatch(move(self.inputs), move(self.targets), move(self.doc_ids), move(self.positions))


@dataclass
class StepBatch:
    """Everything one rank needs for one optimizer step."""

    step: int
    micro: list[MicroBatch]
    row_ids: np.ndarray
    n_tokens: int  # tokens that carry loss on this rank
    source_tokens: np.ndarray  # (n_sources,) non-padding tokens by the row's source
    content_tokens: dict[str, int] = field(default_factory=dict)  # from the rows' source_tokens JSON
    seq_len: int = 0


def build_micro_batches(
    rows: RowBatch,
    seq_len: int,
    cur_len: int,
    micro_rows: int,
    document_mask: bool,
    vocab_size: int | None = None,
) -> tuple[list[MicroBatch], int, np.ndarray]:
    """Rows of ``seq_len + 1`` tokens -> micro-batches of ``micro_rows`` rows.

    Targets are the next token; they are IGNORE on padding and, with document masking, on
    the first token of the next document (the model cannot see anything it depends on).
    With ``cur_len < seq_len`` (sequence-length warm-up) every row is cut into
    ``seq_len / cur_len`` sequences; positions restart in every piece.
    Returns (micro-batches, tokens with loss, non-padding tokens per row).
    """
    ids = rows.ids
    n = len(ids)
    if ids.shape[1] != seq_len + 1:
        raise DataError(f"packed rows have {ids.shape[1]} tokens, but data.seq_len + 1 = {seq_len + 1}")
    if vocab_size is not None and n and ids.max() >= vocab_size:
        raise DataError(f"token id {int(ids.max())} >= model.vocab_size {vocab_size}: the tokenizer and the model disagree")
    nonpad = np.array([int(np.sum(d)) for d in rows.doc_lens], dtype=np.int64)
    if (nonpad > seq_len + 1).any():
        raise DataError(f"doc_lens sum to {int(nonpad.max())} > row length {seq_len + 1}")
    docs = doc_ids_from_lens(rows.doc_lens, seq_len + 1)
    inputs, targets = ids[:, :-1].copy(), ids[:, 1:].copy()
    valid = np.arange(1, seq_len + 1)[None, :] < nonpad[:, None]
    if document_mask:
        valid &= docs[:, 1:] == docs[:, :-1]
    targets[~valid] = IGNORE
    n_tokens = int(valid.sum())
    pieces = seq_len // cur_len
    shape = (n * pieces, cur_len)
    inputs, targets = inputs.reshape(shape), targets.reshape(shape)
    doc_ids = positions = None
    if document_mask:
        doc_ids = docs[:, :-1].reshape(shape)
        positions = positions_from_doc_ids(doc_ids)
    out = []
    step = micro_rows * pieces
    for a in range(0, n * pieces, step):
        out.append(
            MicroBatch(
                torch.from_numpy(inputs[a : a + step]),
                torch.from_numpy(targets[a : a + step]),
                None if doc_ids is None else torch.from_numpy(doc_ids[a : a + step]),
                None if positions is None else torch.from_numpy(positions[a : a + step]),
            )
        )
    return out, n_tokens, np.minimum(nonpad, seq_len)


def build_step(
    dataset: PackedDataset,
    row_ids: np.ndarray,
    step: int,
    seq_len: int,
    cur_len: int,
    micro_rows: int,
    document_mask: bool,
    pad_id: int,
    vocab_size: int | None,
) -> StepBatch:
    """Read this rank's rows for ``step`` and prepare its micro-batches and token counts."""
    rows = dataset.read_rows(row_ids, pad_id)
    micro, n_tokens, row_tokens = build_micro_batches(rows, seq_len, cur_len, micro_rows, document_mask, vocab_size)
    by_source = np.bincount(dataset.row_source[row_ids], weights=row_tokens, minlength=len(dataset.sources))
    content: dict[str, int] = {}
    for st in rows.source_tokens:
        if st:
            for k, v in json.loads(st).items():
                content[k] = content.get(k, 0) + int(v)
    return StepBatch(step, micro, row_ids, n_tokens, by_source.astype(np.int64), content, cur_len)


class Prefetcher:
    """Prepares steps ``[start, end)`` on a background thread, ``depth`` steps ahead.

    ``make(step) -> StepBatch`` runs on the thread (numpy and pyarrow release the GIL for
    the heavy parts). An exception on the thread is re-raised by ``get``.
    """

    def __init__(self, make, start: int, end: int, depth: int):
        self._make, self._q = make, queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start, end), daemon=True, name="prefetch")
        self._thread.start()

    def _run(self, start: int, end: int) -> None:
        try:
            for step in range(start, end):
                item = self._make(step)
                while not self._stop.is_set():
                    try:
                        self._q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as err:  # surfaced to the training thread by get()
            self._q.put(err)

    def get(self) -> StepBatch:
        item = self._q.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def eval_rows(num_rows: int, wanted: int) -> np.ndarray:
    """``wanted`` row indices evenly spaced over ``num_rows`` (all of them if fewer)."""
    if wanted >= num_rows:
        return np.arange(num_rows, dtype=np.int64)
    return (np.arange(wanted, dtype=np.int64) * num_rows) // wanted


class EvalData:
    """A held-out pack: ``batches * global_batch`` rows spread evenly over it (a pack lists its
    sources one after another, so the first rows would be one source), split ``rank::world``,
    prepared once and kept in memory."""

    def __init__(self, path: str, batches: int, global_batch: int, micro_rows: int, rank: int, world: int, seq_len: int, document_mask: bool, pad_id: int, vocab_size: int | None):
        ds = PackedDataset(path)
        rows = eval_rows(ds.num_rows, batches * global_batch)[rank::world]
        self.micro: list[MicroBatch] = []
        for a in range(0, len(rows), micro_rows):
            part = ds.read_rows(rows[a : a + micro_rows], pad_id)
            mb, _, _ = build_micro_batches(part, seq_len, seq_len, micro_rows, document_mask, vocab_size)
            self.micro.extend(mb)
