"""Mix sources to target token shares: subsample large ones, upsample small ones (whole epochs
plus a partial one, at most ``max_epochs``), interleave so every prefix is near the mix.

Nothing per document is planned on the driver (``curation.sampling.mixture``). Phases, all
deterministic under ``seed`` and independent of the worker count:

1. count (one task per upstream shard): documents and tokens per source, and a histogram of the
   documents' keys ``u = hash(seed, source, id)`` by their top digit, merged as they arrive.
2. refineN (only while a source's cut bin is large): the next digit's histogram in that bin.
3. cut (one task per shard): the few documents of each source's final bin; the driver then
   fixes each source's partial-epoch cut ``(u, id)``: a document's copies are a function of
   (seed, source, id, cut) alone.
4. scatter (one task per upstream shard): write each copy (ids ``...#epochN`` after the first)
   with its position into one file per shard, indexed by output shard; unselected rows to
   ``rejected/STAGE/<shard>.parquet`` (``mix:subsampled``, ``mix:not_in_weights``).
5. gather (one task per output shard): its row groups of every scatter file, sorted by position,
   written as ``STAGE/<STAGE>-00000.parquet``... Files written: upstream + output shards.

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
from curation.io.files import safe_names
from curation.io.shards import split_kept_rejected
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
MIX_VERSION = 2  # 2: per-document choice from (seed, source, id); positions per shard


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


def read_choice_columns(path: str) -> pa.Table:
    """The only columns a document's copies depend on: id, source and its tokens."""
    names = location.read_schema(path).names
    return location.read_parquet(path, columns=["id", "source", _token_column(path, names)])


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
    path: str
    seed: int


def count_task(job: CountJob) -> dict:
    """Phase ``count``: per source, documents, tokens and the top-digit histogram of ``u``."""
    out = {}
    for s, d in source_docs(read_choice_columns(job.path), job.path, job.seed).items():
        docs, toks = histogram(d.u, d.tokens, Prefix())
        out[s] = {"docs": len(d.rows), "tokens": int(d.tokens.sum()), "hist": [docs, toks]}
    return out


@dataclass(frozen=True)
class RefineJob:
    path: str
    seed: int
    prefixes: tuple[tuple[str, Prefix], ...]  # (source, prefix) of each source still refining


def refine_task(job: RefineJob) -> dict:
    """Phase ``refineN``: per refining source, the next digit's histogram inside its prefix."""
    groups = source_docs(read_choice_columns(job.path), job.path, job.seed, {s for s, _ in job.prefixes})
    out = {}
    for s, prefix in job.prefixes:
        d = groups.get(s, _NONE)
        out[s] = list(histogram(d.u, d.tokens, prefix))
    return out


def cut_task(job: RefineJob) -> dict:
    """Phase ``cut``: (u, id, tokens) of every document inside each source's final prefix."""
    groups = source_docs(read_choice_columns(job.path), job.path, job.seed, {s for s, _ in job.prefixes})
    out = {}
    for s, prefix in job.prefixes:
        d = groups.get(s, _NONE)
        out[s] = [[int(d.u[j]), d.ids[j], int(d.tokens[j])] for j in np.flatnonzero(prefix.matches(d.u)).tolist()]
    return out


FILL_PER_SHARD = 1000  # candidates a shard sends per fill round


@dataclass(frozen=True)
class FillJob:
    path: str
    seed: int
    #: (source, cut, lower bound (u, id) or None, largest tokens that can still fit)
    asks: tuple[tuple[str, Cut, tuple[int, str] | None, int], ...]


def fill_task(job: FillJob) -> dict:
    """Phase ``fillN``: per source, the first ``FILL_PER_SHARD`` documents after the cut (and
    after the bound) in (u, id) order that are small enough to fit the gap."""
    groups = source_docs(read_choice_columns(job.path), job.path, job.seed, {a[0] for a in job.asks})
    out = {}
    for s, cut, bound, most in job.asks:
        d = groups.get(s, _NONE)
        m = np.flatnonzero(cut.after(d.u, d.ids, bound) & (d.tokens <= most))
        cands = sorted((int(d.u[j]), d.ids[j], int(d.tokens[j])) for j in m.tolist())
        out[s] = {"candidates": [list(c) for c in cands[:FILL_PER_SHARD]], "more": len(cands) > FILL_PER_SHARD}
    return out


