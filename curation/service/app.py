"""The HTTP service: submit DAGs, follow runs, read their stats and query them, on a shared Ray.

``refinery serve`` calls :func:`serve`; tests and embedding code call :func:`create_app`.
Every route but ``/healthz`` needs the token (see ``curation.service.auth``); ``/`` answers
401 with a login form until the browser holds the session cookie.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import threading
from collections import OrderedDict
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Callable, Iterable

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from pydantic import BaseModel, ConfigDict
from starlette.requests import HTTPConnection

from curation.pipeline.dag import StageModuleRefused
from curation.pipeline.rundir import RunDir
from curation.service import browse
from curation.service.auth import COOKIE, PathPolicy, TokenAuth, load_token
from curation.service.runs import RunConflict, RunManager, RunMissing, SubmitError, SUBMITTED_FILE
from curation.service.sql_guard import SqlRejected, run_select

STATIC = Path(__file__).resolve().parent / "static"
MiB = 1 << 20
_PUBLIC = {"/healthz", "/"}  # "/" checks the token itself, to answer with the login form
_BASE_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                 (b"x-frame-options", b"DENY")]
_PAGE_CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
             "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")


# ---------------------------------------------------------------------------------------------
# response models (for /docs; extra keys pass through)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class RunSummary(_Open):
    """One run in the list: state and overall progress (0..1)."""

    id: str
    name: str | None = None
    state: str
    error: str | None = None
    submitted: float | None = None
    started: float | None = None
    finished: float | None = None
    elapsed_s: float | None = None
    progress: float = 0.0
    attempt: int | None = None


class RunDetail(RunSummary):
    """A run with per-phase progress and per-stage counters from progress.json."""

    phases: dict[str, dict[str, int]] = {}
    stages: list[dict[str, Any]] = []
    nodes: list[str] = []
    log_tail: str = ""


class RunStats(_Open):
    """The tables of ``refinery stats``, plus histograms when the columns exist."""

    stages: list[dict[str, Any]]
    top_reasons: list[dict[str, Any]]
    output: dict[str, Any]
    columns: list[str]
    languages: list[dict[str, Any]] | None = None
    quality_histogram: list[dict[str, Any]] | None = None
    tokens_by_source: dict[str, int] | None = None


class SqlAnswer(_Open):
    """Rows of a read-only query; ``truncated`` when the row limit cut it."""

    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool
    truncated_cells: int
    limit: int
    elapsed_s: float


class StageSummary(_Open):
    """A node with shards of its own: kept and rejected rows from its manifest."""

    stage: str
    type: str
    kind: str
    shards: int
    kept: int
    rejected: int
    kept_written: bool


class StageDetail(StageSummary):
    """A stage's columns, numeric signal columns (its own rules' first), rules with this run's
    thresholds, per-column threshold points, and rejection reasons with counts."""

    columns: list[dict[str, Any]]
    signals: list[str]
    rule_signals: list[str]
    rules: list[dict[str, Any]]
    thresholds: dict[str, list[dict[str, Any]]]
    reasons: list[dict[str, Any]]


class DocumentsPage(_Open):
    """Documents ``offset .. offset+limit`` of ``total``: text (cut to ``max_chars``, with its
    full length ``text_chars``) and every other column of the row under ``fields``."""

    stage: str
    which: str
    reason: str | None = None
    offset: int
    limit: int
    total: int
    documents: list[dict[str, Any]]


class SignalHistogram(_Open):
    """Bins [lo, hi) with kept / rejected counts; ``rows`` = bins + below + above + nulls.
    ``thresholds``: where the stage's rules drop, from the DAG as run."""

    stage: str
    column: str
    rows: int
    bins: list[dict[str, Any]]
    below: int
    above: int
    nulls: int
    thresholds: list[dict[str, Any]]


# ---------------------------------------------------------------------------------------------
# stats


