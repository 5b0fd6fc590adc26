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
in place; readers trust the manifest, never a listing. A ``RunDir`` is a location and nothing
else, so it travels to Ray tasks as is.

The root is a local folder or an object-storage URL (``s3://bucket/runs/x``). Every location
``RunDir`` hands out is a ``str`` in the root's form. On object storage a file is uploaded whole
(``files.atomic_path``) and manifests grow by one object per batch of commits
(``files.append_lines``), compacted into ``_manifest.jsonl`` when a stage finishes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import pyarrow as pa
import yaml

from curation.formats import manifest as manifest_format
from curation.formats.manifest import DAG_FILE, PROGRESS_FILE, REJECTED, RESERVED_NAMES  # noqa: F401 (the layout's names)
from curation.io import files, location

if TYPE_CHECKING:  # pragma: no cover
    import duckdb

    from curation.pipeline.dag import Dag
    from curation.tokenizer.model import ParquetCorpus

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

    def open(self) -> ShardWriter:
        """The shard written part by part (``append`` then ``close``)."""
        return self.rundir.open_shard(self.stage, self.key, self.params_hash)


class ShardWriter:
    """One stage's kept and rejected rows for one shard key, appended batch by batch (memory:
    one row group per file), each file renamed into place by ``close``; the shard is committed
    later by its manifest line. The rejected file is only created by the first rejected row,
    and a shard that keeps no row writes no file (its line says ``file: null, rows: 0``)."""

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
        entry: dict = {"shard": self.key, "stage": self.stage, "params_hash": self.params_hash,
                       "rows_in": self.rows_in, "file": None, "rows": self.rows_in - self.rejected_rows,
                       "rejected_file": None, "rejected_rows": 0, **extra}
        if self._kept is not None and self._kept.rows == 0:
            # no rows, no file: the line says rows 0 (readers list shards through the manifest
            # and skip a line without a file; nothing opens a Parquet file with no row in it)
            self._kept.abort()
            entry["rows"] = 0
        elif self._kept is not None:
            info = self._kept.close()
            entry.update(file=self.rundir.rel(self._kept.path), rows=info["rows"], bytes=info["bytes"],
                         sha256=info["sha256"])
        if self._rej is not None:
            info = self._rej.close()
            entry.update(rejected_file=self.rundir.rel(self._rej.path), rejected_rows=info["rows"],
                         rejected_sha256=info["sha256"])
        return entry

    def abort(self) -> None:
        for w in (self._kept, self._rej):
            if w is not None:
                w.abort()


class RunDirError(RuntimeError):
    """The run directory holds another DAG's run (or something else)."""


class OutsideRunDir(RunDirError):
    """A location built from a node name, a shard key or a manifest entry that would leave the
    run directory (``..``, an absolute part, a symlink out). ``parse_dag`` refuses such names
    first; this is the second line, for every writer and reader."""



class RunDir:
    def __init__(self, root: str | Path):
        root = str(root)
        self.root = root.rstrip("/") if location.is_remote(root) else str(Path(location.local(root)).resolve())

    def __repr__(self) -> str:
        return f"RunDir({str(self.root)!r})"

    def __reduce__(self):  # pickles as its location (Ray task arguments)
        return (RunDir, (self.root,))

    @property
    def remote(self) -> bool:
        """On object storage (not a local folder)."""
        return location.is_remote(self.root)

    # -- layout ---------------------------------------------------------------------------

    def _inside(self, *parts: str, resolve: bool = False) -> str:
        """``parts`` joined under the root, refused (``OutsideRunDir``) when a part is empty,
        absolute, ``.`` or ``..`` (the same test for a folder and an object-storage key: no
        normalisation can then take it elsewhere); with ``resolve``, a local location whose
        symlinks lead out of the run directory is refused too."""
        rel = "/".join(str(p) for p in parts)
        if not rel or any(seg in ("", ".", "..") for seg in rel.split("/")) or "\0" in rel:
            raise OutsideRunDir(f"{rel!r}: not a location inside the run directory {self.root}")
        out = location.join(self.root, rel)
        if resolve and not self.remote:
            real = os.path.realpath(out)
            if real != self.root and not real.startswith(self.root + "/"):
                raise OutsideRunDir(f"{rel!r}: leads out of the run directory {self.root} (through a symlink)")
        return out

    def stage_dir(self, stage: str) -> str:
        return self._inside(stage, resolve=True)

    def path(self, rel: str) -> str:
        """The location of ``rel``, a path relative to the run directory (as manifests store them)."""
        return self._inside(rel)

    def rel(self, path: str) -> str:
        """``path`` relative to the run directory (what a manifest stores)."""
        if not path.startswith(self.root + "/"):
            raise ValueError(f"{path}: not inside {self.root}")
        return path[len(self.root) + 1:]

    @property
    def dag_file(self) -> str:
        return location.join(self.root, DAG_FILE)

    @property
    def progress_file(self) -> str:
        return location.join(self.root, PROGRESS_FILE)

    def exists(self) -> bool:
        return location.exists(self.dag_file)

    # -- the DAG --------------------------------------------------------------------------

    def load_dag(self) -> Dag:
        """The DAG this directory was run with."""
        from curation.pipeline.dag import parse_dag

        if not location.exists(self.dag_file):
            raise RunNotFound(f"{self.root}: not a refinery run directory (no dag.yaml)")
        # a run directory holds data: never a place to import a stage's module from
        return parse_dag(yaml.safe_load(location.read_text(self.dag_file)), self.dag_file, dag_dir_code=False)

    def prepare(self, dag: Dag, overwrite: bool) -> None:
        """Refuse to mix two different DAGs in one run directory unless asked to; write dag.yaml."""
        if not location.is_empty_dir(self.root):
            if not location.exists(self.dag_file):
                if not overwrite:
                    raise RunDirError(f"{self.root}: exists and is not a refinery run directory "
                                      "(use --overwrite to reuse it)")
            else:
                new = dag.to_dict()
                old = _restamped(yaml.safe_load(location.read_text(self.dag_file)), new)
                if old != new and not overwrite and not dag.same_up_to_thresholds(old):
                    changed = ", ".join(_differing_fields(old, new)[:8]) or "(the DAG's layout)"
                    raise RunDirError(f"{self.root}: holds a run of a different DAG ({old.get('name')!r}): {changed} "
                                      "differ, beyond rule thresholds; use another --out, or --overwrite to "
                                      "recompute what changed")
        self.write_dag(dag)

    def write_dag(self, dag: Dag) -> None:
        files.write_text(self.dag_file, yaml.safe_dump(dag.to_dict(), sort_keys=False))

    # -- manifests ------------------------------------------------------------------------

    def manifest_path(self, stage: str) -> str:
        return self._inside(stage, manifest_format.MANIFEST, resolve=True)

    def entries(self, stage: str) -> dict[str, dict]:
        """Every manifest entry of ``stage`` (last line per shard key wins)."""
        path = self.manifest_path(stage)
        return manifest_format.parse_lines(files.read_lines(path), path)

    def committed(self, stage: str, params_hash: str) -> dict[str, dict]:
        """Entries committed with ``params_hash`` whose files still exist (a file removed by hand
        is made again). On object storage existence comes from one listing of the stage's folders,
        not a request per file."""
        entries = {k: e for k, e in self.entries(stage).items() if e.get("params_hash") == params_hash}
        if not entries:
            return {}
        if self.remote:
            present = set(location.files_under(self.stage_dir(stage))) | set(
                location.files_under(self._inside(REJECTED, stage)))
            there = present.__contains__
        else:
            there = location.exists
        return {k: e for k, e in entries.items()
                if all(there(self.path(f)) for f in manifest_format.entry_files(e))}

    #: on object storage, a manifest with this many appended segments is folded into one file
    COMPACT_SEGMENTS = 64

    def commit(self, entries: list[dict]) -> None:
        """Append manifest lines (driver side, single writer), one append per stage: a shard is
        committed once its line is stored (locally fsynced; on object storage one object per
        call, folded into the manifest every ``COMPACT_SEGMENTS`` calls)."""
        by_stage: dict[str, list[dict]] = {}
        for e in entries:
            by_stage.setdefault(e["stage"], []).append(e)
        for stage, es in by_stage.items():
            path = self.manifest_path(stage)
            files.append_lines(path, "".join(json.dumps(e, sort_keys=True) + "\n" for e in es))
            if self.remote and files.log_segments(path) >= self.COMPACT_SEGMENTS:
                self.compact(stage)

    def compact(self, stage: str) -> None:
        """Rewrite a manifest with one line per shard, sorted: the same run gives the same bytes."""
        entries = self.entries(stage)
        if entries:
            files.rewrite_lines(self.manifest_path(stage),
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
                    out.append((k, self.path(e["file"]), e))
        return sorted(out, key=lambda t: (t[0], t[1]))

    def shard_files(self, dag: Dag, node: str, hashes: dict[str, str]) -> list[tuple[str, str]]:
        """(key, absolute path) of the committed shards of ``node`` (unions resolved)."""
        return [(k, p) for k, p, _ in self.shard_entries(dag, node, hashes)]

    def shard_path(self, stage: str, key: str) -> str:
        return self._inside(stage, f"{key}.parquet", resolve=True)

    def rejected_path(self, stage: str, key: str) -> str:
        return self._inside(REJECTED, stage, f"{key}.parquet", resolve=True)

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
        kept = location.read_parquet(self.path(entry["file"]), columns=columns) if entry.get("file") else None
        rej = location.read_parquet(self.path(entry["rejected_file"])) if entry.get("rejected_file") else None
        return kept, rej

    # -- reports and work folders ---------------------------------------------------------

    def report_path(self, stage: str, name: str) -> str:
        return self._inside(stage, name, resolve=True)

    def write_report(self, stage: str, name: str, obj: dict) -> None:
        files.write_json(self.report_path(stage, name), obj)

    def read_report(self, stage: str, name: str) -> dict | None:
        p = self.report_path(stage, name)
        return json.loads(location.read_text(p)) if location.exists(p) else None

    def write_progress(self, state: dict) -> None:
        files.write_text(self.progress_file, json.dumps(state, indent=1))

    def work_dir(self, stage: str, params_hash: str) -> str:
        """A global stage's intermediate files, one folder per params hash so a rerun with other
        parameters never reuses them."""
        return self._inside(stage, WORK, params_hash, resolve=True)

    def remove_work(self, stage: str, params_hash: str, keep: bool = False) -> dict:
        """Size of a global stage's work folder (files, bytes), then (unless ``keep``) remove it."""
        d = self.work_dir(stage, params_hash)
        found = location.files_under(d)
        out = {"files": len(found), "bytes": sum(found.values()), "removed": not keep}
        if not keep and found:
            location.remove(d, recursive=True)
            if not self.remote:
                with contextlib.suppress(OSError):
                    Path(d).parent.rmdir()  # ``_work`` itself, when no other params' folder is left
        return out

    # -- views ----------------------------------------------------------------------------

    def connect(self, views: Iterable[str] | None = None) -> duckdb.DuckDBPyConnection:
        """An in-memory DuckDB connection with the run's views: one per node (its committed
        shards), ``kept`` (the DAG's output), ``rejected`` (every dropped row, with ``stage``
        and ``reason``), ``manifest`` (one row per committed shard per stage).

        ``views`` names the views wanted (``views_in(sql)`` finds a query's); they are created
        with the views they read and nothing else. DuckDB reads every file's footer when a view
        is created, so a query over one stage of a run with 90,000 shards per stage reads that
        stage's footers only (and on object storage, makes that stage's requests only)."""
        import duckdb

        dag = self.load_dag()
        hashes = dag.hashes()
        want = None if views is None else self.view_closure(dag, views)
        con = duckdb.connect(":memory:")
        if self.remote:  # DuckDB reads the run's URLs through the same fsspec filesystem
            con.register_filesystem(location.fs_path(self.root)[0])
        nodes = [n for n in list(dag.inputs) + list(dag.stages)
                 if not (n in dag.stages and dag.stages[n].kind == "union")]
        every = want is None or "manifest" in want or "rejected" in want
        done = {n: sorted(self.committed(n, hashes[n]).items()) for n in nodes if every or n in want}
        node_files = {n: [self.path(e["file"]) for _, e in d if e.get("file")] for n, d in done.items()}

        def wanted(name: str) -> bool:
            return want is None or name in want

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
            if wanted(node) and node_files.get(node):
                view(node, node_files[node], empty_docs)
        # in topological order, so a view can read its input's
        for node, st in dag.stages.items():
            if not wanted(node):
                continue
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
        if wanted("kept"):
            con.execute(f"create view kept as select * from {_ident(dag.output)}")
        if wanted("rejected"):
            rejected = [self.path(e["rejected_file"]) for d in done.values() for _, e in d if e.get("rejected_file")]
            view("rejected", rejected, "select null::varchar as id, null::varchar as source, "
                                       "null::varchar as stage, null::varchar as reason where false")
        if wanted("manifest"):
            rows = [f"({_q(n)}, {_q(k)}, {int(e.get('rows_in', 0))}, {int(e.get('rows', 0))}, "
                    f"{int(e.get('rejected_rows', 0))}, {int(e.get('bytes', 0))}, {_q(e.get('sha256') or '')})"
                    for n, d in done.items() for k, e in d]
            values = ", ".join(rows) or "(null, null, 0, 0, 0, 0, null)"
            con.execute("create view manifest as select * from (values " + values +
                        ") t(stage, shard, rows_in, rows, rejected_rows, bytes, sha256) where stage is not null")
        return con

    @staticmethod
    def view_closure(dag: Dag, views: Iterable[str]) -> set[str]:
        """``views`` and every view they read (``kept`` its output, a union its branches, a
        signals-only stage its input)."""
        out: set[str] = set()
        todo = list(views)
        while todo:
            v = todo.pop()
            if v in out:
                continue
            out.add(v)
            if v == "kept":
                todo.append(dag.output)
            st = dag.stages.get(v)
            if st is not None and st.kind == "union":
                todo += list(st.upstreams())
            elif st is not None and st.kind == "map" and not dag.writes_rows(v):
                todo.append(st.input)
        return out

    def views_in(self, sql: str, dag: Dag | None = None) -> set[str]:
        """The run's view names a query mentions (as words or quoted identifiers): what
        ``connect`` must create for it. Over-matching (a column named like a stage) only costs
        a view."""
        dag = dag or self.load_dag()
        names = {*dag.inputs, *dag.stages, "kept", "rejected", "manifest"}
        words = {w.replace('""', '"').lower() for groups in re.findall(r'"((?:[^"]|"")+)"|([A-Za-z_][A-Za-z0-9_$]*)', sql)
                 for w in groups if w}
        return {n for n in names if n.lower() in words}

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
    p = str(path).rstrip("/")
    if "/" not in p or not location.exists(location.join(location.parent(p), DAG_FILE)):
        return None
    run = RunDir(location.parent(p))
    dag = run.load_dag()
    node = location.name(p)
    return (run, node) if node in dag.inputs or node in dag.stages else None


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


def _restamped(old: Any, new: dict) -> Any:
    """A stored DAG with the index inputs' ``index_stamp`` of ``new``: a rebuilt index is the
    same DAG over other records (its params hash differs, so what read it runs again), not
    another DAG to refuse."""
    if not isinstance(old, dict) or not isinstance(old.get("inputs"), dict):
        return old
    inputs = dict(old["inputs"])
    for name, spec in new.get("inputs", {}).items():
        if isinstance(inputs.get(name), dict) and spec.get("format") == "cc_index":
            inputs[name] = {**{k: v for k, v in inputs[name].items() if k != "index_stamp"},
                            **({"index_stamp": spec["index_stamp"]} if "index_stamp" in spec else {})}
    return {**old, "inputs": inputs}


def _has_view(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    return bool(con.execute("select count(*) from duckdb_views() where view_name = ?", [name]).fetchone()[0])


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


def _differing_fields(old: Any, new: Any, at: str = "") -> list[str]:
    """Dotted paths where two DAG dicts differ (for the refusal's message)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in list(old) + [k for k in new if k not in old]:
            out += _differing_fields(old.get(k), new.get(k), f"{at}.{k}" if at else str(k))
        return out
    return [] if old == new else [at or "(root)"]
