"""Runs: submit a DAG, list and describe runs, their progress (also as Prometheus gauges), their
DAG as submitted and as run, cancel, resume and delete."""

from __future__ import annotations

import asyncio
import contextvars
import json
import os
import re
import time
from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from curation.pipeline.rundir import RunDir
from curation.service.models import RunDetail, RunSummary
from curation.service.runs import SUBMITTED_FILE
from curation.service.state import ServiceState

_FILENAME = re.compile(r"[^A-Za-z0-9._-]")


async def _admit(state: ServiceState, text: str, where: str) -> dict:
    """Admission on the service's own small pool, not the event loop's or the routes' threads:
    costly DAGs queue behind each other while /healthz and reads stay answered. Past
    ``admission_slots`` waiting submissions: 429; past ``admission_timeout_s``: 503, and the
    run is not created."""
    if not state.admission_slots.acquire(blocking=False):
        raise HTTPException(429, "too many submissions are being validated; retry shortly")
    deadline = time.monotonic() + state.admission_timeout_s
    try:
        fut = asyncio.get_running_loop().run_in_executor(
            state.admission_pool, contextvars.copy_context().run, state.runs.submit, text, where, deadline)
    except RuntimeError:  # the pool is shut down: the server is stopping
        state.admission_slots.release()
        raise HTTPException(503, "the service is stopping") from None
    fut.add_done_callback(lambda _f: state.admission_slots.release())
    try:
        return await asyncio.wait_for(asyncio.shield(fut), state.admission_timeout_s + 1)
    except (asyncio.TimeoutError, asyncio.CancelledError):
        fut.cancel()
        raise HTTPException(503, f"validating the DAG took longer than {state.admission_timeout_s:g} s; "
                                 "no run was created") from None


async def _dag_text(request: Request) -> tuple[str, str]:
    """The submitted YAML (multipart field ``dag``, or the raw body) and the name it is reported
    under (the uploaded file's name, made safe; ``submitted.yaml`` otherwise)."""
    ctype = request.headers.get("content-type", "")
    where = "submitted.yaml"
    if ctype.startswith("multipart/form-data"):
        form = await request.form(max_files=1, max_fields=8)
        part = form.get("dag")
        if part is None:
            raise HTTPException(422, "dag: missing; send the YAML as multipart field `dag` or as the raw body")
        if isinstance(part, str):
            raw = part.encode()
        else:
            raw = await part.read()
            if part.filename:
                where = _FILENAME.sub("_", os.path.basename(part.filename))[:100] or where
    else:
        raw = await request.body()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise HTTPException(422, "dag: the YAML is not UTF-8 text") from None
    if not text.strip():
        raise HTTPException(422, "dag: empty; send the pipeline YAML")
    return text, where


def add_routes(r: APIRouter, state: ServiceState) -> None:
    runs = state.runs

    @r.post("/runs", status_code=201, response_model=RunDetail, tags=["runs"], openapi_extra={
        "requestBody": {"required": True, "content": {
            "multipart/form-data": {"schema": {"type": "object", "required": ["dag"],
                                               "properties": {"dag": {"type": "string", "format": "binary"}}}},
            "application/yaml": {"schema": {"type": "string"}}}}})
    async def submit(request: Request):
        """Submit a DAG (multipart field ``dag``, or the YAML as the raw body). It is validated
        (422 names the field), its input files checked against the allowed roots (403) and
        pinned, then queued. Answers the new run."""
        text, where = await _dag_text(request)
        info = await _admit(state, text, where)
        return JSONResponse(info, status_code=201, headers={"Location": f"/runs/{info['id']}"})

    @r.get("/runs", response_model=list[RunSummary], tags=["runs"])
    def list_runs():
        """Every run in the runs directory (submitted here or not), newest first."""
        return JSONResponse(runs.list_runs())

    @r.get("/runs/{run_id}", response_model=RunDetail, tags=["runs"])
    def get_run(run_id: str):
        """State (queued, running, done, failed, cancelled), per-phase and per-stage progress, timings."""
        return JSONResponse(runs.describe(run_id))

    @r.get("/runs/{run_id}/progress", tags=["runs"])
    def get_progress(run_id: str) -> dict:
        """The run's progress.json as `refinery status` shows it: per phase shards done, and under
        ``live`` tasks running/done/failed (per node), documents and bytes per second (overall and
        the last minute), ETA and the slowest running tasks (their seconds as of now: ``as_of``);
        ``run_state`` is the service's view."""
        from curation.pipeline.progress import as_of

        d = runs.run_dir(run_id)
        try:
            progress = json.loads(Path(RunDir(d).progress_file).read_text())
        except (OSError, ValueError):
            progress = {}
        return {**as_of(progress), "run_state": runs.describe(run_id, detail=False)["state"]}

    @r.get("/metrics", tags=["service"], response_class=Response)
    def metrics():
        """Every run's progress as Prometheus gauges (text format): shards done/total, tasks
        running and failed, documents, documents and bytes per second, ETA and the slowest
        running task, per run and phase."""
        from curation.pipeline.progress import as_of, prometheus_text

        progress = {}
        for rid in runs.run_ids():
            try:
                progress[rid] = as_of(json.loads(Path(RunDir(runs.runs_dir / rid).progress_file).read_text()))
            except (OSError, ValueError):
                continue
        return Response(prometheus_text(progress), media_type="text/plain; version=0.0.4")

    @r.get("/runs/{run_id}/dag", tags=["runs"])
    def get_dag(run_id: str) -> dict:
        """The DAG as submitted and as run (inputs pinned to resolved files, defaults filled in)."""
        d = runs.run_dir(run_id)
        read = lambda p: p.read_text() if p.exists() else None  # noqa: E731
        return {"submitted": read(d / SUBMITTED_FILE), "resolved": read(Path(RunDir(d).dag_file))}

    @r.post("/runs/{run_id}/cancel", response_model=RunDetail, tags=["runs"])
    def cancel_run(run_id: str):
        """Cancel a queued or running run (its whole process group is stopped)."""
        return runs.cancel(run_id)

    @r.delete("/runs/{run_id}", tags=["runs"])
    def delete_run(run_id: str) -> dict:
        """Delete a done, failed or cancelled run and its directory (409 for a queued or running
        run: cancel it first). Cancelled runs count against the queue cap until deleted."""
        return runs.delete(run_id)

    @r.post("/runs/{run_id}/resume", response_model=RunDetail, tags=["runs"])
    def resume_run(run_id: str):
        """Queue a failed or cancelled run again; committed shards are skipped."""
        return runs.resume(run_id)

