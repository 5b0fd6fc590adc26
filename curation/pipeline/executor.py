"""Run a DAG on Ray.

Work is cut by *roots*: every input shard, and every output shard of a global stage, is one
Ray task that runs all row-local stages reachable from it (read once, transform in memory,
write each stage's shard once). Global stages run as their own phases between. A task is
skipped when every shard it would write is already in its stage's manifest with the same
params hash: that is the whole resume story, identical on one machine and on a cluster.
Outputs depend only on the shard, never on which worker ran it, so any worker count gives
byte-identical shards.

Measure once, decide cheaply: a stage with rules (the heuristic filters) records the hash of
its *signal* parameters (thresholds excluded) in each manifest entry. When only thresholds
changed, the rerun reads the stored rows with their signal columns back and re-decides; rows
it never saw (a looser upstream rule let more through) are the only ones measured.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from curation.io.inputs import InputShard, plan_input
from curation.io.read import read_shard
from curation.pipeline.context import GlobalContext
from curation.pipeline.dag import Dag, parse_dag, roots
from curation.pipeline.progress import RunProgress
from curation.pipeline.rundir import RunDir, RunDirError  # noqa: F401  (RunDirError: callers catch it from here)
from curation.pipeline.tasks import Resources, TasksFailed, run_bounded
from curation.io.shards import split_kept_rejected
from curation.stages.base import MapStage, registry

#: manifest field: hash of a stage's signal parameters (see ``MapStage.signals_hash``)
SIGNALS_HASH = "signals_hash"


class RunFailed(RuntimeError):
    """Some shards failed after retries; the rest are committed and a rerun resumes."""


# ---------------------------------------------------------------------------------------------
# planning (driver)


@dataclass
class Plan:
    dag: Dag
    hashes: dict[str, str]
    signal_hashes: dict[str, str]
    input_shards: dict[str, list[InputShard]]
    closures: dict[str, list[str]]  # root -> map/union stages it feeds, in topological order
    materialize_inputs: set[str]

    def writes(self, root: str) -> list[str]:
        """The nodes whose shards a task of ``root`` writes: the input itself, its map stages."""
        return ([root] if root in self.dag.inputs else []) + [
            n for n in self.closures[root] if self.dag.stages[n].kind != "union"]

    def resources(self, root: str) -> Resources:
        return Resources.most(self.dag.stages[n].resources for n in self.closures[root]
                              if self.dag.stages[n].kind == "map")


def make_plan(dag: Dag) -> Plan:
    """Validate inputs (globs must match) and work out which stages each root feeds."""
    input_shards = {name: plan_input(name, spec, dag.base_dir) for name, spec in dag.inputs.items()}
    closures: dict[str, list[str]] = {}
    for root in list(dag.inputs) + [n for n, s in dag.stages.items() if s.kind == "global"]:
        closures[root] = [n for n, s in dag.stages.items() if s.kind != "global" and root in roots(dag, n)]
    # An input is only streamed into the map stages its task runs; when a union or a global
    # stage consumes it directly, its documents must exist as shards.
    materialize = {u for s in dag.stages.values() if s.kind != "map" for u in s.upstreams() if u in dag.inputs}
    return Plan(dag, dag.hashes(), dag.signal_hashes(), input_shards, closures, materialize)


# ---------------------------------------------------------------------------------------------
# the task (worker)


@dataclass(frozen=True)
class RootJob:
    """One task: a root shard (an input shard, or a global stage's output shard) and the
    row-local stages it feeds. ``done`` names stages whose shard for this key is committed with
    the current params hash: read back from disk when a later stage needs them, not recomputed."""

    dag: dict
    dag_path: str
    base_dir: str | None
    rundir: RunDir
    root: str
    key: str
    shard: InputShard | None  # an input shard to read, or None: the root is a global stage's shard
    source_path: str | None
    materialize: bool
    done: tuple[str, ...] = ()
    #: stage -> this key's manifest entry made with the stage's current signals hash (read once
    #: on the driver: a task never reads a whole manifest)
    signals: tuple[tuple[str, dict], ...] = ()
    #: the user stage classes of the DAG (type -> class), shipped by value: a worker need not
    #: be able to import the user's module
    user_stages: tuple[tuple[str, type], ...] = ()


_DAGS: dict[str, Dag] = {}
_READY: set[tuple[str, str]] = set()


def _worker_dag(job: RootJob) -> Dag:
    fp = hashlib.sha256(json.dumps(job.dag, sort_keys=True).encode()).hexdigest()
    for name, cls in job.user_stages:
        registry.setdefault(name, cls)
    if fp not in _DAGS:
        _DAGS[fp] = parse_dag(job.dag, job.dag_path, job.base_dir)
    return _DAGS[fp]


@dataclass
class _Node:
    """A node's rows in the task, as the batches a stage produced them in, each with the text
    state that goes with it (None: the next stage builds its own). The next fused stage takes
    these same batches, so words split upstream are reused whatever the shard's size."""

    batches: list[tuple[pa.Table, Any]]

    @classmethod
    def of(cls, table: pa.Table, batch_size: int) -> _Node:
        return cls([(table.slice(i, batch_size), None) for i in range(0, max(table.num_rows, 1), batch_size)])

    @cached_property
    def table(self) -> pa.Table:
        parts = [t for t, _ in self.batches]
        t = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
        return t.combine_chunks()


def _setup_once(stage: MapStage, name: str, hash_: str) -> None:
    if (name, hash_) not in _READY:  # models, tokenizers: once per worker process
        stage.setup()
        _READY.add((name, hash_))


def _process(stage: MapStage, name: str, node: _Node, hash_: str) -> tuple[_Node, pa.Table | None]:
    """Measure and decide every batch of ``node``; the kept rows (batch by batch, with their
    text state) and the rejected rows."""
    _setup_once(stage, name, hash_)
    kept_batches, rej_parts = [], []
    for batch, text in node.batches:
        res = stage.run_batch(batch, text if batch.num_rows else None)
        kept, rej = split_kept_rejected(res.table, res.reasons, name)
        if res.text is not None and res.reasons is not None:
            kept_text = res.text.take(np.flatnonzero(pc.is_null(res.reasons).to_numpy(zero_copy_only=False)))
        else:
            kept_text = res.text
        kept_batches.append((kept, kept_text))
        if rej is not None:
            rej_parts.append(rej)
    rej = pa.concat_tables(rej_parts, promote_options="default") if rej_parts else None
    return _Node(kept_batches), (rej.combine_chunks() if rej is not None else None)


def _stored_signals(rundir: RunDir, e: dict | None) -> pa.Table | None:
    """Every row (kept and rejected) a stage measured for a shard with the same signal
    parameters (entry ``e``), rejected rows without their ``stage``/``reason`` columns; None if
    there are none."""
    if not e or (e.get("file") is None and e.get("rows")):
        return None
    if not all(rundir.path(f).exists() for f in (e.get("file"), e.get("rejected_file")) if f):
        return None
    kept, rej = rundir.read_entry(e)
    parts = [t for t in (kept, rej.drop_columns(["stage", "reason"]) if rej is not None else None) if t is not None]
    return pa.concat_tables(parts) if len(parts) > 1 else (parts[0] if parts else None)


def _redecide(stage: MapStage, name: str, node: _Node, stored: pa.Table, batch_size: int,
              hash_: str) -> tuple[_Node, pa.Table | None, int]:
    """Re-decide from stored signal rows; measure only the input rows not among them. Returns
    the kept node, the rejected rows and how many rows were measured."""
    ids = node.table.column("id")
    pos = pc.index_in(ids, value_set=stored.column("id"))
    have = pc.is_valid(pos)
    n_missing = node.table.num_rows - pc.sum(have.cast(pa.int64())).as_py() if node.table.num_rows else 0
    if n_missing:
        # measure only what was never measured, then put rows back in input order
        missing = node.table.filter(pc.invert(have))
        _setup_once(stage, name, hash_)
        measured = pa.concat_tables([stage.run_batch(missing.slice(i, batch_size), None).table
                                     for i in range(0, missing.num_rows, batch_size)], promote_options="default")
        stored = pa.concat_tables([stored.cast(measured.schema), measured])
        pos = pc.index_in(ids, value_set=stored.column("id"))
    table = stored.take(pos).combine_chunks()
    kept, rej = split_kept_rejected(table, stage.decide(table), name)
    return _Node.of(kept.combine_chunks(), batch_size), (rej.combine_chunks() if rej is not None else None), n_missing


def run_root_task(job: RootJob) -> tuple[list[dict], str | None]:
    """Read one root shard and run every row-local stage it feeds. Returns manifest entries
    and the Ray node it ran on."""
    return _root_entries(job), _node_id()


def _root_entries(job: RootJob) -> list[dict]:
    dag = _worker_dag(job)
    hashes, sig = dag.hashes(), dag.signal_hashes()
    rundir, root, key = job.rundir, job.root, job.key
    entries: list[dict] = []
    nodes: dict[str, _Node] = {}
    done_set = set(job.done)
    signals = dict(job.signals)

    def node_of(name: str) -> _Node:
        if name in nodes:
            return nodes[name]
        if name == root and job.shard is not None and job.materialize and name in done_set:
            n = _Node.of(pq.read_table(rundir.shard_path(name, key)), dag.batch_size)
        elif name == root and job.shard is not None:
            res = read_shard(job.shard, dag.inputs[root])
            docs, rejects = res.tables()
            rejects = rejects.append_column("stage", pa.array([root] * rejects.num_rows, pa.string()))
            entries.append(rundir.write_stage_shard(root, key, docs if job.materialize else None, rejects,
                                                    docs.num_rows + rejects.num_rows, hashes[root]))
            n = _Node.of(docs, dag.batch_size)
        elif name == root:
            n = _Node.of(pq.read_table(job.source_path), dag.batch_size)
        elif dag.stages[name].kind == "union":
            n = node_of(next(u for u in dag.stages[name].upstreams() if root in roots(dag, u)))
        elif name in done_set:
            n = _Node.of(pq.read_table(rundir.shard_path(name, key)), dag.batch_size)
        else:
            st = dag.stages[name]
            up = node_of(st.input)
            stored = _stored_signals(rundir, signals.get(name)) if st.rules else None
            extra = {SIGNALS_HASH: sig[name]} if st.rules else {}
            if stored is not None:
                n, rej, measured = _redecide(st, name, up, stored, dag.batch_size, hashes[name])
                extra["measured_rows"] = measured
            else:
                n, rej = _process(st, name, up, hashes[name])
                if st.rules:
                    extra["measured_rows"] = up.table.num_rows
            entries.append(rundir.write_stage_shard(name, key, n.table, rej, up.table.num_rows, hashes[name], **extra))
        nodes[name] = n
        return n

    if job.shard is not None and root not in done_set:
        node_of(root)
    for name, st in dag.stages.items():
        if st.kind == "map" and name not in done_set and root in roots(dag, name):
            node_of(name)
    return entries


def _node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # noqa: BLE001 (outside Ray: no node)
        return None


# ---------------------------------------------------------------------------------------------
# the run (driver)


def _ship_user_stages(dag: Dag) -> tuple[tuple[str, type], ...]:
    """The DAG's user stage classes; their modules are pickled by value from now on, so Ray
    tasks (map tasks and a user global stage's own task functions) carry their code."""
    import ray.cloudpickle

    out = []
    for st in dag.stages.values():
        if ":" in st.type:
            cls = type(st)
            ray.cloudpickle.register_pickle_by_value(sys.modules[cls.__module__])
            out.append((st.type, cls))
    return tuple(dict(out).items())


def _init_ray(address: str | None, workers: int | None) -> int:
    """Connect to ``address`` (or start an embedded Ray with ``workers`` CPUs, all local CPUs
    when None). Returns the tasks to keep in flight: ``workers``, or every CPU the cluster
    reports (on a cluster of 100 nodes, all of them)."""
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_ACCEPT_CONNECTIONS_FROM_ANY_HOST", "0")
        if address:
            ray.init(address=address, logging_level="WARNING", log_to_driver=True)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, logging_level="WARNING",
                     configure_logging=True, log_to_driver=True)
    return workers if workers else max(1, int(ray.cluster_resources().get("CPU", 1)))


