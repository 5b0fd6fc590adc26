"""``/sql`` in a box: each query runs in a child process that the kernel holds to a memory cap
and that the service kills at the query's deadline.

DuckDB's own limits are not enough for a query a client writes: ``memory_limit`` covers the
buffer manager, not a string or a list built by a scalar function (``repeat(repeat('x', 1e8),
8)`` took the service from 290 MB to 1.96 GB), and ``interrupt()`` is only checked between
chunks (a one-row ``regexp_replace`` chain answered after 67 s against a 10 s limit). So:

- the child is forked from a *fork server* (``_zygote``): a clean process started once
  (without the service's token in its environment), which imported DuckDB and the run
  reader. A fork of it starts in milliseconds and shares those pages; the service's own
  threads, sockets and memory never reach the child;
- the child builds the run's views (``sql_guard.locked_connection``), then caps its address
  space at what it uses plus ``memory_bytes`` (``RLIMIT_AS``) before the client's query runs;
  an allocation past it fails inside DuckDB (413) or kills the child (413 too);
- ``RLIMIT_CPU`` backs the deadline up should the service itself die; no core files;
- the service waits for the answer until ``timeout_s + grace_s`` and then has the fork server
  SIGKILL the child (408). DuckDB's interrupt at ``timeout_s`` still answers the ordinary slow
  query cleanly. The answer comes back as JSON over a socket, read up to a size cap.

Answers name no absolute path of this machine: the run directory becomes ``RUN``, the base
directory ``.``, the home directory ``~`` (a query that rewrites a path before returning it
can still learn the layout: no secret is there).
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from curation.service.sql_guard import QueryResult, SqlRejected, check_select

MiB = 1 << 20
#: what the fork server imports once, so a query's child does not: DuckDB, the run reader, the
#: DAG parser
PRELOAD = ("curation.service.sql_guard", "curation.pipeline.stats", "curation.pipeline.dag")
_HEADER = struct.Struct("!I")
_MAX_JOB = 1 << 20


# ---------------------------------------------------------------------------------------------
# the fork server (its own process) and a query's child (forked from it)


def _vm_size() -> int:
    """This process's address space in bytes (``VmSize``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise OSError("no VmSize in /proc/self/status")


def _cap_memory(extra: int) -> None:
    import resource

    limit = _vm_size() + extra
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _hide(v: Any, subs: list[list[str]]) -> Any:
    if isinstance(v, str):
        for old, new in subs:
            if old in v:
                v = v.replace(old, new)
        return v
    if isinstance(v, list):
        return [_hide(x, subs) for x in v]
    if isinstance(v, dict):
        return {k: _hide(x, subs) for k, x in v.items()}
    return v


def _answer(job: dict) -> dict:
    """Run one job (in the child): the answer as a JSON-ready dict."""
    import resource

    from curation.pipeline.dag import StageModuleRefused, stage_modules_allowed
    from curation.pipeline.stats import RunNotFound
    from curation.service.sql_guard import run_select

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (job["cpu_s"], job["cpu_s"] + 1))
    subs = job["hide"]
    try:
        os.chdir(job["run_dir"])  # a relative path in the query means a file of the run
        with stage_modules_allowed(tuple(job["stage_modules"])):
            res = run_select(job["run_dir"], job["query"], before_query=lambda: _cap_memory(job["memory_bytes"]),
                             **job["kw"])
        return {"ok": _hide(res.__dict__, subs)}
    except SqlRejected as e:
        return {"status": e.status, "detail": _hide(str(e), subs)}
    except RunNotFound as e:
        return {"status": 404, "detail": _hide(str(e), subs)}
    except StageModuleRefused as e:
        return {"status": 403, "detail": f"the run's DAG: {e.brief}"}
    except MemoryError:
        return {"status": 413}
    except Exception as e:  # noqa: BLE001 - the client's query: a 4xx with one line, never a 500
        first = str(e).splitlines()[0] if str(e) else ""
        return {"status": 422, "detail": _hide(f"q: {type(e).__name__}: {first}", subs)}


