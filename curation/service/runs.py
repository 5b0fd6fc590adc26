"""Runs submitted to the service: a FIFO queue with a concurrency limit, and processes that
outlive the service. What a submitted DAG must pass first is ``curation.service.admission``.

The run directory is the record; the service keeps nothing else. Besides what ``refinery run``
writes (``dag.yaml``, shards, manifests, ``progress.json``) the service adds:

```
RUN/submitted.yaml   the DAG text as submitted
RUN/service.json     {state: queued|started|cancelled, pid, pid_start, submitted, started, attempt, ...}
RUN/service.log      stdout+stderr of the run process, one header line per attempt
```

Each run is ``python -m curation.cli run RUN/dag.yaml --out RUN -q [--address A]`` in its own
session (process group), so restarting the service never kills a run, and cancelling kills
the whole group (the driver and, on an embedded cluster, the Ray processes it started; on a
shared cluster Ray cleans up the tasks of a driver that died). The state a client sees is
derived, not stored: service.json says what the service asked for, pid liveness says whether
the process still runs, and progress.json (written by the run itself) says how it ended.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from curation.io import files
from curation.pipeline.rundir import RunDir
from curation.service.admission import (MAX_BLOOM_BYTES, MAX_ECHO, MAX_INPUT_FILES, MAX_PATTERNS, MAX_SHARDS,
                                        MIN_SPLIT_BYTES, MiB, AdmissionLimits, SubmitError, admit_dag,
                                        check_stage_modules, dump_yaml, read_dag_file)
from curation.service.auth import PathPolicy

SERVICE_FILE = "service.json"
SUBMITTED_FILE = "submitted.yaml"
LOG_FILE = "service.log"
RUN_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
ACTIVE_STATES = ("queued", "running")
#: a run's limits in `refinery serve`, enforced while it runs (admission's are in admission.py)
MAX_RUN_BYTES = 100 << 30  # a run's directory on disk (`refinery serve --max-run-bytes`), enforced by the run
MAX_RUN_SECONDS = 24 * 3600  # a run's wall time in `refinery serve` (--max-run-seconds; 0: none)
MIN_RUN_MEMORY = 2 << 30   # a Ray worker alone reserves ~1.5 GB of heap and thread stacks (RLIMIT_DATA)
QUOTA_ENV = "REFINERY_MAX_RUN_BYTES"  # ``curation.pipeline.quota.ENV``: the run's disk quota, for the run


class QueueFull(RuntimeError):
    """``max_queued`` runs are already waiting (HTTP 429)."""


_ABS_PATH = re.compile(r"(?<![\w.:/%])/([\w.+@~-]+)(?:/[\w.+@~-]*)+")


def public_message(message: str, base_dir: str | Path) -> str:
    """A message fit for a client: paths under the base directory said relative to it, any other
    absolute path of this machine hidden, and an echoed value (``got ...``) cut to ``MAX_ECHO``."""
    base = str(base_dir).rstrip("/") + "/"
    message = message.replace(base, "").replace(base.rstrip("/"), ".")
    # an absolute path whose top directory exists here (/home/..., /tmp/...), not "a / b" or "/runs/x"
    message = _ABS_PATH.sub(lambda m: "<server path>" if os.path.isdir("/" + m.group(1)) and m.group(1) != "runs"
                            else m.group(), message)
    i = message.find("(got ")
    if i >= 0 and len(message) - i > MAX_ECHO + 10:
        message = message[: i + 5 + MAX_ECHO] + "…)"
    return message if len(message) <= 4 * MAX_ECHO * 5 else message[: 4 * MAX_ECHO * 5] + "…"


class RunMissing(KeyError):
    """No run with that id in the runs directory."""


class RunConflict(RuntimeError):
    """The operation does not apply to the run's current state (HTTP 409)."""


class RunsDirBusy(RuntimeError):
    """Another service process already manages this runs directory."""


# ---------------------------------------------------------------------------------------------
# processes


