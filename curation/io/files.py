"""Atomic file writes, append-only logs and file fingerprints, on a local disk or on object
storage (any fsspec URL, see ``curation.io.location``).

A file is written under a temporary name and put in place whole, so a reader sees it absent or
complete, never half written. Locally the temporary file sits beside the target and is renamed
(a kill mid-write leaves only a dot-file). On object storage there is no rename (a copy would
write every byte twice), so the file is spooled to local disk and uploaded in one PUT (one
multipart upload for large files), which an object store makes visible all at once or not at all.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
import time
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from curation.formats.manifest import SEGMENTS, log_lines, segment_keys
from curation.io.location import fs_path, is_remote, join, local

# -- atomic writes -------------------------------------------------------------------------

class StagedFile:
    """A target file under construction: ``tmp`` is a local temporary path a writer fills (in
    one go or across calls, e.g. a streaming Parquet or shard writer); ``commit`` puts it in
    place at ``path`` whole (a rename beside it locally, one upload on object storage),
    ``abort`` removes it. ``atomic_path`` is the with-block form; this is the one place that
    renames a temporary file into place."""

    def __init__(self, path: str | Path):
        self.path = path
        self.remote = is_remote(path)
        if self.remote:
            fd, name_ = tempfile.mkstemp(prefix=".refinery-spool-", dir=os.environ.get("REFINERY_SPOOL"))
            os.close(fd)
            self.tmp = Path(name_)
        else:
            target = Path(local(path))
            target.parent.mkdir(parents=True, exist_ok=True)
            self.tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")

    def commit(self) -> None:
        if self.remote:
            fs, p = fs_path(self.path)
            fs.put_file(str(self.tmp), p)
            self.tmp.unlink(missing_ok=True)
        else:
            os.replace(self.tmp, local(self.path))

    def abort(self) -> None:
        """Remove the temporary file (nothing to do after ``commit``)."""
        self.tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a local temporary path; on success put it in place at ``path`` (a rename beside it
    locally, one upload on object storage), on error remove it."""
    staged = StagedFile(path)
    try:
        yield staged.tmp
        staged.commit()
    finally:
        staged.abort()