def stats_payload(run_dir: str | Path) -> dict[str, Any]:
    """``refinery stats`` as data: stage table, top reasons, output summary; language and
    quality histograms when ``kept`` has ``lang`` / ``quality``, tokens per source when it has
    ``num_tokens`` (or ``input_ids``)."""
    from curation.pipeline.stats import connect, output_summary, stage_table, top_reasons

    out: dict[str, Any] = {"stages": stage_table(run_dir), "top_reasons": top_reasons(run_dir),
                           "output": output_summary(run_dir), "languages": None, "quality_histogram": None,
                           "tokens_by_source": None}
    con = connect(run_dir, views=["kept"])
    described = con.execute("describe kept").fetchall()
    cols = [r[0] for r in described]
    types = {r[0]: str(r[1]) for r in described}
    out["columns"] = cols
    if "lang" in cols:
        rows = con.execute("select coalesce(lang, '?'), count(*) from kept group by 1 order by 2 desc, 1 limit 30").fetchall()
        out["languages"] = [{"lang": lang, "docs": int(n)} for lang, n in rows]
    if "quality" in cols:
        out["quality_histogram"] = _histogram(con, "quality")
    # Packed rows (input_ids + doc_lens) mix sources within a row: no per-source tokens there.
    if "num_tokens" in cols:
        expr = "sum(num_tokens)"
    elif "input_ids" in cols and "doc_lens" not in cols:
        expr = "sum(len(input_ids))"
    else:
        expr = None
    if expr and types.get("source") == "VARCHAR":
        rows = con.execute(f"select coalesce(source, '?'), coalesce({expr}, 0) from kept group by 1 order by 2 desc").fetchall()
        out["tokens_by_source"] = {s: int(n) for s, n in rows}
    con.close()
    return out


def _histogram(con, column: str, bins: int = 20) -> list[dict[str, Any]]:
    lo, hi, n = con.execute(f'select min("{column}"), max("{column}"), count("{column}") from kept').fetchone()
    if not n:
        return []
    lo, hi = float(lo), float(hi)
    if lo >= 0 and hi <= 1:  # probabilities: fixed bins read the same across runs
        lo, hi = 0.0, 1.0
    width = (hi - lo) / bins or 1.0
    counts = dict(con.execute(
        f'select least(greatest(floor(("{column}" - ?) / ?)::int, 0), ?) as b, count(*) from kept '
        f'where "{column}" is not null group by 1', [lo, width, bins - 1]).fetchall())
    return [{"lo": round(lo + i * width, 6), "hi": round(lo + (i + 1) * width, 6), "docs": int(counts.get(i, 0))}
            for i in range(bins)]


class StatsCache:
    """Stats of a run, recomputed only when its progress.json changes (every committed shard
    rewrites it), and computed once when many clients ask at the same moment."""

    def __init__(self, compute: Callable[[Path], bytes], size: int = 64):
        self._compute = compute
        self._size = size
        self._lock = threading.Lock()
        self._done: OrderedDict[tuple, bytes] = OrderedDict()
        self._pending: dict[tuple, threading.Event] = {}

    @staticmethod
    def _key(run_dir: Path) -> tuple:
        def mtime(path: Path) -> int | None:
            try:
                return path.stat().st_mtime_ns
            except OSError:
                return None
        rd = RunDir(run_dir)
        return (str(run_dir), mtime(Path(rd.progress_file)), mtime(Path(rd.dag_file)))

    def get(self, run_dir: Path) -> bytes:
        key = self._key(run_dir)
        while True:
            with self._lock:
                if key in self._done:
                    self._done.move_to_end(key)
                    return self._done[key]
                ev = self._pending.get(key)
                if ev is None:
                    ev = self._pending[key] = threading.Event()
                    break
            ev.wait()  # someone else computes it; take theirs (or compute if they failed)
        try:
            value = self._compute(run_dir)
            with self._lock:
                self._done[key] = value
                while len(self._done) > self._size:
                    self._done.popitem(last=False)
            return value
        finally:
            with self._lock:
                self._pending.pop(key, None)
            ev.set()


class RunCache:
    """Answers (JSON bytes) keyed by a run's progress.json and dag.yaml mtimes plus the
    request's parameters: a finished run's histograms are computed once."""

    def __init__(self, size: int = 256):
        self._size = size
        self._lock = threading.Lock()
        self._done: OrderedDict[tuple, bytes] = OrderedDict()

    def get(self, run_dir: Path, params: tuple, compute: Callable[[], Any]) -> bytes:
        key = StatsCache._key(run_dir) + params
        with self._lock:
            if key in self._done:
                self._done.move_to_end(key)
                return self._done[key]
        value = json.dumps(compute()).encode()
        with self._lock:
            self._done[key] = value
            while len(self._done) > self._size:
                self._done.popitem(last=False)
        return value


# ---------------------------------------------------------------------------------------------
# middleware


