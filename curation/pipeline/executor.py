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
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.io import location
from curation.io.inputs import InputShard, plan_index, plan_input, stamp_index
from curation.io.read import iter_read
from curation.pipeline.allocator import chain_thread, keep_batch_blocks
from curation.pipeline.context import GlobalContext
from curation.pipeline.dag import Dag, parse_dag, roots
from curation.pipeline.progress import RunProgress
from curation.pipeline.rundir import RunDir, RunDirError, ShardWriter  # noqa: F401  (RunDirError: callers catch it from here)
from curation.pipeline.run_input import FORMAT as RUN_FORMAT, Upstream, check_upstream, iter_run_shard, plan_run_input
from curation.pipeline.tasks import Resources, TasksFailed, run_bounded
from curation.formats.documents import PAYLOAD_COLUMNS
from curation.io.shards import replace_column, split_kept_rejected
from curation.stages.base import MapStage, registry

#: manifest field: hash of a stage's signal parameters (see ``MapStage.signals_hash``)
SIGNALS_HASH = "signals_hash"


class RunFailed(RuntimeError):
    """Some shards failed after retries; the rest are committed and a rerun resumes."""


class DiskQuotaExceeded(RunFailed):
    """The run directory grew past the run's disk quota (``curation.pipeline.quota``)."""


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
    #: ``format: run`` inputs: input -> shard key -> where the shard comes from
    upstream: dict[str, dict[str, Upstream]] = field(default_factory=dict)

    def writes(self, root: str) -> list[str]:
        """The nodes whose shards a task of ``root`` writes: the input itself, its map stages."""
        return ([root] if root in self.dag.inputs else []) + [
            n for n in self.closures[root] if self.dag.stages[n].kind != "union"]

    def resources(self, root: str) -> Resources:
        return Resources.most(self.dag.stages[n].resources for n in self.closures[root]
                              if self.dag.stages[n].kind == "map")


def make_plan(dag: Dag) -> Plan:
    """Validate inputs (globs must match) and work out which stages each root feeds. An index
    input (``format: cc_index``) gets its index's identity in its spec (``index_stamp``: in
    ``dag`` itself, so in its params hash and ``dag.yaml``) and its where checked; its records
    are selected by ``select_indexes`` once the run directory is prepared."""
    input_shards: dict[str, list[InputShard]] = {}
    upstream: dict[str, dict[str, Upstream]] = {}
    for name, spec in dag.inputs.items():
        if spec.format == RUN_FORMAT:
            input_shards[name], upstream[name] = plan_run_input(name, spec, dag.base_dir)
        elif spec.format == "cc_index":
            dag.inputs[name] = stamp_index(name, spec, dag.base_dir)
            input_shards[name] = []
        else:
            input_shards[name] = plan_input(name, spec, dag.base_dir)
    closures: dict[str, list[str]] = {}
    for root in list(dag.inputs) + [n for n, s in dag.stages.items() if s.kind == "global"]:
        closures[root] = [n for n, s in dag.stages.items() if s.kind != "global" and root in roots(dag, n)]
    materialize = {name for name in dag.inputs if dag.input_materialized(name)}
    return Plan(dag, dag.hashes(), dag.signal_hashes(), input_shards, closures, materialize, upstream)


def select_indexes(plan: Plan, rundir: RunDir) -> None:
    """Each index input's records, selected into files below the run (``RUN/INPUT/_work/HASH/``,
    ``curation/io/cc_selection.py``; the one a run before wrote with the same index, where and
    settings is reused), cut into the input's shards. Selections made for another params hash
    (another index or where) are removed: no shard of this run reads them."""
    for name, spec in plan.dag.inputs.items():
        if spec.format != "cc_index":
            continue
        work = rundir.work_dir(name, plan.hashes[name])
        plan.input_shards[name] = plan_index(name, spec, plan.dag.base_dir, work).shards
        for old in {location.parent(p) for p in location.files_under(location.parent(work))}:
            if location.name(old) != location.name(work) and location.parent(old).rstrip("/").endswith("/_work"):
                location.remove(old, recursive=True)


@dataclass(frozen=True)
class PlannedJob:
    """A root shard's task still to run: which of the stages it writes are done (committed
    with the current params hash, and readable back as rows where a stage to run needs them)
    and the manifest entries it may re-decide from."""

    root: str
    key: str
    shard: InputShard | None
    source_path: str | None
    done: tuple[str, ...]
    signals: tuple[tuple[str, dict], ...]
    upstream: Upstream | None


