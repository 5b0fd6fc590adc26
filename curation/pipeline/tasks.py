"""Bounded Ray task loops: the one way the executor and global stages run work on the cluster.

The failure rule, everywhere: a task is retried by Ray when its worker dies (up to 3 times) or
when it raises an I/O error (transient on object storage and network filesystems); any other
exception is deterministic (bad config, refused input) and is not retried. A failed task does
not stop the others: every job that finishes is handed to ``on_result`` (so it is recorded and
a rerun skips it), and the failures are raised together once nothing is left in flight.
"""

from __future__ import annotations

import resource
import time
from typing import Any, Callable, Sequence

from curation.stages.base import Resources

MAX_RETRIES = 3
RETRY_EXCEPTIONS = [OSError, ConnectionError, TimeoutError]


class TasksFailed(RuntimeError):
    """Some jobs failed after retries; the others finished and were recorded."""

    def __init__(self, what: str, failures: list[str]):
        self.failures = failures
        super().__init__(f"{what}: {len(failures)} job(s) failed; rerun the same command to retry them:\n  "
                         + "\n  ".join(failures))


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (a Ray worker's, when called in a task)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _measured(fn: Callable[..., Any], job: Any, star: bool) -> tuple[Any, float, float]:
    """Runs in the worker: the job's result, its seconds and the worker's peak RSS."""
    t0 = time.perf_counter()
    out = fn(*job) if star else fn(job)
    return out, time.perf_counter() - t0, peak_rss_mb()


def _counted(fn: Callable[..., Any], *args: Any) -> tuple[Any, int]:
    """Runs in the worker: ``fn(*args)`` and the object-storage requests it retried."""
    from curation.io import retries

    retries.install()
    before = retries.count()
    out = fn(*args)
    return out, retries.count() - before


def run_bounded(fn: Callable[..., Any], jobs: Sequence[tuple], workers: int,
                resources: Resources | Sequence[Resources],
                on_result: Callable[[int, Any], None], on_error: Callable[[int, str], None],
                on_submit: Callable[[int], None] | None = None, on_idle: Callable[[], None] | None = None,
                idle_s: float = 5.0, on_retries: Callable[[int], None] | None = None) -> None:
    """Call ``fn(*jobs[i])`` as Ray tasks with at most ``workers`` in flight (backpressure: the
    driver holds ``workers`` references, never one per job), each with its resources (one for
    all, or one per job). Results and errors are handed over in completion order with the
    job's index. ``on_submit(i)`` when job ``i`` is handed to Ray; ``on_idle()`` every
    ``idle_s`` seconds in which nothing finished (live progress: stragglers' running times);
    ``on_retries(n)`` after a task that retried ``n`` > 0 object-storage requests
    (``curation.io.retries``)."""
    import ray

    remote = ray.remote(max_retries=MAX_RETRIES, retry_exceptions=RETRY_EXCEPTIONS)(_counted)
    name = getattr(fn, "__name__", "task")  # the task's name (and its worker's title: ray::NAME) stays fn's
    per_job = not isinstance(resources, Resources)
    inflight: dict[Any, int] = {}
    nxt = 0
    while nxt < len(jobs) or inflight:
        while nxt < len(jobs) and len(inflight) < max(1, workers):
            res = resources[nxt] if per_job else resources
            inflight[remote.options(name=name, **res.ray_options()).remote(fn, *jobs[nxt])] = nxt
            if on_submit is not None:
                on_submit(nxt)
            nxt += 1
        ready, _ = ray.wait(list(inflight), num_returns=1, timeout=idle_s if on_idle is not None else None)
        if not ready and on_idle is not None:
            on_idle()
        for ref in ready:
            i = inflight.pop(ref)
            try:
                out, retried = ray.get(ref)
            except Exception as e:  # after retries: recorded, the others go on
                msg = str(e).strip().splitlines()
                on_error(i, f"{type(e).__name__}: {msg[-1] if msg else ''}")
                continue
            if retried and on_retries is not None:
                on_retries(retried)
            on_result(i, out)


def run_measured(fn: Callable[..., Any], jobs: Sequence[Any], workers: int, resources: Resources | Sequence[Resources],
                 on_result: Callable[[int, Any, float, float], None], on_error: Callable[[int, str], None],
                 star: bool = False, on_retries: Callable[[int], None] | None = None) -> None:
    """``run_bounded`` calling ``fn(job)`` (``fn(*job)`` with ``star``), each result with its
    seconds and the worker's peak RSS."""
    run_bounded(_measured, [(fn, j, star) for j in jobs], workers, resources,
                lambda i, r: on_result(i, *r), on_error, on_retries=on_retries)
