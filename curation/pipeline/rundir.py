"""The run directory: the contract between stages, runs, stats, the service and the trainer.

```
RUN/dag.yaml                     the DAG as run (defaults filled in)
RUN/progress.json                phases and per-stage counters, rewritten as the run goes
RUN/STAGE/KEY.parquet            a stage's committed shards (kept rows)
RUN/STAGE/_manifest.jsonl        one line per committed shard (``curation.formats.manifest``)
RUN/STAGE/_*report.json          what a global stage measured (per-partition counts, timings)
RUN/STAGE/_work/PARAMS_HASH/     a global stage's intermediate files
RUN/rejected/STAGE/KEY.parquet   dropped rows, with ``stage`` and ``reason``
```

``RunDir`` is the one class that knows this layout: every reader and writer (executor, global
stages through their context, stats and SQL views, tokenizer corpora, ablations, the service)
goes through it. A shard is committed by its manifest line, written after the shard's file is
in place; readers trust the manifest, never a listing. A ``RunDir`` is a path and nothing else,
so it travels to Ray tasks as is.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from curation.formats import manifest as manifest_format
from curation.io import files

if TYPE_CHECKING:  # pragma: no cover
    import duckdb

    from curation.pipeline.dag import Dag
    from curation.tokenizer.model import ParquetCorpus

DAG_FILE = "dag.yaml"
PROGRESS_FILE = "progress.json"
REJECTED = "rejected"
WORK = "_work"
#: rows per Parquet row group of a stage shard (random access in stats and the trainer)
ROW_GROUP_ROWS = 1024


class RunNotFound(FileNotFoundError):
    """A path that is not a refinery run directory (no dag.yaml)."""


@dataclass(frozen=True)
class ShardOutput:
    """Where one task of a global stage writes its output shard: handed to the task in its job
    (picklable), so a stage writes shards without knowing the run directory's layout."""

    rundir: RunDir
    stage: str
    params_hash: str
    key: str

    def write(self, kept: pa.Table | None, rejected: pa.Table | None, rows_in: int, **kwargs: Any) -> dict:
        """Write the shard (and its rejections); return its manifest entry."""
        return self.rundir.write_stage_shard(self.stage, self.key, kept, rejected, rows_in, self.params_hash, **kwargs)


class ShardWriter:
    """One stage's kept and rejected rows for one shard key, appended batch by batch (memory:
    one row group per file), each file renamed into place by ``close``; the shard is committed
    later by its manifest line. The rejected file is only created by the first rejected row."""

    def __init__(self, rundir: RunDir, stage: str, key: str, params_hash: str, materialize: bool,
                 row_group_size: int):
        self.rundir, self.stage, self.key, self.params_hash = rundir, stage, key, params_hash
        self.row_group_size = row_group_size
        self.rows_in = 0
        self.rejected_rows = 0
        self._kept = (files.ParquetAppender(rundir.shard_path(stage, key), row_group_size)
                      if materialize else None)
        self._rej: files.ParquetAppender | None = None

    def append(self, kept: pa.Table | None, rejected: pa.Table | None, rows_in: int) -> None:
        self.rows_in += rows_in
        if self._kept is not None and kept is not None:
            self._kept.append(kept)
        if rejected is not None and rejected.num_rows:
            if self._rej is None:
                self._rej = files.ParquetAppender(self.rundir.rejected_path(self.stage, self.key), self.row_group_size)
            self._rej.append(rejected)
            self.rejected_rows += rejected.num_rows

    def close(self, **extra: Any) -> dict:
        root = self.rundir.root
        entry: dict = {"shard": self.key, "stage": self.stage, "params_hash": self.params_hash,
                       "rows_in": self.rows_in, "file": None, "rows": self.rows_in - self.rejected_rows,
                       "rejected_file": None, "rejected_rows": 0, **extra}
        if self._kept is not None:
            info = self._kept.close()
            entry.update(file=str(self._kept.path.relative_to(root)), rows=info["rows"], bytes=info["bytes"],
                         sha256=info["sha256"])
        if self._rej is not None:
            info = self._rej.close()
            entry.update(rejected_file=str(self._rej.path.relative_to(root)), rejected_rows=info["rows"],
                         rejected_sha256=info["sha256"])
        return entry

    def abort(self) -> None:
        for w in (self._kept, self._rej):
            if w is not None:
                w.abort()


class RunDirError(RuntimeError):
    """The run directory holds another DAG's run (or something else)."""