class GuardMiddleware:
    """Request size limit, token check and security headers, in front of every route.

    Written as plain ASGI so it runs before any body is read: an oversized upload is refused
    from its Content-Length, and a body without one is cut off as it streams in.
    """

    def __init__(self, app, auth: TokenAuth, max_body_bytes: int, public: Iterable[str] = _PUBLIC):
        self.app = app
        self.auth = auth
        self.max_body_bytes = max_body_bytes
        self.public = set(public)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_secure(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                headers += [h for h in _BASE_HEADERS if h[0] not in names]
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        conn = HTTPConnection(scope)
        limit = self.max_body_bytes
        length = conn.headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > limit):
            resp = JSONResponse({"detail": f"request body larger than {limit} bytes"}, status_code=413)
            return await resp(scope, receive, send_secure)
        if scope["path"] not in self.public:
            ok, why = self.auth.check(conn, scope["method"])
            if not ok:
                resp = JSONResponse({"detail": why}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
                return await resp(scope, receive, send_secure)
        seen = 0

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, f"request body larger than {limit} bytes")
            return message

        await self.app(scope, limited_receive, send_secure)


class StageModulesMiddleware:
    """Every request runs with the operator's ``--stage-modules`` allow-list in force: whatever
    a route validates (a submitted DAG, a run's dag.yaml for stats or browsing) imports no
    module outside it, and load errors name no file of this machine."""

    def __init__(self, app, stage_modules: tuple[str, ...]):
        self.app = app
        self.stage_modules = tuple(stage_modules)

    async def __call__(self, scope, receive, send):
        from curation.pipeline.dag import stage_modules_allowed

        with stage_modules_allowed(self.stage_modules):  # a ContextVar: threadpool routes inherit it
            await self.app(scope, receive, send)


# ---------------------------------------------------------------------------------------------
# the app