def plan_jobs(plan: Plan, jobs: list[tuple[str, str, InputShard | None, str | None]],
              committed: dict[str, dict[str, dict]], redecide: dict[str, dict[str, dict]]) -> list[PlannedJob]:
    """What is done, what must run again and what can be re-decided, for each ``(root, key,
    shard, source path)`` of a phase; the jobs with nothing left to write are left out.
    ``committed``: stage -> key -> manifest entry with the current params hash, for every stage
    the jobs write; ``redecide``: stage -> key -> entry with the current signals hash (stages
    with rules). No I/O: the driver reads the manifests once and hands them in."""
    dag = plan.dag
    out = []
    for root, key, shard, src in jobs:
        writes = plan.writes(root)
        done = {s for s in writes if key in committed[s]}
        up = plan.upstream.get(root, {}).get(key)
        if up is not None and root in done and \
                committed[root][key].get("upstream", {}).get("sha256") != up.sha256:
            done = set()  # the upstream shard changed since: read it again, and all below it
        # shards of signals only cannot be read back as rows, and a shard that kept no row has
        # no file: a stage still to run that takes a done stage's rows runs it again (the same
        # bytes come out)
        changed = True
        while changed:
            changed = False
            for s in writes:
                if s in done or s not in dag.stages:
                    continue
                for f in dag.feeders(s):
                    no_file = f in committed and key in committed[f] and not committed[f][key].get("file") \
                        and (f in dag.stages or f in plan.materialize_inputs)
                    if f in done and (no_file or f in dag.stages and not dag.writes_rows(f)):
                        done.discard(f)
                        changed = True
        done_stages = tuple(s for s in writes if s in done)
        if len(done_stages) < len(writes):
            stored = tuple((s, redecide[s][key]) for s in writes if key in redecide.get(s, {}))
            out.append(PlannedJob(root, key, shard, src, done_stages, stored, up))
    return out


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
    #: a ``format: run`` input's shard: where it comes from (recorded on its manifest line)
    upstream: Upstream | None = None


_DAGS: dict[str, Dag] = {}
_READY: set[tuple[str, str]] = set()


def _worker_dag(job: RootJob) -> Dag:
    fp = hashlib.sha256(json.dumps(job.dag, sort_keys=True).encode()).hexdigest()
    for name, cls in job.user_stages:
        registry.setdefault(name, cls)
    if fp not in _DAGS:
        _DAGS[fp] = parse_dag(job.dag, job.dag_path, job.base_dir)
    return _DAGS[fp]


def _setup_once(stage: MapStage, name: str, hash_: str) -> None:
    if (name, hash_) not in _READY:  # models, tokenizers: once per worker process
        stage.setup()
        _READY.add((name, hash_))


def _stored_signals(rundir: RunDir, e: dict | None, own: tuple[str, ...]) -> pa.Table | None:
    """Every row (kept and rejected) a stage measured for a shard with the same signal
    parameters (entry ``e``), without the payload columns it does not set (held for the whole
    task: its signals, not its text); rows whose stored text was not kept (a rejected row
    outside the sample) are left out when the stage rewrites text, so they are measured
    again. None if there are none."""
    if not e or (e.get("file") is None and e.get("rows")):
        return None
    if not all(location.exists(rundir.path(f)) for f in (e.get("file"), e.get("rejected_file")) if f):
        return None
    drop = {"stage", "reason", *(c for c in PAYLOAD_COLUMNS if c not in own)}
    parts = [t.drop_columns([c for c in t.column_names if c in drop])
             for t in rundir.read_entry(e) if t is not None and "id" in t.column_names]
    if not parts:
        return None
    stored = pa.concat_tables(parts, promote_options="default") if len(parts) > 1 else parts[0]
    if "text" in own:
        stored = stored.filter(pc.is_valid(stored.column("text")))
    return stored.combine_chunks()


