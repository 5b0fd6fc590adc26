"""A processed batch split into kept rows and rejected rows (with ``stage`` and ``reason``); a
column replaced with its field kept; upstream shards grouped into blocks of bounded bytes (a
global stage's map tasks), and a block's small shards into shared outputs."""

from __future__ import annotations

import hashlib

import pyarrow as pa
import pyarrow.compute as pc


def split_kept_rejected(table: pa.Table, reasons: pa.Array | None, stage: str) -> tuple[pa.Table, pa.Table | None]:
    """Kept rows, and rejected rows with ``stage`` and ``reason`` columns (None if nothing dropped)."""
    if reasons is None or reasons.null_count == len(reasons):
        return table, None
    keep = pc.is_null(reasons)
    drop = pc.invert(keep)
    rejected = table.filter(drop)
    rejected = rejected.append_column("stage", pa.array([stage] * rejected.num_rows, pa.string()))
    rejected = rejected.append_column("reason", reasons.filter(drop).cast(pa.string()))
    return table.filter(keep), rejected


def replace_column(table: pa.Table, name: str, values: pa.Array | pa.ChunkedArray) -> pa.Table:
    """``table`` with column ``name`` holding ``values`` (appended when it has none), its field
    kept: nullability and metadata (the ``text`` field's Markdown mark, ``refinery.markup``),
    typed as ``values``. ``Table.set_column(i, name, ...)`` makes a bare field: every stage that
    rewrites its text through it wrote shards that forgot they hold Markdown."""
    i = table.schema.get_field_index(name)
    if i < 0:
        return table.append_column(name, values)
    return table.set_column(i, table.schema.field(i).with_type(values.type), values)


#: a block of upstream shards holds about this many bytes on disk (fewer when the whole input
#: is small: see ``blocks``). Per block a global stage writes its map files (exact's keys,
#: minhash's kept band and doc files): at 64 MB, 50k-document shards (30 MB) pair up and those
#: files halve, while the largest worker stays where 32 MB had it (bench_global.py, 10M docs)
BLOCK_BYTES = 64 << 20
#: the input is cut into at least this many blocks (when it has as many shards): parallelism
#: for a small input, not a memory bound
MIN_BLOCKS = 8


def blocks(sizes: list[int], target: int = BLOCK_BYTES, min_blocks: int = MIN_BLOCKS) -> list[tuple[int, int]]:
    """Consecutive shards grouped into blocks ``[lo, hi)`` of at most ``target`` bytes (at
    most ``total / min_blocks`` when that is smaller; a larger shard is a block alone). A
    global stage runs one map task per block, so its tasks and intermediate files grow with the
    data's bytes, not with how many shards hold them. A pure function of the sizes: never of
    the worker count, so a resumed run finds the same blocks."""
    total = sum(sizes)
    cap = max(1, min(target, total // max(1, min_blocks)))
    out, lo, acc = [], 0, 0
    for i, n in enumerate(sizes):
        if i > lo and acc + n > cap:
            out.append((lo, i))
            lo, acc = i, 0
        acc += n
    if lo < len(sizes):
        out.append((lo, len(sizes)))
    return out


#: a global stage writes one output shard per run of consecutive upstream shards of a block
#: holding up to this many bytes: a shard this size or larger is its own output under its own
#: key, smaller neighbours share one (under the first one's key). Each output file costs a fixed
#: ~2 ms to write (file, writer, a zstd context per column chunk), so 2,000 shards of 500
#: documents took quality_top 1.6x the time of the same documents in 200 shards
#: (bench_global.py); CC-sized shards (tens of MB) are untouched.
OUTPUT_BYTES = 16 << 20


def output_groups(sizes: list[int], span: tuple[int, int], target: int | None = None) -> list[tuple[int, int]]:
    """The outputs of block ``span`` (``[lo, hi)`` of ``sizes``): consecutive runs ``[a, b)``
    of at most ``target`` bytes (``OUTPUT_BYTES``; a larger shard alone). A pure function of
    the sizes, like ``blocks``: a resumed run finds the same outputs."""
    lo, hi = span
    cap = OUTPUT_BYTES if target is None else target
    return [(lo + a, lo + b) for a, b in blocks(sizes[lo:hi], cap, min_blocks=1)]


def block_name(keys: list[str]) -> str:
    """A block's intermediate file name: its first shard's key (made file-safe), its number
    of shards and a digest of all its keys (another grouping never reuses the file)."""
    from curation.io.files import safe_names

    digest = hashlib.sha1("\x00".join(keys).encode()).hexdigest()[:12]
    return f"{safe_names(keys[:1])[0]}-{len(keys)}-{digest}"
