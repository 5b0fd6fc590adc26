"""Intermediate artifacts (signatures, buckets, keys, edges...) as Parquet files that carry
the header they were made with (algorithm, version, seed, params) in their schema metadata.
A reader states the header it expects and a file made otherwise is refused with the fields that
differ, so persisted intermediates never silently change meaning between versions."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from curation.io import location
from curation.io.files import atomic_path

HEADER_KEY = b"refinery.artifact"


class ArtifactMismatch(ValueError):
    """A persisted artifact made with other parameters (or another version) than asked for."""




def header_metadata(header: dict[str, Any]) -> dict[bytes, bytes]:
    """Parquet schema metadata recording an artifact's header."""
    return {HEADER_KEY: json.dumps(header, sort_keys=True).encode()}


def check_header(found: dict[str, Any] | None, expected: dict[str, Any], where: str | Path) -> None:
    """Raise ``ArtifactMismatch`` naming the differing fields unless ``found == expected``."""
    if found == expected:
        return
    if found is None:
        raise ArtifactMismatch(f"{where}: has no artifact header; it was not written by this version "
                               "of refinery. Delete it (or the stage's _work folder) to recompute.")
    diffs = []
    for key in sorted(set(found) | set(expected)):
        if found.get(key) != expected.get(key):
            diffs.append(f"{key}: file has {found.get(key)!r}, expected {expected.get(key)!r}")
    raise ArtifactMismatch(f"{where}: written with other parameters ({'; '.join(diffs)}); refusing to reuse it. "
                           "Delete it (or the stage's _work folder) to recompute.")


def read_header(path: str | Path) -> dict[str, Any] | None:
    """The header stored in a Parquet artifact's schema metadata (None if absent)."""
    meta = location.read_schema(path).metadata or {}
    raw = meta.get(HEADER_KEY)
    return json.loads(raw) if raw is not None else None


def write_artifact(table: pa.Table, path: str | Path, header: dict[str, Any], row_group_size: int = 65536) -> None:
    """Write a Parquet artifact atomically (temporary name, then rename) with ``header`` in
    its schema metadata. Intermediate files: no checksum, light compression."""
    table = table.replace_schema_metadata({**(table.schema.metadata or {}), **header_metadata(header)})
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression="lz4", row_group_size=row_group_size)


def read_artifact(path: str | Path, header: dict[str, Any], **kwargs) -> pa.Table:
    """Read a Parquet artifact after checking its header (``ArtifactMismatch`` otherwise)."""
    check_header(read_header(path), header, path)
    return location.read_parquet(path, **kwargs)


# ---------------------------------------------------------------------------------------------
# partitioned artifacts: the map side of a shuffle writes one file per task, the reduce side
# reads only its own row groups of each.

PARTITIONS_KEY = b"refinery.partitions"


def write_partitioned(table: pa.Table, part: "np.ndarray", path: str | Path, header: dict[str, Any],
                      max_rows: int = 65536) -> None:
    """Write ``table`` (rows already sorted by ``part``, a non-decreasing int array) with row
    groups cut at partition boundaries and an index ``partition -> [first, end)`` row groups in
    the schema metadata, so a reducer reads its byte ranges and nothing else."""
    import numpy as np

    part = np.asarray(part)
    if len(part) and np.any(part[1:] < part[:-1]):
        raise ValueError("write_partitioned: rows must be sorted by partition")
    bounds = np.flatnonzero(np.r_[True, part[1:] != part[:-1], True]) if len(part) else np.zeros(1, np.int64)
    index, slices, rg = [], [], 0
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        n_groups = -(-(hi - lo) // max_rows)
        index.append([int(part[lo]), rg, rg + n_groups])
        slices.append((lo, hi))
        rg += n_groups
    meta = {**(table.schema.metadata or {}), **header_metadata(header), PARTITIONS_KEY: json.dumps(index).encode()}
    schema = table.schema.with_metadata(meta)
    with atomic_path(path) as tmp:
        with pq.ParquetWriter(tmp, schema, compression="lz4") as w:
            for lo, hi in slices:
                w.write_table(table.slice(lo, hi - lo).replace_schema_metadata(meta), row_group_size=max_rows)


def read_partition(path: str | Path, partition: int, header: dict[str, Any],
                   columns: list[str] | None = None) -> pa.Table:
    """The rows of ``partition`` in a file written by ``write_partitioned`` (header-checked):
    only that partition's row groups are read."""
    pf = location.parquet_file(path)
    meta = pf.schema_arrow.metadata or {}
    raw = meta.get(HEADER_KEY)
    check_header(json.loads(raw) if raw is not None else None, header, path)
    if PARTITIONS_KEY not in meta:
        raise ArtifactMismatch(f"{path}: not a partitioned artifact (no partition index)")
    for p, lo, hi in json.loads(meta[PARTITIONS_KEY]):
        if p == partition:
            return pf.read_row_groups(list(range(lo, hi)), columns=columns, use_threads=False)
    schema = pf.schema_arrow
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns])
    return schema.empty_table()