class RunDir:
    def __init__(self, root: str | Path):
        self.root = Path(root).resolve()

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    def __reduce__(self):  # pickles as its path (Ray task arguments)
        return (RunDir, (str(self.root),))

    # -- layout ---------------------------------------------------------------------------

    def stage_dir(self, stage: str) -> Path:
        return self.root / stage

    def path(self, rel: str) -> Path:
        """A path relative to the run directory (as manifests store them)."""
        return self.root / rel

    @property
    def dag_file(self) -> Path:
        return self.root / DAG_FILE

    @property
    def progress_file(self) -> Path:
        return self.root / PROGRESS_FILE

    def exists(self) -> bool:
        return self.dag_file.exists()

    # -- the DAG --------------------------------------------------------------------------

    def load_dag(self) -> Dag:
        """The DAG this directory was run with."""
        from curation.pipeline.dag import parse_dag

        if not self.dag_file.exists():
            raise RunNotFound(f"{self.root}: not a refinery run directory (no dag.yaml)")
        return parse_dag(yaml.safe_load(self.dag_file.read_text()), str(self.dag_file))

    def prepare(self, dag: Dag, overwrite: bool) -> None:
        """Refuse to mix two different DAGs in one run directory unless asked to; write dag.yaml."""
        if self.root.exists() and any(self.root.iterdir()):
            if not self.dag_file.exists():
                if not overwrite:
                    raise RunDirError(f"{self.root}: exists and is not a refinery run directory "
                                      "(use --overwrite to reuse it)")
            else:
                old = yaml.safe_load(self.dag_file.read_text())
                if old != dag.to_dict() and not overwrite:
                    raise RunDirError(f"{self.root}: holds a run of a different DAG ({old.get('name')!r}); "
                                      "use another --out, or --overwrite to recompute what changed")
        self.write_dag(dag)

    def write_dag(self, dag: Dag) -> None:
        files.write_text(self.dag_file, yaml.safe_dump(dag.to_dict(), sort_keys=False))

    # -- manifests ------------------------------------------------------------------------

    def entries(self, stage: str) -> dict[str, dict]:
        """Every manifest entry of ``stage`` (last line per shard key wins)."""
        return manifest_format.read(self.stage_dir(stage))

    def committed(self, stage: str, params_hash: str) -> dict[str, dict]:
        """Entries committed with ``params_hash`` whose files still exist."""
        return manifest_format.committed(self.stage_dir(stage), params_hash)

    def commit(self, entries: list[dict]) -> None:
        """Append manifest lines (driver side, single writer), one append per stage, fsynced:
        a shard is committed once its line is on disk."""
        by_stage: dict[str, list[dict]] = {}
        for e in entries:
            by_stage.setdefault(e["stage"], []).append(e)
        for stage, es in by_stage.items():
            path = self.stage_dir(stage) / manifest_format.MANIFEST
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "a") as f:
                f.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in es))
                f.flush()
                os.fsync(f.fileno())

    def compact(self, stage: str) -> None:
        """Rewrite a manifest with one line per shard, sorted: the same run gives the same bytes."""
        entries = self.entries(stage)
        if entries:
            files.write_text(self.stage_dir(stage) / manifest_format.MANIFEST,
                             "".join(json.dumps(entries[k], sort_keys=True) + "\n" for k in sorted(entries)))

    # -- shards ---------------------------------------------------------------------------

    def shard_entries(self, dag: Dag, node: str, hashes: dict[str, str]) -> list[tuple[str, str, dict]]:
        """(key, absolute path, manifest entry) of the committed shards of ``node`` that hold
        rows, sorted by key; a union's are its branches'."""
        out = []
        for leaf in dag.leaves(node):
            if leaf in dag.stages and not dag.writes_rows(leaf):
                raise RunDirError(f"{self.stage_dir(leaf)}: {leaf!r} writes its signals only (id and its own "
                                  "columns); its whole rows are in the SQL view of the same name "
                                  "(`refinery sql`), or set `materialize: true` on it")
            for k, e in self.committed(leaf, hashes[leaf]).items():
                if e.get("file"):
                    out.append((k, str(self.path(e["file"])), e))
        return sorted(out, key=lambda t: (t[0], t[1]))

    def shard_files(self, dag: Dag, node: str, hashes: dict[str, str]) -> list[tuple[str, str]]:
        """(key, absolute path) of the committed shards of ``node`` (unions resolved)."""
        return [(k, p) for k, p, _ in self.shard_entries(dag, node, hashes)]

    def shard_path(self, stage: str, key: str) -> Path:
        return self.stage_dir(stage) / f"{key}.parquet"

    def rejected_path(self, stage: str, key: str) -> Path:
        return self.root / REJECTED / stage / f"{key}.parquet"

    def write_stage_shard(self, stage: str, key: str, kept: pa.Table | None, rejected: pa.Table | None,
                          rows_in: int, params_hash: str, row_group_size: int = ROW_GROUP_ROWS,
                          **extra: Any) -> dict:
        """Write one stage's output (and rejections) for one shard key; return its manifest
        entry (committed later by ``commit``, on the driver).

        ``kept=None`` means the stage's documents are not materialized (an input read straight
        into the next stage): only the counts and the rejections are recorded. ``extra`` keys
        go into the entry (e.g. the signals hash a re-decision looks for).
        """
        w = self.open_shard(stage, key, params_hash, materialize=kept is not None, row_group_size=row_group_size)
        w.append(kept, rejected, rows_in)
        return w.close(**extra)

    def open_shard(self, stage: str, key: str, params_hash: str, materialize: bool = True,
                   row_group_size: int = ROW_GROUP_ROWS) -> ShardWriter:
        """A writer for one stage's output for one shard key, fed batch by batch (a streaming
        map task); ``close`` returns the manifest entry, the same as ``write_stage_shard``'s
        for the concatenated batches."""
        return ShardWriter(self, stage, key, params_hash, materialize, row_group_size)

    def read_entry(self, entry: dict, columns: list[str] | None = None) -> tuple[pa.Table | None, pa.Table | None]:
        """The kept and rejected rows an entry committed (None where it wrote no file)."""
        kept = pq.read_table(self.path(entry["file"]), columns=columns) if entry.get("file") else None
        rej = pq.read_table(self.path(entry["rejected_file"])) if entry.get("rejected_file") else None
        return kept, rej

    # -- reports and work folders ---------------------------------------------------------

    def report_path(self, stage: str, name: str) -> Path:
        return self.stage_dir(stage) / name

    def write_report(self, stage: str, name: str, obj: dict) -> None:
        files.write_json(self.report_path(stage, name), obj)

    def read_report(self, stage: str, name: str) -> dict | None:
        p = self.report_path(stage, name)
        return json.loads(p.read_text()) if p.exists() else None

    def work_dir(self, stage: str, params_hash: str) -> Path:
        """A global stage's intermediate files, one folder per params hash so a rerun with other
        parameters never reuses them."""
        return self.stage_dir(stage) / WORK / params_hash

    def remove_work(self, stage: str, params_hash: str, keep: bool = False) -> dict:
        """Size of a global stage's work folder (files, bytes), then (unless ``keep``) remove it."""
        d = self.work_dir(stage, params_hash)
        files = [p for p in d.rglob("*") if p.is_file()] if d.exists() else []
        out = {"files": len(files), "bytes": sum(p.stat().st_size for p in files), "removed": not keep}
        if not keep and d.exists():
            shutil.rmtree(d)
            with contextlib.suppress(OSError):
                d.parent.rmdir()  # ``_work`` itself, when no other params' folder is left
        return out

    # -- views ----------------------------------------------------------------------------

    def connect(self) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with the run's views: one per node (its committed
        shards), ``kept`` (the DAG's output), ``rejected`` (every dropped row, with ``stage``
        and ``reason``), ``manifest`` (one row per committed shard per stage)."""
        import duckdb

        dag = self.load_dag()
        hashes = dag.hashes()
        con = duckdb.connect(":memory:")
        node_files: dict[str, list[str]] = {}
        rejected: list[str] = []
        manifest_rows: list[str] = []
        for node in list(dag.inputs) + list(dag.stages):
            if node in dag.stages and dag.stages[node].kind == "union":
                continue
            done = sorted(self.committed(node, hashes[node]).items())
            node_files[node] = [str(self.path(e["file"])) for _, e in done if e.get("file")]
            rejected += [str(self.path(e["rejected_file"])) for _, e in done if e.get("rejected_file")]
            for k, e in done:
                manifest_rows.append(
                    f"({_q(node)}, {_q(k)}, {int(e.get('rows_in', 0))}, {int(e.get('rows', 0))}, "
                    f"{int(e.get('rejected_rows', 0))}, {int(e.get('bytes', 0))}, {_q(e.get('sha256') or '')})")
        def view(name: str, paths: list[str], empty_sql: str) -> None:
            if paths:
                lst = "[" + ", ".join(_q(p) for p in paths) + "]"
                con.execute(f"create view {_ident(name)} as select * from read_parquet({lst}, union_by_name=true)")
            else:
                con.execute(f"create view {_ident(name)} as {empty_sql}")

        def columns(name: str) -> list[str]:
            return [d[0] for d in con.execute(f"select * from {_ident(name)} limit 0").description]

        empty_docs = "select null::varchar as id, null::varchar as text, null::varchar as source where false"
        for node in dag.inputs:
            if node_files.get(node):
                view(node, node_files[node], empty_docs)
        # in topological order, so a view can read its input's
        for node, st in dag.stages.items():
            if st.kind == "union":
                parts = [u for u in st.upstreams() if _has_view(con, u)]
                if parts:
                    con.execute(f"create view {_ident(node)} as " +
                                " union all by name ".join(f"select * from {_ident(u)}" for u in parts))
                else:
                    view(node, [], empty_docs)
            elif st.kind == "map" and not dag.writes_rows(node) and _has_view(con, st.input):
                # signals only on disk: whole rows are the input's, joined by id
                own = dag.own_columns(node) or ()
                if node_files.get(node):
                    lst = "[" + ", ".join(_q(p) for p in node_files[node]) + "]"
                    sig = f"read_parquet({lst}, union_by_name=true)"
                else:
                    sig = "(select null::varchar as id where false)"
                drop = [c for c in columns(st.input) if c in own]
                excl = f" exclude ({', '.join(_ident(c) for c in drop)})" if drop else ""
                con.execute(f"create view {_ident(node)} as select i.*{excl}, s.* exclude (id) "
                            f"from {_ident(st.input)} i join {sig} s using (id)")
            else:
                view(node, node_files.get(node, []), empty_docs)
        con.execute(f"create view kept as select * from {_ident(dag.output)}")
        view("rejected", rejected, "select null::varchar as id, null::varchar as source, null::varchar as stage, "
                                   "null::varchar as reason where false")
        values = ", ".join(manifest_rows) or "(null, null, 0, 0, 0, 0, null)"
        con.execute("create view manifest as select * from (values " + values +
                    ") t(stage, shard, rows_in, rows, rejected_rows, bytes, sha256) where stage is not null")
        return con

    # -- corpora --------------------------------------------------------------------------

    def corpus(self, node: str) -> ParquetCorpus:
        """A node's committed shards with their manifest sha256, as a tokenizer corpus."""
        from curation.tokenizer.model import ParquetCorpus, TokenizerError

        dag = self.load_dag()
        if node not in dag.inputs and node not in dag.stages:
            raise TokenizerError(f"{self.stage_dir(node)}: {node!r} is not a node of this run")
        shards = self.shard_entries(dag, node, dag.hashes())
        if not shards:
            raise TokenizerError(f"{self.stage_dir(node)}: stage has no committed shards (run the pipeline first)")
        return ParquetCorpus([p for _, p, _ in shards], [e.get("sha256") for _, _, e in shards])


