"""``quality_top`` (global; also written ``type: quality`` with ``keep_top``): keeps exactly the
best ``keep_top`` fraction of the whole corpus by quality score, ties broken by (id, shard, row),
on any number of workers, from merged per-shard histograms (``curation.quality.topk``): no score
list is ever gathered on the driver. Rejected rows: ``quality:below_top_fraction``; documents
without text rank last (``quality:no_text``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, model_validator

from curation.io import location
from curation.io.files import write_parquet
from curation.io.shards import block_name, blocks, split_kept_rejected
from curation.quality.scoring import score_table, with_quality
from curation.quality.topk import BINS, Prefix, choose_bin, cut, score_keys
from curation.sampling.radix import GATHER_CAP, Search, narrow
from curation.stages.base import GlobalStage, registry
from curation.stages.context import GroupedOutputs, StageContext, block_outputs, output_keys
from curation.stages.quality_model import QualityModel

REPORT = "_quality_report.json"


# ---------------------------------------------------------------------------------------------
# jobs and tasks of quality_top (run in Ray workers): one per block of upstream shards
# (``curation.io.shards.blocks``), so tasks and score files grow with the data, not with the
# number of shards. A block's score file holds its shards' scores end to end (shard order, row
# order) and ``shard``, each row's shard number within the block.


def score_shard(path: str, model: str, positive_label: str | None, out: str) -> dict:
    """One upstream shard's scores (row order) to ``out``; loads-per-process facts."""
    from curation.quality.classifier import LOADS

    table = location.read_parquet(path, columns=["text"])
    scores, _ = score_table(table, model, positive_label)
    write_parquet(pa.table({"quality": pa.array(scores, pa.float32(), mask=np.isnan(scores))}), out)
    return {"pid": os.getpid(), "loads": int(LOADS[os.path.realpath(model)]), "rows": len(scores)}


def _shard_scores(path: str, model: str | None, positive_label: str | None) -> np.ndarray:
    """One upstream shard's scores (float32, NaN: no text / null), by the model or from its
    ``quality`` column."""
    if model is None:  # the upstream's precomputed column
        col = location.read_parquet(path, columns=["quality"]).column("quality").cast(pa.float32())
        return col.to_numpy(zero_copy_only=False).astype(np.float32)
    scores, _ = score_table(location.read_parquet(path, columns=["text"]), model, positive_label)
    return scores


def _block_scores(path: str) -> tuple[np.ndarray, np.ndarray]:
    """A block's score file: (scores float32, each row's shard number within the block)."""
    t = location.read_parquet(path)
    return (t.column("quality").to_numpy(zero_copy_only=False).astype(np.float32),
            t.column("shard").to_numpy(zero_copy_only=False))


@dataclass(frozen=True)
class ScoreJob:
    paths: tuple[str, ...]  # a block of upstream shards
    model: str | None
    positive_label: str | None
    out: str


def score_task(job: ScoreJob) -> dict:
    """Phase ``score``, one block: its shards' scores to one file in the work folder; the
    histogram of their top key byte."""
    from curation.quality.classifier import LOADS

    parts = [_shard_scores(p, job.model, job.positive_label) for p in job.paths]
    s = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    shard = np.repeat(np.arange(len(parts), dtype=np.int32), [len(x) for x in parts])
    write_parquet(pa.table({"quality": pa.array(s, pa.float32(), mask=np.isnan(s)), "shard": pa.array(shard)}),
                  job.out)
    loads = int(LOADS.get(os.path.realpath(job.model), 0)) if job.model is not None else 0
    valid = s[~np.isnan(s)]
    return {"pid": os.getpid(), "loads": loads, "rows": int(len(s)), "with_text": int(len(valid)),
            "histogram": Prefix().histogram(score_keys(valid)).tolist()}


def _extend(acc: list | None, part: list) -> list:
    """Fold of gather results: the candidates appended in place (no copy per task)."""
    acc = acc if acc is not None else []
    acc.extend(part)
    return acc


