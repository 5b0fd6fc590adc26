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
from dataclasses import dataclass, field
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

    format: Literal["warc", "wet", "jsonl", "parquet", "run", "cc_index"]
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
    #: ``format: cc_index`` (``curation/io/cc_index.py``): ``paths`` are the index's Parquet
    #: files, ``where`` selects records (SQL over the index's columns, the ``select`` sandbox),
    #: ``warc_root`` is what each row's ``warc_filename`` is joined to; ``split_bytes`` is the
    #: record bytes a task reads, ``max_gap`` how far apart ranges of one file may be and still
    #: be fetched as one read
    where: str | None = None
    warc_root: str | None = None
    max_gap: int = Field(default=64 << 10, ge=0)

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
        if self.format == "cc_index":
            if not self.warc_root:
                raise ValueError("format: cc_index reads WARC records by the index's warc_filename: give warc_root "
                                 "(the folder or URL those names are below, e.g. s3://commoncrawl/)")
            if self.where is not None:
                from curation.io.sql_where import expression_columns

                expression_columns(self.where)  # WhereError (a ValueError): does not parse, reads beyond the row
        elif self.where is not None or self.warc_root is not None:
            raise ValueError("where and warc_root belong to format: cc_index (a select stage filters other inputs)")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        # the fields of format: run only where they are used: every other input dumps (and so
        # hashes, and writes dag.yaml) exactly as before they existed
        d = handler(self)
        if self.format != "cc_index":
            for k in ("where", "warc_root", "max_gap"):
                d.pop(k, None)
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
    #: ``format: cc_index``: the records this shard reads (``cc_select.encode_selection``); its
    #: ``path``/``relpath`` are its first WARC file's, ``size`` the bytes of records it reads
    records: bytes = field(default=b"", repr=False)

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
    if spec.format == "cc_index":
        return plan_index(name, spec, base_dir).shards
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


# ---------------------------------------------------------------------------------------------
# format: cc_index


@dataclass
class IndexPlan:
    """A ``cc_index`` input's plan: its shards, the records and bytes it will read per WARC
    file (``files``: warc_filename -> (records, bytes)), and the selection's own figures."""

    shards: list[InputShard]
    files: dict[str, tuple[int, int]]
    records: int
    bytes: int
    scan: object  # curation.io.cc_select.Scan


def plan_index(name: str, spec: InputSpec, base_dir: str | None = None) -> IndexPlan:
    """Select a ``cc_index`` input's records (``cc_select.scan``: the where checked against the
    index's columns, pushed into the scan) and cut them into shards: WARC files in name order,
    each file's records in offset order, a shard closing once it holds ``split_bytes`` of
    records to read (a file with more is cut between records), so tasks are spread by the
    bytes they read, not by files or records. Deterministic: the same index, where and
    settings give the same shards and keys."""
    from curation.io import cc_select
    from curation.io.sql_where import WhereError

    index_files = [p for p, _ in expand_paths(name, spec, base_dir)]
    try:
        sc = cc_select.scan(index_files, spec.where, what=f"the index of inputs.{name} ({len(index_files)} files)")
    except (WhereError, cc_select.IndexSchemaError) as e:
        raise InputError(f"inputs.{name}.{'where' if isinstance(e, WhereError) else 'paths'}: {e}") from None
    sel = sc.records
    root = cc_select.resolve_root(spec.warc_root or "", base_dir)
    names = sel["warc_filename"].to_pylist()
    lengths = sel["warc_record_length"].to_pylist()
    files: dict[str, tuple[int, int]] = {}
    for f, n in zip(names, lengths):
        r, b = files.get(f, (0, 0))
        files[f] = (r + 1, b + max(n, 0))
    # cut points: a shard closes at a record that brings it to split_bytes
    shards: list[InputShard] = []
    lo, held = 0, 0
    for i, n in enumerate(lengths):
        held += max(n, 0)
        if held >= spec.split_bytes or i == len(lengths) - 1:
            part = sel.slice(lo, i + 1 - lo)
            first = names[lo]
            path = cc_select.warc_path(root, first) or first
            key = f"{name}-{len(shards):05d}"
            shards.append(InputShard(name, key, path, first, "cc_index", 0, 1, held, 0, held,
                                     records=cc_select.encode_selection(part, root)))
            lo, held = i + 1, 0
    total = sum(b for _, b in files.values())
    log.info("inputs.%s: %d records (%d bytes) in %d WARC files selected from %d index files (%d of %d bytes read, "
             "%.1f s); %d shards", name, sel.num_rows, total, len(files), sc.index_files, sc.bytes_read,
             sc.index_bytes, sc.seconds, len(shards))
    return IndexPlan(shards, files, sel.num_rows, total, sc)
