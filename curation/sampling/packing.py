"""Packing tokenized documents into fixed-length rows: pure functions over lengths and Arrow
tables (no Ray, no run directory), unit-tested on their own; the ``pack`` stage
(``curation/stages/pack.py``) cuts the windows and writes the shards.

``best_fit_decreasing`` is best-fit decreasing (Ding et al. 2024, "Fewer Truncations Improve
Language Modeling"): documents longer than a row are cut into row-sized pieces
(``split_long``), then pieces are placed largest first into the open row with the least room
that still fits them. ``concat_chunks`` concatenates documents in order and cuts every row.
``pack_window`` turns one window of documents into ``PACKED_SCHEMA`` rows, ``pack_by_source``
does it per source, and ``summarize`` totals the windows' statistics.
"""

from __future__ import annotations

import bisect
import json
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.formats.packed import PACKED_SCHEMA


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


def summarize(stats: list[dict], seq_len: int) -> dict:
    """Totals over windows, plus the non-padding token fraction."""
    keys = ["rows", "docs", "empty_docs", "pieces", "tokens", "padding", "docs_split", "truncations", "long_docs",
            "rows_padded"]
    tot = {k: int(sum(s.get(k, 0) for s in stats)) for k in keys}
    slots = tot["rows"] * (seq_len + 1)
    tot["non_padding_fraction"] = tot["tokens"] / slots if slots else 0.0
    tot["windows"] = len(stats)
    return tot
