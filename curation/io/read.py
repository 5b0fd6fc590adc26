"""Dispatch an input shard to the reader of its format."""

from __future__ import annotations

import fsspec

from curation.io.inputs import InputShard, InputSpec
from curation.io.jsonl import read_jsonl
from curation.io.parquet import read_parquet
from curation.io.read_result import ReadResult
from curation.io.warc import read_warc

READERS = {"warc": read_warc, "wet": read_warc, "jsonl": read_jsonl, "parquet": read_parquet}


def read_shard(shard: InputShard, spec: InputSpec) -> ReadResult:
    """Read one input shard; never raises on bad data (problems become reject rows).

    A file that vanished since planning raises instead: that is an infrastructure problem
    (the task fails, is retried, and the run reports it), not a bad record to count.
    """
    fs, path = fsspec.core.url_to_fs(shard.path)
    if not fs.exists(path):
        raise FileNotFoundError(f"inputs.{shard.input}: {shard.path} disappeared after the run was planned")
    return READERS[shard.format](shard, spec)
