"""``format: run`` inputs: the committed shards of a stage of another run, read through its
``RunDir`` (the manifest is the contract: no globs over another run's part files).

```yaml
inputs:
  docs: {format: run, run: runs/demo, stage: merged}
```

- Only committed shards are read (``RunDir.committed``: the manifest line with the stage's
  current params hash, files present); a union is its branches' shards.
- A stage that writes its signals only (``id`` and its own columns) is joined back to whole
  rows by id, shard by shard, from the stage it reads (recursively), as its SQL view is.
- The upstream run must be finished (its ``progress.json`` says ``done``); ``allow_partial:
  true`` reads what is committed so far (follow a live run: a rerun picks up new shards).
- A shard with no rows is 0 documents (its manifest line says rows 0), never a rejected row.
- Shard keys are ``INPUT-UPSTREAMKEY``, stable as the upstream grows. Each input shard's
  manifest line records where it came from (``upstream``: run, stage, the leaf stage and key,
  its params hash, the file's sha256 and rows); a rerun whose upstream shard changed since
  (another sha256) reads it again, with the row-local stages below it.
- A rerun is refused (``check_upstream``, before any work) when this run's committed shards
  were made from an upstream shard that is no longer committed there (its rows would stay in
  this run's stages and outputs), or from one that changed while a global stage below the
  input has committed output (a global stage is not redone for one changed input shard).
"""

from __future__ import annotations

import json
import posixpath
from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from curation.io import location
from curation.io.inputs import InputError, InputShard, InputSpec

FORMAT = "run"


@dataclass(frozen=True)
class Upstream:
    """Where one shard of a ``format: run`` input comes from."""

    run: str
    stage: str
    leaf: str
    key: str
    params_hash: str
    sha256: str | None
    rows: int
    #: (node, params hash) of the stages whose rows a signals-only leaf is joined to, nearest first
    joins: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict:
        return {"run": self.run, "stage": self.stage, "leaf": self.leaf, "key": self.key,
                "params_hash": self.params_hash, "sha256": self.sha256, "rows": self.rows}


def run_root(spec: InputSpec, base_dir: str | None) -> str:
    run = spec.run or ""
    if base_dir and "://" not in run and not posixpath.isabs(run):
        run = posixpath.join(base_dir, run)
    return run


def plan_run_input(name: str, spec: InputSpec, base_dir: str | None = None) -> tuple[list[InputShard], dict[str, Upstream]]:
    """The input's shards (one per committed upstream shard, by key) and, per shard key, where
    it comes from. Raises ``InputError`` (one line) for a run or stage that cannot be read."""
    from curation.pipeline.dag import DagError
    from curation.pipeline.rundir import RunDir, RunNotFound

    where = f"inputs.{name}"
    root = run_root(spec, base_dir)
    rd = RunDir(root)
    try:
        dag = rd.load_dag()
    except RunNotFound:
        raise InputError(f"{where}.run: {spec.run!r} is not a refinery run directory (no dag.yaml)") from None
    except DagError as e:
        raise InputError(f"{where}.run: {spec.run!r}: its dag.yaml does not load: {e}") from None
    stage = spec.stage or ""
    if stage not in dag.inputs and stage not in dag.stages:
        raise InputError(f"{where}.stage: {stage!r} is not a node of {spec.run} "
                         f"(its nodes: {', '.join(list(dag.inputs) + list(dag.stages))})")
    progress = _progress(rd)
    state = (progress or {}).get("state")
    if state != "done" and not spec.allow_partial:
        raise InputError(f"{where}: {spec.run} is not finished (progress.json state: {state or 'none'}); "
                         "wait for it, or set allow_partial: true to read what it has committed so far")
    hashes = dag.hashes()
    shards: list[InputShard] = []
    upstream: dict[str, Upstream] = {}
    for leaf in dag.leaves(stage):
        joins = _join_chain(dag, leaf, hashes)
        for k, e in sorted(rd.committed(leaf, hashes[leaf]).items()):
            if not e.get("file"):
                if int(e.get("rows") or 0):
                    raise InputError(f"{where}.stage: {leaf!r} of {spec.run} keeps no rows on disk (an input read "
                                     "straight into its stages); read a stage after it")
                path, size = None, 0
            else:
                path, size = rd.path(e["file"]), int(e.get("bytes") or 0)
            key = f"{name}-{k}"
            shards.append(InputShard(name, key, path or "", f"{leaf}/{k}", FORMAT, 0, 1, size))
            upstream[key] = Upstream(str(spec.run), stage, leaf, k, hashes[leaf], e.get("sha256"),
                                     int(e.get("rows") or 0), joins)
    if not shards and not spec.allow_partial:
        raise InputError(f"{where}: {spec.run}/{stage} has no committed shards")
    return shards, upstream


def check_upstream(rundir, dag, hashes: dict[str, str], upstream: dict[str, dict[str, Upstream]]) -> None:
    """Refuse a rerun into ``rundir`` whose committed work was made from upstream shards that
    are gone (no longer committed in the upstream run) or, below a global stage that has
    committed output, changed. ``upstream``: per ``format: run`` input, the shards planned now.
    Raises ``InputError`` naming the input, the shards and what to do."""
    for name, planned in upstream.items():
        mine = {k: e for k, e in rundir.committed(name, hashes[name]).items() if e.get("upstream")}
        if not mine:
            continue
        spec = dag.inputs[name]
        where = f"inputs.{name}: {spec.run}/{spec.stage}"
        redo = f"run into a new --out (or delete {rundir.root}) to read the upstream as it is now"
        gone = sorted(k for k in mine if k not in planned)
        if gone:
            raise InputError(f"{where}: {len(gone)} shard(s) this run read are no longer committed there "
                             f"({_some(gone)}); their rows are still in this run's stages: {redo}")
        changed = sorted(k for k, e in mine.items() if e["upstream"].get("sha256") != planned[k].sha256)
        below = [g for g, st in dag.stages.items()
                 if st.kind == "global" and name in _ancestors(dag, g) and rundir.committed(g, hashes[g])]
        if changed and below:
            raise InputError(f"{where}: {len(changed)} shard(s) this run read changed since ({_some(changed)}) "
                             f"and the global stage(s) {', '.join(below)} below them have committed output made "
                             f"from the old rows: {redo}")


