"""The HTTP service: submit DAGs, follow runs, read their stats and query them, on a shared Ray.

``refinery serve`` calls :func:`serve`; tests and embedding code call :func:`create_app`, which
assembles the shared state (``state.ServiceState``), the middleware in front of every route
(``middleware``: size limit, token, security headers, the stage-module allow-list), the error
answers, and the routes of each area (``routes/``: pages, runs, inspect, browse, evals).
Every route but ``/healthz`` needs the token (see ``curation.service.auth``); ``/`` answers
401 with a login form until the browser holds the session cookie.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Iterable

from fastapi import FastAPI, Request
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse

from curation.pipeline.dag import StageModuleRefused
from curation.service import browse
from curation.service.auth import MAX_PARAM_FILE_BYTES, PathPolicy, TokenAuth, load_token
from curation.service.middleware import GuardMiddleware, StageModulesMiddleware
from curation.service.routes import browse as browse_routes, evals, inspect, pages, runs as runs_routes
from curation.service.admission import (MAX_BLOOM_BYTES, MAX_INPUT_FILES, MAX_PATTERNS, MAX_SHARDS,
                                        MIN_SPLIT_BYTES, SubmitError)
from curation.service.runs import (MAX_RUN_BYTES, MAX_RUN_SECONDS, QueueFull, RunConflict, RunManager, RunMissing,
                                   public_message)
from curation.service.sql_box import FORK_SERVER
from curation.service.sql_guard import SqlRejected
from curation.service.state import ServiceState

MiB = 1 << 20

#: the areas, in the order their routes are matched and documented
AREAS = (pages, runs_routes, inspect, browse_routes, evals)


def _error_answers(app: FastAPI, base_dir: str) -> None:
    """The service's own errors as JSON answers with their status. Messages that may carry
    paths or a client's value go through ``public_message``: paths relative to the base
    directory, no other path of this machine, echoed values cut."""

    @app.exception_handler(RunMissing)
    async def _missing(request: Request, e: RunMissing):
        return JSONResponse({"detail": f"run {e.args[0]!r} not found"}, status_code=404)

    @app.exception_handler(RunConflict)
    async def _conflict(request: Request, e: RunConflict):
        return JSONResponse({"detail": public_message(str(e), base_dir)}, status_code=409)

    @app.exception_handler(SubmitError)
    async def _refused(request: Request, e: SubmitError):
        return JSONResponse({"detail": public_message(str(e), base_dir)}, status_code=e.status)

    @app.exception_handler(QueueFull)
    async def _queue_full(request: Request, e: QueueFull):
        return JSONResponse({"detail": str(e)}, status_code=429, headers={"Retry-After": "30"})

    @app.exception_handler(StageModuleRefused)
    async def _module_refused(request: Request, e: StageModuleRefused):
        # a run's dag.yaml (made with the CLI, or admitted under another allow-list) names a
        # module this service does not load: refused, and the file's location is not said
        return JSONResponse({"detail": f"the run's DAG: {e.brief}"}, status_code=403)

    @app.exception_handler(SqlRejected)
    async def _sql_refused(request: Request, e: SqlRejected):
        return JSONResponse({"detail": public_message(str(e), base_dir)}, status_code=e.status)

    @app.exception_handler(browse.BrowseError)
    async def _browse_refused(request: Request, e: browse.BrowseError):
        return JSONResponse({"detail": str(e)}, status_code=e.status)


def _warm_sql_box() -> None:
    from curation.service.sql_box import warm_up

    try:
        warm_up()
    except Exception as e:  # noqa: BLE001 - the first query starts it instead
        print(f"[refinery serve] /sql fork server: {type(e).__name__}: {e}", file=sys.stderr, flush=True)


def _bearer_openapi(app: FastAPI):
    """The OpenAPI document with the bearer scheme on every route but ``/healthz``."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, description=app.description,
                                 routes=app.routes)
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
            schema["paths"]["/healthz"]["get"]["security"] = []
            app.openapi_schema = schema
        return app.openapi_schema

    return openapi


