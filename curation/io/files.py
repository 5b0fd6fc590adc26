"""Atomic file writes and file fingerprints: the two things every writer in refinery needs.

A file is written under a temporary name in its own folder and renamed into place, so a reader
sees it absent or complete, never half written (a kill mid-write leaves only a dot-file).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it to ``path``, on error
    remove it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):  # renamed: nothing left to remove
            tmp.unlink()


def write_bytes(path: str | Path, data: bytes) -> None:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def write_text(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """JSON with sorted keys (same object, same bytes) and a final newline."""
    write_text(path, json.dumps(obj, indent=indent, sort_keys=True) + "\n")


def write_parquet(table: pa.Table, path: str | Path, row_group_size: int = 1024, compression: str = "zstd") -> dict:
    """Write ``table`` atomically. Returns rows, bytes and sha256 of the file."""
    with atomic_path(path) as tmp:
        pq.write_table(table, tmp, compression=compression, row_group_size=row_group_size)
        info = {"rows": table.num_rows, "bytes": tmp.stat().st_size, "sha256": file_sha256(tmp)}
    return info


def safe_names(keys: list[str]) -> list[str]:
    """File-safe names for shard keys (keys may contain '/')."""
    return [k.replace("/", "__") for k in keys]


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes: how shards, models, tokenizers and eval sets are fingerprinted."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@lru_cache(maxsize=256)
def _file_sha256_at(path: str, mtime_ns: int, size: int) -> str:
    return file_sha256(path)


def cached_file_sha256(path: str | Path) -> str:
    """``file_sha256`` computed once per process per (real path, mtime, size)."""
    real = os.path.realpath(path)
    st = os.stat(real)
    return _file_sha256_at(real, st.st_mtime_ns, st.st_size)
