"""Progress of a run: rich bars on a terminal, plain periodic lines in logs and CI, and
``progress.json`` in the run directory for the CLI (``refinery status``) and the service.

``progress.json``: ``phases`` (done/total shards per phase), ``stages`` (documents in, out and
rejected per stage), ``nodes`` (tasks finished per Ray node) and ``live``, per task phase:
tasks running/done/failed, documents and input bytes finished with their rates (overall and
over the last minute), an ETA (remaining input bytes at the last minute's byte rate, else
remaining tasks at the mean task time), tasks done/failed per node, and the ``stragglers``:
the 10 running tasks that have run longest, with their input and seconds so far.
``partitions``, per shuffle phase (a global stage's phase whose jobs are partitions): the
partitions done so far and the largest, median and smallest of their sizes (the rows or keys
the stage's task reports) with ``skew`` = largest / median. ``retries``: object-storage
requests sent again so far (throttled, reset; ``curation.io.retries``), by the tasks and the
driver.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import deque
from typing import Callable

from curation.io import retries as io_retries

#: running tasks listed as stragglers, longest first
STRAGGLERS = 10
#: the window of the "last minute" rates, seconds
WINDOW_S = 60.0
#: fault injection for tests/test_kill_resume.py: ``STAGE:PHASE`` (a phase label as reported)
#: makes this driver SIGKILL itself in the middle of that phase, after some of its jobs were
#: recorded: at the phase's first finished job it waits ``KILL_WAIT_S`` (so the phase's job
#: log or manifest is flushed with the next result: a second), and dies at the next report
#: with jobs still to run. Unset in every real run.
FAULT_KILL_AT = "REFINERY_FAULT_KILL_AT"
KILL_WAIT_S = 1.3


class _PhaseLive:
    """Task-level figures of one phase (held by ``RunProgress``; ``snapshot`` is what is stored)."""

    def __init__(self, started: float, total_bytes: int | None):
        self.started = started
        self.total_bytes = total_bytes
        self.running: dict[object, tuple[float, str, int]] = {}  # task -> (started, label, bytes)
        self.done = self.failed = 0
        self.docs = self.bytes = 0
        self.task_s = 0.0
        self.recent: deque[tuple[float, int, int]] = deque()  # (finished at, docs, bytes)
        self.nodes: dict[str, dict[str, int]] = {}

    def snapshot(self, now: float, total: int, workers: int | None) -> dict:
        while self.recent and now - self.recent[0][0] > WINDOW_S:
            self.recent.popleft()
        elapsed = max(now - self.started, 1e-9)
        window = min(WINDOW_S, elapsed)
        docs_1m = sum(d for _, d, _ in self.recent) / window
        bytes_1m = sum(b for _, _, b in self.recent) / window
        remaining = max(0, total - self.done - self.failed)
        eta = None
        if remaining == 0:
            eta = 0.0
        elif self.total_bytes and bytes_1m > 0:
            eta = max(0.0, self.total_bytes - self.bytes) / bytes_1m
        elif self.done:
            eta = remaining * (self.task_s / self.done) / max(1, workers or len(self.running) or 1)
        slow = sorted(self.running.values())[:STRAGGLERS]
        return {"running": len(self.running), "done": self.done, "failed": self.failed, "total": total,
                "docs": self.docs, "bytes": self.bytes, "total_bytes": self.total_bytes,
                "elapsed_s": round(elapsed, 3),
                "docs_per_s": round(self.docs / elapsed, 3), "bytes_per_s": round(self.bytes / elapsed, 3),
                "docs_per_s_1m": round(docs_1m, 3), "bytes_per_s_1m": round(bytes_1m, 3),
                "eta_s": None if eta is None else round(eta, 1),
                "nodes": self.nodes,
                "stragglers": [{"task": label, "bytes": nbytes, "running_s": round(now - t0, 1)}
                               for t0, label, nbytes in slow]}


class RunProgress:
    """``write`` stores the state (``RunDir.write_progress``); ``min_write_s`` spaces the writes
    out (a PUT per finished shard would be wasteful on object storage); ``finish`` always writes."""

    def __init__(self, write: Callable[[dict], None], name: str, quiet: bool = False, interval_s: float = 5.0,
                 min_write_s: float = 0.0, clock: Callable[[], float] = time.time, workers: int | None = None):
        self._store = write
        self._clock = clock
        self.workers = workers
        self._live: dict[str, _PhaseLive] = {}
        self.min_write_s = min_write_s
        self._last_write = 0.0
        self.name = name
        self.quiet = quiet
        self.interval_s = interval_s
        self.state: dict = {"name": name, "state": "running", "started": clock(), "phases": {}, "stages": {},
                            "live": {}, "partitions": {}, "retries": 0}
        self._partitions: dict[str, dict[int, int]] = {}
        self._task_retries = 0
        io_retries.install()
        self._driver_retries0 = io_retries.count()
        self._last_line = 0.0
        self._bar = None
        self._tasks: dict[str, int] = {}
        if not quiet and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), transient=False)
            self._bar.start()

    def phase(self, phase: str, done: int, total: int) -> None:
        if os.environ.get(FAULT_KILL_AT) == phase and 0 < done < total:
            self._fault(phase)
        self.state["phases"][phase] = {"done": done, "total": total}
        if self._bar is not None:
            if phase not in self._tasks:
                self._tasks[phase] = self._bar.add_task(phase, total=total)
            self._bar.update(self._tasks[phase], completed=done, total=total)
        elif not self.quiet and (time.time() - self._last_line > self.interval_s or done == total):
            self._last_line = time.time()
            print(f"[refinery] {self.name}: {phase} {done}/{total} shards", file=sys.stderr, flush=True)
        self.write()

    def _fault(self, phase: str) -> None:
        if getattr(self, "_fault_armed", False):
            self.write(force=True)  # what a watcher saw last
            print(f"[refinery] {FAULT_KILL_AT}={phase}: SIGKILL", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        self._fault_armed = True
        time.sleep(KILL_WAIT_S)

    # -- tasks: rates, ETA, stragglers -----------------------------------------------------

    def tasks_planned(self, phase: str, total_bytes: int | None = None) -> None:
        """A task phase starts; ``total_bytes``: the input bytes its tasks will read, if known."""
        self._live[phase] = _PhaseLive(self._clock(), total_bytes)

    def task_started(self, phase: str, task: object, label: str, nbytes: int = 0) -> None:
        live = self._live.setdefault(phase, _PhaseLive(self._clock(), None))
        live.running[task] = (self._clock(), label, int(nbytes))
        self.write()

    def task_finished(self, phase: str, task: object, docs: int, node: str | None = None, ok: bool = True) -> None:
        live = self._live.setdefault(phase, _PhaseLive(self._clock(), None))
        now = self._clock()
        t0, _, nbytes = live.running.pop(task, (now, "", 0))
        per_node = live.nodes.setdefault(node or "-", {"done": 0, "failed": 0})
        if ok:
            live.done += 1
            live.docs += int(docs)
            live.bytes += nbytes
            live.task_s += now - t0
            live.recent.append((now, int(docs), nbytes))
            per_node["done"] += 1
        else:
            live.failed += 1
            per_node["failed"] += 1

    def partition_size(self, phase: str, partition: int, size: int) -> None:
        """A shuffle phase's partition ``partition`` finished with ``size`` rows (or keys)."""
        self._partitions.setdefault(phase, {})[int(partition)] = int(size)

    def retried(self, n: int) -> None:
        """A task retried ``n`` object-storage requests."""
        self._task_retries += int(n)

    def _snapshot_live(self) -> None:
        now = self._clock()
        for phase, sizes in self._partitions.items():
            v = sorted(sizes.values())
            median = v[len(v) // 2] if len(v) % 2 else (v[len(v) // 2 - 1] + v[len(v) // 2]) / 2
            self.state["partitions"][phase] = {
                "done": len(v), "largest": v[-1], "median": median, "smallest": v[0],
                "skew": round(v[-1] / median, 3) if median else None}
        self.state["retries"] = self._task_retries + io_retries.count() - self._driver_retries0
        for phase, live in self._live.items():
            total = self.state["phases"].get(phase, {}).get("total", live.done + live.failed + len(live.running))
            self.state["live"][phase] = live.snapshot(now, total, self.workers)

    def stage_counts(self, stage: str, entry: dict) -> None:
        s = self.state["stages"].setdefault(stage, {"shards": 0, "docs_in": 0, "docs_out": 0, "rejected": 0})
        s["shards"] += 1
        s["docs_in"] += entry.get("rows_in", 0)
        s["docs_out"] += entry.get("rows", 0)
        s["rejected"] += entry.get("rejected_rows", 0)

    def task_node(self, node: str | None) -> None:
        """One more map task finished on Ray node ``node`` (where the run's work went)."""
        if node:
            nodes = self.state.setdefault("nodes", {})
            nodes[node] = nodes.get(node, 0) + 1

    def finish(self, state: str, error: str | None = None) -> None:
        self.state["state"] = state
        self.state["finished"] = self._clock()
        if error:
            self.state["error"] = error
        self.write(force=True)
        if self._bar is not None:
            self._bar.stop()

    def write(self, force: bool = False) -> None:
        now = self._clock()
        if not force and now - self._last_write < self.min_write_s:
            return
        self._snapshot_live()
        self._last_write = self.state["updated"] = now
        self._store(self.state)


# ---------------------------------------------------------------------------------------------
# `refinery status`


def _human_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def _duration(s: float | None) -> str:
    if s is None:
        return "?"
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def as_of(progress: dict, now: float | None = None) -> dict:
    """``progress`` as of ``now`` (default: the clock): a running run's file is rewritten when a
    task starts or ends and every few seconds otherwise, so its stragglers' ``running_s`` and
    phases' ``elapsed_s`` are aged by the time since ``updated`` (``as_of`` records when)."""
    now = time.time() if now is None else now
    age = max(0.0, now - float(progress.get("updated") or now))
    if progress.get("state") != "running" or not age:
        return progress
    live = {phase: {**lv, "elapsed_s": round(lv.get("elapsed_s", 0) + age, 3),
                    "stragglers": [{**x, "running_s": round(x["running_s"] + age, 1)} for x in lv.get("stragglers", [])]}
            for phase, lv in (progress.get("live") or {}).items()}
    return {**progress, "live": live, "as_of": now}


def render_status(progress: dict):
    """``progress.json`` as a rich renderable: per phase a bar (done/total), documents and bytes
    per second (overall and the last minute), ETA, tasks per node; then the stragglers."""
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    progress = as_of(progress)
    state = progress.get("state", "?")
    end = progress.get("finished") or progress.get("as_of") or progress.get("updated") or time.time()
    head = f"{progress.get('name', '?')}: {state}, {_duration(end - progress.get('started', end))}"
    if progress.get("retries"):
        head += f"  ({progress['retries']:,} storage requests retried)"
    if progress.get("error"):
        head += f"  error: {progress['error'].splitlines()[0]}"
    t = Table(title=head, title_justify="left", caption="rates: overall / last minute", caption_justify="left")
    for c in ("phase", "", "shards", "docs", "docs/s", "bytes/s", "ETA"):
        t.add_column(c, justify="left" if c in ("phase", "") else "right", no_wrap=c != "shards")
    live = progress.get("live") or {}
    stragglers, nodes_rows = [], []
    for phase, p in (progress.get("phases") or {}).items():
        lv = live.get(phase) or {}
        done, total = p.get("done", 0), p.get("total", 0)
        shards = f"{done}/{total}"
        if lv.get("running") or lv.get("failed"):
            shards += f" ({lv.get('running', 0)} running, {lv.get('failed', 0)} failed)"
        t.add_row(phase, ProgressBar(total=max(total, 1), completed=done, width=10), shards,
                  f"{lv['docs']:,}" if lv else "-",
                  f"{lv['docs_per_s']:,.0f} / {lv['docs_per_s_1m']:,.0f}" if lv else "-",
                  f"{_human_bytes(lv['bytes_per_s'])} / {_human_bytes(lv['bytes_per_s_1m'])}" if lv else "-",
                  _duration(lv.get("eta_s")) if lv else "-")
        stragglers += [(phase, s) for s in lv.get("stragglers", [])]
        nodes_rows += [(phase, n, c) for n, c in sorted((lv.get("nodes") or {}).items())]
    parts = [t]
    if len({n for _, n, _ in nodes_rows}) > 1:
        nt = Table(title="tasks per node", title_justify="left")
        for c in ("phase", "node", "done", "failed"):
            nt.add_column(c, justify="left" if c in ("phase", "node") else "right")
        for phase, n, c in nodes_rows:
            nt.add_row(phase, n[:16], str(c["done"]), str(c["failed"]))
        parts.append(nt)
    parts_by_phase = progress.get("partitions") or {}
    if parts_by_phase:
        pt = Table(title="shuffle partitions (rows)", title_justify="left")
        for c in ("phase", "done", "largest", "median", "smallest", "largest/median"):
            pt.add_column(c, justify="left" if c == "phase" else "right")
        for phase, x in parts_by_phase.items():
            pt.add_row(phase, str(x["done"]), f"{x['largest']:,}", f"{x['median']:,.0f}", f"{x['smallest']:,}",
                       "-" if x.get("skew") is None else f"{x['skew']:.2f}")
        parts.append(pt)
    if stragglers:
        s = Table(title="slowest running tasks", title_justify="left")
        for c in ("phase", "task", "running", "bytes"):
            s.add_column(c, justify="right" if c in ("running", "bytes") else "left")
        for phase, x in sorted(stragglers, key=lambda ps: -ps[1]["running_s"])[:STRAGGLERS]:
            s.add_row(phase, x["task"], _duration(x["running_s"]), _human_bytes(x.get("bytes")))
        parts.append(s)
    return Group(*parts)


# ---------------------------------------------------------------------------------------------
# Prometheus text format (the service's /metrics)

_METRICS = (
    ("refinery_phase_shards_done", "shards done in a phase", lambda p, lv: p.get("done")),
    ("refinery_phase_shards_total", "shards in a phase", lambda p, lv: p.get("total")),
    ("refinery_phase_tasks_running", "tasks of a phase running now", lambda p, lv: lv.get("running")),
    ("refinery_phase_tasks_failed", "tasks of a phase that failed after retries", lambda p, lv: lv.get("failed")),
    ("refinery_phase_docs", "documents read by a phase's finished tasks", lambda p, lv: lv.get("docs")),
    ("refinery_phase_docs_per_second", "documents per second over the last minute", lambda p, lv: lv.get("docs_per_s_1m")),
    ("refinery_phase_bytes_per_second", "input bytes per second over the last minute", lambda p, lv: lv.get("bytes_per_s_1m")),
    ("refinery_phase_eta_seconds", "estimated seconds to the end of a phase", lambda p, lv: lv.get("eta_s")),
    ("refinery_phase_slowest_task_seconds", "how long the longest-running task has run",
     lambda p, lv: (lv.get("stragglers") or [{}])[0].get("running_s", 0) if lv else None),
)


_PARTITION_METRICS = (
    ("refinery_shuffle_partition_largest", "rows of a shuffle phase's largest partition so far", "largest"),
    ("refinery_shuffle_partition_median", "rows of a shuffle phase's median partition so far", "median"),
)


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus_text(progress_by_run: dict[str, dict]) -> str:
    """Per run and phase, the figures of ``progress.json`` as Prometheus gauges; plus
    ``refinery_run_running`` (1 while a run's state is running)."""
    out = ["# HELP refinery_run_running 1 while the run is running", "# TYPE refinery_run_running gauge"]
    for run, prog in sorted(progress_by_run.items()):
        out.append(f'refinery_run_running{{run="{_label(run)}"}} {int(prog.get("state") == "running")}')
    for name, help_, get in _METRICS:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        for run, prog in sorted(progress_by_run.items()):
            live = prog.get("live") or {}
            for phase, p in (prog.get("phases") or {}).items():
                v = get(p, live.get(phase) or {})
                if v is not None:
                    out.append(f'{name}{{run="{_label(run)}",phase="{_label(phase)}"}} {float(v):g}')
    for name, help_, k in _PARTITION_METRICS:
        out += [f"# HELP {name} {help_}", f"# TYPE {name} gauge"]
        for run, prog in sorted(progress_by_run.items()):
            for phase, x in (prog.get("partitions") or {}).items():
                out.append(f'{name}{{run="{_label(run)}",phase="{_label(phase)}"}} {float(x[k]):g}')
    out += ["# HELP refinery_storage_retries_total object-storage requests retried so far",
            "# TYPE refinery_storage_retries_total counter"]
    for run, prog in sorted(progress_by_run.items()):
        out.append(f'refinery_storage_retries_total{{run="{_label(run)}"}} {int(prog.get("retries") or 0)}')
    return "\n".join(out) + "\n"
