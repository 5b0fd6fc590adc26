"""What a global stage (dedup, mix, pack...) gets from the executor: its upstream shards, a
place for intermediate files, bounded parallel Ray tasks, and shard commits."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable

from curation.io.shards import Manifest


@dataclass
class GlobalContext:
    run_dir: Path
    name: str  # the stage's name in the DAG (its output directory)
    params_hash: str
    workers: int
    #: (shard key, absolute parquet path) of every upstream shard, sorted by key
    upstream: list[tuple[str, str]]
    report: Callable[[str, int, int], None] = field(default=lambda phase, done, total: None)

    @property
    def work_dir(self) -> Path:
        """Intermediate files (signatures, buckets, Bloom bits), one folder per params hash so a
        rerun with other parameters never reuses them."""
        d = self.run_dir / self.name / "_work" / self.params_hash
        d.mkdir(parents=True, exist_ok=True)
        return d

    def done_keys(self) -> set[str]:
        return set(Manifest(self.run_dir, self.name).done(self.params_hash))

    def commit(self, entries: list[dict]) -> None:
        """Record written shards in the stage manifest (driver side, single writer)."""
        Manifest(self.run_dir, self.name).append(entries)

    def map(self, fn: Callable[..., Any], items: Iterable[tuple], phase: str, **options) -> list[Any]:
        """Run ``fn(*item)`` as Ray tasks, at most ``workers`` at a time; results in item order."""
        import ray

        remote = ray.remote(num_cpus=1, max_retries=3, retry_exceptions=True, **options)(fn)
        items = list(items)
        results: list[Any] = [None] * len(items)
        inflight: dict[Any, int] = {}
        nxt = done = 0
        while nxt < len(items) or inflight:
            while nxt < len(items) and len(inflight) < self.workers:
                inflight[remote.remote(*items[nxt])] = nxt
                nxt += 1
            ready, _ = ray.wait(list(inflight), num_returns=1)
            for ref in ready:
                results[inflight.pop(ref)] = ray.get(ref)
                done += 1
                self.report(phase, done, len(items))
        return results

    def map_and_commit(self, fn: Callable[..., dict], items: list[tuple], phase: str) -> list[dict]:
        """``map`` in chunks, committing each chunk's manifest entries as soon as it is done, so a
        killed run keeps the shards it finished (``map`` alone returns only at the very end)."""
        chunk = max(1, 4 * self.workers)
        out: list[dict] = []
        for lo in range(0, len(items), chunk):
            sub = replace(self, report=lambda p, d, t, lo=lo: self.report(p, lo + d, len(items)))
            entries = sub.map(fn, items[lo:lo + chunk], phase=phase)
            self.commit(entries)
            out += entries
        return out
