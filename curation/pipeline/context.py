"""What a global stage (dedup, mix, pack, quality keep_top...) gets from the executor: its
upstream shards, its output shards, work folder and reports, and named, resumable phases of
bounded Ray tasks. ``GlobalContext`` implements the stage layer's ``StageContext``
(``curation/stages/context.py``): stages are typed against that, never against this class or
the run directory.

A global stage's ``run(ctx)`` reads as a list of phases::

    keys = ctx.phase("keys", keys_task, [KeysJob(...) for ...])
    dups = ctx.phase("partitions", partition_task, [PartitionJob(...) for ...])
    ctx.phase("apply", apply_task, [ApplyJob(out=ctx.output(key), ...) for ...], commit=True)
    ctx.write_report(REPORT, {...})

A job is a frozen dataclass (its fields are the task's arguments) and the task returns a small
JSON-able dict. A phase records each finished job's result in ``_work/HASH/_phases/NAME.jsonl``,
so a rerun after a kill skips what finished and returns the recorded results; a ``commit``
phase's jobs carry ``out = ctx.output(key)``; their tasks write through it and return manifest
entries, committed as they arrive, and a rerun skips jobs whose ``out.key`` is committed. A job
that writes several shards (a shuffle's reducer writing the outputs of its partition) carries
``outs`` instead and returns the list of their entries; it is skipped once all are committed.
Every phase is timed and records the largest worker peak RSS; both go into ``_phases.json``. Failures follow ``curation.pipeline.tasks``' rule and raise
``TasksFailed`` at the end of the phase.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, Callable, Sequence

from curation.formats.manifest import parse_lines
from curation.io.artifacts import ArtifactMismatch, check_header
from curation.io import files, location
from curation.pipeline.rundir import RunDir, ShardOutput
from curation.pipeline.tasks import Resources, TasksFailed, peak_rss_mb, run_measured

if TYPE_CHECKING:  # pragma: no cover
    from curation.pipeline.dag import Dag
    from curation.stages.base import Stage

PHASES = "_phases"
PHASES_REPORT = "_phases.json"
#: a phase log is appended every this many results or seconds, whichever comes first
LOG_BATCH, LOG_SECONDS = 256, 1.0


def _outs(job: Any) -> tuple:
    """The output shards a commit phase's job writes: ``job.outs`` (a task writing several
    shards returns a list of their entries) or ``job.out``."""
    return tuple(job.outs) if hasattr(job, "outs") else (job.out,)


#: what a partition task's result calls its size, first found wins (exact_dedup: keys,
#: minhash_dedup: bucket_rows; a gather writing shards returns their manifest entries: rows)
PARTITION_SIZE = ("keys", "bucket_rows", "rows")


def _partition_rows(job: Any, out: Any) -> int | None:
    """The size of a shuffle's partition from its task's result: a job with an ``int`` field
    ``p`` (its partition) whose result says its rows (``PARTITION_SIZE``, or the summed rows of
    the manifest entries it committed); None for any other job."""
    if not isinstance(getattr(job, "p", None), int):
        return None
    if isinstance(out, dict):
        return next((int(out[k]) for k in PARTITION_SIZE if isinstance(out.get(k), int)), None)
    if isinstance(out, list) and out and all(isinstance(e, dict) and "rows" in e for e in out):
        return sum(int(e["rows"]) for e in out)
    return None


class RunView:
    """A run read through its DAG, as a stage sees its input's run (``RunSource``): a node's
    folder, committed shards, stage and params hash. Without ``dag``, the run's ``dag.yaml``."""

    def __init__(self, rundir: RunDir, dag: Dag | None = None):
        self.rundir, self._dag = rundir, dag
        self.root = rundir.root

    @cached_property
    def dag(self) -> Dag:
        return self._dag if self._dag is not None else self.rundir.load_dag()

    @cached_property
    def hashes(self) -> dict[str, str]:
        return self.dag.hashes()

    def stage_dir(self, node: str) -> str:
        return self.rundir.stage_dir(node)

    def node_shards(self, node: str) -> list[tuple[str, str]]:
        return self.rundir.shard_files(self.dag, node, self.hashes)

    def node_stage(self, node: str) -> Stage | None:
        return self.dag.stages.get(node)

    def node_hash(self, node: str) -> str:
        return self.hashes[node]