_LOGIN = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>refinery — sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1"><link rel="icon" href="data:,">
<style>body{font:15px system-ui,sans-serif;margin:0;display:grid;place-items:center;height:100vh;background:#f6f7f9}
form{background:#fff;padding:2em;border:1px solid #ddd;border-radius:8px;min-width:20em}
input{width:100%;box-sizing:border-box;padding:.5em;margin:.5em 0 1em}button{padding:.5em 1.2em}
.err{color:#b00020}</style></head><body>
<form method="post" action="/" id="login"><h1>refinery</h1>
<label for="token">Service token</label><input id="token" name="token" type="password" autocomplete="current-password" autofocus>
<p class="err" id="login-error">{error}</p><button type="submit" id="login-submit">Sign in</button></form></body></html>"""
_LOGIN_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; form-action 'self'; frame-ancestors 'none'"
_FILENAME = re.compile(r"[^A-Za-z0-9._-]")


def _login_page(error: str = "", status: int = 401) -> HTMLResponse:
    import html

    return HTMLResponse(_LOGIN.replace("{error}", html.escape(error)), status_code=status,
                        headers={"Content-Security-Policy": _LOGIN_CSP})


def _session_redirect(request: Request, auth: TokenAuth) -> RedirectResponse:
    # 303 to a clean URL: the token leaves the address bar and the browser history
    resp = RedirectResponse("/", status_code=303)
    resp.set_cookie(COOKIE, auth.session_value, httponly=True, samesite="strict", path="/",
                    secure=request.url.scheme == "https", max_age=7 * 24 * 3600)
    return resp


def create_app(runs_dir: str | Path, token: str, address: str | None = None,
               allowed_roots: Iterable[str | Path] = (), base_dir: str | Path | None = None,
               max_concurrent: int = 2, max_body_bytes: int = MiB, sql_timeout_s: float = 10.0,
               sql_max_rows: int = 1000, sql_max_concurrent: int = 4,
               stage_modules: Iterable[str] | str = ()) -> FastAPI:
    """The FastAPI application. Starting it (lifespan) starts the run scheduler; stopping it
    leaves runs running. ``base_dir`` (default: the CWD) anchors relative input paths.
    ``stage_modules``: module prefixes ``type: module:Class`` stages may come from (default:
    none; the service imports no module a client names)."""
    from curation.pipeline.dag import parse_stage_modules

    auth = TokenAuth(token)
    policy = PathPolicy(list(allowed_roots), base_dir or os.getcwd())
    stage_modules = parse_stage_modules(stage_modules)
    runs = RunManager(runs_dir, policy, address=address, max_concurrent=max_concurrent, stage_modules=stage_modules)
    # cached as JSON bytes: a warm hit is then a file stat and a copy, no validation or encoding
    stats_cache = StatsCache(lambda d: json.dumps(stats_payload(d)).encode())
    sql_slots = threading.BoundedSemaphore(sql_max_concurrent)
    browse_cache = RunCache()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        runs.start()
        try:
            yield
        finally:
            runs.stop()

    app = FastAPI(title="refinery", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None,
                  description="Submit pipeline DAGs to a shared Ray cluster, follow runs, read their stats, "
                              "query their shards. Every route but /healthz needs `Authorization: Bearer <token>`.")
    app.state.runs = runs
    app.state.auth = auth
    app.state.policy = policy
    app.state.stage_modules = stage_modules
    app.add_middleware(StageModulesMiddleware, stage_modules=stage_modules)
    app.add_middleware(GuardMiddleware, auth=auth, max_body_bytes=max_body_bytes)

    @app.exception_handler(RunMissing)
    async def _missing(request: Request, e: RunMissing):
        return JSONResponse({"detail": f"run {e.args[0]!r} not found"}, status_code=404)

    @app.exception_handler(RunConflict)
    async def _conflict(request: Request, e: RunConflict):
        return JSONResponse({"detail": str(e)}, status_code=409)

    @app.exception_handler(SubmitError)
    async def _refused(request: Request, e: SubmitError):
        return JSONResponse({"detail": str(e)}, status_code=e.status)

    @app.exception_handler(StageModuleRefused)
    async def _module_refused(request: Request, e: StageModuleRefused):
        # a run's dag.yaml (made with the CLI, or admitted under another allow-list) names a
        # module this service does not load: refused, and the file's location is not said
        return JSONResponse({"detail": f"the run's DAG: {e.brief}"}, status_code=403)

    @app.exception_handler(SqlRejected)
    async def _sql_refused(request: Request, e: SqlRejected):
        return JSONResponse({"detail": str(e)}, status_code=e.status)

    @app.exception_handler(browse.BrowseError)
    async def _browse_refused(request: Request, e: browse.BrowseError):
        return JSONResponse({"detail": str(e)}, status_code=e.status)

    # -- pages -------------------------------------------------------------------------------

    @app.get("/healthz", include_in_schema=True, tags=["service"])
    def healthz() -> dict:
        """Liveness, without authentication."""
        return {"status": "ok"}

    @app.get("/", include_in_schema=False)
    def index(request: Request, token: str | None = None):
        if token is not None:
            if auth.token_ok(token):
                return _session_redirect(request, auth)
            return _login_page("That token is not valid.")
        ok, _ = auth.check(request)
        if not ok:
            return _login_page()
        return FileResponse(STATIC / "index.html", media_type="text/html",
                            headers={"Content-Security-Policy": _PAGE_CSP})

    @app.post("/", include_in_schema=False)
    async def login(request: Request):
        form = await request.form(max_files=0, max_fields=4)
        token = form.get("token")
        if isinstance(token, str) and auth.token_ok(token.strip()):
            return _session_redirect(request, auth)
        return _login_page("That token is not valid.")

    @app.get("/logout", include_in_schema=False)
    def logout():
        resp = RedirectResponse("/", status_code=303)
        resp.delete_cookie(COOKIE, path="/")
        return resp

    @app.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        path = STATIC / name
        if "/" in name or name.startswith(".") or not path.is_file():
            raise HTTPException(404, "not found")
        return FileResponse(path)

    @app.get("/openapi.json", include_in_schema=False)
    def openapi_json():
        return JSONResponse(app.openapi())

    @app.get("/docs", include_in_schema=False)
    def docs():
        return get_swagger_ui_html(openapi_url="/openapi.json", title="refinery API")

    def custom_openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
            schema["paths"]["/healthz"]["get"]["security"] = []
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = custom_openapi

    # -- runs --------------------------------------------------------------------------------

    @app.post("/runs", status_code=201, response_model=RunDetail, tags=["runs"], openapi_extra={
        "requestBody": {"required": True, "content": {
            "multipart/form-data": {"schema": {"type": "object", "required": ["dag"],
                                               "properties": {"dag": {"type": "string", "format": "binary"}}}},
            "application/yaml": {"schema": {"type": "string"}}}}})
    async def submit(request: Request):
        """Submit a DAG (multipart field ``dag``, or the YAML as the raw body). It is validated
        (422 names the field), its input files checked against the allowed roots (403) and
        pinned, then queued. Answers the new run."""
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
        info = await run_in_threadpool(runs.submit, text, where)
        return JSONResponse(info, status_code=201, headers={"Location": f"/runs/{info['id']}"})

    @app.get("/runs", response_model=list[RunSummary], tags=["runs"])
    def list_runs():
        """Every run in the runs directory (submitted here or not), newest first."""
        return JSONResponse(runs.list_runs())

    @app.get("/runs/{run_id}", response_model=RunDetail, tags=["runs"])
    def get_run(run_id: str):
        """State (queued, running, done, failed, cancelled), per-phase and per-stage progress, timings."""
        return JSONResponse(runs.describe(run_id))

    @app.get("/runs/{run_id}/progress", tags=["runs"])
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

    @app.get("/metrics", tags=["service"], response_class=Response)
    def metrics():
        """Every run's progress as Prometheus gauges (text format): shards done/total, tasks
        running and failed, documents, documents and bytes per second, ETA and the slowest
        running task, per run and phase."""
        from curation.pipeline.progress import as_of, prometheus_text

        progress = {}
        for rid in runs._run_ids():
            try:
                progress[rid] = as_of(json.loads(Path(RunDir(runs.runs_dir / rid).progress_file).read_text()))
            except (OSError, ValueError):
                continue
        return Response(prometheus_text(progress), media_type="text/plain; version=0.0.4")

    @app.get("/runs/{run_id}/dag", tags=["runs"])
    def get_dag(run_id: str) -> dict:
        """The DAG as submitted and as run (inputs pinned to resolved files, defaults filled in)."""
        d = runs.run_dir(run_id)
        read = lambda p: p.read_text() if p.exists() else None  # noqa: E731
        return {"submitted": read(d / SUBMITTED_FILE), "resolved": read(Path(RunDir(d).dag_file))}

    @app.post("/runs/{run_id}/cancel", response_model=RunDetail, tags=["runs"])
    def cancel_run(run_id: str):
        """Cancel a queued or running run (its whole process group is stopped)."""
        return runs.cancel(run_id)

    @app.post("/runs/{run_id}/resume", response_model=RunDetail, tags=["runs"])
    def resume_run(run_id: str):
        """Queue a failed or cancelled run again; committed shards are skipped."""
        return runs.resume(run_id)

    @app.get("/runs/{run_id}/stats", response_model=RunStats, tags=["inspect"])
    def run_stats(run_id: str):
        """What ``refinery stats`` prints, as JSON."""
        from curation.pipeline.stats import RunNotFound

        d = runs.run_dir(run_id)
        try:
            return Response(stats_cache.get(d), media_type="application/json")
        except RunNotFound as e:
            raise HTTPException(404, str(e)) from None

    @app.get("/runs/{run_id}/sql", response_model=SqlAnswer, tags=["inspect"])
    def run_sql(run_id: str, q: str = Query(..., max_length=20_000, description="one SELECT over views kept, "
                                            "rejected, manifest, <stage>"),
                limit: int = Query(100, ge=1, le=sql_max_rows)):
        """A read-only DuckDB query over the run's shards: one SELECT, the run's files only,
        at most ``limit`` rows, within the time limit (408 when exceeded)."""
        from curation.pipeline.stats import RunNotFound

        d = runs.run_dir(run_id)
        if not sql_slots.acquire(timeout=2):
            raise HTTPException(429, "too many queries running; retry shortly")
        try:
            res = run_select(d, q, max_rows=limit, timeout_s=sql_timeout_s)
        except RunNotFound as e:
            raise HTTPException(404, str(e)) from None
        finally:
            sql_slots.release()
        return res.__dict__

    # -- document browser --------------------------------------------------------------------

    def _run(run_id: str) -> tuple[Path, RunDir]:
        d = runs.run_dir(run_id)
        rd = RunDir(d)
        if not rd.exists():
            raise HTTPException(404, f"run {run_id!r} has no dag.yaml yet (not started)")
        return d, rd

    @app.get("/runs/{run_id}/stages", response_model=list[StageSummary], tags=["browse"])
    def list_stages(run_id: str):
        """Every node with shards of its own (inputs, stages; not unions), in DAG order, with
        its committed kept and rejected row counts (from the manifests)."""
        _, rd = _run(run_id)
        return JSONResponse(browse.list_stages(rd))

    @app.get("/runs/{run_id}/stages/{stage}", response_model=StageDetail, tags=["browse"])
    def describe_stage(run_id: str, stage: str):
        """A stage's columns and signal columns, its rules with this run's thresholds, and its
        rejection reasons with counts."""
        d, rd = _run(run_id)
        body = browse_cache.get(d, ("stage", stage), lambda: browse.describe_stage(rd, stage))
        return Response(body, media_type="application/json")

    @app.get("/runs/{run_id}/stages/{stage}/documents", response_model=DocumentsPage, tags=["browse"])
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
        _, rd = _run(run_id)
        return JSONResponse(browse.documents(rd, stage, which, reason or None, offset, limit, max_chars))

    @app.get("/runs/{run_id}/stages/{stage}/histogram", response_model=SignalHistogram, tags=["browse"])
    def stage_histogram(run_id: str, stage: str, column: str = Query(..., max_length=500),
                        bins: int = Query(30, ge=1, le=browse.MAX_BINS),
                        clip: float = Query(0.0, ge=0.0, lt=0.5, description="cut this fraction off each tail"),
                        lo: float | None = None, hi: float | None = None):
        """The distribution of one numeric column over the stage's kept and rejected rows (DuckDB,
        bounded bins), with the stage's thresholds for it from the DAG as run."""
        d, rd = _run(run_id)

        def compute():
            if not sql_slots.acquire(timeout=2):
                raise HTTPException(429, "too many queries running; retry shortly")
            try:
                return browse.histogram(rd, stage, column, bins, clip, lo, hi, timeout_s=sql_timeout_s)
            finally:
                sql_slots.release()

        body = browse_cache.get(d, ("histogram", stage, column, bins, clip, lo, hi), compute)
        return Response(body, media_type="application/json")

    return app


# ---------------------------------------------------------------------------------------------
# serve


class _RedactToken(logging.Filter):
    """Access-log lines must not carry the token of a ``/?token=`` dashboard link."""

    _pat = re.compile(r"(token=)[^&\s]*")

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(self._pat.sub(r"\1***", a) if isinstance(a, str) else a for a in record.args)
        return True


def serve(runs_dir: str | Path, address: str | None = "auto", token_file: str | Path | None = None,
          host: str = "127.0.0.1", port: int = 8080, allowed_roots: Iterable[str | Path] = (),
          max_concurrent: int = 2, base_dir: str | Path | None = None,
          stage_modules: Iterable[str] | str = ()) -> None:
    """Run the service until interrupted. Runs it started keep running after it stops.

    ``address``: the Ray cluster each run connects to (``auto``, ``ray://head:10001``), or
    ``None`` / ``""`` / ``"local"`` for an embedded Ray per run. Relative input paths in
    submitted DAGs resolve against ``base_dir`` (default: the current directory), which also
    becomes the service's and the runs' working directory, so relative stage parameters
    (tokenizer paths) mean the same thing to the validator and to the run. Allowed roots
    default to ``base_dir``. ``stage_modules``: the module prefixes ``type: module:Class``
    stages may be loaded from (default: none).
    """
    import uvicorn

    token = load_token(token_file)
    base = Path(base_dir or os.getcwd()).resolve()
    runs_dir = Path(runs_dir).resolve()
    roots = [r if "://" in str(r) else str((base / Path(r).expanduser()).resolve()) for r in allowed_roots]
    os.chdir(base)
    if address in ("", "local"):
        address = None
    app = create_app(runs_dir, token, address=address, allowed_roots=roots, base_dir=base,
                     max_concurrent=max_concurrent, stage_modules=stage_modules)
    config = uvicorn.Config(app, host=host, port=port, log_level="info", proxy_headers=False,
                            timeout_keep_alive=5, server_header=False)
    server = uvicorn.Server(config)
    logging.getLogger("uvicorn.access").addFilter(_RedactToken())
    app.state.runs.start()  # here rather than only in the lifespan: a busy runs dir fails loudly
    policy = app.state.policy
    print(f"[refinery serve] http://{host}:{port}/  runs: {runs_dir}  ray: {address or 'embedded per run'}  "
          f"inputs under: {policy.describe()}  max concurrent runs: {max_concurrent}  "
          f"stage modules: {', '.join(app.state.stage_modules) or 'built-in only'}", file=sys.stderr, flush=True)
    server.run()
