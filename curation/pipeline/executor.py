"""Run a DAG on Ray.

Work is cut by *roots*: every input shard, and every output shard of a global stage, is one
Ray task that runs all row-local stages reachable from it (read once, transform in memory,
write each stage's shard once). Global stages run as their own phases between. A task is
skipped when every shard it would write is already in its stage's manifest with the same
params hash: that is the whole resume story, identical on one machine and on a cluster.
Outputs depend only on the shard, never on which worker ran it, so any worker count gives
byte-identical shards.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from curation.pipeline.dag import Dag, parse_dag, roots
from curation.pipeline.context import GlobalContext
from curation.io.inputs import InputShard, plan_input
from curation.io.read import read_shard
from curation.io.shards import Manifest, split_kept_rejected, write_stage_shard
from curation.pipeline.progress import RunProgress


class RunDirError(RuntimeError):
    """The run directory holds another DAG's run (or something else)."""


class RunFailed(RuntimeError):
    """Some shards failed after retries; the rest are committed and a rerun resumes."""


# ---------------------------------------------------------------------------------------------
# planning (driver)


@dataclass
class Plan:
    dag: Dag
    hashes: dict[str, str]
    input_shards: dict[str, list[InputShard]]
    closures: dict[str, list[str]]  # root -> map/union stages it feeds, in topological order
    materialize_inputs: set[str]


def make_plan(dag: Dag) -> Plan:
    """Validate inputs (globs must match) and work out which stages each root feeds."""
    input_shards = {name: plan_input(name, spec, dag.base_dir) for name, spec in dag.inputs.items()}
    closures: dict[str, list[str]] = {}
    for root in list(dag.inputs) + [n for n, s in dag.stages.items() if s.kind == "global"]:
        closures[root] = [n for n, s in dag.stages.items() if s.kind != "global" and root in roots(dag, n)]
    # An input is only streamed into the map stages its task runs; when a union or a global
    # stage consumes it directly, its documents must exist as shards.
    materialize = {u for s in dag.stages.values() if s.kind != "map" for u in s.upstreams() if u in dag.inputs}
    return Plan(dag, dag.hashes(), input_shards, closures, materialize)


def stage_files(run_dir: Path, dag: Dag, node: str, hashes: dict[str, str]) -> list[tuple[str, str]]:
    """(key, absolute path) of the committed shards of ``node`` (unions resolve to their inputs)."""
    if node in dag.stages and dag.stages[node].kind == "union":
        out: list[tuple[str, str]] = []
        for u in dag.stages[node].upstreams():
            out += stage_files(run_dir, dag, u, hashes)
        return sorted(out)
    done = Manifest(run_dir, node).done(hashes[node])
    return sorted((k, str(run_dir / e["file"])) for k, e in done.items() if e.get("file"))


# ---------------------------------------------------------------------------------------------
# the task (worker)

_DAGS: dict[str, Dag] = {}
_READY: set[tuple[str, str]] = set()


def _worker_dag(dag_dict: dict, path: str, base_dir: str | None) -> Dag:
    import hashlib
    import json

    fp = hashlib.sha256(json.dumps(dag_dict, sort_keys=True).encode()).hexdigest()
    if fp not in _DAGS:
        _DAGS[fp] = parse_dag(dag_dict, path, base_dir)
    return _DAGS[fp]


def _process(stage, name: str, table: pa.Table, batch_size: int, hash_: str) -> tuple[pa.Table, pa.Table | None]:
    if (name, hash_) not in _READY:  # models, tokenizers: once per worker process
        stage.setup()
        _READY.add((name, hash_))
    kept_parts, rej_parts = [], []
    for i in range(0, max(table.num_rows, 1), batch_size):
        batch = table.slice(i, batch_size)
        res = stage.process(batch)
        kept, rej = split_kept_rejected(res.table, res.reasons, name)
        kept_parts.append(kept)
        if rej is not None:
            rej_parts.append(rej)
    kept = pa.concat_tables(kept_parts, promote_options="default") if len(kept_parts) > 1 else kept_parts[0]
    rej = pa.concat_tables(rej_parts, promote_options="default") if rej_parts else None
    return kept.combine_chunks(), (rej.combine_chunks() if rej is not None else None)