class _RejectedText:
    """Which rejected rows keep their payload (text, html, tokens): all, none, or the first
    ``n`` per reason in the task's row order (the same rows whatever the batch size)."""

    def __init__(self, policy: str, n: int):
        self.policy, self.n = policy, n
        self.seen: dict[str, int] = {}

    def __call__(self, rej: pa.Table | None) -> pa.Table | None:
        """Rejected rows (with their ``reason`` column) under this policy: the payload of
        the rows that do not keep it made null."""
        if rej is None or self.policy == "all" or not any(c in rej.column_names for c in PAYLOAD_COLUMNS):
            return rej
        mask = pa.array(self._kept_payload(rej.column("reason").combine_chunks()))
        for c in PAYLOAD_COLUMNS:
            if c in rej.column_names:
                col = rej.column(c)
                rej = replace_column(rej, c, pc.if_else(mask, col, pa.nulls(rej.num_rows, col.type)))
        return rej

    def split(self, table: pa.Table, reasons: pa.Array | None, stage: str) -> tuple[pa.Table, pa.Table | None]:
        """``split_kept_rejected`` then this policy, without copying a payload that is then
        dropped: a rejected row's text is taken only when it keeps it (after a Gopher filter
        most rejected rows' text was copied once by the filter and once more into nulls)."""
        payload = [c for c in table.column_names if c in PAYLOAD_COLUMNS]
        if reasons is None or reasons.null_count == len(reasons) or self.policy == "all" or not payload:
            return split_kept_rejected(table, reasons, stage)
        keep = pc.is_null(reasons)
        drop = np.flatnonzero(~keep.to_numpy(zero_copy_only=False))
        reason = reasons.take(pa.array(drop)).cast(pa.string())
        rows = pa.array(drop)
        payload_rows = pa.array(drop, mask=~self._kept_payload(reason))  # null: a null payload
        rej = pa.Table.from_arrays([table.column(c).take(payload_rows if c in PAYLOAD_COLUMNS else rows)
                                    for c in table.column_names], schema=table.schema)
        rej = rej.append_column("stage", pa.array([stage] * len(drop), pa.string()))
        return table.filter(keep), rej.append_column("reason", reason)

    def _kept_payload(self, reason: pa.Array) -> np.ndarray:
        """bool per rejected row (``reason``, in the task's row order): whether it keeps its payload."""
        keep = np.zeros(len(reason), bool)
        if self.policy == "sample":  # per distinct reason (a few per batch), not per row
            codes = pc.dictionary_encode(reason)
            idx = codes.indices.to_numpy(zero_copy_only=False)
            for c, r in enumerate(codes.dictionary.to_pylist()):
                room = self.n - self.seen.get(r, 0)
                if room > 0:
                    first = np.flatnonzero(idx == c)[:room]
                    keep[first] = True
                    self.seen[r] = self.seen.get(r, 0) + len(first)
        return keep


