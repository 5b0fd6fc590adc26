"""Named inputs of a DAG and how they are cut into shards (one Ray task each).

A file larger than ``split_bytes`` is cut into byte ranges ``[start, end)`` of about equal
size, one shard each; a shard reads only the records that start in its range (see
``curation.io.ranges`` for how every part finds the same record starts). Files that cannot be
entered in the middle are one shard whatever their size, and the planner says so in the log:
compressed JSON Lines, a WARC that is not gzip, and a gzip WARC that is one gzip stream rather
than one member per record (decided from the file's first member: the planner reads at most a
few MiB of its head, never the whole file).
"""

from __future__ import annotations

import logging
import math
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import fsspec
from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from curation.io import datapaths

MiB = 1 << 20

log = logging.getLogger(__name__)


class InputError(ValueError):
    """An input that cannot be planned (no file matches, unreadable location)."""


class InputSpec(BaseModel):
    """One named input of a DAG: files of one format, all of one mix ``source`` domain; or
    (``format: run``) the committed shards of a stage of another run, read through its
    manifest (``curation/pipeline/run_input.py``): ``run`` its directory, ``stage`` the node
    (a union is its branches' shards), ``allow_partial`` to read a run that is not finished
    (what is committed so far). Its documents keep their ids and sources unless ``source`` is
    given."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    format: Literal["warc", "wet", "jsonl", "parquet", "run"]
    paths: list[str] = Field(default_factory=list)
    source: str | None = None
    run: str | None = None
    stage: str | None = None
    allow_partial: bool = False
    text_field: str = "text"
    id_field: str | None = None
    url_field: str | None = "url"
    #: files larger than this are cut into byte ranges of about this size, one task each
    split_bytes: int = Field(default=128 * MiB, gt=0)
    #: documents larger than this are rejected as ``read:doc_too_large`` (a preview is kept)
    max_doc_bytes: int = Field(default=10 * MiB, gt=0)

    @model_validator(mode="after")
    def _fields_of_the_format(self) -> InputSpec:
        if self.format == "run":
            if not self.run or not self.stage:
                raise ValueError("format: run reads a stage of another run: give run (its directory) and stage")
            if self.paths:
                raise ValueError("format: run reads the run's manifest, not paths: give run and stage")
        else:
            if not self.paths:
                raise ValueError("paths: at least one file or glob")
            if self.source is None:
                raise ValueError("source: missing (the mix domain of these documents: web, math, ...)")
            if self.run is not None or self.stage is not None or self.allow_partial:
                raise ValueError("run, stage and allow_partial belong to format: run")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        # the fields of format: run only where they are used: every other input dumps (and so
        # hashes, and writes dag.yaml) exactly as before they existed
        d = handler(self)
        if self.format != "run":
            for k in ("run", "stage", "allow_partial"):
                d.pop(k, None)
        else:
            d.pop("paths", None)
            if self.source is None:
                d.pop("source", None)
        return d


@dataclass(frozen=True)
class InputShard:
    """The unit of work of a reader: one file, or the byte range ``[start, end)`` of it (part
    ``part`` of ``nparts``); it reads the records that start in its range."""

    input: str
    key: str  # stable shard name, e.g. "crawl-00003"; output files are STAGE/<key>.parquet
    path: str  # full path / URL
    relpath: str  # path relative to the input's common root, used in document ids
    format: str
    part: int
    nparts: int
    size: int
    start: int = 0
    end: int = -1  # -1: to the end of the file

    def __post_init__(self) -> None:
        if self.end < 0:
            object.__setattr__(self, "end", self.size)


def compression_of(path: str) -> str | None:
    """The codec of a JSON Lines file, from its name."""
    if path.endswith(".gz"):
        return "gzip"
    if path.endswith((".zst", ".zstd")):
        return "zstd"
    return None


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
    # which large files can be cut: a look at each one's head, in parallel (remote stores)
    large = [(path, size) for path, size in files if size > spec.split_bytes]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(large)))) as pool:
        splittable = dict(zip((p for p, _ in large),
                              pool.map(lambda ps: _splittable(name, spec.format, *ps), large)))
    for path, size in files:
        rel = posixpath.relpath(path, root) if root else path
        nparts = max(1, math.ceil(size / spec.split_bytes))
        if nparts > 1 and not splittable[path]:
            nparts = 1
        for part in range(nparts):
            key = f"{name}-{len(shards):05d}"
            start, end = size * part // nparts, size * (part + 1) // nparts
            shards.append(InputShard(name, key, path, rel, spec.format, part, nparts, size, start, end))
    return shards


def _splittable(name: str, fmt: str, path: str, size: int) -> bool:
    """Can a file larger than ``split_bytes`` be read by byte ranges? (Logs why not.)"""
    if fmt == "jsonl":
        comp = compression_of(path)
        if comp:
            log.info("inputs.%s: %s is %s-compressed JSON Lines (%d bytes): read whole by one task",
                     name, path, comp, size)
            return False
        return True
    if fmt in ("warc", "wet"):
        from curation.io.ranges import gzip_layout

        layout = gzip_layout(path)
        if layout == "single":
            log.warning("inputs.%s: %s (%d bytes) is one gzip stream, not one gzip member per record: "
                        "read whole by one task (recompress it per record to read it in parallel)",
                        name, path, size)
            return False
        if layout == "plain":
            log.info("inputs.%s: %s (%d bytes) is not gzip (uncompressed WARC): read whole by one task",
                     name, path, size)
            return False
    return True
