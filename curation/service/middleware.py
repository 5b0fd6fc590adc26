"""The ASGI middleware in front of every route: the request size limit, the token check and the
security headers (``GuardMiddleware``), and the operator's stage-module allow-list
(``StageModulesMiddleware``)."""

from __future__ import annotations

from typing import Iterable

from fastapi import HTTPException
from fastapi.responses import JSONResponse
from starlette.requests import ClientDisconnect, HTTPConnection

from curation.service.auth import TokenAuth

PUBLIC = {"/healthz", "/"}  # "/" checks the token itself, to answer with the login form
#: the body a route anyone may call can send: the login form is ``token=`` and a token
PUBLIC_MAX_BODY = 4096
BASE_HEADERS = [(b"x-content-type-options", b"nosniff"), (b"referrer-policy", b"no-referrer"),
                (b"x-frame-options", b"DENY")]


class GuardMiddleware:
    """Request size limit, token check and security headers, in front of every route. The
    public routes (``/healthz``, the login form) take a body of ``public_max_body_bytes`` at most.

    Written as plain ASGI so it runs before any body is read: an oversized upload is refused
    from its Content-Length, and a body without one is cut off as it streams in.
    """

    def __init__(self, app, auth: TokenAuth, max_body_bytes: int, public: Iterable[str] = PUBLIC,
                 public_max_body_bytes: int = PUBLIC_MAX_BODY):
        self.app = app
        self.auth = auth
        self.max_body_bytes = max_body_bytes
        self.public_max_body_bytes = public_max_body_bytes
        self.public = set(public)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_secure(message):
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                headers += [h for h in BASE_HEADERS if h[0] not in names]
                if b"cache-control" not in names:
                    headers.append((b"cache-control", b"no-store"))
                message = {**message, "headers": headers}
            await send(message)

        conn = HTTPConnection(scope)
        limit = self.public_max_body_bytes if scope["path"] in self.public else self.max_body_bytes
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

        try:
            await self.app(scope, limited_receive, send_secure)
        except ClientDisconnect:
            # the client went away mid-body, or the server cut it off at the body deadline
            # (``app.header_timeout_protocol``): nobody is left to answer
            return


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