class _Step:
    """One map stage in a streaming task: takes a batch (with its text state), writes the kept
    and rejected rows to the stage's shard writer, and hands the kept rows on. A stage that
    writes signals only (``Dag.writes_rows``) writes ``id`` and its own columns of kept rows."""

    def __init__(self, name: str, stage: MapStage, hash_: str, writer: ShardWriter, own: tuple[str, ...] | None,
                 whole_rows: bool, rejected_text: _RejectedText, stored: pa.Table | None, extra: dict):
        self.name, self.stage, self.hash, self.writer = name, stage, hash_, writer
        self.own, self.whole_rows, self.rejected_text = own, whole_rows, rejected_text
        self.stored = stored  # rows measured before with the same signal parameters: re-decided
        self.extra = extra
        self.measured = 0

    def __call__(self, batch: pa.Table, text: Any) -> tuple[pa.Table, Any]:
        if self.stored is not None:
            kept, rej = self._redecide(batch)
            rej = self.rejected_text(rej)
            kept_text = None
        else:
            _setup_once(self.stage, self.name, self.hash)
            res = self.stage.run_batch(batch, text if batch.num_rows else None)
            kept, rej = self.rejected_text.split(res.table, res.reasons, self.name)
            if res.text is not None and res.reasons is not None:
                kept_rows = np.flatnonzero(pc.is_null(res.reasons).to_numpy(zero_copy_only=False))
                # the kept table's text is the state's text filtered: not copied a second time
                kept_text = res.text.take(kept_rows, kept.column("text") if "text" in kept.column_names else None)
            else:
                kept_text = res.text
            self.measured += batch.num_rows
        written = kept
        if not self.whole_rows:
            written = kept.select(["id", *self._own_of(kept, batch)])
        self.writer.append(written, rej, batch.num_rows)
        return kept, kept_text

    def _own_of(self, table: pa.Table, batch: pa.Table) -> list[str]:
        """The stage's own columns in ``table`` (its output for ``batch``), in order: those it
        declares and any it added (per-language rules add their own signals)."""
        own = self.own or ()
        return [c for c in table.column_names if c != "id" and (c in own or c not in batch.column_names)]

    def _redecide(self, batch: pa.Table) -> tuple[pa.Table, pa.Table | None]:
        """Decide from the stored signals joined to the batch by id; measure only the rows not
        among them."""
        assert self.stored is not None and self.own is not None
        ids = batch.column("id")
        pos = pc.index_in(ids, value_set=self.stored.column("id"))
        missing = pc.invert(pc.is_valid(pos))
        n_missing = pc.sum(missing.cast(pa.int64())).as_py() or 0
        if n_missing:
            _setup_once(self.stage, self.name, self.hash)
            measured = self.stage.run_batch(batch.filter(missing), None).table
            fresh = measured.select(["id", *self._own_of(measured, batch)])
            self.stored = pa.concat_tables([self.stored, fresh], promote_options="default").combine_chunks()
            pos = pc.index_in(ids, value_set=self.stored.column("id"))
            self.measured += n_missing
        sig = self.stored.take(pos)
        sig = sig.select(["id", *self._own_of(sig, batch)])
        table = batch
        for c in sig.column_names[1:]:  # own columns replace the batch's or are appended, in order
            if c in table.column_names:
                table = table.set_column(table.schema.get_field_index(c), c, sig.column(c))
            else:
                table = table.append_column(c, sig.column(c))
        table = table.combine_chunks()
        return split_kept_rejected(table, self.stage.decide(table), self.name)

    def close(self) -> dict:
        extra = dict(self.extra)
        if self.stage.rules:
            extra["measured_rows"] = self.measured
        if not self.whole_rows:
            extra["whole_rows"] = False
        return self.writer.close(**extra)


class _Coalesced:
    """Kept rows of one stage waiting to go on together, up to ``rows`` rows or ``nbytes``.

    A read batch is cut by payload bytes, so after extraction (HTML of ~100 KB a page, text a
    twentieth of it) a batch holds ~30 small documents, and every stage below pays its fixed
    per-batch cost (Arrow kernels, compiled calls, writer appends) for 30 rows. Joining them
    back to the read budget cut the filter chain's time by a quarter on the scale WARC. Rows
    keep their order and shard files are cut in fixed row groups, so the output is the same.
    Only batches without a text state are joined (a state belongs to one text array)."""

    def __init__(self, rows: int, nbytes: int):
        self.rows, self.nbytes = rows, nbytes
        self.held: list[pa.Table] = []
        self.n = self.size = 0

    def add(self, batch: pa.Table) -> list[pa.Table]:
        out = []
        if self.held and batch.schema != self.held[0].schema:
            out = self.drain()
        self.held.append(batch)
        self.n += batch.num_rows
        self.size += batch.nbytes
        if self.n >= self.rows or self.size >= self.nbytes:
            out += self.drain()
        return out

    def drain(self) -> list[pa.Table]:
        """The held rows as one batch (an empty batch too: the stages below learn the schema)."""
        if not self.held:
            return []
        joined = self.held[0] if len(self.held) == 1 else pa.concat_tables(self.held).combine_chunks()
        self.held, self.n, self.size = [], 0, 0
        return [joined]


def _batches(path: str | os.PathLike, batch_size: int) -> Iterator[pa.Table]:
    """A committed shard's rows, ``batch_size`` at a time (at least one, possibly empty, batch)."""
    f = location.parquet_file(path)
    n = 0
    for rb in f.iter_batches(batch_size=batch_size):
        n += 1
        yield pa.Table.from_batches([rb])
    if not n:
        yield f.schema_arrow.empty_table()


def run_root_task(job: RootJob) -> tuple[list[dict], str | None]:
    """Read one root shard and run every row-local stage it feeds. Returns manifest entries
    and the Ray node it ran on."""
    return _root_entries(job), _node_id()


