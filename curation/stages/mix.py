"""Mix sources to target token shares: subsample large ones, upsample small ones (whole epochs
plus a seeded partial epoch, at most ``max_epochs``), interleave so every prefix has the mix.

Phases (all deterministic under ``seed``, independent of the worker count):

1. plan (driver): read only ``source`` and ``num_tokens`` of every upstream shard; choose, per
   source, which documents are copied how many times; give every copy a rank in the output.
2. scatter (one Ray task per upstream shard): read the shard's full rows once, write each copy
   into a fragment of the output shard its rank falls in, and the unselected rows to
   ``rejected/STAGE/<shard>.parquet`` (reason ``mix:subsampled``).
3. gather (one Ray task per output shard): concatenate its fragments, sort by rank, write
   ``STAGE/<STAGE>-00000.parquet`` ... and commit.

``RUN/STAGE/_mix_report.json`` lists, per source, the target and the realised tokens.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from curation.io.files import write_parquet
from curation.io.shards import split_kept_rejected
if TYPE_CHECKING:  # pragma: no cover
    from curation.pipeline.context import GlobalContext
    from curation.pipeline.rundir import RunDir

from curation.stages.base import GlobalStage, registry

REPORT = "_mix_report.json"


class MixError(ValueError):
    """Weights that do not match the data (a weighted source with no documents...)."""


# ---------------------------------------------------------------------------------------------
# planning: pure functions over numpy arrays (unit-tested without Ray)


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


def _source_rng(seed: int, source: str) -> np.random.Generator:
    # per-source stream: adding a source to the mix does not reshuffle the others
    salt = int.from_bytes(hashlib.sha256(source.encode()).digest()[:8], "little")
    return np.random.default_rng(np.random.SeedSequence([seed & 0xFFFFFFFFFFFFFFFF, salt]))


def select_copies(tokens: np.ndarray, target: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Which documents (indices into ``tokens``) to emit, in emission order, and the epoch of
    each copy: whole epochs (each a fresh permutation) while the target allows, then a partial
    epoch: a random permutation taken while it fits, the remaining gap filled first-fit from
    the rest of that permutation (so the realised total lands within one small document of
    the target)."""
    n = len(tokens)
    avail = int(tokens.sum())
    if n == 0 or avail == 0 or target <= 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    full = int(target // avail)
    rem = target - full * avail
    idx_parts, ep_parts = [], []
    for e in range(full):
        idx_parts.append(rng.permutation(n))
        ep_parts.append(np.full(n, e, np.int64))
    if rem > 0:
        perm = rng.permutation(n)
        cum = np.cumsum(tokens[perm])
        k = int(np.searchsorted(cum, rem, side="right"))
        take = [perm[:k]]
        gap = rem - (int(cum[k - 1]) if k else 0)
        rest = perm[k:]
        smallest = int(tokens[rest].min()) if len(rest) else 0
        if len(rest) and gap >= smallest:
            extra = []
            for j, t in zip(rest.tolist(), tokens[rest].tolist()):
                if t <= gap:
                    extra.append(j)
                    gap -= t
                    if gap < smallest:
                        break
            take.append(np.asarray(extra, np.int64))
        part = np.concatenate(take).astype(np.int64)
        idx_parts.append(part)
        ep_parts.append(np.full(len(part), full, np.int64))
    return np.concatenate(idx_parts), np.concatenate(ep_parts)


def interleave(per_source: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Merge sources' copy sequences (token counts, in emission order) so that any prefix holds
    each source in proportion to its total: copy j of a source sits at position
    (tokens before it + half its own) / source total; ties by source then order.
    Returns (source index, position within source) of each output row, in output order."""
    pos, src, seq = [], [], []
    for s, toks in enumerate(per_source):
        if len(toks) == 0:
            continue
        t = toks.astype(np.float64)
        cum = np.cumsum(t)
        pos.append((cum - t / 2) / cum[-1])
        src.append(np.full(len(t), s, np.int64))
        seq.append(np.arange(len(t), dtype=np.int64))
    if not pos:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    pos_a, src_a, seq_a = np.concatenate(pos), np.concatenate(src), np.concatenate(seq)
    order = np.lexsort((seq_a, src_a, pos_a))
    return src_a[order], seq_a[order]


# ---------------------------------------------------------------------------------------------
# Ray tasks


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


def scatter_shard(run_dir: RunDir, stage: str, params_hash: str, key: str, path: str, frag_dir: str,
                  rows: np.ndarray, epochs: np.ndarray, ranks: np.ndarray, rows_per_shard: int,
                  rej_rows: np.ndarray, rej_reasons: list[str]) -> dict:
    """Phase 2, one upstream shard: write its copies into per-output-shard fragments and its
    unselected rows to rejected/. Returns the shard's manifest entry (counts, rejections)."""
    table = pq.read_table(path)
    frag = Path(frag_dir)
    if len(rows):
        copies = table.take(pa.array(rows))
        ids = _copy_ids(copies.column("id").to_pylist(), epochs)
        copies = copies.set_column(copies.schema.get_field_index("id"), "id", pa.array(ids, pa.string()))
        copies = copies.append_column("_rank", pa.array(ranks, pa.int64()))
        out = ranks // rows_per_shard
        bounds = np.flatnonzero(np.diff(out)) + 1  # ranks are sorted: fragments are runs
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(out)]):
            write_parquet(copies.slice(int(lo), int(hi - lo)), frag / f"{int(out[lo]):05d}" / f"{key}.parquet")
    reasons = [None] * table.num_rows
    for r, why in zip(rej_rows.tolist(), rej_reasons):
        reasons[r] = why
    _, rejected = split_kept_rejected(table, pa.array(reasons, pa.string()), stage)
    entry = run_dir.write_stage_shard(stage, key, None, rejected, table.num_rows, params_hash)
    entry["rows"] = 0  # this entry only accounts for input rows; copies are counted by output shards
    (frag / "_scattered").mkdir(parents=True, exist_ok=True)
    (frag / "_scattered" / key).touch()
    return entry


