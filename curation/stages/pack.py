"""Pack tokenized documents into fixed-length training rows of ``seq_len + 1`` tokens.

``best_fit`` is best-fit decreasing (Ding et al. 2024, "Fewer Truncations Improve Language
Modeling"): documents longer than a row are cut into row-sized pieces, then, within each window
of ``window`` documents, pieces are placed largest first into the open row with the least room
that still fits them; a row is padded only when no remaining piece fits it. Documents are split
only when they are longer than a row. ``concat`` concatenates documents in order and cuts every
``seq_len + 1`` tokens (the classic GPT recipe: about one document cut per row).

Windows are cut from the global document order (upstream shards by key, rows in order), one
output shard each, so the output is the same on any number of workers and memory stays flat;
a Ray task packs a run of consecutive windows of about ``TASK_DOCS`` documents, one window at
a time (``curation.io.shards.blocks`` over the windows' document counts): tasks follow the
documents, not the window size or the upstream's shard count. Rows are then shuffled within their window (seeded), as best-fit emits them
largest piece first. Each row::

    input_ids     list<int32>  exactly seq_len + 1 tokens, padding (pad_id) at the end
    doc_lens      list<int32>  length of each piece in the row, in order (sum = non-padding)
    doc_ids       list<string> "<document id>@<piece>/<pieces>" of each piece
    source        string       the row's source (the only one with per_source, else the majority)
    source_tokens string       JSON {source: tokens}
    quality       double       token-weighted mean document quality (null without a quality column)

``RUN/STAGE/_pack_report.json``: rows, non-padding fraction, documents split, truncations.
The packing itself (pure functions over lengths) is ``curation/sampling/packing.py``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, field_validator

from curation.io import location
from curation.io.rows import read_row_range
from curation.io.shards import blocks
from curation.stages.base import GlobalStage, registry
from curation.stages.paths import PathStr
from curation.stages.context import ShardSink, StageContext
from curation.formats.packed import PACK_REPORT, PACKED_SCHEMA, TOKENIZER_METADATA, with_source_tokens
from curation.sampling.packing import pack_by_source, pack_window, summarize
from curation.tokenizer.model import Tokenizer, checked_tokenizer_dir, tokenizer_fingerprint

REPORT = PACK_REPORT
ROW_GROUP_ROWS = 256


class PackError(ValueError):
    """Input that cannot be packed (no input_ids, no pad id); the message says what to do."""


@dataclass(frozen=True)
class PackJob:
    out: ShardSink
    segments: tuple[tuple[str, int, int], ...]
    seq_len: int
    algorithm: str
    pad_id: int
    per_source: bool
    shuffle_seed: tuple[int, int] | None = None  # (seed, window): permute the window's rows with it


#: a pack task packs consecutive windows holding about this many documents (fewer when the
#: whole input is small: at least ``MIN_TASKS`` tasks), one window at a time
TASK_DOCS = 100_000
MIN_TASKS = 16


@dataclass(frozen=True)
class PackWindows:
    """Consecutive windows packed by one task: one output shard each."""

    windows: tuple[PackJob, ...]

    @property
    def outs(self) -> tuple[ShardSink, ...]:
        return tuple(w.out for w in self.windows)


def pack_windows(job: PackWindows) -> list[dict]:
    """Phase ``pack``, a run of consecutive windows, one after the other (memory: one window):
    their manifest entries."""
    return [pack_task(w) for w in job.windows]


def pack_task(job: PackJob) -> dict:
    """One window: read its documents, pack them, write one shard. Returns its manifest entry."""
    cols = ["id", "source", "input_ids", "quality"]
    parts = [read_row_range(p, lo, hi, cols) for p, lo, hi in job.segments]
    has_q = any("quality" in t.column_names for t in parts)
    parts = [t if not has_q or "quality" in t.column_names else t.append_column("quality", pa.nulls(t.num_rows, pa.float64()))
             for t in parts]
    parts = [t.select([c for c in cols if c in t.column_names]) for t in parts]
    for i, t in enumerate(parts):
        if "quality" in t.column_names and t.schema.field("quality").type != pa.float64():
            parts[i] = t.set_column(t.schema.get_field_index("quality"), "quality", t.column("quality").cast(pa.float64()))
        if t.schema.field("input_ids").type != pa.list_(pa.int32()):
            parts[i] = parts[i].set_column(parts[i].schema.get_field_index("input_ids"), "input_ids",
                                           t.column("input_ids").cast(pa.list_(pa.int32())))
    table = pa.concat_tables(parts).combine_chunks()
    pack = pack_by_source if job.per_source else pack_window
    packed, stats = pack(table, job.seq_len, job.algorithm, job.pad_id)
    if job.shuffle_seed is not None and packed.num_rows:
        # best-fit emits rows largest pieces first: shuffle them. Per source, only within each
        # source's run of rows, so row groups stay one source and a trainer reading by row
        # group under any phase mix decodes only the sources it draws
        perm = np.random.default_rng(list(job.shuffle_seed)).permutation(packed.num_rows)
        if job.per_source:
            src = packed.column("source").to_numpy(zero_copy_only=False)
            perm = perm[np.argsort(src[perm], kind="stable")]  # sources in order, shuffled inside
        packed = packed.take(perm)
    entry = job.out.write(with_source_tokens(packed), None, table.num_rows, row_group_size=ROW_GROUP_ROWS)
    entry["pack"] = stats
    return entry


# ---------------------------------------------------------------------------------------------
# the stage


@registry.register("pack")
class Pack(GlobalStage):
    """Pack tokenized documents into rows of ``seq_len + 1`` tokens for training.

    ``algorithm``: ``best_fit`` (best-fit decreasing within windows of ``window`` documents;
    splits only documents longer than a row) or ``concat`` (concatenate and cut). The pad id is
    ``pad_id``, else the pad id of ``tokenizer`` (a tokenizer directory), else the one recorded
    in the upstream shards' metadata by the tokenize stage. ``shuffle_rows`` permutes the rows of
    each window (seeded by ``seed`` and the window's number), since best-fit emits them sorted by
    their largest piece. ``per_source`` (default) packs each source apart: one source per row.
    """

    type: Literal["pack"] = "pack"
    output_unit: ClassVar[str] = "rows"
    seq_len: int = Field(default=2048, gt=0)
    algorithm: Literal["best_fit", "concat"] = "best_fit"
    window: int = Field(default=10_000, gt=0)
    pad_id: int | None = Field(default=None, ge=0)
    tokenizer: PathStr | None = None
    shuffle_rows: bool = True
    seed: int = Field(default=0, ge=0)
    #: pack each source's documents apart within a window: every row holds one source, so the
    #: trainer's phases realise token shares exactly (False: rows mix sources, ``source`` is the
    #: majority)
    per_source: bool = True

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_exists(cls, v: str | None) -> str | None:
        if v is None:
            return v
        return checked_tokenizer_dir(v)

    def params(self) -> dict[str, Any]:
        p = super().params()
        if self.tokenizer is not None:
            p["tokenizer"] = {"fingerprint": tokenizer_fingerprint(self.tokenizer)}
        return p

    def output_columns(self, upstream: set[str] | None) -> set[str] | None:
        return set(PACKED_SCHEMA.names)  # training rows, whatever the documents' columns

    def resolve_pad_id(self, paths: list[str]) -> int:
        if self.pad_id is not None:
            return self.pad_id
        if self.tokenizer is not None:
            return Tokenizer.load(self.tokenizer).pad_id
        for p in paths:
            meta = location.read_schema(p).metadata or {}
            if TOKENIZER_METADATA in meta:
                return int(json.loads(meta[TOKENIZER_METADATA])["pad_id"])
        raise PackError("pack: no pad id: set pad_id or tokenizer, or pack the output of a tokenize stage")

    def windows(self, paths: list[str]) -> list[list[tuple[str, int, int]]]:
        """The documents of each window as (file, first row, end row) segments: one pass over
        the shards' row counts (from their footers), windows and shards advanced together."""
        if paths and "input_ids" not in location.read_schema(paths[0]).names:
            raise PackError(f"pack: {paths[0]} has no input_ids column; put a tokenize stage before pack")
        out: list[list[tuple[str, int, int]]] = []
        segs: list[tuple[str, int, int]] = []
        room = self.window
        for p in paths:
            n, lo = location.parquet_file(p).metadata.num_rows, 0
            while lo < n:
                take = min(room, n - lo)
                segs.append((p, lo, lo + take))
                lo, room = lo + take, room - take
                if room == 0:
                    out.append(segs)
                    segs, room = [], self.window
        if segs:
            out.append(segs)
        return out

    def run(self, ctx: StageContext) -> None:
        paths = [p for _, p in ctx.upstream]
        windows = self.windows(paths)
        pad_id = self.resolve_pad_id(paths) if windows else (self.pad_id or 0)
        keys = [f"{ctx.name}-{w:05d}" for w in range(len(windows))]
        jobs = [PackJob(ctx.output(k), tuple(windows[w]), self.seq_len, self.algorithm, pad_id, self.per_source,
                        (self.seed, w) if self.shuffle_rows else None) for w, k in enumerate(keys)]
        # tasks are runs of windows with a document budget, so a small window (many output
        # shards) does not mean as many tasks: the same shards and bytes either way
        spans = blocks([sum(hi - lo for _, lo, hi in w) for w in windows], TASK_DOCS, MIN_TASKS)
        ctx.phase("pack", pack_windows, [PackWindows(tuple(jobs[lo:hi])) for lo, hi in spans], commit=True)
        entries = ctx.committed()
        stats = [entries[k]["pack"] for k in keys if k in entries]
        report = summarize(stats, self.seq_len)
        report.update(algorithm=self.algorithm, seq_len=self.seq_len, window=self.window, pad_id=pad_id,
                      shards=len(keys))
        ctx.write_report(REPORT, report)
