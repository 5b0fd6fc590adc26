"""Dispatch an input shard to the reader of its format."""

from __future__ import annotations

from curation.io.inputs import InputShard, InputSpec
from curation.io.jsonl import read_jsonl
from curation.io.parquet import read_parquet
from curation.io.read_result import ReadResult
from curation.io.warc import read_warc

READERS = {"warc": read_warc, "wet": read_warc, "jsonl": read_jsonl, "parquet": read_parquet}


def read_shard(shard: InputShard, spec: InputSpec) -> ReadResult:
    """Read one input shard; never raises on bad data (problems become reject rows)."""
    return READERS[shard.format](shard, spec)