@dataclass(frozen=True)
class Choice:
    """What every task needs to know a source's copies: whole epochs and the partial cut."""

    full: int
    cut: Cut
    weighted: bool


@dataclass(frozen=True)
class ScatterJob:
    out: ShardSink
    shard: int
    path: str
    scatter_file: str
    seed: int
    choices: tuple[tuple[str, Choice], ...]
    out_shards: int


def scatter_task(job: ScatterJob) -> dict:
    """Phase ``scatter``, one upstream shard: its copies with their positions, in one file
    indexed by output shard; its unselected rows to rejected/. Returns its manifest entry."""
    table = location.read_parquet(job.path)
    choices = dict(job.choices)
    reasons = np.full(table.num_rows, None, dtype=object)
    rows_l, epochs_l, pos_l = [], [], []
    for s, d in source_docs(table, job.path, job.seed).items():
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
    part = np.minimum((pos * job.out_shards).astype(np.int64), job.out_shards - 1)
    order = np.lexsort((np.arange(len(rows)), pos, part))
    copies = table.take(pa.array(rows[order], pa.int64()))
    copies = copies.set_column(copies.schema.get_field_index("id"), "id",
                               pa.array(_copy_ids(copies.column("id").to_pylist(), epochs[order]), pa.string()))
    copies = copies.append_column("_pos", pa.array(pos[order], pa.float64()))
    copies = copies.append_column("_shard", pa.array(np.full(len(rows), job.shard, np.int64)))
    copies = copies.append_column("_seq", pa.array(np.arange(len(rows), dtype=np.int64)))
    write_partitioned(copies, part[order], job.scatter_file, {"algorithm": "mix-scatter", "version": MIX_VERSION},
                      max_rows=16384)
    _, rejected = split_kept_rejected(table, pa.array(reasons.tolist(), pa.string()), job.out.stage)
    entry = job.out.write(None, rejected, table.num_rows)
    entry["rows"] = 0  # this entry only accounts for input rows; copies are counted by output shards
    return entry


@dataclass(frozen=True)
class GatherJob:
    out: ShardSink
    j: int
    files: tuple[str, ...]
    schema: pa.Schema


def gather_task(job: GatherJob) -> dict:
    """Phase ``gather``, one output shard: its row groups of every scatter file, by position."""
    extra = [pa.field("_pos", pa.float64()), pa.field("_shard", pa.int64()), pa.field("_seq", pa.int64())]
    ranked = pa.schema(list(job.schema) + extra)
    head = {"algorithm": "mix-scatter", "version": MIX_VERSION}
    parts = [conform(read_partition(f, job.j, head), ranked) for f in job.files]
    table = pa.concat_tables(parts).combine_chunks() if parts else ranked.empty_table()
    table = table.take(pc.sort_indices(table, [("_pos", "ascending"), ("_shard", "ascending"), ("_seq", "ascending")]))
    table = table.drop_columns(["_pos", "_shard", "_seq"]).replace_schema_metadata(job.schema.metadata)
    return job.out.write(table, None, 0)


def _merge(acc: dict | None, out: dict) -> dict:
    """Fold of count results: per source, docs and tokens summed, histograms added."""
    acc = acc or {}
    for s, r in out.items():
        a = acc.setdefault(s, {"docs": 0, "tokens": 0, "hist": [[0] * BINS, [0] * BINS]})
        a["docs"] += r["docs"]
        a["tokens"] += r["tokens"]
        a["hist"] = [[x + y for x, y in zip(a["hist"][k], r["hist"][k])] for k in range(2)]
    return acc


