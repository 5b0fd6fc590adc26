"""The document browser: a run's stages with their counts, a stage's columns, rules and
rejection reasons, pages of its kept or rejected documents, and a signal's histogram with the
stage's thresholds."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import JSONResponse, Response

from curation.service import browse
from curation.service.models import DocumentsPage, SignalHistogram, StageDetail, StageSummary
from curation.service.state import ServiceState


def add_routes(r: APIRouter, state: ServiceState) -> None:
    browse_cache, sql_slots = state.browse_cache, state.sql_slots

    @r.get("/runs/{run_id}/stages", response_model=list[StageSummary], tags=["browse"])
    def list_stages(run_id: str):
        """Every node with shards of its own (inputs, stages; not unions), in DAG order, with
        its committed kept and rejected row counts (from the manifests)."""
        _, rd = state.started_run(run_id)
        return JSONResponse(browse.list_stages(rd))

    @r.get("/runs/{run_id}/stages/{stage}", response_model=StageDetail, tags=["browse"])
    def describe_stage(run_id: str, stage: str):
        """A stage's columns and signal columns, its rules with this run's thresholds, and its
        rejection reasons with counts."""
        d, rd = state.started_run(run_id)
        body = browse_cache.get(d, ("stage", stage), lambda: browse.describe_stage(rd, stage))
        return Response(body, media_type="application/json")

    @r.get("/runs/{run_id}/stages/{stage}/documents", response_model=DocumentsPage, tags=["browse"])
    def stage_documents(run_id: str, stage: str,
                        which: str = Query("kept", pattern="^(kept|rejected)$",
                                           description="kept (RUN/STAGE) or rejected (RUN/rejected/STAGE)"),
                        reason: str | None = Query(None, max_length=1000,
                                                   description="only rejected rows with exactly this reason"),
                        offset: int = Query(0, ge=0, le=1 << 40), limit: int = Query(20, ge=1, le=browse.MAX_LIMIT),
                        max_chars: int = Query(1000, ge=0, le=browse.MAX_TEXT_CHARS,
                                               description="cut each text to this many characters")):
        """A page of a stage's kept or rejected documents (shard order, then row order), each
        with its text and every signal column of its row. Only the row groups holding the
        page are read."""
        _, rd = state.started_run(run_id)
        return JSONResponse(browse.documents(rd, stage, which, reason or None, offset, limit, max_chars))

    @r.get("/runs/{run_id}/stages/{stage}/histogram", response_model=SignalHistogram, tags=["browse"])
    def stage_histogram(run_id: str, stage: str, column: str = Query(..., max_length=500),
                        bins: int = Query(30, ge=1, le=browse.MAX_BINS),
                        clip: float = Query(0.0, ge=0.0, lt=0.5, description="cut this fraction off each tail"),
                        lo: float | None = None, hi: float | None = None):
        """The distribution of one numeric column over the stage's kept and rejected rows (DuckDB,
        bounded bins), with the stage's thresholds for it from the DAG as run."""
        d, rd = state.started_run(run_id)

        def compute():
            if not sql_slots.acquire(timeout=2):
                raise HTTPException(429, "too many queries running; retry shortly")
            try:
                return browse.histogram(rd, stage, column, bins, clip, lo, hi, timeout_s=state.sql_timeout_s)
            finally:
                sql_slots.release()

        body = browse_cache.get(d, ("histogram", stage, column, bins, clip, lo, hi), compute)
        return Response(body, media_type="application/json")