def append_lines(path: str | Path, text: str) -> None:
    """Append whole lines to a log (a manifest, a phase log). Locally: one append, fsynced. On
    object storage, which has no append: one new object per call (``manifest.SEGMENTS``), which
    ``read_lines`` takes after the file in sequence order and ``rewrite_lines`` folds in."""
    if not text:
        return
    if is_remote(path):
        # time-ordered names: a later driver (a resumed run) sorts after an earlier one
        write_text(join(str(path) + SEGMENTS, f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"), text)
        return
    p = Path(local(path))
    p.parent.mkdir(parents=True, exist_ok=True)
    with open(p, "a") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def read_lines(path: str | Path) -> list[str]:
    """The lines of a log written with ``append_lines`` (empty when absent)."""
    if not is_remote(path):
        p = Path(local(path))
        return p.read_text().splitlines() if p.exists() else []
    return log_lines(*fs_path(path))


def log_segments(path: str | Path) -> int:
    """How many appended segments a remote log holds (always 0 locally)."""
    if not is_remote(path):
        return 0
    return len(segment_keys(*fs_path(path)))


def rewrite_lines(path: str | Path, text: str) -> None:
    """Replace a log with ``text`` and drop its appended segments (a reader in between sees
    some lines twice, which last-line-wins logs do not mind)."""
    segs: list[str] = []
    if is_remote(path):
        fs, p = fs_path(path)
        segs = segment_keys(fs, p)
    write_text(path, text)
    if segs:
        fs.rm(segs)


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """JSON with sorted keys (same object, same bytes) and a final newline."""
    write_text(path, json.dumps(obj, indent=indent, sort_keys=True) + "\n")


def write_parquet(table: pa.Table, path: str | Path, row_group_size: int = 1024, compression: str = "zstd") -> dict:
    """Write ``table`` atomically. Returns rows, bytes and sha256 of the file."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression=compression, row_group_size=row_group_size)
        info = {"rows": table.num_rows, "bytes": tmp.stat().st_size, "sha256": file_sha256(tmp)}
    return info


def safe_names(keys: list[str]) -> list[str]:
    """File-safe names for shard keys (keys may contain '/')."""
    return [k.replace("/", "__") for k in keys]


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes: how shards, models, tokenizers and eval sets are fingerprinted."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@lru_cache(maxsize=256)
def _file_sha256_at(path: str, mtime_ns: int, size: int) -> str:
    return file_sha256(path)


def cached_file_sha256(path: str | Path) -> str:
    """``file_sha256`` computed once per process per (real path, mtime, size)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return _file_sha256_at(real, st.st_mtime_ns, st.st_size)


class ParquetAppender:
    """A Parquet file written batch by batch, committed atomically by ``close``.

    Rows are buffered to whole row groups of ``row_group_size``, so the file is the one
    ``write_parquet`` would write for the concatenated batches (same row groups, same bytes)
    while memory holds one row group, not the file. A batch whose schema differs from the
    file's is cast to it; when that fails (an all-null first row group typed ``null``), the
    part written so far is rewritten under the unified schema, row group by row group.
    """

    def __init__(self, path: str | Path, row_group_size: int = 1024, compression: str = "zstd"):
        self.path = str(path)
        self.row_group_size = row_group_size
        self.compression = compression
        self.rows = 0
        self._ctx = atomic_path(self.path)
        self._tmp = self._ctx.__enter__()
        self._writer: pq.ParquetWriter | None = None
        self._schema: pa.Schema | None = None
        self._buf: list[pa.Table] = []
        self._buffered = 0

    def append(self, table: pa.Table) -> None:
        self._buf.append(table)
        self._buffered += table.num_rows
        self.rows += table.num_rows
        if self._buffered >= self.row_group_size:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        if not self._buf:
            return
        t = self._buf[0] if len(self._buf) == 1 else pa.concat_tables(self._buf, promote_options="default")
        n_full = t.num_rows if final else t.num_rows - t.num_rows % self.row_group_size
        head, rest = t.slice(0, n_full), t.slice(n_full)
        self._buf, self._buffered = ([rest] if rest.num_rows else []), rest.num_rows
        if self._writer is None:
            self._schema = head.schema
            self._writer = pq.ParquetWriter(self._tmp, head.schema, compression=self.compression)
        elif head.schema != self._schema:
            head = self._conform(head)
        if head.num_rows:
            self._writer.write_table(head.combine_chunks(), row_group_size=self.row_group_size)

    def _conform(self, t: pa.Table) -> pa.Table:
        assert self._schema is not None and self._writer is not None
        with contextlib.suppress(pa.ArrowInvalid, pa.ArrowNotImplementedError, KeyError):
            return t.select(self._schema.names).cast(self._schema)
        # not castable (a column typed null in the first row group): unify and rewrite
        unified = pa.unify_schemas([self._schema, t.schema], promote_options="permissive")
        self._writer.close()
        old = self._tmp.with_name(self._tmp.name + ".old")
        os.replace(self._tmp, old)
        try:
            self._schema = unified
            self._writer = pq.ParquetWriter(self._tmp, unified, compression=self.compression)
            src = pq.ParquetFile(old)
            for i in range(src.num_row_groups):
                rg = src.read_row_group(i)
                self._writer.write_table(_to_schema(rg, unified), row_group_size=self.row_group_size)
        finally:
            old.unlink(missing_ok=True)
        return _to_schema(t, unified)

    def close(self) -> dict:
        """Write what is buffered and rename the file into place: its rows, bytes and sha256."""
        self._flush(final=True)
        if self._writer is None:  # nothing appended at all: an empty file without columns
            pq.write_table(pa.table({}), self._tmp, compression=self.compression)
        else:
            self._writer.close()
        info = {"rows": self.rows, "bytes": self._tmp.stat().st_size, "sha256": file_sha256(self._tmp)}
        self._ctx.__exit__(None, None, None)
        return info

    def abort(self) -> None:
        """Drop the file: nothing is renamed into place."""
        if self._writer is not None:
            with contextlib.suppress(Exception):
                self._writer.close()
        with contextlib.suppress(Exception):
            self._ctx.__exit__(RuntimeError, RuntimeError("aborted"), None)


def _to_schema(t: pa.Table, schema: pa.Schema) -> pa.Table:
    """``t`` with ``schema``'s columns in order (missing ones null), each cast to its type."""
    cols = [t.column(f.name).cast(f.type) if f.name in t.column_names else pa.nulls(t.num_rows, f.type)
            for f in schema]
    return pa.Table.from_arrays(cols, schema=schema)