def gather_shard(run_dir: RunDir, stage: str, params_hash: str, key: str, frag_dir: str, schema: pa.Schema) -> dict:
    """Phase 3, one output shard: its fragments, in rank order, as one committed shard."""
    ranked = schema.append(pa.field("_rank", pa.int64()))
    parts = [conform(pq.read_table(f), ranked) for f in sorted(Path(frag_dir).glob("*.parquet"))]
    table = pa.concat_tables(parts).combine_chunks()
    table = table.take(pc.sort_indices(table.column("_rank"))).drop_columns(["_rank"])
    return run_dir.write_stage_shard(stage, key, table.replace_schema_metadata(schema.metadata), None, 0, params_hash)


# ---------------------------------------------------------------------------------------------
# the stage


def _plan_columns(path: str) -> tuple[pa.Array, np.ndarray]:
    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    if "source" not in names:
        raise MixError(f"mix: {path} has no 'source' column")
    if "num_tokens" in names:
        t = pf.read(columns=["source", "num_tokens"])
        tokens = t.column("num_tokens").to_numpy(zero_copy_only=False)
    elif "input_ids" in names:
        t = pf.read(columns=["source", "input_ids"])
        tokens = pc.list_value_length(t.column("input_ids")).to_numpy(zero_copy_only=False)
    else:
        raise MixError(f"mix: {path} has neither num_tokens nor input_ids; put a tokenize stage before mix")
    return t.column("source").combine_chunks().cast(pa.string()), np.nan_to_num(tokens.astype(np.float64)).astype(np.int64)


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

    def plan(self, shards: list[str]) -> dict[str, Any]:
        """Choose the copies. Returns per-shard (rows, epochs, ranks), rejections and a report."""
        srcs, toks, shard_of, row_of = [], [], [], []
        for i, path in enumerate(shards):
            s, t = _plan_columns(path)
            srcs.append(s)
            toks.append(t)
            shard_of.append(np.full(len(t), i, np.int64))
            row_of.append(np.arange(len(t), dtype=np.int64))
        if not toks:
            raise MixError("mix: upstream has no shards")
        source_arr = pa.chunked_array(srcs, pa.string()).fill_null("-").combine_chunks().dictionary_encode()
        names = source_arr.dictionary.to_pylist()
        code_raw = source_arr.indices.to_numpy(zero_copy_only=False)
        order = sorted(range(len(names)), key=lambda j: names[j])  # sources by name: stable codes
        remap = np.empty(len(names), np.int64)
        remap[order] = np.arange(len(names))
        names = [names[j] for j in order]
        code = remap[code_raw] if len(code_raw) else code_raw.astype(np.int64)
        tokens = np.concatenate(toks)
        shard_of, row_of = np.concatenate(shard_of), np.concatenate(row_of)

        members = [np.flatnonzero(code == c) for c in range(len(names))]
        available = {s: int(tokens[m].sum()) for s, m in zip(names, members)}
        if not sum(available.values()):
            raise MixError(f"mix: upstream has no tokens ({len(shards)} shards, {len(tokens)} documents)")
        weights = self.resolve_weights(available)
        targets = source_targets(available, weights, self.total_tokens, self.max_epochs)

        seqs_doc, seqs_ep, seqs_tok = [], [], []
        rejected: list[tuple[np.ndarray, str]] = []
        report_sources: dict[str, dict] = {}
        for c, s in enumerate(names):
            m = members[c]
            if weights[s] == 0:
                idx, ep = np.zeros(0, np.int64), np.zeros(0, np.int64)
            else:
                idx, ep = select_copies(tokens[m], targets[s], _source_rng(self.seed, s))
            docs = m[idx]
            seqs_doc.append(docs)
            seqs_ep.append(ep)
            seqs_tok.append(tokens[docs])
            unused = np.setdiff1d(m, docs, assume_unique=False)
            if len(unused):
                rejected.append((unused, "mix:subsampled" if weights[s] > 0 else "mix:not_in_weights"))
            report_sources[s] = {
                "weight": weights[s], "available_docs": int(len(m)), "available_tokens": available[s],
                "target_tokens": targets[s], "realised_tokens": int(tokens[docs].sum()),
                "copies": int(len(docs)), "docs_used": int(len(np.unique(docs))),
                "docs_rejected": int(len(unused)),
                "epochs": (int(tokens[docs].sum()) / available[s]) if available[s] else 0.0,
                "capped": bool(targets[s] < weights[s] * self.total_tokens - 1e-6),
            }
        out_src, out_seq = interleave(seqs_tok)
        # output row -> (upstream doc, epoch)
        g_doc = np.empty(len(out_src), np.int64)
        g_ep = np.empty(len(out_src), np.int64)
        for c in range(len(names)):
            sel = out_src == c
            g_doc[sel] = seqs_doc[c][out_seq[sel]]
            g_ep[sel] = seqs_ep[c][out_seq[sel]]
        rank = np.arange(len(g_doc), dtype=np.int64)

        per_shard = []
        g_shard = shard_of[g_doc]
        by_shard = np.argsort(g_shard, kind="stable")  # within a shard: rank order
        bounds = np.searchsorted(g_shard[by_shard], np.arange(len(shards) + 1))
        rej_idx = np.concatenate([r for r, _ in rejected]) if rejected else np.zeros(0, np.int64)
        rej_why = np.concatenate([np.full(len(r), w, object) for r, w in rejected]) if rejected else np.zeros(0, object)
        rej_order = np.argsort(rej_idx, kind="stable")
        rej_idx, rej_why = rej_idx[rej_order], rej_why[rej_order]
        rej_bounds = np.searchsorted(shard_of[rej_idx], np.arange(len(shards) + 1))
        for i in range(len(shards)):
            sel = by_shard[bounds[i]:bounds[i + 1]]
            ridx = rej_idx[rej_bounds[i]:rej_bounds[i + 1]]
            per_shard.append({
                "rows": row_of[g_doc[sel]], "epochs": g_ep[sel], "ranks": rank[sel],
                "rej_rows": row_of[ridx], "rej_reasons": list(rej_why[rej_bounds[i]:rej_bounds[i + 1]]),
            })
        realised_total = sum(r["realised_tokens"] for r in report_sources.values())
        target_total = sum(targets.values())
        for s, r in report_sources.items():
            r["target_share"] = targets[s] / target_total if target_total else 0.0
            r["realised_share"] = r["realised_tokens"] / realised_total if realised_total else 0.0
        report = {"total_tokens_requested": self.total_tokens, "target_tokens": target_total,
                  "realised_tokens": realised_total, "rows": int(len(g_doc)),
                  "shards": math.ceil(len(g_doc) / self.rows_per_shard), "seed": self.seed,
                  "max_epochs": self.max_epochs, "sources": report_sources}
        return {"per_shard": per_shard, "report": report}

    # -- running -------------------------------------------------------------------------------

    def run(self, ctx: GlobalContext) -> None:
        keys = [k for k, _ in ctx.upstream]
        paths = [p for _, p in ctx.upstream]
        ctx.report(f"{ctx.name}:plan", 0, 1)
        plan = self.plan(paths)
        ctx.report(f"{ctx.name}:plan", 1, 1)
        report = plan["report"]
        out_keys = [f"{ctx.name}-{k:05d}" for k in range(report["shards"])]
        done = ctx.done_keys()
        frag_dir = ctx.work_dir / "fragments"
        if not (set(keys) | set(out_keys)) <= done:
            schema = _unified_schema(paths)
            scattered = frag_dir / "_scattered"
            todo_out = [(j, k) for j, k in enumerate(out_keys) if k not in done]
            # fragments are needed for any output shard still to write
            todo_in = [i for i, k in enumerate(keys)
                       if k not in done or (todo_out and not (scattered / k).exists())]
            items = [(ctx.rundir, ctx.name, ctx.params_hash, keys[i], paths[i], str(frag_dir),
                      plan["per_shard"][i]["rows"], plan["per_shard"][i]["epochs"], plan["per_shard"][i]["ranks"],
                      self.rows_per_shard, plan["per_shard"][i]["rej_rows"], plan["per_shard"][i]["rej_reasons"])
                     for i in todo_in]
            ctx.map_and_commit(scatter_shard, items, f"{ctx.name}:scatter")
            items = [(ctx.rundir, ctx.name, ctx.params_hash, k, str(frag_dir / f"{j:05d}"), schema)
                     for j, k in todo_out]
            ctx.map_and_commit(gather_shard, items, f"{ctx.name}:gather")
        # fragments are a full copy of the data: drop them once every output shard is committed
        work = frag_dir.parent  # (ctx.work_dir would create it again)
        shutil.rmtree(work, ignore_errors=True)
        with contextlib.suppress(OSError):  # other parameters still have files there
            work.parent.rmdir()  # _work/
        ctx.write_report(REPORT, report)


def _unified_schema(paths: list[str]) -> pa.Schema:
    """One schema for every output shard: the union of the upstream shards' columns."""
    schemas = [pq.read_schema(p) for p in paths]
    try:
        schema = pa.unify_schemas(schemas)
    except (pa.ArrowInvalid, pa.ArrowTypeError):
        schema = pa.unify_schemas(schemas, promote_options="permissive")
    meta = next((s.metadata for s in schemas if s.metadata), None)
    return schema.with_metadata(meta) if meta else schema.remove_metadata()
