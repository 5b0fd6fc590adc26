"""Selecting records from a columnar index of WARC records (Common Crawl's ``cc-index-table``
schema, or one ``refinery index cc`` built): the driver's half of ``format: cc_index``
(``curation/io/cc_index.py`` reads what is selected; ``curation.io.inputs.plan_index`` cuts it
into shards).

``where`` is the ``select`` stage's sandboxed expression (``curation/io/sql_where.py``: columns
only); its column names are checked against the index's before anything is read (an unknown one
is named, with the columns there are), and it is run once over a row of nulls (what does not
bind fails before the run). The index is scanned as a pyarrow dataset (hive partitions such as
``crawl=``/``subset=`` are columns) registered on a sandboxed DuckDB connection, which pushes the
expression's comparisons (and the ranges a prefix match implies) into the scan: row groups whose
statistics exclude them are not read, and of the others only the columns needed. ``select``
streams the selected records, sorted by WARC file and offset, one per (file, offset), into
selection files (``curation/io/cc_selection.py``); the sort spills to local disk past
``SORT_MEMORY``, so the driver holds per-WARC-file figures and shard cuts, not the records.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import tempfile
import time

import pyarrow as pa

from curation.io import location
from curation.io.cc_selection import DOC_FIELDS, SCHEMA, Selection, SelectionWriter, scratch_dir
from curation.io.sql_where import (WhereError, expression_columns, implied_ranges, reads_beyond_row, sandboxed_connection,
                                   scan_connection)

#: the index columns a selection needs
REQUIRED = ("url", "warc_filename", "warc_record_offset", "warc_record_length")
#: a row missing where its record is: the reader's rejection (``bad_warc_filename``, not a byte
#: range), not a null in the sort and the figures
NULL_AS = {"warc_filename": "coalesce(\"warc_filename\"::VARCHAR, '')",
           "warc_record_offset": "coalesce(\"warc_record_offset\"::BIGINT, -1)",
           "warc_record_length": "coalesce(\"warc_record_length\"::BIGINT, -1)"}
#: index columns every document carries (null where the index has no such column)
DOC_COLUMNS = tuple(f.name for f in DOC_FIELDS)
#: what the sort behind a selection may hold in memory before it spills to local disk
#: (``$REFINERY_SELECT_MEMORY``): the driver's memory does not grow with the records selected
SORT_MEMORY = os.environ.get("REFINERY_SELECT_MEMORY", "512MB")
#: rows handed from the sort to the selection files at a time
BATCH_ROWS = 1 << 16
#: index bytes scanned by one statement (the files of a chunk are read ahead together)
CHUNK_BYTES = 64 << 20


class IndexSchemaError(ValueError):
    """An index that cannot be selected from (a column missing, a where that does not bind)."""


class _CountingFile:
    """A file object that counts the bytes read through it (for the scan's figures)."""

    def __init__(self, f, counter: list[int]):
        self._f, self._n = f, counter

    def read(self, size: int = -1) -> bytes:
        b = self._f.read(size)
        self._n[0] += len(b)
        return b

    def readinto(self, buf) -> int:
        b = self._f.read(len(buf))
        buf[:len(b)] = b
        self._n[0] += len(b)
        return len(b)

    def __getattr__(self, name):
        return getattr(self._f, name)


def _filesystem(path: str, counter: list[int]):
    """A pyarrow filesystem over ``path``'s fsspec filesystem whose reads are counted."""
    from pyarrow.fs import FSSpecHandler, PyFileSystem

    fs, _ = location.fs_path(path)

    class Counting(FSSpecHandler):
        def open_input_file(self, p):
            return pa.PythonFile(_CountingFile(self.fs.open(p, mode="rb", block_size=1 << 20), counter), mode="r")

    return PyFileSystem(Counting(fs))


def _partition_base(paths: list[str]) -> str | None:
    """The folder above the first ``key=value`` part of the index files' paths (hive
    partitions: ``crawl=CC-MAIN-.../subset=warc/``), or None."""
    parts = [p.split("/") for p in paths]
    for i, seg in enumerate(parts[0][:-1]):
        if "=" in seg and all(len(q) > i + 1 and "=" in q[i] for q in parts):
            return "/".join(parts[0][:i])
    return None


def dataset(files: list[str], counter: list[int] | None = None):
    """The index files as one pyarrow dataset (local paths or URLs of one filesystem)."""
    import pyarrow.dataset as ds

    counter = counter if counter is not None else [0]
    fs = _filesystem(files[0], counter)
    inner = [location.fs_path(f)[1] if location.is_remote(f) else location.local(f) for f in files]
    base = _partition_base(inner)
    return ds.dataset(inner, format="parquet", filesystem=fs,
                      partitioning="hive" if base is not None else None, partition_base_dir=base)


def check_columns(where: str | None, columns: list[str], what: str) -> None:
    """WhereError naming each column ``where`` reads that ``columns`` lacks, and the ones there are."""
    missing = sorted(expression_columns(where) - set(columns)) if where else []
    if missing:
        raise WhereError(f"where: {', '.join(repr(c) for c in missing)} {'is not a column' if len(missing) == 1 else 'are not columns'} "
                         f"of {what}; it has: {', '.join(columns)}")
    lacking = [c for c in REQUIRED if c not in columns]
    if lacking:
        raise IndexSchemaError(f"{what} has no {', '.join(lacking)} column(s): not a columnar index of WARC records "
                          f"(Common Crawl's cc-index-table schema, or `refinery index cc`)")


def scan_query(where: str | None, columns: list[str]) -> str:
    """The SQL the scan runs on the sandboxed connection (checked: one select over ``rows``):
    the selection's columns (a document column the index lacks is null), the rows ``where``
    keeps."""
    cols = ['"url"', *(f'{NULL_AS[c]} AS "{c}"' for c in REQUIRED[1:])] + [
        f'"{c}"' if c in columns else f'NULL::VARCHAR AS "{c}"' for c in DOC_COLUMNS]
    sql = "SELECT " + ", ".join(cols) + " FROM rows"
    if where:
        sql += f" WHERE ({where})::BOOLEAN" + "".join(f" AND {r}" for r in implied_ranges(where))
        tree = json.loads(sandboxed_connection().execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0])
        stmts = tree.get("statements") or []
        node = stmts[0]["node"] if len(stmts) == 1 else {}
        frm = node.get("from_table") or {}
        if (tree.get("error") or node.get("type") != "SELECT_NODE" or frm.get("type") != "BASE_TABLE"
                or frm.get("table_name") != "rows" or reads_beyond_row(node.get("where_clause"))
                or reads_beyond_row(node.get("select_list"))):
            raise WhereError(f"where: one boolean expression over the index's columns: {where!r}")
    return sql