def _root_entries(job: RootJob) -> list[dict]:
    """Stream the root shard through the task's map stages, batch by batch: each batch goes
    through the fused chain (and every branch of it) before the next is read, and each stage
    appends its rows to its own shard files as they come. A worker holds one read batch and a
    row group per stage, never a whole shard.

    Read batches close at ``dag.batch_size`` rows or ``dag.batch_bytes`` of payload. Stages are
    row-local and shard files are cut in fixed row groups, so the output does not depend on
    either: any batch size and any worker count give byte-identical shards."""
    keep_batch_blocks()  # freed batch arrays stay in the heap: no page faults per batch
    dag = _worker_dag(job)
    hashes, sig = dag.hashes(), dag.signal_hashes()
    rundir, root, key = job.rundir, job.root, job.key
    done = set(job.done)
    signals = dict(job.signals)

    def feeder(name: str) -> str:
        """The node whose batches a stage's input is: unions resolve to the branch this root feeds."""
        st = dag.stages.get(name)
        if st is not None and st.kind == "union":
            return feeder(next(u for u in st.upstreams() if root in roots(dag, u)))
        return name

    todo = [n for n, st in dag.stages.items() if st.kind == "map" and n not in done and root in roots(dag, n)]
    children: dict[str, list[str]] = {}
    for n in todo:
        children.setdefault(feeder(dag.stages[n].input), []).append(n)
    steps: dict[str, _Step] = {}
    chain = chain_thread()
    root_writer: ShardWriter | None = None
    read_bytes: dict[str, int] = {}
    try:
        for n in todo:
            st = dag.stages[n]
            own = dag.own_columns(n)
            stored = _stored_signals(rundir, signals.get(n), own) if st.rules and own is not None else None
            extra = {SIGNALS_HASH: sig[n]} if st.rules else {}
            steps[n] = _Step(n, st, hashes[n], rundir.open_shard(n, key, hashes[n]), own, dag.writes_rows(n),
                             _RejectedText(dag.rejected_text, dag.rejected_text_sample), stored, extra)

        pending = {n: _Coalesced(dag.batch_size, dag.batch_bytes) for n in todo if n in children}

        def push(name: str, batch: pa.Table, text: Any) -> None:
            # the stages fed by a stage of this task (the chain after extraction) on the chain
            # thread, the ones fed by the read on this one: two heaps (see ``allocator``)
            if chain is not None and name in steps and not chain.here():
                chain.call(push, name, batch, text)
                return
            for child in children.get(name, ()):
                kept, kept_text = steps[child](batch, text)
                emit(child, kept, kept_text)

        def emit(name: str, batch: pa.Table, text: Any) -> None:
            """Hand a stage's kept rows on: small batches without a text state are joined first."""
            buf = pending.get(name)
            if buf is None or text is not None:
                push(name, batch, text)
                return
            for full in buf.add(batch):
                push(name, full, None)

        def flush() -> None:
            for n in pending:  # parents before children: a flush feeds the buffers below it
                for rest in pending[n].drain():
                    push(n, rest, None)

        # sources: the root, then committed stages whose shard a stage still to run reads
        sources = ([root] if root not in done or root in children else []) + [n for n in children if n != root and n not in steps]
        for src in sources:
            if src == root and job.shard is not None and job.upstream is not None and not (job.materialize and root in done):
                # another run's committed shard: whole rows as they are (0 rows: 0 documents)
                if root not in done:
                    root_writer = rundir.open_shard(root, key, hashes[root], materialize=job.materialize)
                    read_bytes = {"upstream": job.upstream.to_dict()}
                for docs in iter_run_shard(job.shard, dag.inputs[root], job.upstream, dag.base_dir, dag.batch_size):
                    if root_writer is not None:
                        root_writer.append(docs, None, docs.num_rows)
                    push(root, docs, None)
            elif src == root and job.shard is not None and not (job.materialize and root in done):
                if root not in done:
                    root_writer = rundir.open_shard(root, key, hashes[root], materialize=job.materialize)
                for res in iter_read(job.shard, dag.inputs[root], dag.batch_size, dag.batch_bytes):
                    read_bytes = {"bytes_read": res.bytes_read, "bytes_decompressed": res.bytes_decompressed}
                    if res.empty:  # a file with nothing in it: noted, 0 documents, no rejected row
                        read_bytes.update(empty_file=res.empty, empty_file_path=job.shard.relpath)
                    docs, rejects = res.tables()
                    if root_writer is not None:
                        rejects = rejects.append_column("stage", pa.array([root] * rejects.num_rows, pa.string()))
                        root_writer.append(docs, rejects, docs.num_rows + rejects.num_rows)
                    push(root, docs, None)
            else:
                path = (job.source_path if src == root and job.shard is None else rundir.shard_path(src, key))
                for batch in _batches(path, dag.batch_size):
                    push(src, batch, None)
            flush()
        # the read's cumulative byte counts: every byte read once is checkable from the manifest
        entries = [root_writer.close(**read_bytes)] if root_writer is not None else []
        return entries + [steps[n].close() for n in todo]
    except BaseException:
        if chain is not None:
            chain.settle()  # interrupted while the chain ran: it stops writing before the abort
        for w in [root_writer, *(s.writer for s in steps.values())]:
            if w is not None:
                w.abort()
        raise


