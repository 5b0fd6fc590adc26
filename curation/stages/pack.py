"""Pack tokenized documents into fixed-length training rows of ``seq_len + 1`` tokens.

``best_fit`` is best-fit decreasing (Ding et al. 2024, "Fewer Truncations Improve Language
Modeling"): documents longer than a row are cut into row-sized pieces, then, within each window
of ``window`` documents, pieces are placed largest first into the open row with the least room
that still fits them; a row is padded only when no remaining piece fits it. Documents are split
only when they are longer than a row. ``concat`` concatenates documents in order and cuts every
``seq_len + 1`` tokens (the classic GPT recipe: about one document cut per row).

Windows are cut from the global document order (upstream shards by key, rows in order), one
Ray task and one output shard each, so the output is the same on any number of workers and
memory stays flat. Rows are then shuffled within their window (seeded), as best-fit emits them
largest piece first. Each row::

    input_ids     list<int32>  exactly seq_len + 1 tokens, padding (pad_id) at the end
    doc_lens      list<int32>  length of each piece in the row, in order (sum = non-padding)
    doc_ids       list<string> "<document id>@<piece>/<pieces>" of each piece
    source        string       the row's source (the only one with per_source, else the majority)
    source_tokens string       JSON {source: tokens}
    quality       double       token-weighted mean document quality (null without a quality column)

``RUN/STAGE/_pack_report.json``: rows, non-padding fraction, documents split, truncations.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

if TYPE_CHECKING:  # pragma: no cover
    from curation.pipeline.context import GlobalContext
    from curation.pipeline.rundir import ShardOutput

from curation.io import location
from curation.io.rows import read_row_range
from curation.stages.base import GlobalStage, registry
from curation.formats.packed import PACK_REPORT, PACKED_SCHEMA, TOKENIZER_METADATA, with_source_tokens
from curation.tokenizer.model import Tokenizer, checked_tokenizer_dir, tokenizer_fingerprint

REPORT = PACK_REPORT
ROW_GROUP_ROWS = 256



class PackError(ValueError):
    """Input that cannot be packed (no input_ids, no pad id); the message says what to do."""


# ---------------------------------------------------------------------------------------------
# the algorithms: pure functions over lengths (unit-tested without Ray)


@dataclass
class Pieces:
    """Pieces of documents: piece i is tokens [start, start + length) of document ``doc``."""

    doc: np.ndarray
    start: np.ndarray
    length: np.ndarray
    index: np.ndarray  # piece number within its document
    count: np.ndarray  # pieces of its document


def split_long(lengths: np.ndarray, cap: int) -> Pieces:
    """Cut each document into ceil(len / cap) pieces of ``cap`` tokens (the last one shorter)."""
    lengths = np.asarray(lengths, np.int64)
    n = -(-lengths // cap)
    doc = np.repeat(np.arange(len(lengths), dtype=np.int64), n)
    first = np.repeat(np.cumsum(n) - n, n)
    index = np.arange(len(doc), dtype=np.int64) - first
    start = index * cap
    return Pieces(doc, start, np.minimum(cap, lengths[doc] - start), index, n[doc])


def best_fit_decreasing(lengths: np.ndarray, cap: int) -> list[list[int]]:
    """Bins (lists of item indices, in placement order) of capacity ``cap``, best-fit decreasing.

    Open bins live in one sorted list of keys ``room * K + bin``: ``bisect`` finds the bin with
    the least room that fits an item (ties: the oldest bin), so each placement is one binary
    search plus one list insert/delete, not a scan over bins."""
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    K = len(lengths) + 1
    keys: list[int] = []
    bins: list[list[int]] = []
    for i in order:
        size = int(lengths[i])
        if size <= 0:
            continue
        j = bisect.bisect_left(keys, size * K)
        if j < len(keys):
            key = keys.pop(j)
            room, b = divmod(key, K)
            bins[b].append(i)
            room -= size
        else:
            b = len(bins)
            bins.append([i])
            room = cap - size
        if room > 0:
            bisect.insort(keys, room * K + b)
    return bins


def concat_chunks(lengths: np.ndarray, cap: int) -> tuple[Pieces, list[list[int]]]:
    """Documents concatenated in order and cut every ``cap`` tokens: pieces and rows."""
    lengths = np.asarray(lengths, np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    docs, pstart, plen, pidx, rows = [], [], [], [], []
    for d in range(len(lengths)):
        if lengths[d] <= 0:
            continue
        pos, k = int(starts[d]), 0
        while pos < ends[d]:
            row = pos // cap
            stop = min(int(ends[d]), (row + 1) * cap)
            docs.append(d)
            pstart.append(pos - int(starts[d]))
            plen.append(stop - pos)
            pidx.append(k)
            rows.append(row)
            pos, k = stop, k + 1
    docs_a = np.asarray(docs, np.int64)
    idx_a = np.asarray(pidx, np.int64)
    counts = np.bincount(docs_a, minlength=len(lengths)) if len(docs_a) else np.zeros(len(lengths), np.int64)
    pieces = Pieces(docs_a, np.asarray(pstart, np.int64), np.asarray(plen, np.int64), idx_a, counts[docs_a])
    out: list[list[int]] = [[] for _ in range(int(rows[-1]) + 1 if rows else 0)]
    for i, r in enumerate(rows):
        out[r].append(i)
    return pieces, out


def pack_window(table: pa.Table, seq_len: int, algorithm: str, pad_id: int) -> tuple[pa.Table, dict]:
    """Pack one window of documents (columns id, source, input_ids, optional quality)."""
    cap = seq_len + 1
    ids_col = table.column("input_ids").combine_chunks()
    if isinstance(ids_col, pa.ChunkedArray):
        ids_col = ids_col.chunk(0) if ids_col.num_chunks else pa.array([], pa.list_(pa.int32()))
    offsets = ids_col.offsets.to_numpy().astype(np.int64)
    values = ids_col.values.to_numpy(zero_copy_only=False).astype(np.int32, copy=False)
    lengths = np.diff(offsets)
    if algorithm == "best_fit":
        pieces = split_long(lengths, cap)
        rows = best_fit_decreasing(pieces.length, cap)
    else:
        pieces, rows = concat_chunks(lengths, cap)

    flat = np.fromiter((p for r in rows for p in r), dtype=np.int64, count=sum(len(r) for r in rows))
    row_of = np.repeat(np.arange(len(rows), dtype=np.int64), [len(r) for r in rows])
    plen = pieces.length[flat]
    # where each piece goes: its row, after the pieces before it in that row
    row_first = np.cumsum([0] + [len(r) for r in rows])[:-1]
    within_row = np.cumsum(plen) - plen
    row_base = within_row[row_first[row_of]] if len(flat) else within_row
    dst = row_of * cap + (within_row - row_base)
    src = offsets[pieces.doc[flat]] + pieces.start[flat]
    mat = np.full(len(rows) * cap, pad_id, dtype=np.int32)
    total = int(plen.sum())
    if total:
        piece_of_tok = np.repeat(np.arange(len(flat)), plen)
        k = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(plen) - plen, plen)
        mat[dst[piece_of_tok] + k] = values[src[piece_of_tok] + k]

    n_rows = len(rows)
    row_off = np.zeros(n_rows + 1, np.int32)
    np.cumsum([len(r) for r in rows], out=row_off[1:])
    doc_id = table.column("id").to_pylist()
    source = table.column("source").to_pylist()
    quality = table.column("quality").to_pylist() if "quality" in table.column_names else None
    docs_of = pieces.doc[flat].tolist()
    piece_names = [f"{doc_id[d]}@{i}/{c}" for d, i, c in zip(docs_of, pieces.index[flat].tolist(), pieces.count[flat].tolist())]
    plen_l = plen.tolist()
    majority, per_source, qual = [], [], []
    for r in range(n_rows):
        counts: dict[str, int] = {}
        qsum = qw = 0.0
        for j in range(row_off[r], row_off[r + 1]):
            d, n = docs_of[j], plen_l[j]
            s = source[d] or "-"
            counts[s] = counts.get(s, 0) + n
            if quality is not None and quality[d] is not None:
                qsum += quality[d] * n
                qw += n
        majority.append(min(counts, key=lambda s: (-counts[s], s)))
        per_source.append(json.dumps(counts, sort_keys=True, separators=(",", ":")))
        qual.append(qsum / qw if qw else None)
    out = pa.Table.from_arrays([
        pa.ListArray.from_arrays(pa.array(np.arange(n_rows + 1, dtype=np.int32) * cap), pa.array(mat)),
        pa.ListArray.from_arrays(pa.array(row_off), pa.array(plen.astype(np.int32))),
        pa.ListArray.from_arrays(pa.array(row_off), pa.array(piece_names, pa.string())),
        pa.array(majority, pa.string()),
        pa.array(per_source, pa.string()),
        pa.array(qual, pa.float64()),
    ], schema=PACKED_SCHEMA)
    nonempty = int((lengths > 0).sum())
    split = int((np.bincount(pieces.doc, minlength=len(lengths)) > 1).sum()) if len(pieces.doc) else 0
    stats = {"rows": n_rows, "docs": nonempty, "empty_docs": int(len(lengths) - nonempty),
             "pieces": int(len(flat)), "tokens": total, "padding": n_rows * cap - total,
             "docs_split": split, "truncations": int(len(flat) - nonempty),
             "long_docs": int((lengths > cap).sum()), "rows_padded": int(sum(1 for r in range(n_rows)
                                                                            if plen[row_off[r]:row_off[r + 1]].sum() < cap))}
    return out, stats


# ---------------------------------------------------------------------------------------------
# Ray task


def pack_by_source(table: pa.Table, seq_len: int, algorithm: str, pad_id: int) -> tuple[pa.Table, dict]:
    """``pack_window`` on each source's documents of the window apart (sources in name order),
    so every row holds one source's tokens: the trainer can then mix sources by exact token
    counts. Costs at most one partly filled row per source per window."""
    if "source" not in table.column_names or table.num_rows == 0:
        return pack_window(table, seq_len, algorithm, pad_id)
    src = pc.fill_null(table.column("source"), "-")
    outs, stats = [], []
    for s in sorted(pc.unique(src).to_pylist()):
        out, st = pack_window(table.filter(pc.equal(src, s)), seq_len, algorithm, pad_id)
        outs.append(out)
        stats.append(st)
    return pa.concat_tables(outs).combine_chunks(), {k: sum(st[k] for st in stats) for k in stats[0]}


@dataclass(frozen=True)
class PackJob:
    out: ShardOutput
    segments: tuple[tuple[str, int, int], ...]
    seq_len: int
    algorithm: str
    pad_id: int
    per_source: bool
    shuffle_seed: tuple[int, int] | None = None  # (seed, window): permute the window's rows with it


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
    tokenizer: str | None = None
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

    def run(self, ctx: GlobalContext) -> None:
        paths = [p for _, p in ctx.upstream]
        windows = self.windows(paths)
        pad_id = self.resolve_pad_id(paths) if windows else (self.pad_id or 0)
        keys = [f"{ctx.name}-{w:05d}" for w in range(len(windows))]
        ctx.phase("pack", pack_task, [
            PackJob(ctx.output(k), tuple(windows[w]), self.seq_len, self.algorithm,
                    pad_id, self.per_source, (self.seed, w) if self.shuffle_rows else None)
            for w, k in enumerate(keys)], commit=True)
        entries = ctx.committed()
        stats = [entries[k]["pack"] for k in keys if k in entries]
        report = summarize(stats, self.seq_len)
        report.update(algorithm=self.algorithm, seq_len=self.seq_len, window=self.window, pad_id=pad_id,
                      shards=len(keys))
        ctx.write_report(REPORT, report)


def summarize(stats: list[dict], seq_len: int) -> dict:
    """Totals over windows, plus the non-padding token fraction."""
    keys = ["rows", "docs", "empty_docs", "pieces", "tokens", "padding", "docs_split", "truncations", "long_docs",
            "rows_padded"]
    tot = {k: int(sum(s.get(k, 0) for s in stats)) for k in keys}
    slots = tot["rows"] * (seq_len + 1)
    tot["non_padding_fraction"] = tot["tokens"] / slots if slots else 0.0
    tot["windows"] = len(stats)
    return tot
