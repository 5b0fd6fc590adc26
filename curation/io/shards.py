"""Writing shards atomically and recording them in a stage's ``_manifest.jsonl``.

A shard is written under a temporary name and renamed into place, so it is either absent or
complete. The driver (a single writer) appends the manifest line after the rename; a rerun
treats a shard as done only when its manifest line exists with a matching params hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

MANIFEST = "_manifest.jsonl"
ROW_GROUP_ROWS = 1024


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


def write_parquet(table: pa.Table, path: str | Path, row_group_size: int = ROW_GROUP_ROWS) -> dict:
    """Write ``table`` to ``path`` atomically (zstd). Returns rows, bytes and sha256 of the file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        pq.write_table(table, tmp, compression="zstd", row_group_size=row_group_size)
        digest = file_sha256(tmp)
        size = tmp.stat().st_size
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return {"rows": table.num_rows, "bytes": size, "sha256": digest}


class Manifest:
    """The committed shards of one stage: ``{shard key: entry}``. File paths in entries are
    relative to the run directory."""

    def __init__(self, run_dir: str | Path, stage: str):
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / stage / MANIFEST

    def load(self) -> dict[str, dict]:
        entries: dict[str, dict] = {}
        if not self.path.exists():
            return entries
        with open(self.path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    e = json.loads(line)
                except json.JSONDecodeError:
                    continue  # a line torn by a kill mid-append: that shard is simply redone
                entries[e["shard"]] = e  # last entry wins
        return entries

    def done(self, params_hash: str) -> dict[str, dict]:
        """Entries committed with this params hash whose files still exist."""
        base = self.run_dir
        return {
            k: e for k, e in self.load().items()
            if e.get("params_hash") == params_hash and all((base / f).exists() for f in _files(e))
        }

    def append(self, entries: list[dict]) -> None:
        if not entries:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write("".join(json.dumps(e, sort_keys=True) + "\n" for e in entries))
            f.flush()
            os.fsync(f.fileno())

    def compact(self) -> None:
        """Rewrite with one line per shard, sorted: the same run gives the same manifest bytes."""
        entries = self.load()
        if not entries:
            return
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w") as f:
            f.write("".join(json.dumps(entries[k], sort_keys=True) + "\n" for k in sorted(entries)))
        os.replace(tmp, self.path)


def _files(entry: dict) -> list[str]:
    return [f for f in (entry.get("file"), entry.get("rejected_file")) if f]


def split_kept_rejected(table: pa.Table, reasons: pa.Array | None, stage: str) -> tuple[pa.Table, pa.Table | None]:
    """Kept rows, and rejected rows with ``stage`` and ``reason`` columns (None if nothing dropped)."""
    import pyarrow.compute as pc

    if reasons is None or reasons.null_count == len(reasons):
        return table, None
    keep = pc.is_null(reasons)
    drop = pc.invert(keep)
    rejected = table.filter(drop)
    rejected = rejected.append_column("stage", pa.array([stage] * rejected.num_rows, pa.string()))
    rejected = rejected.append_column("reason", reasons.filter(drop).cast(pa.string()))
    return table.filter(keep), rejected


def write_stage_shard(run_dir: str | Path, stage: str, key: str, kept: pa.Table | None,
                      rejected: pa.Table | None, rows_in: int, params_hash: str,
                      row_group_size: int = ROW_GROUP_ROWS) -> dict:
    """Write one stage's output (and rejections) for one shard key; return its manifest entry.

    ``kept=None`` means the stage's documents are not materialized (an input read straight into
    the next stage): only the counts and the rejections are recorded.
    """
    run_dir = Path(run_dir)
    entry: dict = {"shard": key, "stage": stage, "params_hash": params_hash, "rows_in": rows_in,
                   "file": None, "rows": kept.num_rows if kept is not None else rows_in - (rejected.num_rows if rejected is not None else 0),
                   "rejected_file": None, "rejected_rows": 0}
    if kept is not None:
        rel = f"{stage}/{key}.parquet"
        info = write_parquet(kept, run_dir / rel, row_group_size)
        entry.update(file=rel, bytes=info["bytes"], sha256=info["sha256"])
    if rejected is not None and rejected.num_rows:
        rel = f"rejected/{stage}/{key}.parquet"
        info = write_parquet(rejected, run_dir / rel, row_group_size)
        entry.update(rejected_file=rel, rejected_rows=rejected.num_rows, rejected_sha256=info["sha256"])
    return entry