def _task_bytes(job: RootJob) -> int:
    """The input bytes a task reads (its byte range of an input file; 0 for a global stage's
    shard, whose size would cost a request per task on object storage: its ETA is by tasks)."""
    return max(0, job.shard.end - job.shard.start) if job.shard is not None else 0


def _task_label(job: RootJob) -> str:
    """What a straggler is called: its input file (with the byte range of a part), or the shard."""
    s = job.shard
    if s is None:
        return f"{job.root}/{job.key}"
    if s.nparts > 1:
        return f"{job.key} {s.path} [{s.start}:{s.end}]"
    return f"{job.key} {s.path or s.relpath}"


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


def init_ray(address: str | None, workers: int | None) -> int:
    """Connect to ``address`` (or start an embedded Ray with ``workers`` CPUs, all local CPUs
    when None). Returns the tasks to keep in flight: ``workers``, or every CPU the cluster
    reports (on a cluster of 100 nodes, all of them).

    Embedded is ``address="local"``: a bare ``ray.init`` joins whatever cluster ``ray start``
    (or ``ray.cluster_utils``) last recorded on this machine, and then refuses ``num_cpus``
    ("When connecting to an existing cluster, num_cpus ... must not be provided"): a run
    without ``--address`` failed on any machine where someone had started a cluster."""
    import ray

    if not ray.is_initialized():
        os.environ.setdefault("RAY_ACCEPT_CONNECTIONS_FROM_ANY_HOST", "0")
        if address:
            ray.init(address=address, logging_level="WARNING", log_to_driver=True)
        else:
            ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level="WARNING",
                     configure_logging=True, log_to_driver=True)
    return workers if workers else max(1, int(ray.cluster_resources().get("CPU", 1)))


def _map_stage_reports(dag: Dag, rundir: RunDir) -> None:
    """Reports of map stages that summarise their committed shards (``decontaminate``):
    ``stage.summarise_run(read, docs) -> (file name, report)``, where ``read(columns,
    filters)`` returns those columns of the stage's kept and rejected rows (Parquet filters,
    so row groups whose statistics exclude a match are skipped) and ``docs`` is its rows in."""
    hashes = dag.hashes()
    for name, st in dag.stages.items():
        if st.kind != "map" or not hasattr(st, "summarise_run"):
            continue
        entries = list(rundir.committed(name, hashes[name]).values())

        def read(columns: list[str], filters: list | None = None, entries: list[dict] = entries) -> pa.Table | None:
            parts = []
            for e in entries:
                for key in ("file", "rejected_file"):
                    if not e.get(key):
                        continue
                    path = rundir.path(e[key])
                    if all(c in location.read_schema(path).names for c in columns):
                        parts.append(location.read_parquet(path, columns=columns, filters=filters).select(columns))
            return pa.concat_tables(parts, promote_options="default") if parts else None

        filename, report = st.summarise_run(read, sum(int(e.get("rows_in", 0)) for e in entries))
        rundir.write_report(name, filename, report)


