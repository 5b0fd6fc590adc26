"""Mix sources to target token shares: subsample large ones, upsample small ones (whole epochs
plus a partial one, at most ``max_epochs``), interleave so every prefix is near the mix.

Nothing per document is planned on the driver (``curation.sampling.mixture``). Upstream shards
are grouped into blocks of bounded bytes (``curation.io.shards.blocks``): one map task per
block, so tasks and intermediate files grow with the data, not with the number of shards.
Phases, all deterministic under ``seed`` and independent of the worker count:

1. count (one task per block): documents and tokens per source, and a histogram of the
   documents' keys ``u = hash(seed, source, id)`` by their top digit, merged as they arrive;
   the block's (source, id, u, tokens) to one choice file, which the next phases read (one
   file per block, not one per shard, and no key hashed twice).
2. refineN (only while a source's cut bin is large): the next digit's histogram in that bin.
3. cut (one task per block): the few documents of each source's final bin; the driver then
   fixes each source's partial-epoch cut ``(u, id)``: a document's copies are a function of
   (seed, source, id, cut) alone.
4. fillN: the gap the cut leaves, filled first-fit from the documents after it in (u, id)
   order; each task sends its first ``FILL_PER_TASK`` that fit, and the driver folds them into
   the ``FILL_PER_TASK`` smallest as they arrive (it holds O(sources x FILL_PER_TASK), whatever
   the number of shards).
5. scatter (one task per block): each copy (ids ``...#epochN`` after the first) with its
   position, into one file per block indexed by partition; unselected rows to
   ``rejected/STAGE/<shard>.parquet`` (``mix:subsampled``, ``mix:not_in_weights``).
6. gather (one task per partition): its row groups of every scatter file, sorted by position,
   written as its consecutive output shards ``STAGE/<STAGE>-00000.parquet``...

Output shard ``j`` holds the copies with position in ``[j/n, (j+1)/n)`` (``n`` output shards
of about ``rows_per_shard`` rows), sorted by (position, upstream shard, rank in its shard);
partitions are runs of consecutive output shards, as many as the copies' bytes need
(``PARTITION_BYTES`` each, from the upstream's row-group sizes; at least ``MIN_PARTITIONS``),
never more than ``n``. The
shuffle reads blocks x partitions row-group ranges and writes blocks + outputs files. (Version
3: the same output bytes as version 2, which scattered per shard and gathered per output.)

``RUN/STAGE/_mix_report.json`` lists, per source, the target and the realised tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from curation.io import location
from curation.io.artifacts import read_partition, write_partitioned
from curation.io.files import write_parquet
from curation.io.shards import block_name, blocks, split_kept_rejected
from curation.sampling.mixture import (
    BINS,
    Cut,
    Prefix,
    choose_bin,
    doc_keys,
    emission_positions,
    final_cut,
    first_fit,
    histogram,
    source_targets,
)
from curation.sampling.radix import GATHER_CAP, Search, narrow
from curation.stages.base import GlobalStage, registry
from curation.stages.context import ShardSink, StageContext

REPORT = "_mix_report.json"
MIX_VERSION = 3  # 2: per-document choice from (seed, source, id); 3: scatter per block, gather per partition
#: bytes (uncompressed, from row-group sizes) of the copies one gather task holds
PARTITION_BYTES = 256 << 20
#: at least this many partitions (when there are as many output shards): small inputs still
#: gather on every worker
MIN_PARTITIONS = 16


class MixError(ValueError):
    """Weights that do not match the data (a weighted source with no documents...)."""


def conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with exactly ``schema``'s columns (missing ones null), in its order and types."""
    cols = []
    for f in schema:
        if f.name in table.column_names:
            col = table.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(table.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def _copy_ids(ids: list[str], epochs: np.ndarray) -> list[str]:
    return [i if e == 0 else f"{i}#epoch{e}" for i, e in zip(ids, epochs.tolist())]


def _token_column(path: str, names: list[str]) -> str:
    if "source" not in names:
        raise MixError(f"mix: {path} has no 'source' column")
    for col in ("num_tokens", "input_ids"):
        if col in names:
            return col
    raise MixError(f"mix: {path} has neither num_tokens nor input_ids; put a tokenize stage before mix")


def read_choice_columns(path: str) -> tuple[pa.Table, int]:
    """The only columns a document's copies depend on: id, source and its tokens; and the
    shard's uncompressed bytes (all columns, from its row groups' sizes)."""
    pf = location.parquet_file(path)
    md = pf.metadata
    nbytes = sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
    return pf.read(columns=["id", "source", _token_column(path, pf.schema_arrow.names)], use_threads=False), nbytes


_CHOICE_SCHEMA = pa.schema([("source", pa.string()), ("id", pa.string()), ("u", pa.uint64()),
                            ("tokens", pa.int64())])


def block_docs(path: str, only: set[str] | None = None) -> dict[str, SourceDocs]:
    """A block's documents grouped by source (``only`` those), from the choice file its count
    task wrote: one read per block in every later phase, not one per shard (at 10x more,
    smaller shards the per-file cost would dominate), and no key recomputed."""
    t = location.parquet_file(path).read(use_threads=False)
    enc = t.column("source").combine_chunks().dictionary_encode()
    codes = enc.indices.to_numpy(zero_copy_only=False)
    ids = t.column("id").combine_chunks()
    u = t.column("u").to_numpy()
    tokens = t.column("tokens").to_numpy()
    out = {}
    for c, s in enumerate(enc.dictionary.to_pylist()):
        if only is not None and s not in only:
            continue
        rows = np.flatnonzero(codes == c)
        out[s] = SourceDocs(rows, [str(i) for i in ids.take(pa.array(rows)).to_pylist()], u[rows], tokens[rows])
    return out


@dataclass
class SourceDocs:
    """One source's documents in a shard: their rows, ids, keys ``u`` and token counts."""

    rows: np.ndarray
    ids: list[str]
    u: np.ndarray
    tokens: np.ndarray


def source_docs(table: pa.Table, path: str, seed: int, only: set[str] | None = None) -> dict[str, SourceDocs]:
    """A shard's documents grouped by source (``only`` those sources), each with its keys."""
    col = _token_column(path, table.column_names)
    t = table.column(col)
    tokens = (t.to_numpy(zero_copy_only=False) if col == "num_tokens"
              else pc.list_value_length(t).to_numpy(zero_copy_only=False))
    tokens = np.nan_to_num(tokens.astype(np.float64)).astype(np.int64)
    ids = [str(i) for i in table.column("id").to_pylist()]
    enc = pc.fill_null(table.column("source").cast(pa.string()), "-").combine_chunks().dictionary_encode()
    codes = enc.indices.to_numpy(zero_copy_only=False)
    out = {}
    for c, s in enumerate(enc.dictionary.to_pylist()):
        if only is not None and s not in only:
            continue
        rows = np.flatnonzero(codes == c)
        sid = [ids[r] for r in rows]
        out[s] = SourceDocs(rows, sid, doc_keys(seed, s, sid), tokens[rows])
    return out


_NONE = SourceDocs(np.zeros(0, np.int64), [], np.zeros(0, np.uint64), np.zeros(0, np.int64))


@dataclass(frozen=True)
class CountJob:
    paths: tuple[str, ...]  # a block of upstream shards
    seed: int
    out: str  # the block's choice file (source, id, u, tokens of every document)


def count_task(job: CountJob) -> dict:
    """Phase ``count``: per source, documents, tokens and the top-digit histogram of ``u``;
    and the block's documents and uncompressed bytes. Writes the block's choice file."""
    out: dict = {"sources": {}, "docs": 0, "bytes": 0}
    parts = []
    for p in job.paths:
        t, nbytes = read_choice_columns(p)
        out["bytes"] += nbytes
        for s, d in source_docs(t, p, job.seed).items():
            parts.append(pa.table([pa.array([s] * len(d.rows), pa.string()), pa.array(d.ids, pa.string()),
                                   pa.array(d.u, pa.uint64()), pa.array(d.tokens, pa.int64())], schema=_CHOICE_SCHEMA))
    choice = pa.concat_tables(parts) if parts else _CHOICE_SCHEMA.empty_table()
    write_parquet(choice, job.out, row_group_size=1 << 16)
    for s, d in block_docs(job.out).items():
        docs, toks = histogram(d.u, d.tokens, Prefix())
        _merge_source(out["sources"], s, {"docs": len(d.rows), "tokens": int(d.tokens.sum()), "hist": [docs, toks],
                                          "min_tokens": int(d.tokens.min()) if len(d.rows) else None})
        out["docs"] += len(d.rows)
    return out


@dataclass(frozen=True)
class RefineJob:
    choice: str  # a block's choice file
    prefixes: tuple[tuple[str, Prefix], ...]  # (source, prefix) of each source still refining


def refine_task(job: RefineJob) -> dict:
    """Phase ``refineN``: per refining source, the next digit's histogram inside its prefix."""
    groups = block_docs(job.choice, {s for s, _ in job.prefixes})
    return {s: list(histogram(groups.get(s, _NONE).u, groups.get(s, _NONE).tokens, prefix))
            for s, prefix in job.prefixes}


def cut_task(job: RefineJob) -> dict:
    """Phase ``cut``: (u, id, tokens) of every document inside each source's final prefix."""
    groups = block_docs(job.choice, {s for s, _ in job.prefixes})
    out: dict = {}
    for s, prefix in job.prefixes:
        d = groups.get(s, _NONE)
        out[s] = [[int(d.u[j]), d.ids[j], int(d.tokens[j])] for j in np.flatnonzero(prefix.matches(d.u)).tolist()]
    return out


FILL_PER_TASK = 256  # candidates a task sends per fill round, and the most the driver keeps per source


@dataclass(frozen=True)
class FillJob:
    choice: str  # a block's choice file
    #: (source, cut, lower bound (u, id) or None, largest tokens that can still fit)
    asks: tuple[tuple[str, Cut, tuple[int, str] | None, int], ...]


def fill_task(job: FillJob) -> dict:
    """Phase ``fillN``: per source, the first ``FILL_PER_TASK`` documents of the block after the
    cut (and after the bound) in (u, id) order that are small enough to fit the gap."""
    cands: dict[str, list] = {a[0]: [] for a in job.asks}
    groups = block_docs(job.choice, set(cands))
    for s, cut, bound, most in job.asks:
        d = groups.get(s, _NONE)
        m = np.flatnonzero(cut.after(d.u, d.ids, bound) & (d.tokens <= most))
        cands[s] += [(int(d.u[j]), d.ids[j], int(d.tokens[j])) for j in m.tolist()]
    out = {}
    for s, c in cands.items():
        c.sort()
        out[s] = {"candidates": [list(x) for x in c[:FILL_PER_TASK]], "more": len(c) > FILL_PER_TASK}
    return out


def _fold_fill(acc: dict | None, res: dict) -> dict:
    """Fill results folded as they arrive, whatever their order: per source the
    ``FILL_PER_TASK`` smallest candidates, and ``end``: the largest (u, id) up to which they are
    complete (the smallest last candidate of a task that had more, or of the truncated list)."""
    acc = acc if acc is not None else {}
    for s, r in res.items():
        a = acc.setdefault(s, {"candidates": [], "end": None})
        if r["more"]:
            last = tuple(r["candidates"][-1][:2])
            a["end"] = last if a["end"] is None else min(tuple(a["end"]), last)
        merged = sorted([tuple(c) for c in a["candidates"]] + [tuple(c) for c in r["candidates"]])
        if len(merged) > FILL_PER_TASK:
            last = merged[FILL_PER_TASK - 1][:2]
            a["end"] = last if a["end"] is None else min(tuple(a["end"]), last)
        a["candidates"] = merged[:FILL_PER_TASK]
    return acc


@dataclass(frozen=True)
class Choice:
    """What every task needs to know a source's copies: whole epochs and the partial cut."""

    full: int
    cut: Cut
    weighted: bool


@dataclass(frozen=True)
class Shuffle:
    """How copies go to output shards and partitions: ``n_out`` output shards by position,
    ``partitions`` runs of consecutive output shards."""

    n_out: int
    partitions: int

    def out_shard(self, pos: np.ndarray) -> np.ndarray:
        return np.minimum((pos * self.n_out).astype(np.int64), self.n_out - 1)

    def partition(self, out_shard: np.ndarray) -> np.ndarray:
        return out_shard * self.partitions // self.n_out

    def out_shards(self, p: int) -> range:
        """The output shards of partition ``p``."""
        return range(-(-p * self.n_out // self.partitions), -(-(p + 1) * self.n_out // self.partitions))

    def header(self) -> dict:
        return {"algorithm": "mix-scatter", "version": MIX_VERSION, "out_shards": self.n_out,
                "partitions": self.partitions}


_EXTRA = [pa.field("_pos", pa.float64()), pa.field("_shard", pa.int64()), pa.field("_seq", pa.int64())]


@dataclass(frozen=True)
class ScatterJob:
    outs: tuple[ShardSink, ...]  # one per shard of the block: its rejected rows
    first: int  # the block's first shard's number
    paths: tuple[str, ...]
    scatter_file: str
    seed: int
    choices: tuple[tuple[str, Choice], ...]
    shuffle: Shuffle
    schema: pa.Schema


def _shard_copies(table: pa.Table, path: str, shard: int, job: ScatterJob) -> tuple[pa.Table, np.ndarray]:
    """One upstream shard's copies (ranked columns added, in ``job.schema``'s columns) and the
    reasons of its unselected rows."""
    choices = dict(job.choices)
    reasons = np.full(table.num_rows, None, dtype=object)
    rows_l, epochs_l, pos_l = [], [], []
    for s, d in source_docs(table, path, job.seed).items():
        ch = choices.get(s, Choice(0, Cut(None), False))
        if not ch.weighted:
            reasons[d.rows] = "mix:not_in_weights"
            continue
        copies = ch.full + ch.cut.selected(d.u, d.ids).astype(np.int64)
        reasons[d.rows[copies == 0]] = "mix:subsampled"
        doc, epoch, pos = emission_positions(d.u, d.tokens, copies, job.seed)
        rows_l.append(d.rows[doc])
        epochs_l.append(epoch)
        pos_l.append(pos)
    rows = np.concatenate(rows_l) if rows_l else np.zeros(0, np.int64)
    epochs = np.concatenate(epochs_l) if epochs_l else np.zeros(0, np.int64)
    pos = np.concatenate(pos_l) if pos_l else np.zeros(0)
    order = np.lexsort((np.arange(len(rows)), pos))  # a copy's rank in its shard: by position
    copies = table.take(pa.array(rows[order], pa.int64()))
    copies = copies.set_column(copies.schema.get_field_index("id"), "id",
                               pa.array(_copy_ids(copies.column("id").to_pylist(), epochs[order]), pa.string()))
    copies = conform(copies, job.schema)
    for f, col in zip(_EXTRA, (pos[order], np.full(len(rows), shard, np.int64), np.arange(len(rows), dtype=np.int64))):
        copies = copies.append_column(f, pa.array(col, f.type))
    return copies, reasons


def scatter_task(job: ScatterJob) -> list[dict]:
    """Phase ``scatter``, one block: its shards' copies with their positions, in one file
    indexed by partition; each shard's unselected rows to rejected/. Returns the shards'
    manifest entries (input rows only: copies are counted by the output shards)."""
    parts, entries = [], []
    for k, (out, path) in enumerate(zip(job.outs, job.paths)):
        table = location.parquet_file(path).read(use_threads=False)  # no dataset set-up per (small) shard
        copies, reasons = _shard_copies(table, path, job.first + k, job)
        parts.append(copies)
        _, rejected = split_kept_rejected(table, pa.array(reasons.tolist(), pa.string()), out.stage)
        entry = out.write(None, rejected, table.num_rows)
        entry["rows"] = 0
        entries.append(entry)
        del table
    ranked = pa.schema(list(job.schema) + _EXTRA)
    # one chunk: a take over one chunk per shard costs per chunk (10x more, smaller shards)
    copies = pa.concat_tables(parts).combine_chunks() if parts else ranked.empty_table()
    del parts
    part = job.shuffle.partition(job.shuffle.out_shard(copies.column("_pos").to_numpy()))
    order = np.argsort(part, kind="stable")
    write_partitioned(copies.take(pa.array(order)), part[order], job.scatter_file, job.shuffle.header(),
                      max_rows=16384)
    return entries


@dataclass(frozen=True)
class GatherJob:
    outs: tuple[ShardSink, ...]  # the partition's output shards, in order
    p: int
    files: tuple[str, ...]
    schema: pa.Schema
    shuffle: Shuffle


def gather_task(job: GatherJob) -> list[dict]:
    """Phase ``gather``, one partition: its row groups of every scatter file, sorted by
    position, cut into its output shards. Returns their manifest entries."""
    ranked = pa.schema(list(job.schema) + _EXTRA)
    head = job.shuffle.header()
    parts = [conform(t, ranked) for t in (read_partition(f, job.p, head) for f in job.files) if t.num_rows]
    table = pa.concat_tables(parts).combine_chunks() if parts else ranked.empty_table()
    del parts
    table = table.take(pc.sort_indices(table, [("_pos", "ascending"), ("_shard", "ascending"), ("_seq", "ascending")]))
    j = job.shuffle.out_shard(table.column("_pos").to_numpy())
    table = table.drop_columns(["_pos", "_shard", "_seq"]).replace_schema_metadata(job.schema.metadata)
    first = job.shuffle.out_shards(job.p).start
    bounds = np.searchsorted(j, np.arange(first, first + len(job.outs) + 1))
    return [out.write(table.slice(lo, hi - lo), None, 0)
            for out, lo, hi in zip(job.outs, bounds[:-1].tolist(), bounds[1:].tolist())]


def _merge_source(acc: dict, s: str, r: dict) -> None:
    a = acc.setdefault(s, {"docs": 0, "tokens": 0, "hist": [[0] * BINS, [0] * BINS], "min_tokens": None})
    if r.get("min_tokens") is not None:
        a["min_tokens"] = r["min_tokens"] if a["min_tokens"] is None else min(a["min_tokens"], r["min_tokens"])
    a["docs"] += r["docs"]
    a["tokens"] += r["tokens"]
    a["hist"] = [[x + y for x, y in zip(a["hist"][k], r["hist"][k])] for k in range(2)]


def _merge(acc: dict | None, out: dict) -> dict:
    """Fold of count results: per source, docs and tokens summed, histograms added; the
    blocks' documents and bytes summed."""
    acc = acc or {"sources": {}, "docs": 0, "bytes": 0}
    for s, r in out["sources"].items():
        _merge_source(acc["sources"], s, r)
    acc["docs"] += out["docs"]
    acc["bytes"] += out["bytes"]
    return acc


def _merge_hists(acc: dict | None, out: dict) -> dict:
    acc = acc or {}
    for s, h in out.items():
        a = acc.setdefault(s, [[0] * BINS, [0] * BINS])
        acc[s] = [[x + y for x, y in zip(a[k], h[k])] for k in range(2)]
    return acc


def _extend(acc: dict | None, out: dict) -> dict:
    """Fold of cut results: per source, the candidates appended (in place: no copy per task)."""
    acc = acc if acc is not None else {}
    for s, v in out.items():
        acc.setdefault(s, []).extend(v)
    return acc


@registry.register("mix")
class Mix(GlobalStage):
    """Sample documents so each ``source`` gets its share of ``total_tokens``.

    ``weights`` ({source: w}, renormalised) or ``temperature`` T (natural token shares ^ 1/T,
    renormalised; T=1 or neither given: natural shares). Sources below target are repeated up
    to ``max_epochs`` (copies get ids ``...#epoch1``...), the shortfall going to the others in
    proportion to their weights; sources above target are subsampled (the rest rejected as
    ``mix:subsampled``; sources absent from ``weights`` as ``mix:not_in_weights``). Output
    shards of ``rows_per_shard`` rows interleave sources so any prefix has the target mix.
    """

    type: Literal["mix"] = "mix"
    weights: dict[str, float] | None = None
    total_tokens: float = Field(gt=0)
    max_epochs: float = Field(default=4.0, gt=0)
    temperature: float | None = Field(default=None, gt=0)
    seed: int = 0
    rows_per_shard: int = Field(default=50_000, gt=0)

    @model_validator(mode="after")
    def _check_weights(self) -> Mix:
        if self.weights is not None:
            if self.temperature is not None:
                raise ValueError("give weights or temperature, not both")
            if any(w < 0 for w in self.weights.values()) or not any(w > 0 for w in self.weights.values()):
                raise ValueError("weights must be >= 0 with at least one > 0")
        return self

    # -- planning ------------------------------------------------------------------------------

    def resolve_weights(self, available: dict[str, int]) -> dict[str, float]:
        """Normalised weight per source present in the data."""
        if self.weights is not None:
            missing = sorted(s for s, w in self.weights.items() if w > 0 and available.get(s, 0) == 0)
            if missing:
                raise MixError(f"mix: weights name {missing} but upstream has no tokens of them "
                               f"(sources: {sorted(available)})")
            raw = {s: float(self.weights.get(s, 0.0)) for s in available}
        else:
            total = sum(available.values())
            temp = self.temperature or 1.0
            raw = {s: (a / total) ** (1.0 / temp) if a else 0.0 for s, a in available.items()}
        z = sum(raw.values())
        return {s: w / z for s, w in raw.items()}

    def _cuts(self, ctx: StageContext, groups: list[str], counts: dict, rem: dict[str, int]) -> dict:
        """Per source with a partial epoch: its cut, and the documents and tokens it takes."""
        state = {s: Search(Prefix(), r, *(np.asarray(h, np.int64) for h in counts[s]["hist"]))
                 for s, r in rem.items() if r > 0}

        def refine(level: int, prefixes: dict) -> dict:
            job_prefixes = tuple(sorted(prefixes.items()))
            return ctx.phase(f"refine{level}", refine_task, [RefineJob(g, job_prefixes) for g in groups],
                             fold=_merge_hists)

        narrow(state, choose_bin, refine, GATHER_CAP)
        out = {}
        if state:
            prefixes = tuple((s, st.prefix) for s, st in sorted(state.items()))
            found: dict[str, list] = ctx.phase("cut", cut_task, [RefineJob(g, prefixes) for g in groups],
                                               fold=_extend)
            for s, st in state.items():
                cut, taken = final_cut([tuple(c) for c in found.get(s, [])], st.need)
                n_taken = sum(1 for c in found.get(s, []) if cut.u is None or (c[0], c[1]) < (cut.u, cut.id))
                out[s] = {"cut": cut, "docs": st.keys_passed + n_taken, "tokens": st.weight_passed + taken,
                          "gap": st.need - taken, "min_tokens": counts[s]["min_tokens"] or 0}
            del found
            self._fill(ctx, groups, out)
        return out

    def _fill(self, ctx: StageContext, groups: list[str], cuts: dict) -> None:
        """First-fit the gap each cut leaves with the documents after it, in (u, id) order, in
        rounds; the driver keeps at most ``FILL_PER_TASK`` candidates per source per round."""
        bound: dict[str, tuple[int, str] | None] = {s: None for s, c in cuts.items() if c["cut"].u is not None}
        extra: dict[str, list] = {s: [] for s in bound}
        for r in range(10_000):
            # a gap smaller than the source's smallest document cannot be filled: no pass for it
            asks = tuple((s, cuts[s]["cut"], bound[s], cuts[s]["gap"]) for s in sorted(bound)
                         if cuts[s]["gap"] > 0 and cuts[s]["gap"] >= cuts[s]["min_tokens"])
            if not asks:
                break
            got = ctx.phase(f"fill{r}", fill_task, [FillJob(g, asks) for g in groups], fold=_fold_fill)
            for s, _, _, _ in asks:
                g = (got or {}).get(s, {"candidates": [], "end": None})
                end = tuple(g["end"]) if g["end"] is not None else None
                taken, tok, gap, again = first_fit([tuple(c) for c in g["candidates"]], cuts[s]["gap"], end)
                extra[s] += taken
                cuts[s]["tokens"] += tok
                cuts[s]["docs"] += len(taken)
                cuts[s]["gap"] = gap
                if again:
                    bound[s] = end
                else:
                    del bound[s]
        for s, e in extra.items():
            c = cuts[s]["cut"]
            cuts[s]["cut"] = Cut(c.u, c.id, tuple(sorted(e)))

    # -- running -------------------------------------------------------------------------------

    def run(self, ctx: StageContext) -> None:
        keys = [k for k, _ in ctx.upstream]
        paths = [p for _, p in ctx.upstream]
        if not paths:
            raise MixError("mix: upstream has no shards")
        if ctx.finished(keys, REPORT):
            return
        # the work folder's layout (count/choice/scatter per block since version 3): an older
        # version's folder is refused, never resumed as if its jobs were this version's
        ctx.check_work_header({"algorithm": "mix", "version": MIX_VERSION})
        spans = blocks(location.sizes(paths))
        choice = [location.join(ctx.work_dir, "choice", f"{block_name(keys[lo:hi])}.parquet") for lo, hi in spans]
        total = ctx.phase("count", count_task, [CountJob(tuple(paths[lo:hi]), self.seed, choice[b])
                                                for b, (lo, hi) in enumerate(spans)], fold=_merge)
        counts = total["sources"]
        names = sorted(counts)
        available = {s: counts[s]["tokens"] for s in names}
        if not sum(available.values()):
            raise MixError(f"mix: upstream has no tokens ({len(paths)} shards, {total['docs']} documents)")
        weights = self.resolve_weights(available)
        targets = source_targets(available, weights, self.total_tokens, self.max_epochs)
        full = {s: int(targets[s] // available[s]) if weights[s] > 0 and available[s] else 0 for s in names}
        rem = {s: int(round(targets[s] - full[s] * available[s])) if weights[s] > 0 else 0 for s in names}
        rem = {s: min(r, available[s] - 1) if available[s] else 0 for s, r in rem.items()}
        cuts = self._cuts(ctx, choice, counts, rem)
        choices = {s: Choice(full[s], cuts[s]["cut"] if s in cuts else Cut(None), weights[s] > 0) for s in names}
        report = self._report(counts, weights, targets, full, cuts)
        n_out = max(1, math.ceil(report["rows"] / self.rows_per_shard))
        copy_bytes = report["rows"] * total["bytes"] / max(1, total["docs"])
        shuffle = Shuffle(n_out, min(n_out, max(MIN_PARTITIONS, math.ceil(copy_bytes / PARTITION_BYTES))))
        report["shards"], report["partitions"] = n_out, shuffle.partitions
        schema = _unified_schema(paths)
        scatter = tuple(location.join(ctx.work_dir, "scatter", f"{block_name(keys[lo:hi])}.parquet")
                        for lo, hi in spans)
        ctx.phase("scatter", scatter_task, [
            ScatterJob(tuple(ctx.output(k) for k in keys[lo:hi]), lo, tuple(paths[lo:hi]), scatter[b], self.seed,
                       tuple(sorted(choices.items())), shuffle, schema) for b, (lo, hi) in enumerate(spans)],
                  commit=True)
        ctx.phase("gather", gather_task, [
            GatherJob(tuple(ctx.output(f"{ctx.name}-{j:05d}") for j in shuffle.out_shards(p)), p, scatter, schema,
                      shuffle) for p in range(shuffle.partitions)], commit=True)
        ctx.write_report(REPORT, report)

    def _report(self, counts: dict, weights: dict, targets: dict, full: dict, cuts: dict) -> dict:
        sources = {}
        for s in sorted(counts):
            docs, tokens = counts[s]["docs"], counts[s]["tokens"]
            part = cuts.get(s, {"docs": 0, "tokens": 0})
            realised = full[s] * tokens + part["tokens"]
            used = docs if full[s] > 0 else part["docs"]
            sources[s] = {
                "weight": weights[s], "available_docs": docs, "available_tokens": tokens,
                "target_tokens": targets[s], "realised_tokens": int(realised),
                "copies": int(full[s] * docs + part["docs"]), "docs_used": int(used),
                "docs_rejected": int(docs - used), "epochs": realised / tokens if tokens else 0.0,
                "capped": bool(targets[s] < weights[s] * self.total_tokens - 1e-6)}
        realised_total = sum(r["realised_tokens"] for r in sources.values())
        target_total = sum(targets.values())
        for s, r in sources.items():
            r["target_share"] = targets[s] / target_total if target_total else 0.0
            r["realised_share"] = r["realised_tokens"] / realised_total if realised_total else 0.0
        return {"total_tokens_requested": self.total_tokens, "target_tokens": target_total,
                "realised_tokens": realised_total, "rows": int(sum(r["copies"] for r in sources.values())),
                "seed": self.seed, "max_epochs": self.max_epochs, "sources": sources}


def _unified_schema(paths: list[str]) -> pa.Schema:
    """One schema for every output shard: the union of the upstream shards' columns."""
    schemas = [location.read_schema(p) for p in paths]
    try:
        schema = pa.unify_schemas(schemas)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        schema = pa.unify_schemas(schemas, promote_options="permissive")
    meta = next((s.metadata for s in schemas if s.metadata), None)
    return schema.with_metadata(meta) if meta else schema.remove_metadata()
