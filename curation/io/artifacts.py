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
    meta = pq.read_schema(path).metadata or {}
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
    return pq.read_table(path, **kwargs)
