"""Parquet reader: large files are split by row group across shards."""

from __future__ import annotations

import json

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq

from curation.io.inputs import InputShard, InputSpec
from curation.io.read_result import ReadResult


def read_parquet(shard: InputShard, spec: InputSpec) -> ReadResult:
    """Read the row groups dealt to this shard (row group i goes to part i % nparts)."""
    res = ReadResult(shard, spec)
    row_base = 0
    try:
        with fsspec.open(shard.path, "rb") as fh:
            pf = pq.ParquetFile(fh)
            if pf.metadata.num_rows == 0:
                res.reject(None, "empty_file", 0, "parquet file has no rows")
            for rg in range(pf.num_row_groups):
                n = pf.metadata.row_group(rg).num_rows
                if rg % shard.nparts == shard.part:
                    _add_rows(res, spec, pf.read_row_group(rg), row_base)
                row_base += n
    except (FileNotFoundError, PermissionError):
        raise  # the file vanished or is unreadable: fail the task (retried), not bad data
    except Exception as e:
        res.reject(None, "corrupt_stream", row_base, f"{type(e).__name__}: {e}")
    return res


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