def _merge_scores(acc: dict | None, f: dict) -> dict:
    """Fold of score results: counts and histograms added, model loads per worker process."""
    acc["rows"] += f["rows"]
    acc["with_text"] += f["with_text"]
    acc["histogram"] = [a + b for a, b in zip(acc["histogram"], f["histogram"])]
    if f["loads"]:
        acc["loads"][str(f["pid"])] = max(acc["loads"].get(str(f["pid"]), 0), f["loads"])
    return acc


@dataclass(frozen=True)
class RefineJob:
    scores: str
    prefix: Prefix


def refine_task(job: RefineJob) -> list[int]:
    """Phase ``refineN``, one block: the histogram of the next key byte among its scores whose
    key starts with ``prefix``."""
    s, _ = _block_scores(job.scores)
    return job.prefix.histogram(score_keys(s[~np.isnan(s)])).tolist()


@dataclass(frozen=True)
class GatherJob:
    paths: tuple[str, ...]
    keys: tuple[str, ...]
    scores: str
    prefix: Prefix


def gather_task(job: GatherJob) -> list[list]:
    """Phase ``gather``, one block: (score, id, shard, row) of its documents in the final bin."""
    s, shard = _block_scores(job.scores)
    idx = np.flatnonzero(~np.isnan(s))
    idx = idx[job.prefix.matches(score_keys(s[idx]))]
    if not len(idx):
        return []
    start = np.searchsorted(shard, np.arange(len(job.paths)))  # each shard's first row in the block
    out = []
    for k in np.unique(shard[idx]).tolist():
        rows = idx[shard[idx] == k] - start[k]
        ids = location.read_parquet(job.paths[k], columns=["id"]).column("id").take(pa.array(rows)).to_pylist()
        out += [[float(s[start[k] + r]), str(i), job.keys[k], int(r)] for r, i in zip(rows.tolist(), ids)]
    return out


@dataclass(frozen=True)
class CutJob:
    outs: GroupedOutputs  # the block's outputs (small shards share one)
    paths: tuple[str, ...]
    keys: tuple[str, ...]  # the upstream shards' keys: the tie-break's (id, shard, row)
    scores: str
    threshold: float
    boundary: tuple[str, str, int] | None


def cut_task(job: CutJob) -> list[dict]:
    """Phase ``cut``, one block: for each shard, kept rows (score above the cut, or tied and not
    after the boundary document) and rejected rows, written to its output; their manifest
    entries."""
    block, shard = _block_scores(job.scores)
    start = np.searchsorted(shard, np.arange(len(job.paths) + 1))
    w, stage = job.outs.writer(), job.outs.stage
    for key, path, lo, hi in zip(job.keys, job.paths, start[:-1].tolist(), start[1:].tolist()):
        w.add(*_cut_shard(key, stage, path, block[lo:hi], job.threshold, job.boundary))
    return w.done()


def _cut_shard(key: str, stage: str, path: str, scores: np.ndarray, threshold: float,
               boundary: tuple[str, str, int] | None) -> tuple[pa.Table, pa.Table | None, int]:
    table = location.read_parquet(path)
    has = ~np.isnan(scores)
    keep = has & (scores > threshold)
    tied = np.flatnonzero(has & (scores == threshold))
    if len(tied) and boundary is not None:
        ids = table.column("id").take(pa.array(tied)).to_pylist()
        for j, doc_id in zip(tied.tolist(), ids):
            keep[j] = (str(doc_id), key, j) <= boundary
    reasons = np.where(keep, None, np.where(has, "quality:below_top_fraction", "quality:no_text"))
    table = with_quality(table, scores)
    kept, rejected = split_kept_rejected(table, pa.array(reasons.tolist(), pa.string()), stage)
    return kept, rejected, table.num_rows