def process_identity(pid: int) -> str | None:
    """The process's start time (clock ticks since boot) if it is alive and not a zombie.

    Comparing it with the value recorded at launch tells our run apart from an unrelated
    process that reused the pid after a service restart.
    """
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return None
    except OSError:
        raw = ""
    if not raw:  # no /proc (macOS): signal 0 says alive, without identity
        try:
            with contextlib.suppress(PermissionError):  # alive, but someone else's
                os.kill(pid, 0)
        except ProcessLookupError:
            return None
        return "unknown"
    fields = raw.rsplit(")", 1)[1].split()
    if fields[0] in ("Z", "X"):  # exited; an orphan's parent may never reap it
        return None
    return fields[19]


def _find_run_process(run_dir: Path) -> int | None:
    """The pid of a ``refinery run`` writing ``run_dir``, found by its command line. Used only
    when the service stopped between launching a run and recording its pid."""
    want = str(run_dir)
    for d in Path("/proc").glob("[0-9]*"):
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "curation.cli" in args and "run" in args and "--out" in args:
            i = args.index("--out")
            if i + 1 < len(args) and args[i + 1] == want:
                return int(d.name)
    return None


def _limit_memory(pid: int, limit: int) -> None:
    """The kernel's cap on the heap of a run process and of every process it starts (its Ray
    workers on an embedded cluster). RLIMIT_DATA, not RLIMIT_AS: each Ray process maps the
    whole object store (GBs of shared address space it does not own). Set right after the
    process starts, before it has allocated more than an interpreter's start-up."""
    import resource

    if hasattr(resource, "prlimit"):
        with contextlib.suppress(OSError, ValueError):  # gone already, or a platform without it
            resource.prlimit(pid, resource.RLIMIT_DATA, (limit, limit))


def session_memory(sessions: set[int]) -> dict[int, int]:
    """Private resident memory (RssAnon: heap, not shared object-store pages or files), summed
    over the live processes of each session (a run and every process it started)."""
    out = dict.fromkeys(sessions, 0)
    try:
        procs = os.listdir("/proc")
    except OSError:
        return out
    for name in procs:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
            sid = int(fields[3])
            if sid not in out or fields[0] in (b"Z", b"X"):
                continue
            with open(f"/proc/{name}/status", "rb") as f:
                for line in f:
                    if line.startswith(b"RssAnon:"):
                        out[sid] += int(line.split()[1]) * 1024
                        break
        except (OSError, ValueError, IndexError):
            continue
    return out


def _read_json(p: Path) -> dict | None:
    try:
        return json.loads(p.read_text())
    except (OSError, ValueError):
        return None


def _read_text(p: Path) -> str:
    try:
        return p.read_text()
    except OSError:
        return ""


def _fresh(meta: dict, progress: dict | None) -> bool:
    """Whether progress.json belongs to the current attempt (a resumed run keeps the old file
    until its new process gets going)."""
    if not progress:
        return False
    if not meta:
        return True
    started = meta.get("started")
    return started is not None and progress.get("started", 0) >= started - 1