def create_app(runs_dir: str | Path, token: str, address: str | None = None,
               allowed_roots: Iterable[str | Path] = (), base_dir: str | Path | None = None,
               max_concurrent: int = 2, max_body_bytes: int = MiB, sql_timeout_s: float = 10.0,
               sql_max_rows: int = 1000, sql_max_concurrent: int = 4, sql_max_bytes: int = 4 * MiB,
               stage_modules: Iterable[str] | str = (), max_queued: int | None = None,
               max_run_seconds: float | None = None, sql_memory_bytes: int = 1024 * MiB,
               max_patterns: int = MAX_PATTERNS, max_input_files: int = MAX_INPUT_FILES,
               max_bloom_bytes: int = MAX_BLOOM_BYTES, min_split_bytes: int = MIN_SPLIT_BYTES,
               max_shards: int = MAX_SHARDS, max_run_bytes: int | None = None,
               max_run_memory: int | None = None, max_param_file_bytes: int = MAX_PARAM_FILE_BYTES,
               private_files: Iterable[str | Path] = (), cookie_secure: bool = False) -> FastAPI:
    """The FastAPI application. Starting it (lifespan) starts the run scheduler; stopping it
    leaves runs running. ``base_dir`` (default: the CWD) anchors relative input paths.
    ``stage_modules``: module prefixes ``type: module:Class`` stages may come from (default:
    none; the service imports no module a client names). ``sql_memory_bytes``: what one /sql
    query may add to its boxed process's memory (``curation.service.sql_box``). ``max_patterns``,
    ``max_input_files``: admission's caps on a DAG's distinct input patterns and the files they
    match, ``max_bloom_bytes`` for a stage's Bloom filters, ``min_split_bytes`` for an input's
    ``split_bytes``, ``max_shards`` it cuts the files into (``admission.AdmissionLimits``; 422 names them).
    A run's quotas (``None``: none): ``max_run_seconds``, ``max_run_bytes`` on disk (the run
    stops itself past it), ``max_run_memory`` (``RunManager``). ``max_param_file_bytes``: a stage
    parameter file read whole at admission (``lang_config``, ``base``; ``auth.PathPolicy``).
    ``private_files`` (the token file) no DAG may read, under a root or not; ``cookie_secure``:
    the session cookie is ``Secure`` (browsers reach the service through https)."""
    from curation.pipeline.dag import parse_stage_modules

    auth = TokenAuth(token)
    policy = PathPolicy(list(allowed_roots), base_dir or os.getcwd(), max_param_file_bytes=max_param_file_bytes,
                        private=private_files)
    stage_modules = parse_stage_modules(stage_modules)
    runs = RunManager(runs_dir, policy, address=address, max_concurrent=max_concurrent, stage_modules=stage_modules,
                      max_queued=max_queued, max_run_seconds=max_run_seconds, max_patterns=max_patterns,
                      max_input_files=max_input_files, max_bloom_bytes=max_bloom_bytes,
                      min_split_bytes=min_split_bytes, max_shards=max_shards, max_run_bytes=max_run_bytes,
                      max_run_memory=max_run_memory)
    state = ServiceState(runs=runs, auth=auth, policy=policy, stage_modules=stage_modules,
                         sql_timeout_s=sql_timeout_s, sql_max_rows=sql_max_rows,
                         sql_max_concurrent=sql_max_concurrent, sql_max_bytes=sql_max_bytes,
                         sql_memory_bytes=sql_memory_bytes, cookie_secure=cookie_secure)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        runs.start()
        # the /sql fork server starts in the background: the first query need not wait for it
        threading.Thread(target=_warm_sql_box, daemon=True, name="refinery-sql-warmup").start()
        try:
            yield
        finally:
            # submissions still waiting for validation are dropped: stopping must not wait on them
            state.admission_pool.shutdown(wait=False, cancel_futures=True)
            runs.stop()
            FORK_SERVER.stop()

    app = FastAPI(title="refinery", version="0.1.0", lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None,
                  description="Submit pipeline DAGs to a shared Ray cluster, follow runs, read their stats, "
                              "query their shards. Every route but /healthz needs `Authorization: Bearer <token>`.")
    app.state.service = state
    app.state.runs = runs
    app.state.auth = auth
    app.state.policy = policy
    app.state.stage_modules = stage_modules
    app.add_middleware(StageModulesMiddleware, stage_modules=stage_modules)
    app.add_middleware(GuardMiddleware, auth=auth, max_body_bytes=max_body_bytes)
    _error_answers(app, policy.base_dir)
    for area in AREAS:  # onto the app's own router: app.routes lists every route (a route table)
        area.add_routes(app.router, state)
    app.openapi = _bearer_openapi(app)
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