#: the selection's order: by file and offset, ties (a record indexed twice) broken by every
#: column, so the row kept of each (file, offset) is the same on every run
ORDER = " ORDER BY " + ", ".join(f'"{c}"' for c in SCHEMA.names)
#: the selected rows in that order, each WARC file's name an ENUM of the names in name order:
#: the sort moves (and spills) a small number, not a 100-byte path (76 against 130 bytes of
#: local disk a record at the peak, and a third faster)
FILE_ENUM = ("CREATE TYPE warc_file AS ENUM (SELECT DISTINCT warc_filename FROM selected "
             "WHERE warc_filename IS NOT NULL ORDER BY 1)")
SORTED = "SELECT warc_filename::warc_file AS warc_filename, * EXCLUDE (warc_filename) FROM selected" + ORDER


def check_where(files: list[str], where: str | None, what: str = "the index") -> str:
    """The scan's SQL for ``where`` over the index ``files``, checked before anything but a
    footer is read: its columns against the index's, then run over one row of nulls (what does
    not bind, such as ``fetch_status = 'two hundred'``, fails here, not in the scan)."""
    import duckdb

    schema = dataset(files).schema
    check_columns(where, schema.names, what)
    sql = scan_query(where, schema.names)
    con = sandboxed_connection()
    con.register("rows", pa.Table.from_pylist([{}], schema=schema))
    try:
        con.sql(sql).fetchall()
    except duckdb.Error as e:
        raise WhereError(f"where: {where!r} over {what}: {str(e).splitlines()[0]}") from None
    finally:
        con.unregister("rows")
    return sql


