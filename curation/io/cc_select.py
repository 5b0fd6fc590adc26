"""Selecting records from a columnar index of WARC records (Common Crawl's ``cc-index-table``
schema, or one ``refinery index cc`` built): the driver's half of ``format: cc_index``
(``curation/io/cc_index.py`` reads what is selected; ``curation.io.inputs.plan_index`` cuts it
into shards).

``where`` is the ``select`` stage's sandboxed expression (``curation/io/sql_where.py``: columns
only); its column names are checked against the index's before anything is read (an unknown one
is named, with the columns there are). The index is scanned as a pyarrow dataset (hive
partitions such as ``crawl=``/``subset=`` are columns) registered on the sandboxed DuckDB
connection, which pushes the expression's comparisons (and the ranges a prefix match implies)
into the scan: row groups whose statistics exclude them are not read, and of the others only the
columns needed. ``scan`` returns the selected records sorted by WARC file and offset, one per
(file, offset), and what reading the index cost.
"""

from __future__ import annotations

import json
import posixpath
import time
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from curation.io import location
from curation.io.sql_where import WhereError, reads_beyond_row, expression_columns, implied_ranges, sandboxed_connection

#: the index columns a selection needs
REQUIRED = ("url", "warc_filename", "warc_record_offset", "warc_record_length")
#: index columns every document carries (null where the index has no such column)
DOC_FIELDS = (pa.field("content_languages", pa.string()), pa.field("content_mime_detected", pa.string()))
DOC_COLUMNS = tuple(f.name for f in DOC_FIELDS)
#: the selection a shard carries: one row per record, sorted by file and offset
SELECTION_SCHEMA = pa.schema([
    pa.field("warc_filename", pa.dictionary(pa.int32(), pa.string())),
    pa.field("warc_record_offset", pa.int64()),
    pa.field("warc_record_length", pa.int64()),
    pa.field("url", pa.string()),
    *DOC_FIELDS,
])


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


@dataclass
class Scan:
    """What a selection found and cost: its records (``SELECTION_SCHEMA``, sorted by file and
    offset) and the index reading's figures."""

    records: pa.Table
    index_files: int
    index_bytes: int  # the index files' size
    bytes_read: int  # of them, read by the scan (footers and the column chunks of row groups kept)
    seconds: float
    query: str
    duplicates: int = 0  # rows naming a (file, offset) another row named


def scan_query(where: str | None, columns: list[str]) -> str:
    """The SQL the scan runs on the sandboxed connection (checked: one select over ``rows``)."""
    cols = list(REQUIRED) + [c for c in DOC_COLUMNS if c in columns]
    sql = "SELECT " + ", ".join('"' + c + '"' for c in cols) + " FROM rows"
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


def scan(files: list[str], where: str | None, what: str = "the index") -> Scan:
    """Select the records of the index ``files`` for which ``where`` holds (all without one)."""
    import duckdb

    t0 = time.perf_counter()
    counter = [0]
    d = dataset(files, counter)
    columns = d.schema.names
    check_columns(where, columns, what)
    sql = scan_query(where, columns)
    con = sandboxed_connection()
    con.register("rows", d)
    try:
        t = con.sql(sql).to_arrow_table()
    except duckdb.Error as e:
        raise WhereError(f"where: {where!r} over {what}: {str(e).splitlines()[0]}") from None
    finally:
        con.unregister("rows")
    for name in DOC_COLUMNS:
        if name not in t.column_names:
            t = t.append_column(name, pa.nulls(t.num_rows, pa.string()))
    t = t.select(list(REQUIRED) + list(DOC_COLUMNS))
    t = pa.table({
        "warc_filename": t["warc_filename"].cast(pa.string()),
        "warc_record_offset": t["warc_record_offset"].cast(pa.int64()),
        "warc_record_length": t["warc_record_length"].cast(pa.int64()),
        "url": t["url"].cast(pa.string()),
        **{c: t[c].cast(pa.string()) for c in DOC_COLUMNS},
    })
    t = t.sort_by([("warc_filename", "ascending"), ("warc_record_offset", "ascending")])
    n = t.num_rows
    if n > 1:  # one row per (file, offset): a capture indexed twice is read once
        f, o = t["warc_filename"].combine_chunks(), t["warc_record_offset"].combine_chunks()
        same = pc.and_(pc.equal(f.slice(1), f.slice(0, n - 1)), pc.equal(o.slice(1), o.slice(0, n - 1)))
        keep = pa.concat_arrays([pa.array([True]), pc.invert(pc.fill_null(same, False))])
        t = t.filter(keep)
    t = t.set_column(0, SELECTION_SCHEMA.field("warc_filename"), t["warc_filename"].dictionary_encode())
    sizes = location.sizes(files) if files else []
    return Scan(t.cast(SELECTION_SCHEMA), len(files), sum(sizes), counter[0], time.perf_counter() - t0, sql,
                n - t.num_rows)


def encode_selection(t: pa.Table, root: str) -> bytes:
    """A shard's records and the WARC root they are below (resolved: a local folder made
    absolute) as compact bytes (Arrow IPC, zstd): what its task is handed."""
    schema = SELECTION_SCHEMA.with_metadata({b"warc_root": root.encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(t.cast(schema).combine_chunks())
    return sink.getvalue().to_pybytes()


def decode_selection(data: bytes) -> tuple[pa.Table, str]:
    """(records, warc root) of ``encode_selection``'s bytes."""
    with pa.ipc.open_stream(pa.BufferReader(data)) as r:
        t = r.read_all()
    return t, (t.schema.metadata or {}).get(b"warc_root", b"").decode()


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
