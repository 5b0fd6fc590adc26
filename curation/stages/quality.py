"""Model-based quality: adds ``quality`` = P(high quality) from a fastText classifier trained
with ``refinery quality train`` (see ``curation/quality/``), and keeps documents by it.

- ``min_score: 0.5`` keeps documents scoring at least 0.5: a row-local map stage.
- ``keep_top: 0.3`` keeps the best 30% of the whole corpus: a corpus-level quantile, so a
  global stage in two phases. Phase 1 (one Ray task per upstream shard) scores every document
  and writes the scores to the stage's work directory. The driver then finds the exact cut:
  the k-th best score (k = round(keep_top * documents)), and, among documents tied with it,
  the first by (id, shard, row) — so exactly k documents are kept, on any number of workers.
  Phase 2 (one task per shard) writes kept rows and rejected rows (``quality:below_top_fraction``).
- neither: only measure (every document kept, ``quality`` added).

Documents without text (empty, whitespace) get a null ``quality`` and ``quality:no_text``; with
``keep_top`` they rank last. The model is loaded once per worker process (a per-process cache
keyed by path, mtime and size); a missing or corrupt model file stops the run before any work
with ``quality.model: cannot load 'PATH': why``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field, PrivateAttr, field_validator, model_validator

from curation.io.files import write_parquet
from curation.io.shards import split_kept_rejected
if TYPE_CHECKING:  # pragma: no cover
    from curation.pipeline.context import GlobalContext
    from curation.pipeline.rundir import RunDir

from curation.stages.base import GlobalStage, StageResult, registry

REPORT = "_quality_report.json"


def _has_text(texts: pa.Array) -> np.ndarray:
    if len(texts) == 0:
        return np.zeros(0, bool)
    m = pc.match_substring_regex(texts, r"\S")  # RE2 stops at the first non-space character
    return m.fill_null(False).to_numpy(zero_copy_only=False)


def score_table(table: pa.Table, model: str, positive_label: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32, has_text bool) for a table's ``text`` column; no-text rows score NaN."""
    from curation.quality.classifier import load_scorer

    if "text" not in table.column_names:
        raise ValueError(f"quality: input has no 'text' column (columns: {table.column_names})")
    texts = table.column("text").combine_chunks() if table.num_rows else pa.array([], pa.string())
    has = _has_text(texts)
    scores = np.full(len(texts), np.nan, np.float32)
    if has.any():
        scorer = load_scorer(model, "quality.model", positive_label)
        scores[has] = scorer.score(texts.filter(pa.array(has)))
    return scores, has


def _with_quality(table: pa.Table, scores: np.ndarray) -> pa.Table:
    table = table.drop_columns(["quality"]) if "quality" in table.column_names else table
    return table.append_column("quality", pa.array(scores, pa.float32(), mask=np.isnan(scores)))


# ---------------------------------------------------------------------------------------------
# Ray tasks of the keep_top phases


def score_shard(path: str, model: str, positive_label: str | None, out: str) -> dict:
    """Phase 1, one upstream shard: its scores (row order) to ``out``; loads-per-process facts."""
    from curation.quality.classifier import LOADS

    table = pq.read_table(path, columns=["text"])
    scores, _ = score_table(table, model, positive_label)
    write_parquet(pa.table({"quality": pa.array(scores, pa.float32(), mask=np.isnan(scores))}), out)
    return {"pid": os.getpid(), "loads": int(LOADS[os.path.realpath(model)]), "rows": len(scores)}


def cut_shard(run_dir: RunDir, stage: str, params_hash: str, key: str, path: str, scores_path: str,
              threshold: float, boundary: tuple[str, str, int] | None) -> dict:
    """Phase 2, one upstream shard: kept rows (score above the cut, or tied and not after the
    boundary document) and rejected rows, written and returned as a manifest entry."""
    table = pq.read_table(path)
    scores = pq.read_table(scores_path).column("quality").to_numpy(zero_copy_only=False).astype(np.float32)
    has = ~np.isnan(scores)
    keep = has & (scores > threshold)
    tied = np.flatnonzero(has & (scores == threshold))
    if len(tied) and boundary is not None:
        ids = table.column("id").take(pa.array(tied)).to_pylist()
        for j, doc_id in zip(tied.tolist(), ids):
            keep[j] = (str(doc_id), key, j) <= boundary
    reasons = np.where(keep, None, np.where(has, "quality:below_top_fraction", "quality:no_text"))
    out = _with_quality(table, scores)
    kept, rejected = split_kept_rejected(out, pa.array(reasons.tolist(), pa.string()), stage)
    return run_dir.write_stage_shard(stage, key, kept, rejected, table.num_rows, params_hash)


