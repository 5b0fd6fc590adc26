"""Progress of a run: rich bars on a terminal, plain periodic lines in logs and CI, and
``progress.json`` in the run directory for the CLI and the service."""

from __future__ import annotations

import sys
import time
from typing import Callable


class RunProgress:
    """``write`` stores the state (``RunDir.write_progress``); ``min_write_s`` spaces the writes
    out (a PUT per finished shard would be wasteful on object storage); ``finish`` always writes."""

    def __init__(self, write: Callable[[dict], None], name: str, quiet: bool = False, interval_s: float = 5.0,
                 min_write_s: float = 0.0):
        self._store = write
        self.min_write_s = min_write_s
        self._last_write = 0.0
        self.name = name
        self.quiet = quiet
        self.interval_s = interval_s
        self.state: dict = {"name": name, "state": "running", "started": time.time(), "phases": {}, "stages": {}}
        self._last_line = 0.0
        self._bar = None
        self._tasks: dict[str, int] = {}
        if not quiet and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), transient=False)
            self._bar.start()

    def phase(self, phase: str, done: int, total: int) -> None:
        self.state["phases"][phase] = {"done": done, "total": total}
        if self._bar is not None:
            if phase not in self._tasks:
                self._tasks[phase] = self._bar.add_task(phase, total=total)
            self._bar.update(self._tasks[phase], completed=done, total=total)
        elif not self.quiet and (time.time() - self._last_line > self.interval_s or done == total):
            self._last_line = time.time()
            print(f"[refinery] {self.name}: {phase} {done}/{total} shards", file=sys.stderr, flush=True)
        self.write()

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
        self.state["finished"] = time.time()
        if error:
            self.state["error"] = error
        self.write(force=True)
        if self._bar is not None:
            self._bar.stop()

    def write(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_write < self.min_write_s:
            return
        self._last_write = self.state["updated"] = now
        self._store(self.state)
