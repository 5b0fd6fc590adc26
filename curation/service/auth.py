"""Who may call the service, and which files a submitted DAG may read.

Authentication is one shared bearer token (``Authorization: Bearer T``, or the dashboard's
cookie, which holds a random session id the service issued at sign-in, never the token: signing
out ends that session on the server, and a restart ends them all).
Authorisation of data access is a path policy: every file a DAG names must resolve, after
``..`` and symlinks, under one of the configured roots.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Iterable

from starlette.requests import HTTPConnection

from curation.stages.paths import PathRefused

COOKIE = "refinery_session"
CSRF_HEADER = "x-refinery-csrf"
_SAFE_METHODS = {"GET", "HEAD", "OPTIONS"}
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class TokenError(RuntimeError):
    """No usable token was configured; the service refuses to start without one."""


def load_token(token_file: str | Path | None = None) -> str:
    """The service token: from ``token_file`` if given, else the ``REFINERY_TOKEN`` variable."""
    if token_file:
        p = Path(token_file)
        try:
            token = p.read_text().strip()
        except OSError as e:
            raise TokenError(f"--token-file {p}: {e.strerror}") from None
        if not token:
            raise TokenError(f"--token-file {p}: the file is empty; put a long random token in it")
        with contextlib.suppress(OSError):  # the warning is best effort
            if p.stat().st_mode & (stat.S_IRWXG | stat.S_IRWXO):
                print(f"[refinery serve] warning: {p} is readable by other users; chmod 600 it",
                      file=sys.stderr)
        return token
    token = os.environ.get("REFINERY_TOKEN", "").strip()
    if not token:
        raise TokenError("no token: pass --token-file FILE or set REFINERY_TOKEN "
                         "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))' > token; chmod 600 token)")
    if len(token) < 16:
        print("[refinery serve] warning: the token is shorter than 16 characters", file=sys.stderr)
    return token


#: how long a dashboard session lasts (the cookie's max-age too), and how many may be open at
#: once (past that, the oldest ends: sign-ins cannot grow the service's memory)
SESSION_SECONDS = 7 * 24 * 3600
MAX_SESSIONS = 10_000


class TokenAuth:
    """Checks a request's bearer token or dashboard cookie.

    The cookie holds a random session id issued at sign-in (``new_session``); the service keeps
    only its hash and expiry, so a leaked cookie jar leaks neither the token nor a session
    that was signed out (``end_session``) or outlived ``SESSION_SECONDS``.

    Requests authenticated by cookie must also carry the ``X-Refinery-CSRF`` header on
    state-changing methods: a cross-site form cannot set custom headers, so a page elsewhere
    cannot make a logged-in browser submit or cancel runs.
    """

    def __init__(self, token: str, session_seconds: float = SESSION_SECONDS, max_sessions: int = MAX_SESSIONS):
        if not token:
            raise TokenError("empty token")
        self._token = token.encode()
        self.session_seconds = session_seconds
        self.max_sessions = max_sessions
        self._sessions: dict[str, float] = {}  # sha256(session id) -> expiry (time.time()), oldest first
        self._lock = threading.Lock()

    def token_ok(self, candidate: str | None) -> bool:
        return bool(candidate) and hmac.compare_digest(candidate.encode(), self._token)

    @staticmethod
    def _key(session: str) -> str:
        return hashlib.sha256(session.encode()).hexdigest()

    def new_session(self) -> str:
        """A new session id for a browser that showed the token."""
        session = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[self._key(session)] = time.time() + self.session_seconds
            while len(self._sessions) > self.max_sessions:
                self._sessions.pop(next(iter(self._sessions)))
        return session

    def end_session(self, session: str | None) -> None:
        """Sign out: the session id stops working at once, whoever holds it."""
        if session:
            with self._lock:
                self._sessions.pop(self._key(session), None)

    def cookie_ok(self, candidate: str | None) -> bool:
        if not candidate or len(candidate) > 128:
            return False
        key = self._key(candidate)
        with self._lock:
            expiry = self._sessions.get(key)
            if expiry is not None and expiry < time.time():
                del self._sessions[key]
                expiry = None
        return expiry is not None

    def check(self, conn: HTTPConnection, method: str = "GET") -> tuple[bool, str]:
        """(allowed, reason-if-not)."""
        header = conn.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        if header:
            if scheme.lower() == "bearer" and self.token_ok(value.strip()):
                return True, ""
            return False, "invalid bearer token"
        if self.cookie_ok(conn.cookies.get(COOKIE)):
            if method.upper() not in _SAFE_METHODS and not conn.headers.get(CSRF_HEADER):
                return False, f"cookie-authenticated {method} requests need the {CSRF_HEADER} header"
            return True, ""
        return False, "missing bearer token (Authorization: Bearer <token>)"


# ---------------------------------------------------------------------------------------------
# which files a DAG may read


class PathDenied(PathRefused):
    """A DAG names a location outside the allowed roots."""


#: stage parameters whose file a validator reads whole when a DAG is admitted (``lang_config``,
#: ``calibrate_rules.base``: a preset or a calibration, 5-170 KB as shipped). Their size is
#: capped before anything reads them, and an overlay's ``base`` chain is followed through the
#: policy (roots and cap) before the validator follows it.
READ_WHOLE = frozenset({"lang_config", "base"})
MAX_PARAM_FILE_BYTES = 4 << 20
MAX_BASE_CHAIN = 8


def _has_magic(s: str) -> bool:
    return any(c in s for c in "*?[")


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


class PathPolicy:
    """Local paths must resolve (``..`` and symlinks followed) under a local root; URLs must
    start with an allowed URL root (``s3://bucket/prefix/``). Relative paths are relative to
    ``base_dir``. fsspec chained URLs (``a::b``) are refused: they can hide a second location.
    """

    def __init__(self, roots: Iterable[str | Path], base_dir: str | Path,
                 max_param_file_bytes: int = MAX_PARAM_FILE_BYTES, private: Iterable[str | Path] = ()):
        self.base_dir = os.path.realpath(base_dir)
        self.max_param_file_bytes = max_param_file_bytes
        # files no DAG may name, under a root or not: the service's token file (with no
        # --allowed-root, the base directory that holds it is the root)
        self.private = {os.path.realpath(os.path.join(self.base_dir, os.path.expanduser(str(p)))) for p in private}
        self.local_roots: list[str] = []
        self.url_roots: list[str] = []
        for r in roots:
            r = str(r)
            if r.startswith("file://"):
                r = r[len("file://"):]
            if _SCHEME.match(r):
                if ".." in r.split("/") or "::" in r:
                    raise ValueError(f"allowed root {r!r}: no '..' or '::' in URL roots")
                self.url_roots.append(r if r.endswith("/") else r + "/")
            else:
                self.local_roots.append(os.path.realpath(os.path.join(self.base_dir, os.path.expanduser(r))))
        if not self.local_roots and not self.url_roots:
            self.local_roots.append(self.base_dir)

    def describe(self) -> str:
        return ", ".join(self.local_roots + self.url_roots)

    def _deny(self, where: str, value: str, via_symlink: bool = False) -> PathDenied:
        how = " after following symlinks" if via_symlink else ""
        return PathDenied(f"{where}: {value!r} is outside the allowed roots{how} ({self.describe()})")

    def is_url(self, s: str) -> bool:
        return bool(_SCHEME.match(s)) and not s.startswith("file://")

    def absolute(self, s: str) -> str:
        """A local path or pattern made absolute against ``base_dir`` (not yet resolved)."""
        if s.startswith("file://"):
            s = s[len("file://"):]
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(s)))

    def check_url(self, url: str, where: str) -> str:
        if "::" in url or ".." in url.split("/") or not any(url.startswith(r) for r in self.url_roots):
            raise self._deny(where, url)
        return url

    def check_local(self, path: str, where: str) -> str:
        """The resolved path (symlinks followed) if it is under a local root."""
        plain = self.absolute(path)
        real = os.path.realpath(plain)
        if not any(_within(real, r) for r in self.local_roots):
            raise self._deny(where, path, via_symlink=real != plain)
        if real in self.private:
            raise PathDenied(f"{where}: {path!r} is the service's token file; no DAG may read it")
        return real

    def check_pattern(self, pattern: str, where: str) -> None:
        """Refuse a glob whose fixed part already leaves the roots, before touching the disk
        (so the answer never tells whether a file outside the roots exists)."""
        if "::" in pattern:
            raise self._deny(where, pattern)
        if self.is_url(pattern):
            self.check_url(pattern, where)
            return
        parts = self.absolute(pattern).split("/")
        fixed = []
        for p in parts:
            if _has_magic(p):
                break
            fixed.append(p)
        prefix = "/".join(fixed) or "/"
        real = os.path.realpath(prefix)
        if not any(_within(real, r) for r in self.local_roots):
            raise self._deny(where, pattern, via_symlink=real != os.path.normpath(prefix))

    def guard(self, value: str, field: str) -> str:
        """The path guard of a submitted DAG (``curation.stages.paths``): a stage parameter
        declared as a path, resolved (against ``base_dir``, symlinks followed) and checked
        before any validator opens it; returns the resolved path. A URL must start with a URL
        root. Parameters not declared as paths are data and never come here."""
        if "::" in value:
            raise self._deny(field, value)
        if self.is_url(value):
            return self.check_url(value, field)
        real = self.check_local(value, field)
        if field in READ_WHOLE:
            self._check_read_whole(real, value, field)
        return real

    def _check_read_whole(self, real: str, value: str, field: str) -> None:
        """A parameter file a validator reads whole: at most ``max_param_file_bytes`` (a
        ``ValueError``, which validation reports as 422), opened without blocking (a FIFO is not
        a file), and if it is an overlay, its ``base`` chain under the roots and the cap too."""
        import json

        from curation.text.lang_rules import is_file

        cap, seen, where = self.max_param_file_bytes, set(), value
        for _ in range(MAX_BASE_CHAIN):
            if real in seen:
                raise ValueError(f"{field}: {value!r}: its chain of `base` files comes back to {where!r}")
            seen.add(real)
            try:
                fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK)
            except OSError:
                return  # missing: the validator says so, as it would to anyone
            with os.fdopen(fd, "rb") as f:
                st = os.fstat(fd)
                if not stat.S_ISREG(st.st_mode):
                    raise ValueError(f"{field}: {where!r} is not a regular file")
                data = f.read(cap + 1) if st.st_size <= cap else b""
                if st.st_size > cap or len(data) > cap:
                    raise ValueError(f"{field}: {where!r} is {max(st.st_size, len(data)):,} bytes; the service reads "
                                     f"at most {cap:,} bytes of a parameter file (max_param_file_bytes; a preset is "
                                     "~170 KB)")
            try:
                base = json.loads(data).get("base")
            except (ValueError, AttributeError, RecursionError):
                return  # not an overlay (or not JSON: the validator says so)
            if not isinstance(base, str) or not is_file(base):
                return  # a shipped preset, or no base
            where = base
            real = self.check_local(base, f"{field} (the base of {value!r})")
        raise ValueError(f"{field}: {value!r}: a chain of more than {MAX_BASE_CHAIN} `base` files")