def run_root_task(dag_dict: dict, dag_path: str, base_dir: str | None, run_dir: str, root: str, key: str,
                  shard: InputShard | None, source_path: str | None, materialize: bool,
                  done: tuple[str, ...] = ()) -> list[dict]:
    """Read one root shard and run every row-local stage it feeds. Returns manifest entries.

    ``done`` names stages whose shard for this key is already committed with the current
    params hash: they are read back from disk when a later stage needs them, not recomputed
    (so changing the last filter's threshold does not re-extract HTML).
    """
    dag = _worker_dag(dag_dict, dag_path, base_dir)
    hashes = dag.hashes()
    entries: list[dict] = []
    tables: dict[str, pa.Table] = {}
    done_set = set(done)

    def table_of(node: str) -> pa.Table:
        if node in tables:
            return tables[node]
        if node == root and shard is not None and materialize and node in done_set:
            t = pq.read_table(Path(run_dir) / node / f"{key}.parquet")
        elif node == root and shard is not None:
            res = read_shard(shard, dag.inputs[root])
            docs, rejects = res.tables()
            rejects = rejects.append_column("stage", pa.array([root] * rejects.num_rows, pa.string()))
            entries.append(write_stage_shard(run_dir, root, key, docs if materialize else None, rejects,
                                             docs.num_rows + rejects.num_rows, hashes[root]))
            t = docs
        elif node == root:
            t = pq.read_table(source_path)
        elif dag.stages[node].kind == "union":
            t = table_of(next(u for u in dag.stages[node].upstreams() if root in roots(dag, u)))
        elif node in done_set:
            t = pq.read_table(Path(run_dir) / node / f"{key}.parquet")
        else:
            st = dag.stages[node]
            table = table_of(st.input)
            t, rej = _process(st, node, table, dag.batch_size, hashes[node])
            entries.append(write_stage_shard(run_dir, node, key, t, rej, table.num_rows, hashes[node]))
        tables[node] = t
        return t

    if shard is not None and root not in done_set:
        table_of(root)
    for name in dag.stages:
        st = dag.stages[name]
        if st.kind == "map" and name not in done_set and root in roots(dag, name):
            table_of(name)
    return entries


# ---------------------------------------------------------------------------------------------
# the run (driver)


def prepare_run_dir(run_dir: Path, dag: Dag, overwrite: bool) -> None:
    """Refuse to mix two different DAGs in one run directory unless asked to."""
    dag_file = run_dir / "dag.yaml"
    if run_dir.exists() and any(run_dir.iterdir()):
        if not dag_file.exists():
            if not overwrite:
                raise RunDirError(f"{run_dir}: exists and is not a refinery run directory (use --overwrite to reuse it)")
        else:
            old = yaml.safe_load(dag_file.read_text())
            if old != dag.to_dict() and not overwrite:
                raise RunDirError(f"{run_dir}: holds a run of a different DAG ({old.get('name')!r}); "
                                  "use another --out, or --overwrite to recompute what changed")
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / ".dag.yaml.tmp"
    tmp.write_text(yaml.safe_dump(dag.to_dict(), sort_keys=False))
    os.replace(tmp, dag_file)


def _init_ray(address: str | None, workers: int) -> None:
    import ray

    if ray.is_initialized():
        return
    os.environ.setdefault("RAY_ACCEPT_CONNECTIONS_FROM_ANY_HOST", "0")
    if address:
        ray.init(address=address, logging_level="WARNING", log_to_driver=True)
    else:
        ray.init(num_cpus=workers, include_dashboard=False, logging_level="WARNING",
                 configure_logging=True, log_to_driver=True)