@registry.register("quality")
class QualityScore(GlobalStage):
    """Score documents with a fastText quality classifier; keep by ``min_score`` or ``keep_top``.

    ``model``: the ``.bin`` written by ``refinery quality train`` (its card beside it names
    the positive label). ``min_score`` (0..1): a row-local threshold. ``keep_top`` (0..1]:
    the exact top fraction of the corpus (a global stage). Give at most one of them.
    """

    type: Literal["quality"] = "quality"
    model: str
    min_score: float | None = Field(default=None, ge=0.0, le=1.0)
    keep_top: float | None = Field(default=None, gt=0.0, le=1.0)
    positive_label: str | None = None

    _scorer_ready: bool = PrivateAttr(default=False)

    @property
    def kind(self) -> str:  # type: ignore[override]
        # A corpus quantile needs every score first; a threshold is row-local and fuses.
        return "global" if self.keep_top is not None else "map"

    @field_validator("model")
    @classmethod
    def _model_loadable(cls, v: str) -> str:
        from curation.quality.classifier import checked_model_path

        return checked_model_path(v)

    @model_validator(mode="after")
    def _one_rule(self) -> QualityScore:
        if self.min_score is not None and self.keep_top is not None:
            raise ValueError("give min_score or keep_top, not both")
        return self

    def params(self) -> dict[str, Any]:
        from curation.io.files import cached_file_sha256

        p = super().params()
        p["model"] = {"sha256": cached_file_sha256(self.model)}  # retraining changes the hash, moving does not
        return p

    def setup(self) -> None:
        from curation.quality.classifier import load_scorer

        load_scorer(self.model, "quality.model", self.positive_label)  # fails early, caches
        self._scorer_ready = True

    # -- map mode ------------------------------------------------------------------------------

    def process(self, batch: pa.Table) -> StageResult:
        if not self._scorer_ready:
            self.setup()
        scores, has = score_table(batch, self.model, self.positive_label)
        table = _with_quality(batch, scores)
        if self.min_score is None and has.all():
            return StageResult(table, None)
        low = has & (scores < (self.min_score if self.min_score is not None else -1.0))
        reasons = np.where(~has, "quality:no_text", np.where(low, "quality:low_score", None))
        return StageResult(table, pa.array(reasons.tolist(), pa.string()))

    # -- keep_top mode -------------------------------------------------------------------------

    def run(self, ctx: GlobalContext) -> None:

        self.setup()  # a bad model fails on the driver, before any task starts
        keys = [k for k, _ in ctx.upstream]
        paths = dict(ctx.upstream)
        score_dir = ctx.work_dir / "scores"
        todo = [(paths[k], self.model, self.positive_label, str(score_dir / f"{k}.parquet"))
                for k in keys if not (score_dir / f"{k}.parquet").exists()]
        facts = ctx.map(score_shard, todo, phase=f"{ctx.name}:score") if todo else []
        all_scores = [pq.read_table(score_dir / f"{k}.parquet").column("quality").to_numpy(zero_copy_only=False)
                      for k in keys]
        flat = np.concatenate(all_scores).astype(np.float32) if all_scores else np.zeros(0, np.float32)
        n = len(flat)
        valid = flat[~np.isnan(flat)]
        k = min(int(round(self.keep_top * n)), len(valid))
        threshold, boundary = float("inf"), None
        if k > 0:
            threshold = float(np.partition(valid, len(valid) - k)[len(valid) - k])  # k-th largest
            need = k - int((valid > threshold).sum())
            tied: list[tuple[str, str, int]] = []
            for key, s in zip(keys, all_scores):
                rows = np.flatnonzero(s.astype(np.float32) == np.float32(threshold))
                if len(rows):
                    ids = pq.read_table(paths[key], columns=["id"]).column("id").take(pa.array(rows)).to_pylist()
                    tied += [(str(i), key, int(r)) for i, r in zip(ids, rows.tolist())]
            tied.sort()
            boundary = tied[need - 1]
        done = ctx.done_keys()
        items = [(ctx.rundir, ctx.name, ctx.params_hash, key, paths[key], str(score_dir / f"{key}.parquet"),
                  threshold, boundary) for key in keys if key not in done]
        ctx.map_and_commit(cut_shard, items, f"{ctx.name}:cut")
        loads: dict[str, int] = {}
        for f in facts:
            loads[str(f["pid"])] = max(loads.get(str(f["pid"]), 0), f["loads"])
        report = {"documents": n, "with_text": int(len(valid)),
                  "keep_top": self.keep_top, "kept": k, "kept_share": (k / n) if n else 0.0,
                  "threshold": threshold if k > 0 else None,
                  "boundary": list(boundary) if boundary else None,
                  "model_loads_per_worker_process": loads}
        ctx.write_report(REPORT, report)
