"""Evaluations: the latest ``refinery eval`` report of each stage of a run (written to
``RUN/STAGE/_eval_<kind>.json``; ``curation.pipeline.evaluate`` reads them)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from curation.service.models import EvalReport
from curation.service.state import ServiceState


def add_routes(r: APIRouter, state: ServiceState) -> None:

    @r.get("/runs/{run_id}/evals", response_model=list[EvalReport], tags=["inspect"])
    def run_evals(run_id: str):
        """Each stage's latest eval report of each kind (decontam, rules, langid, dedup), in DAG
        order and the newest first within a stage: when it was written, its headline figures
        and its tables."""
        from curation.pipeline.evaluate import run_reports

        _, rd = state.started_run(run_id)
        return JSONResponse(run_reports(rd))

