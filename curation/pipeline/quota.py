"""A run's disk quota, enforced by the run itself as it writes.

``refinery serve`` starts each run with ``REFINERY_MAX_RUN_BYTES`` (its ``--max-run-bytes``).
The driver then measures its run directory (bytes on disk, every file, from a thread: four times
a second, or every ten times the scan's own time on a run of many files) and, past the quota,
stops the run where it waits: the main thread is interrupted (a signal; Ray's waits give way to
it), Ray is shut down so no task writes on, and the run's work files are removed (every global
stage's ``_work``, temporary files, and what the stage that was running wrote without
committing it). The run fails with ``executor.DiskQuotaExceeded`` and says so in ``progress.json``.
Committed shards stay: the run can be deleted, or resumed under a larger quota.

Local run directories only (an object-store run has no disk of the service's to fill). A
kernel limit per file (``RLIMIT_FSIZE``) cannot back this up: Ray's object store is a file
of its own size.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from pathlib import Path

from curation.pipeline.rundir import WORK, RunDir

ENV = "REFINERY_MAX_RUN_BYTES"
MiB = 1 << 20


class _Interrupt(KeyboardInterrupt):
    """What the signal raises in the main thread: Ray's waits give way to a KeyboardInterrupt
    (and only to one); the executor then fails the run with ``DiskQuota.failure()``'s reason."""


def disk_bytes(root: str | os.PathLike) -> int:
    """Bytes on disk under ``root`` (allocated blocks, so a sparse file counts what it holds)."""
    total = 0
    stack = [str(root)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for e in it:
                    try:
                        if e.is_dir(follow_symlinks=False):
                            stack.append(e.path)
                        else:
                            st = e.stat(follow_symlinks=False)
                            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
                    except OSError:  # removed while scanning
                        continue
        except OSError:
            continue
    return total


class DiskQuota:
    """Watches ``rundir`` against ``limit`` bytes (``None``: no quota; every method is then a
    no-op). ``start``/``stop`` around the run; ``stage`` names the global stage running (its
    uncommitted files go if the quota is hit); ``failure()`` once ``exceeded``."""

    def __init__(self, rundir: RunDir, limit: int | None, min_interval_s: float = 0.25):
        self.rundir = rundir
        self.limit = limit
        self.min_interval_s = min_interval_s
        self.stage: str | None = None
        self.used = 0  # the last measurement
        self.exceeded: int | None = None  # bytes measured past the limit
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._armed = False
        self._old_handler = None

    @classmethod
    def for_run(cls, rundir: RunDir) -> DiskQuota:
        raw = os.environ.get(ENV, "").strip()
        limit = int(raw) if raw.isdigit() and int(raw) > 0 else None
        return cls(rundir, None if rundir.remote else limit)

    def start(self) -> None:
        if self.limit is None:
            return
        if threading.current_thread() is threading.main_thread():
            self._old_handler = signal.signal(signal.SIGUSR2, self._on_signal)
            self._armed = True
        self._thread = threading.Thread(target=self._watch, name="refinery-disk-quota", daemon=True)
        self._thread.start()

    def _on_signal(self, signum, frame) -> None:
        if self._armed:
            self._armed = False
            raise _Interrupt("disk quota")

    def _over(self) -> bool:
        self.used = disk_bytes(self.rundir.root)
        if self.used > self.limit:
            self.exceeded = self.used
        return self.exceeded is not None

    def _watch(self) -> None:
        main = threading.main_thread().ident
        while not self._stop.is_set():
            t0 = time.monotonic()
            if self._over():
                if self._armed:
                    signal.pthread_kill(main, signal.SIGUSR2)
                return
            self._stop.wait(max(self.min_interval_s, 10 * (time.monotonic() - t0)))

    def stop(self) -> None:
        """Stop watching; one last measurement (a run that went past the quota in its last
        second fails too)."""
        if self.limit is None:
            return
        self._armed = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self._old_handler is not None:
            signal.signal(signal.SIGUSR2, self._old_handler)
            self._old_handler = None
        if self.exceeded is None:
            self._over()

    def failure(self) -> str:
        """Ray stopped, the work files removed; why the run fails."""
        import ray

        if ray.is_initialized():
            ray.shutdown()  # no task writes on (a cluster ends the tasks of a driver that left)
        removed = self._clean()
        return (
            f"the run directory reached {self.exceeded / MiB:,.1f} MiB, past the run's disk quota of "
            f"{self.limit / MiB:,.1f} MiB (the service's --max-run-bytes); the run was stopped and its work "
            f"files removed ({removed / MiB:,.1f} MiB); committed shards stay ({self.used / MiB:,.1f} MiB): "
            "delete the run, or resume it under a larger quota")

    def _clean(self) -> int:
        """Remove the run's work files; returns the bytes freed."""
        root = Path(self.rundir.root)
        before = disk_bytes(root)
        doomed: list[Path] = [p for p in root.glob(f"*/{WORK}")]
        doomed += [p for p in root.rglob(".*.tmp-*")]
        if self.stage is not None:  # the global stage that was writing: what it did not commit
            from curation.formats.manifest import entry_files

            keep = {self.rundir.path(f) for e in self.rundir.entries(self.stage).values() for f in entry_files(e)}
            for p in Path(self.rundir.stage_dir(self.stage)).rglob("*"):
                if p.is_file() and str(p) not in keep and not p.name.startswith("_manifest"):
                    doomed.append(p)
        for p in doomed:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
        self.used = disk_bytes(root)
        return max(0, before - self.used)