def _merge_hists(acc: dict | None, out: dict) -> dict:
    acc = acc or {}
    for s, h in out.items():
        a = acc.setdefault(s, [[0] * BINS, [0] * BINS])
        acc[s] = [[x + y for x, y in zip(a[k], h[k])] for k in range(2)]
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

    def _cuts(self, ctx: StageContext, paths: list[str], counts: dict, rem: dict[str, int]) -> dict:
        """Per source with a partial epoch: its cut, and the documents and tokens it takes."""
        state = {s: Search(Prefix(), r, *(np.asarray(h, np.int64) for h in counts[s]["hist"]))
                 for s, r in rem.items() if r > 0}

        def refine(level: int, prefixes: dict) -> dict:
            job_prefixes = tuple(sorted(prefixes.items()))
            return ctx.phase(f"refine{level}", refine_task, [RefineJob(p, self.seed, job_prefixes) for p in paths],
                             fold=_merge_hists)

        narrow(state, choose_bin, refine, GATHER_CAP)
        out = {}
        if state:
            prefixes = tuple((s, st.prefix) for s, st in sorted(state.items()))
            found: dict[str, list] = ctx.phase("cut", cut_task, [RefineJob(p, self.seed, prefixes) for p in paths],
                                               fold=lambda acc, r: {s: (acc or {}).get(s, []) + v for s, v in r.items()})
            for s, st in state.items():
                cut, taken = final_cut([tuple(c) for c in found.get(s, [])], st.need)
                n_taken = sum(1 for c in found.get(s, []) if cut.u is None or (c[0], c[1]) < (cut.u, cut.id))
                out[s] = {"cut": cut, "docs": st.keys_passed + n_taken, "tokens": st.weight_passed + taken,
                          "gap": st.need - taken}
            self._fill(ctx, paths, out)
        return out

    def _fill(self, ctx: StageContext, paths: list[str], cuts: dict) -> None:
        """First-fit the gap each cut leaves with the documents after it, in (u, id) order, in
        rounds of at most ``FILL_PER_SHARD`` candidates per shard."""
        bound: dict[str, tuple[int, str] | None] = {s: None for s, c in cuts.items() if c["cut"].u is not None}
        extra: dict[str, list] = {s: [] for s in bound}
        for r in range(10_000):
            asks = tuple((s, cuts[s]["cut"], bound[s], cuts[s]["gap"]) for s in sorted(bound) if cuts[s]["gap"] > 0)
            if not asks:
                break
            got = ctx.phase(f"fill{r}", fill_task, [FillJob(p, self.seed, asks) for p in paths],
                            fold=lambda acc, res: [*(acc or []), res])
            for s, _, _, _ in asks:
                parts = [g[s] for g in got if s in g]
                # a shard that sent a full list may hold more before the others' later candidates
                end = min((tuple(p["candidates"][-1][:2]) for p in parts if p["more"]), default=None)
                cands = [tuple(c) for p in parts for c in p["candidates"]]
                taken, tok, gap, again = first_fit(cands, cuts[s]["gap"], end)
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
        counts = ctx.phase("count", count_task, [CountJob(p, self.seed) for p in paths], fold=_merge)
        names = sorted(counts)
        available = {s: counts[s]["tokens"] for s in names}
        if not sum(available.values()):
            raise MixError(f"mix: upstream has no tokens ({len(paths)} shards, "
                           f"{sum(c['docs'] for c in counts.values())} documents)")
        weights = self.resolve_weights(available)
        targets = source_targets(available, weights, self.total_tokens, self.max_epochs)
        full = {s: int(targets[s] // available[s]) if weights[s] > 0 and available[s] else 0 for s in names}
        rem = {s: int(round(targets[s] - full[s] * available[s])) if weights[s] > 0 else 0 for s in names}
        rem = {s: min(r, available[s] - 1) if available[s] else 0 for s, r in rem.items()}
        cuts = self._cuts(ctx, paths, counts, rem)
        choices = {s: Choice(full[s], cuts[s]["cut"] if s in cuts else Cut(None), weights[s] > 0) for s in names}
        report = self._report(counts, weights, targets, full, cuts)
        n_out = max(1, math.ceil(report["rows"] / self.rows_per_shard))
        report["shards"] = n_out
        out_keys = [f"{ctx.name}-{j:05d}" for j in range(n_out)]
        scatter = tuple(location.join(ctx.work_dir, "scatter", f"{n}.parquet") for n in safe_names(keys))
        ctx.phase("scatter", scatter_task, [
            ScatterJob(ctx.output(keys[i]), i, paths[i], scatter[i], self.seed,
                       tuple(sorted(choices.items())), n_out) for i in range(len(paths))], commit=True)
        schema = _unified_schema(paths)
        ctx.phase("gather", gather_task, [GatherJob(ctx.output(out_keys[j]), j, scatter,
                                                    schema) for j in range(n_out)], commit=True)
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