def _tail(p: Path, max_bytes: int = 4000, lines: int = 20) -> str:
    try:
        with open(p, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            data = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


class RunManager:
    """Admits DAGs, queues them FIFO, runs at most ``max_concurrent`` at a time, and answers
    what each run is doing. Safe to restart at any moment: all state is in the run directories.
    """

    def __init__(self, runs_dir: str | Path, policy: PathPolicy, address: str | None = None,
                 max_concurrent: int = 2, poll_s: float = 0.5, cancel_grace_s: float = 10.0,
                 python: str = sys.executable, stage_modules: tuple[str, ...] = (),
                 max_queued: int | None = None, max_run_seconds: float | None = None,
                 max_patterns: int = MAX_PATTERNS, max_input_files: int = MAX_INPUT_FILES,
                 max_bloom_bytes: int = MAX_BLOOM_BYTES, min_split_bytes: int = MIN_SPLIT_BYTES,
                 max_shards: int = MAX_SHARDS, max_run_bytes: int | None = None,
                 max_run_memory: int | None = None, memory_poll_s: float = 2.0):
        self.runs_dir = Path(runs_dir).resolve()
        # a run's quotas (None: none): its directory's bytes on disk, enforced by the run itself
        # (curation.pipeline.quota); its memory, the kernel's RLIMIT_DATA on each of its processes
        # and the private resident memory of all of them together, watched here
        self.max_run_bytes = max_run_bytes or None
        self.max_run_memory = max(MIN_RUN_MEMORY, max_run_memory) if max_run_memory else None
        self.memory_poll_s = memory_poll_s
        self._memory_checked = 0.0
        # admission's caps (AdmissionLimits)
        self.max_patterns, self.max_input_files = max_patterns, max_input_files
        self.max_bloom_bytes, self.min_split_bytes, self.max_shards = max_bloom_bytes, min_split_bytes, max_shards
        self._cancelled: set[str] = set()  # cancelled runs still on disk: they count against max_queued
        self.max_queued = max_queued  # None: no cap
        self.max_run_seconds = max_run_seconds or None  # None: runs take as long as they take
        self.policy = policy
        self.stage_modules = tuple(stage_modules)
        self.address = address or None
        self.max_concurrent = max(1, int(max_concurrent))
        self.poll_s = poll_s
        self.cancel_grace_s = cancel_grace_s
        self.python = python
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._children: dict[str, subprocess.Popen] = {}
        self._active: set[str] = set()
        self._lock_fd: int | None = None
        self._orders: dict[str, tuple[int, list[str]]] = {}  # dag.yaml path -> (mtime_ns, node order)

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, schedule: bool = True) -> None:
        """Take the runs directory, rediscover unfinished runs, start the scheduler thread.
        Idempotent, so ``serve`` can fail fast on a busy directory before the server starts.
        ``schedule=False`` (``refinery delete`` without a service): only take the directory and
        read the runs' states; nothing is launched, stopped or cleaned in the background."""
        if self._thread is not None and self._thread.is_alive():
            return
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.runs_dir / ".service.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunsDirBusy(f"{self.runs_dir}: another `refinery serve` manages this runs directory") from None
        self._lock_fd = fd
        for trash in self.runs_dir.glob(".deleting-*") if schedule else ():  # deletions a stop interrupted
            threading.Thread(target=shutil.rmtree, args=(trash,), kwargs={"ignore_errors": True}, daemon=True).start()
        with self._lock:
            for rid in self.run_ids():
                meta = self._meta(rid)
                if meta.get("state") == "started" and not meta.get("pid") and not meta.get("launch_error"):
                    pid = _find_run_process(self.runs_dir / rid)
                    if pid:
                        meta.update(pid=pid, pid_start=process_identity(pid))
                    else:
                        meta["launch_error"] = "the service stopped while launching this run; resume it"
                    self._write_meta(rid, meta)
                if meta.get("state") in ("queued", "started", "cancelled"):
                    self._active.add(rid)
                if meta.get("state") == "cancelled":
                    self._cancelled.add(rid)
                if schedule and meta.get("state") == "cancelled" and self._alive(rid, meta):
                    # cancelled just before a restart: finish stopping it (SIGKILL after the grace)
                    threading.Thread(target=self._finish_cancel, args=(rid,), daemon=True,
                                     name=f"refinery-cancel-{rid}").start()
        if not schedule:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="refinery-run-scheduler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop scheduling. Running runs keep running: they belong to their own sessions."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception as e:  # keep scheduling; the next tick retries
                print(f"[refinery serve] scheduler: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            self._wake.wait(self.poll_s)
            self._wake.clear()

    # -- files -------------------------------------------------------------------------------

    def run_dir(self, run_id: str) -> Path:
        """The directory of an existing run; RunMissing for anything else (ids are one path
        component, so no id can point outside the runs directory)."""
        if not RUN_ID.match(run_id or ""):
            raise RunMissing(run_id)
        d = self.runs_dir / run_id
        if not ((d / SERVICE_FILE).exists() or Path(RunDir(d).dag_file).exists()):
            raise RunMissing(run_id)
        return d

    def run_ids(self) -> list[str]:
        """Every run directory here (made by the service or by `refinery run`), unordered."""
        out = []
        for d in self.runs_dir.iterdir():
            if d.is_dir() and RUN_ID.match(d.name) and ((d / SERVICE_FILE).exists() or Path(RunDir(d).dag_file).exists()):
                out.append(d.name)
        return out

    def _meta(self, rid: str) -> dict:
        return _read_json(self.runs_dir / rid / SERVICE_FILE) or {}

    def _write_meta(self, rid: str, meta: dict) -> None:
        files.write_json(self.runs_dir / rid / SERVICE_FILE, meta, indent=1)

    # -- state -------------------------------------------------------------------------------

    def _alive(self, rid: str, meta: dict) -> bool:
        child = self._children.get(rid)
        if child is not None and child.pid == meta.get("pid"):
            code = child.poll()
            if code is None:
                return True
            self._reap(rid, code, meta)
            return False
        pid = meta.get("pid")
        if not pid:
            return False
        ident = process_identity(int(pid))
        return ident is not None and (ident == meta.get("pid_start") or ident == "unknown"
                                      or meta.get("pid_start") in (None, "unknown"))

    def _reap(self, rid: str, code: int, meta: dict | None = None) -> None:
        """Record a child's exit; updates ``meta`` in place so a caller holding it stays current."""
        self._children.pop(rid, None)
        meta = meta if meta is not None else self._meta(rid)
        meta["exit_code"] = code
        meta["ended"] = time.time()
        self._write_meta(rid, meta)

    def _derive(self, rid: str, meta: dict, progress: dict | None) -> tuple[str, str | None]:
        """(state, error): queued, running, done, failed, cancelled, or unknown."""
        want = meta.get("state")
        if not meta:  # a run directory made by `refinery run` itself, not by the service
            return ((progress or {}).get("state") or "unknown"), (progress or {}).get("error")
        if want == "queued":
            return "queued", None
        alive = self._alive(rid, meta)
        if want == "cancelled":
            if meta.get("timed_out"):
                return "cancelled", f"timed out: ran longer than the service's limit of {meta['timed_out']:g} s"
            if meta.get("over_memory"):
                return "cancelled", (f"out of memory: its processes held {meta['over_memory'] / MiB:,.0f} MiB, past "
                                     f"the run's limit of {meta['memory_limit'] / MiB:,.0f} MiB (the service's "
                                     "--max-run-memory); stopped")
            return "cancelled", None
        if meta.get("launch_error"):
            return "failed", meta["launch_error"]
        if alive or not meta.get("pid"):  # no pid yet: being launched right now (under the lock)
            return "running", None
        fresh = _fresh(meta, progress)
        if fresh and progress.get("state") == "done":
            return "done", None
        if fresh and progress.get("state") == "failed":
            return "failed", progress.get("error")
        code = meta.get("exit_code")
        how = f"exit code {code}" if code is not None else "it is no longer running"
        tail = _tail(self.runs_dir / rid / LOG_FILE, lines=5)
        return "failed", f"the run process stopped without finishing ({how}); resume to continue" + \
            (f"\n{tail}" if tail else "")

    def describe(self, run_id: str, detail: bool = True) -> dict[str, Any]:
        """What a client sees of one run: state, progress, timings (and per-stage counters)."""
        d = self.run_dir(run_id)
        progress = _read_json(Path(RunDir(d).progress_file))
        with self._lock:  # service.json is rewritten under the lock (launch, reap): read it there too
            meta = self._meta(run_id)
            state, error = self._derive(run_id, meta, progress)
        fresh = _fresh(meta, progress)
        progress = progress or {}
        phases = progress.get("phases", {}) if fresh else {}
        total = sum(p.get("total", 0) for p in phases.values())
        done = sum(p.get("done", 0) for p in phases.values())
        frac = 1.0 if state == "done" else (done / total if total else 0.0)
        started = meta.get("started") or progress.get("started")
        finished = progress.get("finished") if fresh and state in ("done", "failed") else None
        if state == "cancelled":
            finished = meta.get("cancelled_at")
        elif state == "failed" and finished is None:
            finished = meta.get("ended")
        end = finished or (time.time() if state == "running" else None)
        info: dict[str, Any] = {
            "id": run_id,
            "name": meta.get("name") or progress.get("name"),
            "state": state,
            "error": error,
            "submitted": meta.get("submitted"),
            "started": started if state != "queued" else None,
            "finished": finished,
            "elapsed_s": round(end - started, 3) if (end and started and state != "queued") else None,
            "progress": round(frac, 4),
            "attempt": meta.get("attempt"),
            "managed": bool(meta),
            "timed_out": bool(meta.get("timed_out")),
            "limits": meta.get("limits"),
        }
        if error:
            info["error"] = public_message(error, self.policy.base_dir)
        if detail:
            stages = progress.get("stages", {}) if fresh else {}
            order = self._node_order(d)
            info.update({
                "pid": meta.get("pid") if state == "running" else None,
                "exit_code": meta.get("exit_code"),
                "updated": progress.get("updated") if fresh else None,
                "phases": phases,
                "stages": [{"stage": n, **stages[n]} for n in order if n in stages]
                + [{"stage": n, **v} for n, v in stages.items() if n not in order],
                "nodes": order,
                "command": [public_message(a, self.policy.base_dir) for a in meta.get("command") or []] or None,
                "log_tail": public_message(_tail(d / LOG_FILE), self.policy.base_dir),
            })
        return info

    def _node_order(self, d: Path) -> list[str]:
        """Inputs then stages, as in dag.yaml. Cached by mtime: parsing the YAML is most of
        the cost of a run description."""
        p = Path(RunDir(d).dag_file)
        try:
            mtime = p.stat().st_mtime_ns
        except OSError:
            return []
        hit = self._orders.get(str(p))
        if hit and hit[0] == mtime:
            return hit[1]
        data = read_dag_file(p)
        order = (list(data.get("inputs") or {}) + list(data.get("stages") or {})) if isinstance(data, dict) else []
        self._orders[str(p)] = (mtime, order)
        return order

    def list_runs(self) -> list[dict[str, Any]]:
        """Every run in the runs directory, newest submission first."""
        out = []
        for rid in self.run_ids():
            try:
                out.append(self.describe(rid, detail=False))
            except RunMissing:  # deleted while listing
                continue
        out.sort(key=lambda r: (r.get("submitted") or r.get("started") or 0, r["id"]), reverse=True)
        return out

    # -- operations --------------------------------------------------------------------------

    def submit(self, text: str, where: str = "submitted.yaml", deadline: float | None = None) -> dict[str, Any]:
        """Admit a DAG (SubmitError if refused) and queue it (QueueFull past ``max_queued``).
        Returns the run's description. ``deadline`` (``time.monotonic()``): past it, nothing is
        created (the client was already told the admission timed out)."""
        if deadline is not None and time.monotonic() > deadline:
            raise SubmitError(f"{where}: waited too long for validation; no run was created", 503)
        self._check_queue()  # before the admission work too: a full queue costs nothing to refuse
        limits = AdmissionLimits(self.max_patterns, self.max_input_files, deadline, self.max_bloom_bytes,
                                 self.min_split_bytes, self.max_shards, self.max_run_bytes)
        dag = admit_dag(text, self.policy, where, self.stage_modules, limits)
        if deadline is not None and time.monotonic() > deadline:
            raise SubmitError(f"{where}: validation took too long; no run was created", 503)
        rid = f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
        d = self.runs_dir / rid
        now = time.time()
        with self._lock:
            self._check_queue()
            d.mkdir(parents=True)
            # dag.yaml as `refinery run` itself would write it (the same data, which is what it
            # compares), so the run accepts this directory; LibYAML: 90,000 pinned paths in ~1 s
            files.write_text(RunDir(d).dag_file, dump_yaml(dag.to_dict()))
            (d / SUBMITTED_FILE).write_text(text)
            self._write_meta(rid, {"id": rid, "name": dag.name, "state": "queued", "submitted": now,
                                   "queued_at": now, "attempt": 1})
            self._active.add(rid)
        self._wake.set()
        return self.describe(rid)

    def _check_queue(self) -> None:
        if self.max_queued is None:
            return
        with self._lock:
            queued = sum(1 for rid in self._active if self._meta(rid).get("state") == "queued")
            kept = len(self._cancelled)
        if queued + kept >= self.max_queued:
            if kept:
                raise QueueFull(f"{queued} runs are queued and {kept} cancelled runs are kept (the service's limit is "
                                f"{self.max_queued} together); delete cancelled runs (DELETE /runs/ID) or retry when "
                                "some have started")
            raise QueueFull(f"{queued} runs are already queued (the service's limit is {self.max_queued}); "
                            "retry when some have started")

    def cancel(self, run_id: str) -> dict[str, Any]:
        """Stop a queued or running run: the whole process group gets SIGTERM, then SIGKILL
        after ``cancel_grace_s`` if anything is left."""
        self.run_dir(run_id)
        with self._lock:
            meta = self._meta(run_id)
            if not meta:
                raise RunConflict(f"run {run_id} was not started by the service; stop it where it runs")
            state, _ = self._derive(run_id, meta, _read_json(Path(RunDir(self.runs_dir / run_id).progress_file)))
            if state not in ACTIVE_STATES:
                raise RunConflict(f"run {run_id} is {state}; only queued or running runs can be cancelled")
            meta.update(state="cancelled", cancelled_at=time.time())
            self._write_meta(run_id, meta)
            self._cancelled.add(run_id)
            if state == "running":
                self._signal(meta, signal.SIGTERM)
                threading.Thread(target=self._finish_cancel, args=(run_id,), daemon=True,
                                 name=f"refinery-cancel-{run_id}").start()
        self._wake.set()
        return self.describe(run_id)

    def _signal(self, meta: dict, sig: int) -> None:
        pid = meta.get("pid")
        if not pid:
            return
        # the run is the leader of its own session, so its pid is its process group id
        with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
            os.killpg(int(pid), sig)

    def _finish_cancel(self, run_id: str) -> None:
        deadline = time.time() + self.cancel_grace_s
        while time.time() < deadline:
            with self._lock:
                if not self._alive(run_id, self._meta(run_id)):
                    break
            time.sleep(0.1)
        # SIGKILL whatever is left in the group: a hung driver, or Ray processes that outlived it
        with self._lock:
            self._signal(self._meta(run_id), signal.SIGKILL)
            child = self._children.get(run_id)
        if child is not None:
            try:
                code = child.wait(timeout=5)
            except subprocess.TimeoutExpired:
                return
            with self._lock:
                if run_id in self._children:
                    self._reap(run_id, code)

    def delete(self, run_id: str, wait: bool = False) -> dict[str, Any]:
        """Delete a finished (done, failed) or cancelled run the service started: its directory
        leaves the listing at once (renamed under the lock) and is removed in the background
        (``wait``: before returning). 409 for a queued or running run (cancel it first), one
        still stopping, one another active run reads (``format: run``), or one the service did
        not start."""
        d = self.run_dir(run_id)
        with self._lock:
            meta = self._meta(run_id)
            if not meta:
                raise RunConflict(f"run {run_id} was not started by the service; delete its directory where it lives")
            state, _ = self._derive(run_id, meta, _read_json(Path(RunDir(d).progress_file)))
            if state not in ("done", "failed", "cancelled"):
                raise RunConflict(f"run {run_id} is {state}; only done, failed or cancelled runs can be deleted "
                                  "(cancel it first)")
            if self._alive(run_id, meta):
                raise RunConflict(f"run {run_id} is still stopping; retry in a few seconds")
            for other in self._active:
                if other != run_id and str(d) in _read_text(Path(RunDir(self.runs_dir / other).dag_file)):
                    raise RunConflict(f"run {run_id} is an input of run {other} (format: run), which has not "
                                      "ended; delete it when that one has")
            trash = self.runs_dir / f".deleting-{run_id}-{secrets.token_hex(4)}"
            os.rename(d, trash)
            self._active.discard(run_id)
            self._cancelled.discard(run_id)
            self._children.pop(run_id, None)
        if wait:
            shutil.rmtree(trash, ignore_errors=True)
        else:
            threading.Thread(target=shutil.rmtree, args=(trash,), kwargs={"ignore_errors": True}, daemon=True,
                             name=f"refinery-delete-{run_id}").start()
        return {"id": run_id, "deleted": True, "state": state}

    def resume(self, run_id: str) -> dict[str, Any]:
        """Queue a failed or cancelled run again; it re-launches the same command, and the run
        skips every shard already committed."""
        d = self.run_dir(run_id)
        with self._lock:
            meta = self._meta(run_id)
            if not meta:
                raise RunConflict(f"run {run_id} was not started by the service; resume it with `refinery run`")
            state, _ = self._derive(run_id, meta, _read_json(Path(RunDir(d).progress_file)))
            if state not in ("failed", "cancelled"):
                raise RunConflict(f"run {run_id} is {state}; only failed or cancelled runs can be resumed")
            if self._alive(run_id, meta):
                raise RunConflict(f"run {run_id} is still stopping; retry in a few seconds")
            # admitted under the allow-list of its day: the one in force now decides a rerun
            dag_data = read_dag_file(RunDir(d).dag_file)
            check_stage_modules(dag_data, self.stage_modules, f"run {run_id}")
            for k in ("pid", "pid_start", "exit_code", "cancelled_at", "launch_error", "ended", "started", "timed_out",
                      "over_memory", "memory_limit"):
                meta.pop(k, None)
            meta.update(state="queued", queued_at=time.time(), attempt=int(meta.get("attempt") or 1) + 1)
            self._write_meta(run_id, meta)
            self._active.add(run_id)
            self._cancelled.discard(run_id)
        self._wake.set()
        return self.describe(run_id)

    # -- scheduling --------------------------------------------------------------------------

    def tick(self) -> None:
        """Reap finished processes and launch queued runs, oldest first, up to the limit."""
        with self._lock:
            running = 0
            queued: list[tuple[float, str]] = []
            alive: dict[str, dict] = {}
            for rid in sorted(self._active):
                meta = self._meta(rid)
                want = meta.get("state")
                if want == "queued":
                    queued.append((meta.get("queued_at") or meta.get("submitted") or 0, rid))
                elif self._alive(rid, meta):  # started, or cancelled but still stopping
                    running += 1
                    self._enforce_time_limit(rid, meta)
                    alive[rid] = meta
                else:
                    self._active.discard(rid)
            self._enforce_memory_limit(alive)
            for _, rid in sorted(queued)[: max(0, self.max_concurrent - running)]:
                self._launch(rid)

    def _enforce_time_limit(self, rid: str, meta: dict) -> None:
        """Cancel (SIGTERM, SIGKILL after the grace) a run that ran past ``max_run_seconds``;
        it is marked ``timed_out`` so a client sees why it stopped."""
        if self.max_run_seconds is None or meta.get("state") != "started" or not meta.get("started"):
            return
        if time.time() - meta["started"] <= self.max_run_seconds:
            return
        meta.update(state="cancelled", cancelled_at=time.time(), timed_out=self.max_run_seconds)
        self._write_meta(rid, meta)
        self._cancelled.add(rid)
        self._signal(meta, signal.SIGTERM)
        threading.Thread(target=self._finish_cancel, args=(rid,), daemon=True, name=f"refinery-cancel-{rid}").start()

    def _enforce_memory_limit(self, alive: dict[str, dict]) -> None:
        """Stop (SIGKILL: memory is what runs out first) a run whose processes together hold more
        private resident memory than ``max_run_memory``; every ``memory_poll_s`` seconds. The
        kernel holds each process to it already (RLIMIT_DATA); this bounds their sum."""
        now = time.monotonic()
        if self.max_run_memory is None or now - self._memory_checked < self.memory_poll_s:
            return
        self._memory_checked = now
        runs = {int(m["pid"]): (rid, m) for rid, m in alive.items() if m.get("state") == "started" and m.get("pid")}
        if not runs:
            return
        for sid, used in session_memory(set(runs)).items():
            rid, meta = runs[sid]
            if used <= self.max_run_memory:
                continue
            meta.update(state="cancelled", cancelled_at=time.time(), over_memory=used, memory_limit=self.max_run_memory)
            self._write_meta(rid, meta)
            self._cancelled.add(rid)
            self._signal(meta, signal.SIGKILL)
            threading.Thread(target=self._finish_cancel, args=(rid,), daemon=True,
                             name=f"refinery-cancel-{rid}").start()

    def limits(self) -> dict[str, Any]:
        """A run's quotas, as the service starts it (recorded in its service.json)."""
        return {"max_run_seconds": self.max_run_seconds, "max_run_bytes": self.max_run_bytes,
                "max_run_memory": self.max_run_memory}

    def command(self, run_id: str) -> list[str]:
        d = self.runs_dir / run_id
        cmd = [self.python, "-m", "curation.cli", "run", RunDir(d).dag_file, "--out", str(d), "-q"]
        if self.address:
            cmd += ["--address", self.address]
        return cmd

    def _launch(self, rid: str) -> None:
        d = self.runs_dir / rid
        meta = self._meta(rid)
        cmd = self.command(rid)
        # Recorded before the process exists: a service that dies right after Popen finds the
        # run again by its command line (see start()), instead of launching it twice.
        meta.update(state="started", started=time.time(), command=cmd, limits=self.limits())
        self._write_meta(rid, meta)
        env = {k: v for k, v in os.environ.items() if k != "REFINERY_TOKEN"}  # runs need no API token
        env["REFINERY_STAGE_MODULES"] = ",".join(self.stage_modules)  # the run holds every DAG it parses to it
        env.pop(QUOTA_ENV, None)
        if self.max_run_bytes is not None:
            env[QUOTA_ENV] = str(self.max_run_bytes)  # the run stops itself past it (curation.pipeline.quota)
        try:
            with open(d / LOG_FILE, "ab") as log:
                log.write(f"--- attempt {meta.get('attempt', 1)} {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                          f"{' '.join(cmd)}\n".encode())
                log.flush()
                proc = subprocess.Popen(cmd, cwd=self.policy.base_dir, stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True, env=env)
        except OSError as e:
            meta["launch_error"] = f"could not start the run process: {e}"
            self._write_meta(rid, meta)
            return
        if self.max_run_memory is not None:
            _limit_memory(proc.pid, self.max_run_memory)
        meta.update(pid=proc.pid, pid_start=process_identity(proc.pid))
        self._write_meta(rid, meta)
        self._children[rid] = proc


def delete_local(run_dir: str | Path) -> dict[str, Any]:
    """``refinery delete RUN_DIR``: what ``DELETE /runs/{id}`` does, without a service. A run
    the service started is deleted under the runs directory's lock, by the service's own rules
    (done, failed or cancelled; not one an active run reads); ``RunsDirBusy`` while a service
    manages that directory (delete through it). A run made by ``refinery run`` is deleted
    unless a ``refinery run`` process still writes it (``RunConflict``)."""
    d = Path(run_dir).resolve()
    if not d.is_dir() or not ((d / SERVICE_FILE).exists() or Path(RunDir(d).dag_file).exists()):
        raise RunMissing(str(run_dir))
    if (d / SERVICE_FILE).exists():
        if not RUN_ID.match(d.name):
            raise RunMissing(str(run_dir))
        manager = RunManager(d.parent, PathPolicy([], d.parent))
        manager.start(schedule=False)
        try:
            return manager.delete(d.name, wait=True)
        finally:
            manager.stop()
    pid = _find_run_process(d)
    if pid is not None:
        raise RunConflict(f"run {d.name} is being written by `refinery run` (pid {pid}); stop it first")
    for other in d.parent.iterdir():  # a service run beside it that has not ended may read it (format: run)
        meta = _read_json(other / SERVICE_FILE) if other != d else None
        if meta and meta.get("state") in ("queued", "started") and \
                str(d) in _read_text(Path(RunDir(other).dag_file)):
            raise RunConflict(f"run {d.name} is an input of run {other.name} (format: run), which has not ended; "
                              "delete it when that one has")
    state = (_read_json(Path(RunDir(d).progress_file)) or {}).get("state") or "unknown"
    shutil.rmtree(d)
    return {"id": d.name, "deleted": True, "state": state}
