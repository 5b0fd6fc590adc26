"""Keeper policies: which copy of a duplicate group survives (``exact_dedup`` and
``minhash_dedup``'s ``keep``), within a run and against a corpus index. No Ray, no run directory.

- ``first``: the first copy in corpus order (exact: the lowest ``id``; near: the smallest
  document index); across an index, the indexed copy (it came first).
- ``latest``: the copy with the latest ``date_column`` value (a timestamp, a date, an ISO-8601
  string or a number); a missing date ranks last; ties as ``first`` within a run, and across an
  index the new copy wins a tie (the new snapshot is the later crawl).
- ``highest_quality``: the largest ``quality``; a missing one ranks last; ties as ``first``.
- ``source_rank``: the copy whose ``source`` comes first in ``source_rank`` (``[wiki, books,
  web]``); a source not listed ranks last; ties as ``first``.

A policy turns one document attribute into a rank (float64, lower wins): ``rank``. What an
index keeps of its documents is the attribute itself (``attribute_column``: ``source``,
``quality``, or the date as int64 microseconds), so a later run may rank it with its own list.
Where the policy says a new document beats an indexed one, the new one is kept and the indexed
one is listed in the stage's ``superseded`` table (``SUPERSEDED_SCHEMA``), applied to the old
shards with ``refinery index apply-superseded``.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

Keep = Literal["first", "latest", "highest_quality", "source_rank"]
#: the stage's table of indexed documents a new document replaced (per stage: ``_superseded/``)
SUPERSEDED_DIR = "_superseded"
SUPERSEDED_SCHEMA = pa.schema([("member", pa.string()), ("id", pa.string()), ("by", pa.string()),
                               ("stage", pa.string())])


def source_column(keep: str, date_column: str = "date") -> str | None:
    """The input column a policy reads (None for ``first``)."""
    return {"first": None, "latest": date_column, "highest_quality": "quality", "source_rank": "source"}[keep]


def attribute_column(keep: str) -> str | None:
    """The column an index stores for the policy (the date under the name ``date``)."""
    return {"first": None, "latest": "date", "highest_quality": "quality", "source_rank": "source"}[keep]


def attribute_type(keep: str) -> pa.DataType | None:
    return {"first": None, "latest": pa.int64(), "highest_quality": pa.float64(), "source_rank": pa.string()}[keep]


def attribute(col: pa.Array | pa.ChunkedArray, keep: str) -> pa.Array:
    """The stored attribute of an input column: the date as int64 microseconds since the epoch,
    the quality as float64 (NaN as null), the source as a string."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if keep == "latest":
        t = col.type
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            return pc.cast(col, pa.int64())
        if pa.types.is_string(t) or pa.types.is_large_string(t):
            col = pc.cast(col, pa.timestamp("us"))  # ISO-8601 strings
        elif pa.types.is_date(t) or pa.types.is_timestamp(t):
            col = pc.cast(col, pa.timestamp("us", getattr(t, "tz", None)))
        else:
            raise ValueError(f"keep: latest: a date column of type {t} (want a timestamp, date, ISO string or number)")
        return pc.cast(col, pa.int64())
    if keep == "highest_quality":
        q = pc.cast(col, pa.float64())
        return pc.if_else(pc.is_nan(q), pa.scalar(None, pa.float64()), q)
    if keep == "source_rank":
        return pc.cast(col, pa.string())
    raise ValueError(keep)


def rank(values: pa.Array | pa.ChunkedArray | None, keep: str, source_rank: list[str] | tuple[str, ...] = (),
         n: int | None = None) -> np.ndarray:
    """float64 rank (lower wins) of stored attribute values (``attribute``'s output); ``first``
    ranks everything 0 (``n`` rows)."""
    if keep == "first" or values is None:
        return np.zeros(n if n is not None else (0 if values is None else len(values)), np.float64)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if keep == "source_rank":
        order = {s: float(i) for i, s in enumerate(source_rank)}
        worst = float(len(source_rank))
        return np.array([order.get(s, worst) for s in values.to_pylist()], np.float64)
    v = pc.fill_null(pc.cast(values, pa.float64()), float("nan")).to_numpy(zero_copy_only=False)
    return np.where(np.isnan(v), np.inf, -v)


def new_wins(keep: str, new_rank: np.ndarray, index_rank: np.ndarray) -> np.ndarray:
    """bool per pair: whether the new document replaces the indexed one."""
    if keep == "first":
        return np.zeros(len(new_rank), dtype=bool)
    if keep == "latest":
        return new_rank <= index_rank
    return new_rank < index_rank


def superseded_table(member_ids: list[str], by: list[str], stage: str) -> pa.Table:
    """Rows of the superseded table from ``MEMBER:ID`` names (a member name holds no ':')."""
    member, ids = [], []
    for x in member_ids:
        m, _, i = x.partition(":")
        member.append(m)
        ids.append(i)
    return pa.table({"member": pa.array(member, pa.string()), "id": pa.array(ids, pa.string()),
                     "by": pa.array(by, pa.string()), "stage": pa.array([stage] * len(ids), pa.string())},
                    schema=SUPERSEDED_SCHEMA)
