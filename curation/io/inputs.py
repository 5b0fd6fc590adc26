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
from typing import TYPE_CHECKING, Literal

import fsspec
from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from curation.io import datapaths

if TYPE_CHECKING:  # pragma: no cover
    from curation.io.cc_selection import Selection, SelectionSlice

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
    #: ``format: cc_index``: the index files' identity (``cc_select.index_stamp``: names, sizes,
    #: mtimes or ETags), set by the run's planner, never by hand: a rebuilt index under the same
    #: paths is another input (another params hash), so nothing made from the old one resumes
    index_stamp: str | None = None

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
        elif self.where is not None or self.warc_root is not None or self.index_stamp is not None:
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
        if self.index_stamp is None:  # a DAG as written (not yet planned) hashes as before
            d.pop("index_stamp", None)
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
    #: ``format: cc_index``: the rows of the selection files this shard reads (None: planned
    #: for a plan only); its ``path``/``relpath`` are its first WARC file's, ``size`` the bytes
    #: of records it reads
    selection: SelectionSlice | None = None

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
    if spec.format == "cc_index":  # a run plans it into its run directory (executor.select_indexes)
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
    scan: Selection


def stamp_index(name: str, spec: InputSpec, base_dir: str | None = None) -> InputSpec:
    """``spec`` with its ``index_stamp`` (the index files' identity), its ``where`` checked
    against the index (columns, and a run over a row of nulls): what a run plans before it
    touches its run directory. InputError as ``plan_index`` gives it."""
    from curation.io import cc_select
    from curation.io.sql_where import WhereError

    files = [p for p, _ in expand_paths(name, spec, base_dir)]
    try:
        cc_select.check_where(files, spec.where, what=f"the index of inputs.{name} ({len(files)} files)")
    except (WhereError, cc_select.IndexSchemaError) as e:
        raise InputError(f"inputs.{name}.{'where' if isinstance(e, WhereError) else 'paths'}: {e}") from None
    return spec.model_copy(update={"index_stamp": cc_select.index_stamp(files)})


def plan_index(name: str, spec: InputSpec, base_dir: str | None = None, work_dir: str | None = None,
               rows: bool = True) -> IndexPlan:
    """Select a ``cc_index`` input's records (``cc_select.select``: the where checked against
    the index's columns, pushed into the scan) into selection files in ``work_dir`` (a
    scratch folder without one; none at all without ``rows``: a plan's figures only), and cut
    them into shards: WARC files in name order, each file's records in offset order, a shard
    closing once it holds ``split_bytes`` of records to read (a file with more is cut between
    records), so tasks are spread by the bytes they read, not by files or records. A selection
    ``work_dir`` holds from the same index files (names, sizes, mtimes/ETags), where and
    settings is reused: the index is not read again. Deterministic: the same index, where and
    settings give the same shards and keys."""
    import hashlib
    import json

    from curation.io import cc_select, cc_selection
    from curation.io.sql_where import WhereError

    index_files = [p for p, _ in expand_paths(name, spec, base_dir)]
    root = cc_select.resolve_root(spec.warc_root or "", base_dir)
    ident = {"spec": spec.model_dump(mode="json"), "index": cc_select.index_stamp(index_files), "files": index_files}
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    sel = cc_selection.load(work_dir, key) if work_dir and rows else None
    if sel is None:
        out = (work_dir or cc_selection.scratch_dir()) if rows else None
        try:
            sel = cc_select.select(index_files, spec.where, spec.split_bytes, out, key,
                                   what=f"the index of inputs.{name} ({len(index_files)} files)")
        except (WhereError, cc_select.IndexSchemaError) as e:
            raise InputError(f"inputs.{name}.{'where' if isinstance(e, WhereError) else 'paths'}: {e}") from None
    shards = [InputShard(name, f"{name}-{i:05d}", cc_select.warc_path(root, first) or first, first, "cc_index",
                         0, 1, held, 0, held, selection=sel.slice(lo, hi, root) if sel.dir else None)
              for i, (lo, hi, held, first) in enumerate(sel.shards)]
    log.info("inputs.%s: %d records (%d bytes) in %d WARC files selected from %d index files (%s; %d of %d bytes "
             "read, %.1f s); %d shards", name, sel.rows, sel.bytes, len(sel.files), sel.index_files,
             "reused" if sel.reused else "scanned", sel.bytes_read, sel.index_bytes, sel.seconds, len(shards))
    return IndexPlan(shards, sel.files, sel.rows, sel.bytes, sel)