def index_stamp(files: list[str]) -> str:
    """The index files' identity (their names, sizes and mtimes or ETags; nothing read): a
    rebuilt index under the same paths has another."""
    h = hashlib.sha256()
    for f, st in zip(files, location.stamps(files)):
        h.update(f"{f}\t{st}\n".encode())
    return h.hexdigest()[:16]


def _chunks(d, sizes: list[int]):
    """The index as datasets of consecutive files of about ``CHUNK_BYTES`` (one file where
    files are larger): the scan reads one at a time, so what pyarrow reads ahead is one
    chunk's, whatever the index's size."""
    import pyarrow.dataset as ds

    chunk, held = [], 0
    for frag, size in zip(d.get_fragments(), sizes):
        chunk.append(frag)
        held += size
        if held >= CHUNK_BYTES:
            yield ds.FileSystemDataset(chunk, d.schema, d.format, d.filesystem)
            chunk, held = [], 0
    if chunk:
        yield ds.FileSystemDataset(chunk, d.schema, d.format, d.filesystem)


def select(files: list[str], where: str | None, split_bytes: int, out: str | None, key: str = "",
           what: str = "the index") -> Selection:
    """Select the records of the index ``files`` for which ``where`` holds (all without one)
    into selection files in ``out`` (``curation/io/cc_selection.py``; None: counted, not
    written). The where is pushed into the Parquet scan, chunk of files by chunk, into a DuckDB
    table; its rows come out sorted into the files. DuckDB holds at most ``SORT_MEMORY`` of
    them and spills the rest to a local temporary folder (``$REFINERY_SPOOL``, else the
    system's: about 90 bytes a selected record at the peak)."""
    import duckdb

    t0 = time.perf_counter()
    sql = check_where(files, where, what)
    counter = [0]
    sizes = location.sizes(files)
    sel = Selection(out, key, index_files=len(files), index_bytes=sum(sizes), query=sql)
    writer = SelectionWriter(sel, split_bytes)
    with tempfile.TemporaryDirectory(prefix="refinery-sort-", dir=os.environ.get("REFINERY_SPOOL")) as tmp:
        con = scan_connection(SORT_MEMORY, posixpath.join(tmp, "spill"), posixpath.join(tmp, "select.duckdb"))
        try:
            for i, part in enumerate(_chunks(dataset(files, counter), sizes)):
                con.register("rows", part)
                con.execute(("CREATE TABLE selected AS " if i == 0 else "INSERT INTO selected ") + sql)
                con.unregister("rows")
            con.execute("CHECKPOINT")  # the table compressed on disk (a file's name stored once)
            con.execute(FILE_ENUM)
            for batch in con.sql(SORTED).to_arrow_reader(BATCH_ROWS):
                writer.add(batch)
        except duckdb.Error as e:
            writer.abort()
            raise WhereError(f"where: {where!r} over {what}: {str(e).splitlines()[0]}") from None
        except BaseException:
            writer.abort()
            raise
        finally:
            con.close()
        sel.bytes_read, sel.seconds = counter[0], time.perf_counter() - t0
        return writer.close()


def scan(files: list[str], where: str | None, what: str = "the index") -> Selection:
    """``select`` into a scratch folder, in one shard: its ``records`` read back whole (tests,
    benchmarks, small selections)."""
    return select(files, where, 1 << 62, scratch_dir(), what=what)


def warc_path(root: str, filename: str) -> str | None:
    """``root`` joined with an index row's ``warc_filename``; None for a name that would leave
    the root (absolute, a URL, ``..``)."""
    if not filename or filename.startswith("/") or "://" in filename or ".." in filename.split("/"):
        return None
    return root.rstrip("/") + "/" + filename.removeprefix("./")


def resolve_root(root: str, base_dir: str | None) -> str:
    """``warc_root`` as paths are made from it: a URL as given, a local folder absolute."""
    from curation.io import datapaths

    root = datapaths.expand(root)
    if "://" in root and not root.startswith("file://"):
        return root.rstrip("/")
    root = location.local(root)
    if base_dir and not posixpath.isabs(root):
        root = posixpath.join(base_dir, root)
    return posixpath.normpath(posixpath.abspath(root))