@registry.register("quality_top")
class QualityTop(QualityModel, GlobalStage):
    """Keep exactly the best ``keep_top`` (0..1] fraction of the whole corpus by quality score
    (``round(keep_top * documents)``, ties at the cut broken by id), on any number of workers.
    Documents without text score null, rank last and are rejected as ``quality:no_text``.

    Without ``model``, the upstream's ``quality`` column is the score (e.g. from a ``quality``
    stage, or computed elsewhere).

    Phases, each one task per block of upstream shards (``curation.io.shards.blocks``):
    ``score`` (the block's scores to one file in the work folder, a histogram of their top key
    byte), ``refineN`` (only while the chosen bin is large: the next byte's histogram),
    ``gather`` (the few documents in the final bin), ``cut`` (write each shard's kept and
    rejected rows; a block's small shards into one output, ``curation.io.shards.output_groups``).
    See ``curation.quality.topk``.
    """

    type: Literal["quality_top", "quality"] = "quality_top"
    columns: ClassVar[tuple[str, ...]] = ('quality',)
    keep_top: float = Field(gt=0.0, le=1.0)
    min_score: float | None = Field(default=None, exclude=True)  # accepted so "not both" is said clearly

    @model_validator(mode="after")
    def _one_rule(self) -> QualityTop:
        if self.min_score is not None:
            raise ValueError("give min_score or keep_top, not both")
        return self

    def run(self, ctx: StageContext) -> None:
        from curation.quality.classifier import load_scorer

        if self.model is not None:  # a bad model fails here, before any task
            load_scorer(self.model, "quality.model", self.positive_label)
        else:
            missing = [p for _, p in ctx.upstream if "quality" not in location.read_schema(p).names]
            if missing:
                raise ValueError(f"{ctx.name}: no model and no 'quality' column in {missing[0]}; give quality_top a "
                                 "model or put a quality stage upstream")
        keys = [k for k, _ in ctx.upstream]
        paths = [p for _, p in ctx.upstream]
        sizes = location.sizes(paths)
        spans = blocks(sizes)
        outputs = block_outputs(ctx, keys, sizes, spans)
        if ctx.finished(output_keys(outputs), REPORT):
            return
        scores = [location.join(ctx.work_dir, "scores", f"{block_name(keys[lo:hi])}.parquet") for lo, hi in spans]
        facts = ctx.phase("score", score_task, [ScoreJob(tuple(paths[lo:hi]), self.model, self.positive_label,
                                                         scores[b]) for b, (lo, hi) in enumerate(spans)],
                          fold=_merge_scores, init={"rows": 0, "with_text": 0, "histogram": [0] * BINS, "loads": {}})
        n, with_text = facts["rows"], facts["with_text"]
        k = min(int(round(self.keep_top * n)), with_text)
        threshold, boundary = float("inf"), None
        if k > 0:
            def refine(level: int, prefixes: dict) -> dict:
                hist = ctx.phase(f"refine{level}", refine_task, [RefineJob(f, prefixes["top"]) for f in scores],
                                 fold=lambda acc, h: np.asarray(h, np.int64) + (0 if acc is None else acc))
                return {"top": (hist, hist)}

            hist = np.asarray(facts["histogram"], np.int64)
            search = Search(Prefix(), k, hist, hist)
            narrow({"top": search}, choose_bin, refine, GATHER_CAP)
            found = ctx.phase("gather", gather_task, [GatherJob(tuple(paths[lo:hi]), tuple(keys[lo:hi]), scores[b],
                                                                search.prefix) for b, (lo, hi) in enumerate(spans)],
                              fold=_extend)
            threshold, bnd = cut([tuple(c) for c in found], search.need)
            boundary = tuple(bnd)
            del found
        ctx.phase("cut", cut_task, [CutJob(outputs[b], tuple(paths[lo:hi]), tuple(keys[lo:hi]), scores[b], threshold,
                                           boundary) for b, (lo, hi) in enumerate(spans)], commit=True)
        loads = facts["loads"]
        ctx.write_report(REPORT, {"documents": n, "with_text": with_text, "keep_top": self.keep_top, "kept": k,
                                  "kept_share": (k / n) if n else 0.0, "threshold": threshold if k > 0 else None,
                                  "boundary": list(boundary) if boundary else None,
                                  "model_loads_per_worker_process": loads})