def _child(out: socket.socket, job: dict) -> None:
    try:
        try:
            body = json.dumps(_answer(job)).encode()
        except MemoryError:
            body = b'{"status": 413}'
        out.sendall(body)
    finally:
        os._exit(0)


def _zygote(fd: int) -> None:
    """The fork server's loop: a job (JSON, with the socket its answer goes to) -> a forked
    child, whose pid goes back; ``kill PID`` -> SIGKILL to that child if it is still ours.
    Single-threaded but for idle library threads (OpenBLAS kept at one, jemalloc's, which
    forks safely), so forking here is safe. Ends when the service closes its socket."""
    for m in PRELOAD:
        __import__(m)
    ctl = socket.socket(fileno=fd)
    live: set[int] = set()
    while True:
        ready, _, _ = select.select([ctl], [], [], 1.0)
        while live:  # reap
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                live.clear()
                break
            if not pid:
                break
            live.discard(pid)
        if not ready:
            continue
        try:
            data, fds, _, _ = socket.recv_fds(ctl, _MAX_JOB, 1)
        except OSError:
            data, fds = b"", []
        if not data:
            for pid in live:
                os.kill(pid, signal.SIGKILL)
            os._exit(0)
        msg = json.loads(data)
        if msg.get("kill"):
            if msg["kill"] in live:
                os.kill(msg["kill"], signal.SIGKILL)
            continue
        out = socket.socket(fileno=fds[0])
        pid = os.fork()
        if pid == 0:
            ctl.close()
            _child(out, msg)
        out.close()
        live.add(pid)
        ctl.send(_HEADER.pack(pid))