def run_dag(dag: Dag, run_dir: str | os.PathLike, workers: int | None = None, address: str | None = None,
            overwrite: bool = False, quiet: bool = False) -> dict[str, Any]:
    """Run (or resume) ``dag`` into ``run_dir``. Returns the final progress state."""
    rundir = RunDir(run_dir)
    plan = make_plan(dag)  # fails on missing inputs before any Ray work starts
    check_upstream(rundir, dag, plan.hashes, plan.upstream)  # a format: run input's shards gone or changed
    rundir.prepare(dag, overwrite)
    select_indexes(plan, rundir)
    progress = RunProgress(rundir.write_progress, dag.name, quiet=quiet,
                           min_write_s=2.0 if rundir.remote else 0.0, workers=workers)
    dag_dict = dag.to_dict()
    failures: list[str] = []
    from curation.pipeline.quota import DiskQuota

    quota = DiskQuota.for_run(rundir)  # $REFINERY_MAX_RUN_BYTES (the service's --max-run-bytes); else none
    try:
        quota.start()
        workers = init_ray(address, workers)
        user_stages = _ship_user_stages(dag)

        def run_tasks(phase: str, jobs: list[tuple[str, str, InputShard | None, str | None]]) -> None:
            writes = {root: plan.writes(root) for root, *_ in jobs}
            committed = {s: rundir.committed(s, plan.hashes[s]) for ws in writes.values() for s in ws}
            # entries whose signals can be re-decided: same signals hash, other params hash
            redecide = {s: {k: e for k, e in rundir.entries(s).items() if e.get(SIGNALS_HASH) == plan.signal_hashes[s]}
                        for ws in writes.values() for s in ws if s in dag.stages and dag.stages[s].rules}
            todo = [RootJob(dag_dict, dag.path, dag.base_dir, rundir, j.root, j.key, j.shard, j.source_path,
                            j.root in plan.materialize_inputs, j.done, j.signals, user_stages, j.upstream)
                    for j in plan_jobs(plan, jobs, committed, redecide)]
            total, finished = len(jobs), len(jobs) - len(todo)
            progress.tasks_planned(phase, sum(_task_bytes(j) for j in todo))
            progress.phase(phase, finished, total)

            def on_result(i: int, result: tuple[list[dict], str | None]) -> None:
                nonlocal finished
                entries, node = result
                progress.task_node(node)
                rundir.commit(entries)  # one append per stage for the whole task
                for e in entries:
                    progress.stage_counts(e["stage"], e)
                finished += 1
                root_entry = next((e for e in entries if e["stage"] == todo[i].root), entries[0] if entries else {})
                progress.task_finished(phase, i, int(root_entry.get("rows_in", 0)), node)
                progress.phase(phase, finished, total)

            def on_error(i: int, msg: str) -> None:
                failures.append(f"{todo[i].root}/{todo[i].key}: {msg}")
                progress.task_finished(phase, i, 0, None, ok=False)

            def on_submit(i: int) -> None:
                progress.task_started(phase, i, _task_label(todo[i]), _task_bytes(todo[i]))

            run_bounded(run_root_task, [(j,) for j in todo], workers, [plan.resources(j.root) for j in todo],
                        on_result, on_error, on_submit=on_submit, on_idle=progress.write,
                        on_retries=progress.retried)

        # Phase 1: every input shard, with the row-local stages it feeds.
        run_tasks("read+map", [(name, s.key, s, None) for name, shards in plan.input_shards.items() for s in shards])
        # Then each global stage, followed by the row-local stages downstream of it.
        for name, st in dag.stages.items():
            if st.kind != "global" or failures:
                continue
            upstream = sorted(kf for u in st.upstreams() for kf in rundir.shard_files(dag, u, plan.hashes))
            ctx = GlobalContext(rundir, name, plan.hashes[name], workers, upstream, st.resources,
                                report=progress.phase, partition=progress.partition_size, retried=progress.retried)
            quota.stage = name
            try:
                st.run(ctx)
            except TasksFailed as e:
                failures += e.failures
                continue
            ctx.finish(keep_work=st.keep_work)
            quota.stage = None
            if plan.closures[name]:
                run_tasks(f"{name}+map", [(name, k, None, p) for k, p in rundir.shard_files(dag, name, plan.hashes)])
        for node in list(dag.inputs) + list(dag.stages):
            rundir.compact(node)
        if not failures:
            _map_stage_reports(dag, rundir)
        if failures:
            raise RunFailed(f"{len(failures)} shard(s) failed; rerun the same command to retry them:\n  "
                            + "\n  ".join(failures))
        quota.stop()
        if quota.exceeded:
            raise RunFailed("disk quota")  # replaced below
    except BaseException as e:
        quota.stop()
        if quota.exceeded:  # whatever it interrupted: the quota is why the run stops
            err = DiskQuotaExceeded(quota.failure())
            progress.finish("failed", f"{type(err).__name__}: {err}")
            raise err from None
        progress.finish("failed", f"{type(e).__name__}: {e}")
        raise
    progress.finish("done")
    return progress.state
