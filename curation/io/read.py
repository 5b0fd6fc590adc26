"""Dispatch an input shard to the reader of its format.

``iter_read`` streams a shard as ``ReadResult`` batches of bounded size (rows and payload
bytes), so a worker never holds a whole shard; ``read_shard`` is their concatenation.
"""

from __future__ import annotations

from collections.abc import Iterator

import fsspec

from curation.io.cc_index import iter_cc_index
from curation.io.cc_select import DOC_FIELDS as INDEX_FIELDS
from curation.io.inputs import InputShard, InputSpec
from curation.io.jsonl import iter_jsonl
from curation.io.parquet import iter_parquet
from curation.io.read_result import ReadResult
from curation.io.warc import iter_warc

READERS = {"warc": iter_warc, "wet": iter_warc, "jsonl": iter_jsonl, "parquet": iter_parquet,
           "cc_index": iter_cc_index}

#: default batch bounds of ``iter_read``
BATCH_ROWS = 4096
BATCH_BYTES = 64 << 20


def _check_exists(shard: InputShard) -> None:
    fs, path = fsspec.core.url_to_fs(shard.path)
    if not fs.exists(path):
        raise FileNotFoundError(f"inputs.{shard.input}: {shard.path} disappeared after the run was planned")


def iter_read(shard: InputShard, spec: InputSpec, batch_rows: int | None = BATCH_ROWS,
              batch_bytes: int | None = BATCH_BYTES) -> Iterator[ReadResult]:
    """Read one input shard as batches: each holds at most ``batch_rows`` rows (documents plus
    rejects) or about ``batch_bytes`` payload bytes (html, text, previews; a batch closes after
    the record that crosses it). None means no bound. At least one batch comes out (empty if
    the shard holds nothing); ``bytes_read``/``bytes_decompressed`` of a batch count the shard
    up to its end. Never raises on bad data; a file that vanished since planning raises
    ``FileNotFoundError`` (the task fails and is retried: not a bad record to count).
    """
    if shard.format == "cc_index":  # many files, each read by ranges: a missing one is a rejection
        out = ReadResult(shard, spec, html=True, extra=INDEX_FIELDS)
    else:
        _check_exists(shard)
        out = ReadResult(shard, spec, html=shard.format == "warc")
    n = 0
    for _ in READERS[shard.format](shard, spec, out):
        if out.full(batch_rows, batch_bytes):
            n += 1
            yield out.take()
    if len(out) or not n:
        yield out.take()


def read_shard(shard: InputShard, spec: InputSpec) -> ReadResult:
    """Read one input shard whole: the concatenation of ``iter_read``'s batches."""
    res: ReadResult | None = None
    for batch in iter_read(shard, spec, batch_rows=None, batch_bytes=None):
        if res is None:
            res = batch
        else:
            res.extend(batch)
    assert res is not None
    return res