def run_dag(dag: Dag, run_dir: str | Path, workers: int = 2, address: str | None = None,
            overwrite: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Run (or resume) ``dag`` into ``run_dir``. Returns the final progress state."""
    import ray

    run_dir = Path(run_dir).resolve()
    plan = make_plan(dag)  # fails on missing inputs before any Ray work starts
    prepare_run_dir(run_dir, dag, overwrite)
    progress = RunProgress(run_dir, dag.name, quiet=quiet)
    dag_dict = dag.to_dict()
    try:
        _init_ray(address, workers)
        remote = ray.remote(num_cpus=1, max_retries=3, retry_exceptions=True)(run_root_task)
        failures: list[str] = []

        def run_tasks(phase: str, jobs: list[tuple[str, str, InputShard | None, str | None]]) -> None:
            # what a job writes: the input's own entry (counts, read rejections) and its closure
            stages_of = {root: ([root] if root in dag.inputs else [])
                         + [n for n in plan.closures[root] if dag.stages[n].kind != "union"]
                         for root, *_ in jobs}
            committed = {s: Manifest(run_dir, s).done(plan.hashes[s]) for r in stages_of for s in stages_of[r]}
            todo = []
            for root, key, shard, src in jobs:
                done_stages = tuple(s for s in stages_of[root] if key in committed[s])
                if len(done_stages) < len(stages_of[root]):
                    todo.append((root, key, shard, src, done_stages))
            total, done = len(jobs), len(jobs) - len(todo)
            progress.phase(phase, done, total)
            inflight: dict[Any, tuple[str, str]] = {}
            it = iter(todo)
            while True:
                while len(inflight) < workers:
                    job = next(it, None)
                    if job is None:
                        break
                    root, key, shard, src, done_stages = job
                    ref = remote.remote(dag_dict, dag.path, dag.base_dir, str(run_dir), root, key, shard, src,
                                        root in plan.materialize_inputs, done_stages)
                    inflight[ref] = (root, key)
                if not inflight:
                    break
                ready, _ = ray.wait(list(inflight), num_returns=1)
                for ref in ready:
                    root, key = inflight.pop(ref)
                    try:
                        entries = ray.get(ref)
                    except Exception as e:  # after retries: record, go on, fail at the end
                        failures.append(f"{root}/{key}: {type(e).__name__}: {str(e).splitlines()[-1] if str(e) else ''}")
                        continue
                    for e in entries:
                        Manifest(run_dir, e["stage"]).append([e])
                        progress.stage_counts(e["stage"], e)
                    done += 1
                    progress.phase(phase, done, total)

        # Phase 1: every input shard, with the row-local stages it feeds.
        jobs = [(name, s.key, s, None) for name, shards in plan.input_shards.items() for s in shards]
        run_tasks("read+map", jobs)
        # Then each global stage, followed by the row-local stages downstream of it.
        for name, st in dag.stages.items():
            if st.kind != "global" or failures:
                continue
            upstream = sorted(kf for u in st.upstreams() for kf in stage_files(run_dir, dag, u, plan.hashes))
            ctx = GlobalContext(run_dir, name, plan.hashes[name], workers, upstream, report=progress.phase)
            st.run(ctx)
            jobs = [(name, key, None, path) for key, path in stage_files(run_dir, dag, name, plan.hashes)]
            if plan.closures[name]:
                run_tasks(f"{name}+map", jobs)
        for node in list(dag.inputs) + list(dag.stages):
            Manifest(run_dir, node).compact()
        if failures:
            raise RunFailed(f"{len(failures)} shard(s) failed; rerun the same command to retry them:\n  "
                            + "\n  ".join(failures))
    except BaseException as e:
        progress.finish("failed", f"{type(e).__name__}: {e}")
        raise
    progress.finish("done")
    return progress.state


def clear_run(run_dir: str | Path) -> None:
    shutil.rmtree(run_dir, ignore_errors=True)
