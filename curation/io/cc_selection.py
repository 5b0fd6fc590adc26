"""The selection files of a ``format: cc_index`` input: the records its ``where`` selected,
written once by the driver as Parquet below the run directory and read back by each task for
its own rows only. A selection of a whole snapshot (~1e9 records) is never held in one process:
the driver streams the sorted scan into these files and keeps per-WARC-file figures and the
shards' row ranges; a task reads the row groups that hold its rows.

```
DIR/part-00000.parquet   the records, sorted by (warc_filename, offset), one per (file, offset):
DIR/part-00001.parquet   PART_ROWS rows a file (the last fewer), row groups of GROUP_ROWS
DIR/_selection.json      written last (a selection without it is not done): its key, rows,
                         bytes, records and bytes per WARC file, the shards' row ranges, and
                         what reading the index cost
```

``DIR`` is the input's work folder of its params hash (``RUN/INPUT/_work/HASH/``): a rerun with
the same index (the same files, sizes and mtimes/ETags), where and settings reuses it without
reading the index again.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.io import files as iofiles, location

#: rows a selection file holds, and a row group of one (a multiple of it: row groups never
#: straddle files, so a row's file and row group are arithmetic)
PART_ROWS = 1 << 20
GROUP_ROWS = 8192
SUMMARY = "_selection.json"
#: the selection a task reads: one row per record, sorted by file and offset
DOC_FIELDS = (pa.field("content_languages", pa.string()), pa.field("content_mime_detected", pa.string()))
SCHEMA = pa.schema([
    pa.field("warc_filename", pa.string()),
    pa.field("warc_record_offset", pa.int64()),
    pa.field("warc_record_length", pa.int64()),
    pa.field("url", pa.string()),
    *DOC_FIELDS,
])


@dataclass(frozen=True)
class SelectionSlice:
    """The rows ``[start, stop)`` of a selection: what one task reads (its shard's records),
    and the root their ``warc_filename`` is below."""

    dir: str
    start: int
    stop: int
    warc_root: str
    part_rows: int = PART_ROWS
    group_rows: int = GROUP_ROWS


@dataclass
class Selection:
    """A written selection's figures (``_selection.json``): records and bytes in total and per
    WARC file, the shards' ``(first row, end row, bytes, first warc_filename)`` and the index
    scan's cost. ``dir`` is None for one counted without writing its rows (a plan's)."""

    dir: str | None
    key: str
    rows: int = 0
    bytes: int = 0
    files: dict[str, tuple[int, int]] = field(default_factory=dict)
    shards: list[tuple[int, int, int, str]] = field(default_factory=list)
    index_files: int = 0
    index_bytes: int = 0
    bytes_read: int = 0  # of the index (footers and the column chunks of row groups kept)
    seconds: float = 0.0
    query: str = ""
    duplicates: int = 0  # rows naming a (file, offset) another row named
    reused: bool = False  # loaded from a run before: the index not read again
    part_rows: int = PART_ROWS
    group_rows: int = GROUP_ROWS

    def slice(self, start: int, stop: int, warc_root: str) -> SelectionSlice:
        assert self.dir is not None, "a selection counted without its rows cannot be read"
        return SelectionSlice(self.dir, start, stop, warc_root, self.part_rows, self.group_rows)

    @property
    def records(self) -> pa.Table:
        """Every selected record as one table: for tests and small selections only."""
        return read_slice(self.slice(0, self.rows, "")) if self.dir else SCHEMA.empty_table()

    def to_json(self) -> dict:
        d = {k: getattr(self, k) for k in ("key", "rows", "bytes", "index_files", "index_bytes", "bytes_read",
                                           "seconds", "query", "duplicates", "part_rows", "group_rows")}
        return {**d, "files": {f: list(v) for f, v in self.files.items()}, "shards": [list(s) for s in self.shards]}


def load(dir: str, key: str) -> Selection | None:
    """The selection written in ``dir`` under ``key`` (the index, where and settings it was made
    from), or None: none there, one not finished, or one of something else."""
    path = location.join(dir, SUMMARY)
    if not location.exists(path):
        return None
    d = json.loads(location.read_text(path))
    if d.get("key") != key:
        return None
    sel = Selection(dir, key, reused=True, **{k: v for k, v in d.items() if k not in ("key", "files", "shards")})
    sel.files = {f: (int(r), int(b)) for f, (r, b) in d["files"].items()}
    sel.shards = [(int(a), int(b), int(c), str(n)) for a, b, c, n in d["shards"]]
    return sel


def scratch_dir() -> str:
    """A local folder for a selection planned outside a run (a test, ``evaluate``), removed
    when the process exits."""
    d = tempfile.mkdtemp(prefix="refinery-selection-", dir=os.environ.get("REFINERY_SPOOL"))
    atexit.register(shutil.rmtree, d, True)
    return d


class SelectionWriter:
    """Sorted batches of selected records in; the selection files, per-file figures and shard
    cuts out. Holds one row group per open file and the figures, never the selection. A shard
    closes at the record that brings it to ``split_bytes`` (and at the last record), so tasks
    are cut by the bytes they read; the cuts are those of the records in order, whatever the
    batches."""

    def __init__(self, sel: Selection, split_bytes: int):
        self.sel, self.split = sel, split_bytes
        self._last: tuple[str, int] | None = None  # the key of the last row kept (duplicates across batches)
        self._held, self._lo, self._first = 0, 0, ""  # the open shard
        self._part: iofiles.ParquetAppender | None = None
        self._parts = 0

    def add(self, batch: pa.RecordBatch | pa.Table) -> None:
        t = pa.Table.from_batches([batch]) if isinstance(batch, pa.RecordBatch) else batch
        if not t.num_rows:
            return
        t = t.select(SCHEMA.names).cast(SCHEMA)
        t = self._unique(t)
        if not t.num_rows:
            return
        self._count(t)
        self._cut(t)
        if self.sel.dir is not None:
            self._write(t)
        self.sel.rows += t.num_rows

    def _unique(self, t: pa.Table) -> pa.Table:
        """``t`` without rows naming the (file, offset) of the row before them (the first kept)."""
        f = t["warc_filename"].combine_chunks()
        o = t["warc_record_offset"].combine_chunks()
        n = t.num_rows
        first_same = self._last is not None and (f[0].as_py(), o[0].as_py()) == self._last
        same = pc.and_(pc.equal(f.slice(1), f.slice(0, n - 1)), pc.equal(o.slice(1), o.slice(0, n - 1)))
        keep = pc.invert(pc.fill_null(pa.concat_arrays([pa.array([first_same]), same]), False))
        self._last = (f[n - 1].as_py(), o[n - 1].as_py())
        kept = t.filter(keep)
        self.sel.duplicates += n - kept.num_rows
        return kept

    def _count(self, t: pa.Table) -> None:
        lengths = pc.max_element_wise(t["warc_record_length"], 0)
        agg = pa.table({"f": t["warc_filename"], "n": lengths}).group_by("f").aggregate([("n", "count"), ("n", "sum")])
        for f, r, b in zip(agg["f"].to_pylist(), agg["n_count"].to_pylist(), agg["n_sum"].to_pylist()):
            r0, b0 = self.sel.files.get(f, (0, 0))
            self.sel.files[f] = (r0 + r, b0 + b)
            self.sel.bytes += b

    def _cut(self, t: pa.Table) -> None:
        lengths = np.maximum(t["warc_record_length"].to_numpy(), 0)
        held = self._held + np.cumsum(lengths)  # the open shard's bytes at each row (nondecreasing)
        names = t["warc_filename"]
        base, start, i = 0, 0, 0  # bytes closed before; the batch row the open shard resumes at
        if self._lo == self.sel.rows:  # the open shard starts with this batch
            self._first = names[0].as_py()
        while True:
            i = int(np.searchsorted(held, base + self.split, side="left"))
            if i >= len(held):
                break
            end = self.sel.rows + i + 1
            self.sel.shards.append((self._lo, end, int(held[i] - base), self._first))
            self._lo, base = end, int(held[i])
            if i + 1 < len(held):
                self._first = names[i + 1].as_py()
        self._held = int(held[-1] - base)

    def _write(self, t: pa.Table) -> None:
        at = 0
        while at < t.num_rows:
            if self._part is None:
                path = location.join(self.sel.dir, f"part-{self._parts:05d}.parquet")
                self._part = iofiles.ParquetAppender(path, row_group_size=self.sel.group_rows)
            take = min(t.num_rows - at, self.sel.part_rows - self._part.rows)
            self._part.append(t.slice(at, take))
            at += take
            if self._part.rows == self.sel.part_rows:
                self._part.close()
                self._part, self._parts = None, self._parts + 1

    def close(self) -> Selection:
        """Close the last shard and file, then write ``_selection.json`` (what makes it done)."""
        if self.sel.rows > self._lo:
            self.sel.shards.append((self._lo, self.sel.rows, self._held, self._first))
        if self._part is not None:
            self._part.close()
            self._part = None
        if self.sel.dir is not None:
            iofiles.write_json(location.join(self.sel.dir, SUMMARY), self.sel.to_json(), indent=None)
        return self.sel

    def abort(self) -> None:
        if self._part is not None:
            self._part.abort()


def read_slice(s: SelectionSlice) -> pa.Table:
    """The rows of a slice: of each selection file it spans, the row groups holding them."""
    parts = []
    row = s.start
    while row < s.stop:
        p = row // s.part_rows
        lo, hi = row - p * s.part_rows, min(s.stop - p * s.part_rows, s.part_rows)
        g0, g1 = lo // s.group_rows, (hi - 1) // s.group_rows
        pf = location.parquet_file(location.join(s.dir, f"part-{p:05d}.parquet"))
        t = pf.read_row_groups(list(range(g0, g1 + 1)), use_threads=False)
        parts.append(t.slice(lo - g0 * s.group_rows, hi - lo))
        row = (p + 1) * s.part_rows
    return pa.concat_tables(parts).cast(SCHEMA) if parts else SCHEMA.empty_table()
