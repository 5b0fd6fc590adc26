"""Named inputs of a DAG and how they are cut into shards (one Ray task each)."""

from __future__ import annotations

import math
import posixpath
from dataclasses import dataclass
from typing import Literal

import fsspec
from pydantic import BaseModel, ConfigDict, Field

from curation.io import datapaths

MiB = 1 << 20


class InputError(ValueError):
    """An input that cannot be planned (no file matches, unreadable location)."""


class InputSpec(BaseModel):
    """One named input of a DAG: files of one format, all of one mix ``source`` domain."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["warc", "wet", "jsonl", "parquet"]
    paths: list[str] = Field(min_length=1)
    source: str
    text_field: str = "text"
    id_field: str | None = None
    url_field: str | None = "url"
    #: files larger than this are read by several tasks (records dealt round-robin, or row groups)
    split_bytes: int = Field(default=128 * MiB, gt=0)
    #: documents larger than this are rejected as ``read:doc_too_large`` (a preview is kept)
    max_doc_bytes: int = Field(default=10 * MiB, gt=0)


@dataclass(frozen=True)
class InputShard:
    """The unit of work of a reader: one file, or one of ``nparts`` interleaved parts of it."""

    input: str
    key: str  # stable shard name, e.g. "crawl-00003"; output files are STAGE/<key>.parquet
    path: str  # full path / URL
    relpath: str  # path relative to the input's common root, used in document ids
    format: str
    part: int
    nparts: int
    size: int


def _has_magic(p: str) -> bool:
    return any(c in p for c in "*?[")


def expand_paths(name: str, spec: InputSpec, base_dir: str | None = None) -> list[tuple[str, int]]:
    """Expand globs (local or any fsspec URL) to a sorted list of (path, size); fail if none."""
    found: dict[str, int] = {}
    for pattern in spec.paths:
        try:
            pattern = datapaths.expand(pattern)
        except datapaths.DataPathError as e:
            raise InputError(f"inputs.{name}.paths: {e}") from None
        if base_dir and "://" not in pattern and not posixpath.isabs(pattern):
            pattern = posixpath.join(base_dir, pattern)
        fs, _, _ = fsspec.get_fs_token_paths(pattern)
        matches = fs.glob(pattern) if _has_magic(pattern) else ([pattern] if fs.exists(pattern) else [])
        matches = [m for m in matches if not fs.isdir(m)]
        if not matches:
            raise InputError(f"inputs.{name}.paths: no file matches {pattern!r}")
        proto = fs.protocol[0] if isinstance(fs.protocol, (tuple, list)) else fs.protocol
        for m in matches:
            full = m if (proto in ("file", "local") or "://" in m) else f"{proto}://{m}"
            if proto in ("file", "local") and not full.startswith("/") and "://" not in pattern:
                full = m
            found[full] = int(fs.size(m) or 0)
    return sorted(found.items())


def plan_input(name: str, spec: InputSpec, base_dir: str | None = None) -> list[InputShard]:
    """Cut one input into shards. Deterministic: same files and settings give the same keys."""
    files = expand_paths(name, spec, base_dir)
    root = posixpath.commonpath([posixpath.dirname(p) for p, _ in files]) if len(files) > 1 else posixpath.dirname(files[0][0])
    shards: list[InputShard] = []
    for path, size in files:
        rel = posixpath.relpath(path, root) if root else path
        nparts = max(1, math.ceil(size / spec.split_bytes))
        for part in range(nparts):
            key = f"{name}-{len(shards):05d}"
            shards.append(InputShard(name, key, path, rel, spec.format, part, nparts, size))
    return shards