@dataclass
class GlobalContext:
    rundir: RunDir
    name: str  # the stage's name in the DAG (its output directory)
    params_hash: str
    workers: int
    #: (shard key, absolute parquet path) of every upstream shard, sorted by key
    upstream: list[tuple[str, str]]
    resources: Resources = field(default_factory=Resources)
    report: Callable[[str, int, int], None] = field(default=lambda phase, done, total: None)
    #: name -> {jobs, ran, seconds, max_task_seconds, peak_worker_rss_mb}, in the order run
    phases: dict[str, dict] = field(default_factory=dict)
    #: the run the stage's input comes from (default: this run, read through its dag.yaml)
    source: RunView | None = None
    #: (phase label, partition, rows) as a shuffle's partition finishes (live progress)
    partition: Callable[[str, int, int], None] = field(default=lambda phase, p, rows: None)
    #: object-storage requests a task retried (live progress)
    retried: Callable[[int], None] = field(default=lambda n: None)

    def __post_init__(self) -> None:
        if self.source is None:
            self.source = RunView(self.rundir)

    @property
    def stage_dir(self) -> str:
        return self.rundir.stage_dir(self.name)

    @property
    def work_dir(self) -> str:
        """Intermediate files, one folder per params hash so other parameters never reuse them
        (a local path or a URL, like the run directory: build names with ``location.join``)."""
        return self.rundir.work_dir(self.name, self.params_hash)

    def output(self, key: str) -> ShardOutput:
        """The output shard ``key`` of this stage, for a commit phase's job (``job.out``)."""
        return ShardOutput(self.rundir, self.name, self.params_hash, key)

    def done_keys(self) -> set[str]:
        return set(self.rundir.committed(self.name, self.params_hash))

    def committed(self) -> dict[str, dict]:
        return self.rundir.committed(self.name, self.params_hash)

    def entries(self) -> dict[str, dict]:
        return self.rundir.entries(self.name)

    def finished(self, keys: Sequence[str], report: str) -> bool:
        return not set(keys) - self.done_keys() and self.read_report(report) is not None

    def read_report(self, filename: str) -> dict | None:
        return self.rundir.read_report(self.name, filename)

    def commit(self, entries: list[dict]) -> None:
        self.rundir.commit(entries)

    def check_work_header(self, header: dict, create: bool = True) -> None:
        """``work/header.json`` records what the stage's intermediate files were made with; a
        run with another header (e.g. a newer algorithm version) refuses them. ``create=False``
        only checks (a finished stage whose work folder is gone has nothing to check)."""
        f = location.join(self.rundir.work_dir(self.name, self.params_hash), "header.json")
        if location.exists(f):
            check_header(json.loads(location.read_text(f)), header, f)
        elif create:
            if location.exists(location.join(self.work_dir, PHASES)):
                # phase records without a header: an older version's folder, whose jobs (per
                # shard, say, where this one runs per block) must not be taken for this one's
                raise ArtifactMismatch(f"{self.work_dir}: holds phase records but no header.json: it was left by "
                                       "an older version of refinery. Delete it to recompute the stage.")
            files.write_json(f, header)

    def recorded(self, name: str) -> list[Any]:
        """The results a (non-commit) phase recorded, in job order (this run's and earlier runs')."""
        rec = parse_lines(files.read_lines(location.join(self.work_dir, PHASES, f"{name}.jsonl")))
        return [rec[k]["result"] for k in sorted(rec, key=int)]

    def phase(self, name: str, fn: Callable[[Any], dict], jobs: Sequence[Any], commit: bool = False,
              resources: Resources | None = None, fold: Callable[[Any, Any], Any] | None = None,
              init: Any = None) -> Any:
        """Run ``fn(job)`` for every job; results in job order (recorded ones included). With
        ``fold``, results are not kept: ``fold(acc, result)`` from ``init`` as they arrive (in
        any order; fold must not depend on it), and the accumulator is returned — the driver
        then holds one value, not one per task (histograms merged, say)."""
        log = location.join(self.work_dir, PHASES, f"{name}.jsonl")
        if commit:
            entries = self.committed()
            done = {}
            for i, j in enumerate(jobs):
                outs = _outs(j)
                if all(o.key in entries for o in outs):
                    done[i] = [entries[o.key] for o in outs] if hasattr(j, "outs") else entries[j.out.key]
        else:
            recorded = parse_lines(files.read_lines(log))
            done = {i: recorded[str(i)]["result"] for i in range(len(jobs)) if str(i) in recorded}
        label = f"{self.name}:{name}"
        for i, out in done.items():  # recorded by an earlier run: their sizes count too
            rows = _partition_rows(jobs[i], out)
            if rows is not None:
                self.partition(label, jobs[i].p, rows)
        acc = init
        if fold is not None:
            for i in sorted(done):
                acc = fold(acc, done[i])
            results: list[Any] = []
        else:
            results = [done.get(i) for i in range(len(jobs))]
        todo = [i for i in range(len(jobs)) if i not in done]
        finished, pending, lines = len(done), [], []
        flushed = time.monotonic()
        done = {}
        self.report(label, finished, len(jobs))

        def flush_lines() -> None:
            nonlocal flushed
            if lines:
                files.append_lines(log, "".join(lines))
                lines.clear()
            flushed = time.monotonic()

        def on_result(k: int, out: Any) -> None:
            nonlocal finished, acc
            i = todo[k]
            rows = _partition_rows(jobs[i], out)
            if rows is not None:
                self.partition(label, jobs[i].p, rows)
            if fold is not None:
                acc = fold(acc, out)
            else:
                results[i] = out
            if commit:
                pending.extend(out if isinstance(out, list) else [out])
                if len(pending) >= max(1, self.workers):  # batched: one append per few shards
                    self.commit(pending)
                    pending.clear()
            else:
                # keyed like a manifest line, so the same parser reads it; appended in batches
                # (a result lost to a kill is recomputed): many small tasks cost no fsync each
                lines.append(json.dumps({"shard": str(i), "result": out}, sort_keys=True) + "\n")
                if len(lines) >= LOG_BATCH or time.monotonic() - flushed >= LOG_SECONDS:
                    flush_lines()
            finished += 1
            self.report(label, finished, len(jobs))

        try:
            self._run(label, fn, [jobs[i] for i in todo], False, on_result, resources)
        finally:
            if pending:
                self.commit(pending)
            flush_lines()
        self.phases[name].update(jobs=len(jobs), ran=len(todo))
        return acc if fold is not None else results

    def _run(self, label: str, fn: Callable[..., Any], jobs: Sequence[Any], star: bool,
             on_result: Callable[[int, Any], None], resources: Resources | None = None) -> None:
        """Run jobs with the one failure rule, recording the phase's seconds, its longest task
        and the largest worker peak RSS under ``label``."""
        stats = {"jobs": len(jobs), "seconds": 0.0, "max_task_seconds": 0.0, "peak_worker_rss_mb": 0.0}
        failures: list[str] = []
        t0 = time.perf_counter()

        def measured(i: int, out: Any, seconds: float, rss: float) -> None:
            stats["max_task_seconds"] = max(stats["max_task_seconds"], round(seconds, 3))
            stats["peak_worker_rss_mb"] = max(stats["peak_worker_rss_mb"], round(rss, 1))
            on_result(i, out)

        run_measured(fn, jobs, self.workers, resources or self.resources, measured,
                     lambda i, msg: failures.append(f"{label} job {i}: {msg}"), star, on_retries=self.retried)
        stats["seconds"] = round(time.perf_counter() - t0, 3)
        self.phases[label.split(":", 1)[-1]] = stats
        if failures:
            raise TasksFailed(label, failures)

    def map(self, fn: Callable[..., Any], items: Sequence[tuple], phase: str) -> list[Any]:
        """``fn(*item)`` for every item, unrecorded (for algorithms that keep their own resume
        markers, like the connected-components steps); results in item order."""
        results: list[Any] = [None] * len(items)
        done = 0

        def on_result(i: int, out: Any) -> None:
            nonlocal done
            results[i] = out
            done += 1
            self.report(phase, done, len(items))

        self._run(phase, fn, list(items), True, on_result)
        return results

    def finish(self, keep_work: bool = False) -> None:
        """After the stage committed: record its work folder's size in ``_phases.json`` and
        remove the folder unless ``keep_work``."""
        work = self.rundir.remove_work(self.name, self.params_hash, keep=keep_work)
        report = self.rundir.read_report(self.name, PHASES_REPORT) or {"stage": self.name,
                                                                          "params_hash": self.params_hash}
        self.rundir.write_report(self.name, PHASES_REPORT, {**report, "work": work})

    def write_report(self, filename: str, report: dict, timings: bool = False) -> None:
        """The stage's report (``RUN/STAGE/filename``). Phase timings, worker and driver peak RSS
        always go to ``RUN/STAGE/_phases.json``; with ``timings`` they are in the report too
        (otherwise the report is a pure function of the inputs: same run, same bytes)."""
        measured = {"phases": self.phases, "phase_seconds": {k: v["seconds"] for k, v in self.phases.items()},
                    "max_rss_mb": max((v["peak_worker_rss_mb"] for v in self.phases.values()), default=0.0),
                    "driver_peak_rss_mb": round(peak_rss_mb(), 1)}
        self.rundir.write_report(self.name, PHASES_REPORT, {"stage": self.name, "params_hash": self.params_hash,
                                                            **measured})
        self.rundir.write_report(self.name, filename, {"stage": self.name, "params_hash": self.params_hash, **report,
                                                       **(measured if timings else {})})