def stage_of(path: str | Path) -> tuple[RunDir, str] | None:
    """``(RunDir, node)`` when ``path`` is ``RUN/NODE`` of a run directory, else None."""
    p = Path(path)
    if p.is_file() or not (p.parent / DAG_FILE).exists():
        return None
    run = RunDir(p.parent)
    dag = run.load_dag()
    return (run, p.name) if p.name in dag.inputs or p.name in dag.stages else None


def resolve_corpus(paths: str | Path | list) -> ParquetCorpus:
    """A tokenizer corpus from ``RUN/STAGE`` paths (their committed shards, sha256 from the
    manifests, unions resolved) and anything ``ParquetCorpus.resolve`` takes (folders, globs,
    files). Files are de-duplicated and sorted, so the corpus fingerprint ignores argument order."""
    from curation.tokenizer.model import ParquetCorpus

    if isinstance(paths, (str, Path)):
        paths = [paths]
    seen: dict[str, str] = {}
    for raw in paths:
        hit = stage_of(raw)
        part = hit[0].corpus(hit[1]) if hit else ParquetCorpus.resolve(raw)
        for f, sha in zip(part.files, part.sha256):
            seen.setdefault(str(Path(f).resolve()), sha)
    files = sorted(seen)
    return ParquetCorpus(files, [seen[f] or files.file_sha256(f) for f in files])


def _has_view(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute("select count(*) from duckdb_views() where view_name = ?", [name]).fetchone()[0])


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'
