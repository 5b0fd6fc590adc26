"""Pages and service routes: liveness, the sign-in form and the session cookie, the dashboard
page and its static files, the API's OpenAPI document and its reference page (``/docs``: the
routes as plain HTML, no script: Swagger UI would load one from a CDN)."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse

from curation.service.auth import COOKIE, SESSION_SECONDS, TokenAuth
from curation.service.state import ServiceState

STATIC = Path(__file__).resolve().parents[1] / "static"
PAGE_CSP = ("default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")

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


def _login_page(error: str = "", status: int = 401) -> HTMLResponse:
    import html

    return HTMLResponse(_LOGIN.replace("{error}", html.escape(error)), status_code=status,
                        headers={"Content-Security-Policy": _LOGIN_CSP})


def _session_redirect(request: Request, auth: TokenAuth, secure: bool) -> RedirectResponse:
    # 303 to a clean URL: the token leaves the address bar and the browser history. Secure when
    # the browser speaks https: to a --behind-tls-proxy service, or through a --trusted-proxy
    # that says so (X-Forwarded-Proto, which uvicorn believes from that proxy only)
    resp = RedirectResponse("/", status_code=303)
    resp.set_cookie(COOKIE, auth.new_session(), httponly=True, samesite="strict", path="/",
                    secure=secure or request.url.scheme == "https", max_age=SESSION_SECONDS)
    return resp


_DOCS_CSP = ("default-src 'none'; style-src 'self'; img-src 'self' data:; form-action 'none'; "
             "frame-ancestors 'none'; base-uri 'none'")


def _docs_page(spec: dict) -> HTMLResponse:
    """The API reference from the OpenAPI document: each route's method, path, summary and
    parameters, in plain HTML under a CSP that allows no script at all."""
    import html

    esc = html.escape
    rows = []
    for path, ops in spec.get("paths", {}).items():
        for method, op in ops.items():
            params = ", ".join(f"{p['name']} ({p.get('in')})" for p in op.get("parameters", []))
            body = ", ".join(op.get("requestBody", {}).get("content", {}))
            doc = (op.get("description") or op.get("summary") or "").strip()
            rows.append(f"<tr><td><b>{esc(method.upper())}</b></td><td><code>{esc(path)}</code></td>"
                        f"<td>{esc(doc)}</td><td>{esc(params)}</td><td>{esc(body)}</td></tr>")
    page = ('<!doctype html><html lang="en"><head><meta charset="utf-8"><title>refinery API</title>'
            '<link rel="icon" href="data:,"><link rel="stylesheet" href="/static/app.css"></head><body><main>'
            '<div class="card"><h2>refinery API</h2><p class="muted">Every route but <code>/healthz</code> needs '
            '<code>Authorization: Bearer &lt;token&gt;</code>. The OpenAPI document is at '
            '<a href="/openapi.json">/openapi.json</a> (load it into any OpenAPI viewer).</p>'
            '<table><tr><th>method</th><th>path</th><th>what it does</th><th>parameters</th><th>body</th></tr>'
            + "".join(rows) + "</table></div></main></body></html>")
    return HTMLResponse(page, headers={"Content-Security-Policy": _DOCS_CSP})


def add_routes(r: APIRouter, state: ServiceState) -> None:
    auth = state.auth

    @r.get("/healthz", include_in_schema=True, tags=["service"])
    async def healthz() -> dict:  # on the event loop: answers even when every worker thread is busy
        """Liveness, without authentication."""
        return {"status": "ok"}

    @r.get("/", include_in_schema=False)
    def index(request: Request, token: str | None = None):
        if token is not None:
            if auth.token_ok(token):
                return _session_redirect(request, auth, state.cookie_secure)
            return _login_page("That token is not valid.")
        ok, _ = auth.check(request)
        if not ok:
            return _login_page()
        return FileResponse(STATIC / "index.html", media_type="text/html",
                            headers={"Content-Security-Policy": PAGE_CSP})

    @r.post("/", include_in_schema=False)
    async def login(request: Request):
        form = await request.form(max_files=0, max_fields=4)
        token = form.get("token")
        if isinstance(token, str) and auth.token_ok(token.strip()):
            return _session_redirect(request, auth, state.cookie_secure)
        return _login_page("That token is not valid.")

    @r.get("/logout", include_in_schema=False)
    def logout(request: Request):
        auth.end_session(request.cookies.get(COOKIE))  # the session ends here, not only in this browser
        resp = RedirectResponse("/", status_code=303)
        resp.delete_cookie(COOKIE, path="/")
        return resp

    @r.get("/static/{name}", include_in_schema=False)
    def static(name: str):
        path = STATIC / name
        if "/" in name or name.startswith(".") or not path.is_file():
            raise HTTPException(404, "not found")
        return FileResponse(path)

    @r.get("/openapi.json", include_in_schema=False)
    def openapi_json(request: Request):
        return JSONResponse(request.app.openapi())

    @r.get("/docs", include_in_schema=False)
    def docs(request: Request):
        return _docs_page(request.app.openapi())