def _some(keys: list[str], n: int = 3) -> str:
    return ", ".join(keys[:n]) + (f" and {len(keys) - n} more" if len(keys) > n else "")


def _ancestors(dag, node: str) -> set[str]:
    """Every node whose rows flow into ``node``."""
    out: set[str] = set()
    todo = [node]
    while todo:
        n = todo.pop()
        st = dag.stages.get(n)
        for u in (st.upstreams() if st is not None else ()):
            if u not in out:
                out.add(u)
                todo.append(u)
    return out


def _progress(rd) -> dict | None:
    try:
        return json.loads(location.read_text(rd.progress_file))
    except (OSError, ValueError):
        return None


def _join_chain(dag, leaf: str, hashes: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """For a signals-only stage, the stages whose rows it is joined to (nearest first, up to one
    that writes whole rows); empty for a stage that writes whole rows."""
    out: list[tuple[str, str]] = []
    node = leaf
    while node in dag.stages and dag.stages[node].kind == "map" and not dag.writes_rows(node):
        node = dag.stages[node].input  # the branch holding this key is resolved per shard
        out.append((node, ""))
    return tuple(out)


def node_rows(path: str, batch_size: int = 8192) -> Iterator[pa.Table] | None:
    """The whole rows of ``RUN/NODE`` (``rundir.stage_of``: a local folder or a URL), read as a
    ``format: run`` input reads them: its committed shards through the manifest, in key order,
    a union's branches, a signals-only stage joined back to whole rows; what is committed so far
    (the run need not be finished). None when ``path`` is not a node of a run directory.
    (``refinery quality label RUN/STAGE`` reads its crawl this way.)"""
    from curation.pipeline.rundir import stage_of

    hit = stage_of(path)
    if hit is None:
        return None
    run, node = hit
    spec = InputSpec(format=FORMAT, run=run.root, stage=node, allow_partial=True)
    shards, upstream = plan_run_input(node, spec)
    if not shards:
        raise InputError(f"{path}: no committed shards (run the pipeline first)")

    def rows() -> Iterator[pa.Table]:
        for shard in shards:
            yield from iter_run_shard(shard, spec, upstream[shard.key], None, batch_size)

    return rows()


# ---------------------------------------------------------------------------------------------
# the task side


def iter_run_shard(shard: InputShard, spec: InputSpec, up: Upstream, base_dir: str | None,
                   batch_size: int) -> Iterator[pa.Table]:
    """The shard's whole rows, ``batch_size`` at a time (at least one batch, possibly empty,
    from a file; none for a shard with no file: it kept no row upstream)."""
    from curation.pipeline.rundir import RunDir

    if not shard.path:
        return
    f = location.parquet_file(shard.path)
    base = _whole_rows(RunDir(run_root(spec, base_dir)), up) if up.joins else None
    n = 0
    for rb in f.iter_batches(batch_size=batch_size):
        n += 1
        yield _finish(pa.Table.from_batches([rb]), base, spec)
    if not n:
        yield _finish(f.schema_arrow.empty_table(), base, spec)


def _whole_rows(rd, up: Upstream) -> pa.Table:
    """The rows a signals-only leaf's shard ``up.key`` is joined to: its input's shard of the
    same key (a union: the branch that has it), itself joined further up when it is signals-only
    too."""
    dag = rd.load_dag()
    hashes = dag.hashes()
    node = dag.stages[up.leaf].input
    for leaf in dag.leaves(node):
        e = rd.committed(leaf, hashes[leaf]).get(up.key)
        if e is None:
            continue
        if not e.get("file"):
            raise InputError(f"{rd.root}: {leaf!r} keeps no rows for {up.key}: cannot join {up.leaf!r}'s signals")
        table = location.read_parquet(rd.path(e["file"]))
        if leaf in dag.stages and dag.stages[leaf].kind == "map" and not dag.writes_rows(leaf):
            parent = _whole_rows(rd, Upstream(up.run, up.stage, leaf, up.key, hashes[leaf], None, 0, ((leaf, ""),)))
            table = _join(parent, table)
        return table
    raise InputError(f"{rd.root}: no committed shard {up.key} upstream of {up.leaf!r}")


def _join(base: pa.Table, signals: pa.Table) -> pa.Table:
    """``signals``' rows in their order, with ``base``'s columns for the same id (``signals``'
    own columns replace ``base``'s)."""
    pos = pc.index_in(signals.column("id"), value_set=base.column("id"))
    if pos.null_count:
        raise InputError("a signals-only shard names ids its input's shard does not have")
    rows = base.take(pos)
    for c in signals.column_names:
        if c == "id":
            continue
        if c in rows.column_names:
            rows = rows.set_column(rows.schema.get_field_index(c), c, signals.column(c))
        else:
            rows = rows.append_column(c, signals.column(c))
    return rows


def _finish(batch: pa.Table, base: pa.Table | None, spec: InputSpec) -> pa.Table:
    if base is not None:
        batch = _join(base, batch)
    if spec.source is not None:
        src = pa.array([spec.source] * batch.num_rows, pa.string())
        if "source" in batch.column_names:
            batch = batch.set_column(batch.schema.get_field_index("source"), "source", src)
        else:
            batch = batch.append_column("source", src)
    return batch