class _ForkServer:
    """The service's handle on the fork server: started on first use (and again if it died)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._ctl: socket.socket | None = None

    def _start(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = {k: v for k, v in os.environ.items() if k != "REFINERY_TOKEN"}  # a query needs no token
        env.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
        root = str(Path(__file__).resolve().parents[2])  # where `curation` is imported from
        env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
        # -P: no current directory on sys.path (a run's or the base dir's files are data, not modules)
        self._proc = subprocess.Popen(
            [sys.executable, "-P", "-c", f"from curation.service.sql_box import _zygote; _zygote({theirs.fileno()})"],
            pass_fds=[theirs.fileno()], env=env, cwd="/", stdin=subprocess.DEVNULL)
        theirs.close()
        self._ctl = ours

    def ensure_running(self) -> None:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._start()

    def fork(self, job: dict, out: socket.socket) -> int:
        """A child running ``job``, writing its answer to ``out``; its pid."""
        data = json.dumps(job).encode()
        for attempt in (0, 1):
            with self._lock:
                if self._proc is None or self._proc.poll() is not None:
                    self._start()
                with contextlib.suppress(OSError):  # a broken socket: the fork server died
                    socket.send_fds(self._ctl, [data], [out.fileno()])
                    reply = self._ctl.recv(_HEADER.size)
                    if len(reply) == _HEADER.size:
                        return _HEADER.unpack(reply)[0]
                # the fork server died under us: start another, once
                self._proc.kill()
                self._proc = None
        raise SqlRejected("q: the query process could not be started; retry", 503)

    def kill(self, pid: int) -> None:
        with self._lock:
            if self._ctl is not None:
                with contextlib.suppress(OSError):  # the fork server is gone, and its children with it
                    self._ctl.send(json.dumps({"kill": pid}).encode())

    def stop(self) -> None:
        with self._lock:
            if self._ctl is not None:
                self._ctl.close()
                self._ctl = None
            if self._proc is not None:
                try:
                    self._proc.wait(5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                self._proc = None


FORK_SERVER = _ForkServer()


def warm_up() -> None:
    """Start the fork server now (about a second), so the first query does not wait for it."""
    FORK_SERVER.ensure_running()


@dataclass
class SqlBox:
    """Runs ``/sql`` queries in boxed children: ``timeout_s`` (DuckDB's interrupt; the child is
    killed ``grace_s`` later), ``memory_bytes`` the query may add to the child's address space,
    ``duckdb_memory`` DuckDB's own buffer limit inside it."""

    timeout_s: float = 10.0
    memory_bytes: int = 1024 * MiB
    duckdb_memory: str = "512MB"
    grace_s: float = 1.0
    stage_modules: tuple[str, ...] = ()
    hide: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def _memory_refusal(self, how: str = "") -> SqlRejected:
        return SqlRejected(f"q: the query needed more than the {self.memory_bytes // MiB} MiB of memory a /sql "
                           f"query may use{how}; stopped", 413)

    def _time_refusal(self) -> SqlRejected:
        return SqlRejected(f"q: query exceeded the {self.timeout_s:g} s time limit; stopped", 408)

    def run(self, run_dir: str | Path, query: str, max_rows: int = 1000, max_bytes: int = 4 * MiB,
            max_cell_chars: int = 10_000) -> QueryResult:
        """The query's answer, or SqlRejected with the status that says which limit cut it."""
        check_select(query)  # 400 / 403 without a process
        run_dir = str(Path(run_dir).resolve())
        subs = sorted({(run_dir, "RUN"), *self.hide}, key=lambda s: -len(s[0]))
        job = {"run_dir": run_dir, "query": query, "memory_bytes": self.memory_bytes,
               "cpu_s": int(self.timeout_s + self.grace_s) + 5, "stage_modules": list(self.stage_modules),
               "hide": [list(x) for x in subs],
               "kw": {"max_rows": max_rows, "timeout_s": self.timeout_s, "max_cell_chars": max_cell_chars,
                      "memory_limit": self.duckdb_memory, "max_bytes": max_bytes}}
        # the answer: at most max_bytes of cells, JSON-escaped (up to 6 bytes a character), and the rest
        cap = 6 * max_bytes + 64 * max_rows + MiB
        ours, theirs = socket.socketpair()
        deadline = time.monotonic() + self.timeout_s + self.grace_s
        chunks: list[bytes] = []
        size, killed, too_big, pid = 0, False, False, None
        try:
            pid = FORK_SERVER.fork(job, theirs)
            theirs.close()
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    killed = True
                    break
                ready, _, _ = select.select([ours], [], [], left)
                if not ready:
                    continue
                chunk = ours.recv(1 << 16)
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
                if size > cap:
                    killed = too_big = True
                    break
        finally:
            theirs.close()
            ours.close()
            if killed and pid:
                FORK_SERVER.kill(pid)
        if too_big:
            raise SqlRejected(f"q: the answer is larger than {cap // MiB} MiB; select fewer or shorter columns", 413)
        if killed:
            raise self._time_refusal()
        try:
            msg = json.loads(b"".join(chunks)) if chunks else None
        except ValueError:
            msg = None
        if not isinstance(msg, dict):  # died without a whole answer: the kernel's memory cap
            raise self._memory_refusal(" (the query process ended without answering)")
        if "ok" in msg:
            return QueryResult(**msg["ok"])
        status = msg.get("status", 422)
        if status == 413:
            raise self._memory_refusal()
        if status == 408:
            raise self._time_refusal()
        raise SqlRejected(msg.get("detail") or "q: the query failed", status)


def server_paths(base_dir: str | Path) -> tuple[tuple[str, str], ...]:
    """Prefixes an answer must not show, with what stands for them."""
    out = [(str(base_dir).rstrip("/") + "/", ""), (str(base_dir).rstrip("/"), ".")]
    home = os.path.expanduser("~")
    if home not in ("/", "~", ""):
        out.append((home, "~"))
    if sys.prefix not in ("/", "/usr", "/usr/local"):
        out.append((sys.prefix, "<python>"))
    return tuple(out)