def run_dag(dag: Dag, run_dir: str | os.PathLike, workers: int | None = None, address: str | None = None,
            overwrite: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Run (or resume) ``dag`` into ``run_dir``. Returns the final progress state."""
    rundir = RunDir(run_dir)
    plan = make_plan(dag)  # fails on missing inputs before any Ray work starts
    rundir.prepare(dag, overwrite)
    progress = RunProgress(rundir.root, dag.name, quiet=quiet)
    dag_dict = dag.to_dict()
    failures: list[str] = []
    try:
        workers = _init_ray(address, workers)
        user_stages = _ship_user_stages(dag)

        def run_tasks(phase: str, jobs: list[tuple[str, str, InputShard | None, str | None]]) -> None:
            writes = {root: plan.writes(root) for root, *_ in jobs}
            committed = {s: rundir.committed(s, plan.hashes[s]) for ws in writes.values() for s in ws}
            # entries whose signals can be re-decided: same signals hash, other params hash
            redecide = {s: {k: e for k, e in rundir.entries(s).items() if e.get(SIGNALS_HASH) == plan.signal_hashes[s]}
                        for ws in writes.values() for s in ws if s in dag.stages and dag.stages[s].rules}
            todo = []
            for root, key, shard, src in jobs:
                done_stages = tuple(s for s in writes[root] if key in committed[s])
                if len(done_stages) < len(writes[root]):
                    stored = tuple((s, redecide[s][key]) for s in writes[root] if key in redecide.get(s, {}))
                    todo.append(RootJob(dag_dict, dag.path, dag.base_dir, rundir, root, key, shard, src,
                                        root in plan.materialize_inputs, done_stages, stored, user_stages))
            total, finished = len(jobs), len(jobs) - len(todo)
            progress.phase(phase, finished, total)

            def on_result(i: int, result: tuple[list[dict], str | None]) -> None:
                nonlocal finished
                entries, node = result
                progress.task_node(node)
                rundir.commit(entries)  # one append per stage for the whole task
                for e in entries:
                    progress.stage_counts(e["stage"], e)
                finished += 1
                progress.phase(phase, finished, total)

            def on_error(i: int, msg: str) -> None:
                failures.append(f"{todo[i].root}/{todo[i].key}: {msg}")

            run_bounded(run_root_task, [(j,) for j in todo], workers, [plan.resources(j.root) for j in todo],
                        on_result, on_error)

        # Phase 1: every input shard, with the row-local stages it feeds.
        run_tasks("read+map", [(name, s.key, s, None) for name, shards in plan.input_shards.items() for s in shards])
        # Then each global stage, followed by the row-local stages downstream of it.
        for name, st in dag.stages.items():
            if st.kind != "global" or failures:
                continue
            upstream = sorted(kf for u in st.upstreams() for kf in rundir.shard_files(dag, u, plan.hashes))
            ctx = GlobalContext(rundir, name, plan.hashes[name], workers, upstream, st.resources,
                                report=progress.phase)
            try:
                st.run(ctx)
            except TasksFailed as e:
                failures += e.failures
                continue
            ctx.finish(keep_work=st.keep_work)
            if plan.closures[name]:
                run_tasks(f"{name}+map", [(name, k, None, p) for k, p in rundir.shard_files(dag, name, plan.hashes)])
        for node in list(dag.inputs) + list(dag.stages):
            rundir.compact(node)
        if failures:
            raise RunFailed(f"{len(failures)} shard(s) failed; rerun the same command to retry them:\n  "
                            + "\n  ".join(failures))
    except BaseException as e:
        progress.finish("failed", f"{type(e).__name__}: {e}")
        raise
    progress.finish("done")
    return progress.state