def default_run_memory() -> int:
    """Half this machine's memory (at least ``runs.MIN_RUN_MEMORY``): the default cap on a run's
    processes, so that one run leaves the service and the other runs the other half."""
    from curation.service.runs import MIN_RUN_MEMORY

    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        total = 16 << 30
    return max(MIN_RUN_MEMORY, total // 2)


def _quotas(limits: dict) -> str:
    secs, disk, mem = limits["max_run_seconds"], limits["max_run_bytes"], limits["max_run_memory"]
    return ", ".join([f"{secs:g} s" if secs else "no time limit", f"{disk / (1 << 30):g} GiB on disk" if disk else
                      "no disk quota", f"{mem / (1 << 30):.1f} GiB of memory" if mem else "no memory cap"])


LOOPBACK = ("127.0.0.1", "::1", "localhost")
MIN_TOKEN_CHARS = 16


class ServeRefused(RuntimeError):
    """``serve`` options that would expose the service unsafely."""


def header_timeout_protocol(seconds: float, body_timeout_s: float = 60.0, public_body_timeout_s: float | None = None,
                            auth: TokenAuth | None = None, max_pending: int | None = None):
    """uvicorn's h11 protocol with the deadlines uvicorn lacks, so that no client can hold a
    connection (and a ``limit_concurrency`` slot) by sending slowly:

    - a connection that has not sent a whole request head ``seconds`` after connecting (or
      after its last response) is closed (slowloris on the head);
    - a request whose body is not all in ``body_timeout_s`` after its head is closed; on a
      connection that has not shown the token (the public login ``POST /``, or any request
      answered 401 while its body still trickles in) the deadline is ``public_body_timeout_s``
      (default ``seconds``);
    - at most ``max_pending`` connections may be open without having shown the token (``auth``)
      in a request head: past that, the oldest of them is closed. So connections that do show
      it, and ``/healthz``, always find a slot, however many strangers open sockets.
    """
    import h11
    from starlette.requests import HTTPConnection
    from uvicorn.protocols.http.h11_impl import H11Protocol

    public_body_timeout_s = seconds if public_body_timeout_s is None else public_body_timeout_s
    pending: dict = {}  # connections that have not shown the token, oldest first (per server)

    class HeaderTimeoutH11(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._trusted = False
            self._seen_cycle = None
            self._body_timer = None
            self._arm_header_timer()
            pending[self] = None
            if max_pending is not None:
                while len(pending) > max_pending:  # evict the oldest stranger
                    oldest = next(iter(pending))
                    pending.pop(oldest, None)
                    if not oldest.transport.is_closing():
                        oldest.transport.close()

        def _arm_header_timer(self) -> None:
            self._header_timer = self.loop.call_later(seconds, self._header_deadline)

        def _header_deadline(self) -> None:
            # IDLE: h11 has not seen a whole request head (partial heads stay buffered in IDLE)
            idle = self.cycle is None or self.cycle.response_complete
            if idle and self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

        def handle_events(self) -> None:
            super().handle_events()
            cycle = self.cycle
            if cycle is None or cycle is self._seen_cycle or self.transport.is_closing():
                return
            self._seen_cycle = cycle  # a new request head
            if not self._trusted and auth is not None:
                conn = HTTPConnection({"type": "http", "headers": cycle.scope["headers"]})
                if auth.check(conn, cycle.scope["method"])[0]:
                    self._trusted = True
                    pending.pop(self, None)
            if self._body_timer is not None:
                self._body_timer.cancel()
            if self.conn.their_state is h11.SEND_BODY:  # a body follows the head
                limit = body_timeout_s if self._trusted else public_body_timeout_s
                self._body_timer = self.loop.call_later(limit, self._body_deadline, cycle)

        def _body_deadline(self, cycle) -> None:
            if cycle is self.cycle and self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
                self.transport.close()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._header_timer.cancel()
            self._arm_header_timer()

        def connection_lost(self, exc) -> None:
            self._header_timer.cancel()
            if self._body_timer is not None:
                self._body_timer.cancel()
            pending.pop(self, None)
            super().connection_lost(exc)

    return HeaderTimeoutH11


def serve(runs_dir: str | Path, address: str | None = "auto", token_file: str | Path | None = None,
          host: str = "127.0.0.1", port: int = 8080, allowed_roots: Iterable[str | Path] = (),
          max_concurrent: int = 2, base_dir: str | Path | None = None,
          stage_modules: Iterable[str] | str = (), max_queued: int | None = 100,
          max_run_seconds: float | None = MAX_RUN_SECONDS, sql_max_bytes: int = 4 * MiB, max_connections: int = 200,
          header_timeout_s: float = 10.0, behind_tls_proxy: bool = False,
          sql_memory_bytes: int = 1024 * MiB, body_timeout_s: float = 60.0,
          max_strangers: int | None = None, max_patterns: int = MAX_PATTERNS,
          max_input_files: int = MAX_INPUT_FILES, max_bloom_bytes: int = MAX_BLOOM_BYTES,
          min_split_bytes: int = MIN_SPLIT_BYTES, max_shards: int = MAX_SHARDS,
          max_run_bytes: int | None = MAX_RUN_BYTES, max_run_memory: int | None = -1,
          max_param_file_bytes: int = MAX_PARAM_FILE_BYTES, trusted_proxies: Iterable[str] = ()) -> None:
    """Run the service until interrupted. Runs it started keep running after it stops.

    ``address``: the Ray cluster each run connects to (``auto``, ``ray://head:10001``), or
    ``None`` / ``""`` / ``"local"`` for an embedded Ray per run. Relative input paths in
    submitted DAGs resolve against ``base_dir`` (default: the current directory), which also
    becomes the service's and the runs' working directory, so relative stage parameters
    (tokenizer paths) mean the same thing to the validator and to the run. Allowed roots
    default to ``base_dir``. ``stage_modules``: the module prefixes ``type: module:Class``
    stages may be loaded from (default: none).

    Limits: ``max_queued`` runs waiting (429 past it), ``max_run_seconds`` per run (then it is
    cancelled and marked timed out; default a day), ``max_run_bytes`` of a run's directory on
    disk (the run fails past it and removes its work files; default 100 GiB),
    ``max_run_memory`` of its processes (default -1: half this machine's memory; ``None`` or 0:
    none), ``max_param_file_bytes`` of a parameter file read whole at admission (422 past it),
    ``sql_max_bytes`` per /sql answer, ``sql_memory_bytes`` per
    /sql query (its boxed process; 413 past it), ``max_connections``
    open at once (503 past it), ``header_timeout_s`` to send a request head (and the body of a
    request without the token: the login form), ``body_timeout_s`` for a body otherwise,
    ``max_strangers`` connections open without having shown the token (default half of
    ``max_connections``; past it the oldest is closed); ``max_patterns`` distinct input patterns
    and ``max_input_files`` files they match per submitted DAG, ``max_bloom_bytes`` of Bloom
    filters per stage, ``min_split_bytes`` per input shard and ``max_shards`` per DAG;
    ``max_queued`` counts cancelled runs
    until they are deleted. The service speaks
    plain HTTP: a non-loopback ``host`` needs ``behind_tls_proxy`` (a TLS proxy in front), which
    also makes the session cookie ``Secure``; ``trusted_proxies``: addresses whose
    ``X-Forwarded-Proto`` is believed (``https`` there makes the cookie ``Secure`` too). The token
    file is never readable by a DAG, even when a root (by default the base directory) holds it.
    """
    import uvicorn

    if host not in LOOPBACK and not behind_tls_proxy:
        raise ServeRefused(f"--host {host}: the service speaks plain HTTP and the token would cross the network "
                           "in clear; bind 127.0.0.1 behind a TLS proxy, or pass --behind-tls-proxy if this "
                           "address is only reachable through one")
    token = load_token(token_file)
    private = [str(Path(token_file).resolve())] if token_file else []  # before the chdir below
    if len(token) < MIN_TOKEN_CHARS:
        raise ServeRefused(f"the token has {len(token)} characters; use at least {MIN_TOKEN_CHARS} "
                           "(python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    base = Path(base_dir or os.getcwd()).resolve()
    runs_dir = Path(runs_dir).resolve()
    roots = [r if "://" in str(r) else str((base / Path(r).expanduser()).resolve()) for r in allowed_roots]
    os.chdir(base)
    if address in ("", "local"):
        address = None
    if max_run_memory is not None and max_run_memory < 0:
        max_run_memory = default_run_memory()
    app = create_app(runs_dir, token, address=address, allowed_roots=roots, base_dir=base,
                     max_concurrent=max_concurrent, stage_modules=stage_modules, max_queued=max_queued,
                     max_run_seconds=max_run_seconds, sql_max_bytes=sql_max_bytes,
                     sql_memory_bytes=sql_memory_bytes, max_patterns=max_patterns, max_input_files=max_input_files,
                     max_bloom_bytes=max_bloom_bytes, min_split_bytes=min_split_bytes, max_shards=max_shards,
                     max_run_bytes=max_run_bytes, max_run_memory=max_run_memory,
                     max_param_file_bytes=max_param_file_bytes, private_files=private,
                     cookie_secure=behind_tls_proxy)
    trusted_proxies = [str(a) for a in trusted_proxies]
    strangers = max(1, max_connections // 2) if max_strangers is None else max_strangers
    # timeout_graceful_shutdown: SIGTERM stops the server within seconds even with requests in flight
    config = uvicorn.Config(app, host=host, port=port, log_level="info", proxy_headers=bool(trusted_proxies),
                            forwarded_allow_ips=trusted_proxies or None,
                            timeout_keep_alive=5, server_header=False, limit_concurrency=max_connections,
                            h11_max_incomplete_event_size=64 * 1024, timeout_graceful_shutdown=3,
                            http=header_timeout_protocol(header_timeout_s, body_timeout_s, header_timeout_s,
                                                         auth=app.state.auth, max_pending=strangers))
    server = uvicorn.Server(config)
    logging.getLogger("uvicorn.access").addFilter(_RedactToken())
    app.state.runs.start()  # here rather than only in the lifespan: a busy runs dir fails loudly
    policy = app.state.policy
    print(f"[refinery serve] http://{host}:{port}/  runs: {runs_dir}  ray: {address or 'embedded per run'}  "
          f"inputs under: {policy.describe()}  max concurrent runs: {max_concurrent}  "
          f"stage modules: {', '.join(app.state.stage_modules) or 'built-in only'}  "
          f"a run's quotas: {_quotas(app.state.runs.limits())}", file=sys.stderr, flush=True)
    server.run()
