"""Inspect a run: what ``refinery stats`` prints, and read-only SQL over its shards."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import Response

from curation.service.models import RunStats, SqlAnswer
from curation.service.state import ServiceState


def add_routes(r: APIRouter, state: ServiceState) -> None:
    runs, sql_slots = state.runs, state.sql_slots

    @r.get("/runs/{run_id}/stats", response_model=RunStats, tags=["inspect"])
    def run_stats(run_id: str):
        """What ``refinery stats`` prints, as JSON."""
        from curation.pipeline.stats import RunNotFound

        d = runs.run_dir(run_id)
        try:
            return Response(state.stats_cache.get(d), media_type="application/json")
        except RunNotFound as e:
            raise HTTPException(404, str(e)) from None

    @r.get("/runs/{run_id}/sql", response_model=SqlAnswer, tags=["inspect"])
    def run_sql(run_id: str, q: str = Query(..., max_length=20_000, description="one SELECT over views kept, "
                                            "rejected, manifest, <stage>"),
                limit: int = Query(100, ge=1, le=state.sql_max_rows)):
        """A read-only DuckDB query over the run's shards: one SELECT, the run's files only,
        at most ``limit`` rows and the service's byte budget (``truncated`` when either cut it),
        cells cut to 10,000 characters. It runs in a child process held to the service's memory
        cap (413 when a query needs more) and killed at the time limit (408)."""
        from curation.pipeline.stats import RunNotFound

        d = runs.run_dir(run_id)
        if not sql_slots.acquire(timeout=2):
            raise HTTPException(429, "too many queries running; retry shortly")
        try:
            res = state.sql_box.run(d, q, max_rows=limit, max_bytes=state.sql_max_bytes)
        except RunNotFound as e:
            raise HTTPException(404, str(e)) from None
        finally:
            sql_slots.release()
        return res.__dict__

