"""Parquet reader: a part of a large file reads the row groups whose middle byte lies in its
byte range (contiguous row groups, each owned by exactly one part; no footer is read when
planning). Rows are read a batch at a time; a document id is the row index in the file."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from curation.io.inputs import InputShard, InputSpec
from curation.io import ranges
from curation.io.ranges import CountingRaw
from curation.io.read_result import ReadResult

#: rows converted to Python objects at a time
ROWS_PER_BATCH = 1024


def _group_middle(md: pq.FileMetaData, g: int) -> int:
    rg = md.row_group(g)
    starts, size = [], 0
    for c in range(rg.num_columns):
        col = rg.column(c)
        off = col.data_page_offset
        if col.has_dictionary_page and col.dictionary_page_offset:
            off = min(off, col.dictionary_page_offset)
        starts.append(off)
        size += col.total_compressed_size
    return (min(starts) if starts else 0) + size // 2


def owned_row_groups(md: pq.FileMetaData, shard: InputShard) -> list[int]:
    """Row groups of this shard: all for a whole-file shard, else those whose middle byte is in
    ``[start, end)``."""
    if shard.start == 0 and shard.end >= shard.size:
        return list(range(md.num_row_groups))
    return [g for g in range(md.num_row_groups) if shard.start <= _group_middle(md, g) < shard.end]


def iter_parquet(shard: InputShard, spec: InputSpec, res: ReadResult) -> Iterator[None]:
    """Read the row groups of this shard into ``res``; yield after each batch of rows."""
    row_base = 0
    raw = CountingRaw(ranges.open_raw(shard.path))
    try:
        with raw:
            pf = pq.ParquetFile(raw)
            md = pf.metadata
            if md.num_rows == 0 and shard.start == 0:
                res.empty = "parquet file has no rows"  # 0 documents, not a rejected one
            starts = [0]
            for g in range(md.num_row_groups):
                starts.append(starts[-1] + md.row_group(g).num_rows)
            for g in owned_row_groups(md, shard):
                row_base = starts[g]
                for batch in pf.iter_batches(batch_size=ROWS_PER_BATCH, row_groups=[g]):
                    _add_rows(res, spec, pa.Table.from_batches([batch]), row_base)
                    row_base += batch.num_rows
                    res.bytes_read = raw.bytes_read
                    yield
    except (FileNotFoundError, PermissionError):
        raise  # the file vanished or is unreadable: fail the task (retried), not bad data
    except Exception as e:
        res.reject(None, "corrupt_stream", row_base, f"{type(e).__name__}: {e}")
    res.bytes_read = raw.bytes_read


def _add_rows(res: ReadResult, spec: InputSpec, table: pa.Table, row_base: int) -> None:
    if spec.text_field not in table.column_names:
        raise ValueError(f"column {spec.text_field!r} not in {table.column_names}")
    rows = table.to_pylist()
    for i, row in enumerate(rows):
        index = row_base + i
        text = row.pop(spec.text_field)
        if not isinstance(text, str):
            res.reject(index, "missing_text", index, f"no string in column {spec.text_field!r}")
            continue
        if len(text) > spec.max_doc_bytes:
            res.reject(index, "doc_too_large", index, f"{len(text)} chars > max_doc_bytes", text)
            continue
        doc_id = f"{res.shard.input}/{row.pop(spec.id_field)}" if spec.id_field and row.get(spec.id_field) is not None else None
        url = row.pop(spec.url_field, None) if spec.url_field else None
        meta = json.loads(json.dumps(row, default=str)) if row else None
        res.add(index, text, url if isinstance(url, str) else None, meta, doc_id=doc_id)
