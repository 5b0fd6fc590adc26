"""Reading some rows of a Parquet shard, decoding only the row groups that hold them."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def _group_starts(pf: pq.ParquetFile) -> np.ndarray:
    sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
    return np.r_[0, np.cumsum(sizes)].astype(np.int64)


def read_row_range(path: str, lo: int, hi: int, columns: list[str]) -> pa.Table:
    """Rows [lo, hi) of ``columns`` (those the file has)."""
    pf = pq.ParquetFile(path)
    cols = [c for c in columns if c in pf.schema_arrow.names]
    starts = _group_starts(pf)
    groups = [g for g in range(pf.num_row_groups) if starts[g + 1] > lo and starts[g] < hi]
    if not groups:
        return pf.schema_arrow.empty_table().select(cols)
    return pf.read_row_groups(groups, columns=cols).slice(lo - int(starts[groups[0]]), hi - lo)


def take_rows(path: str, rows: np.ndarray, column: str) -> pa.Array:
    """``column`` at sorted ``rows``."""
    pf = pq.ParquetFile(path)
    starts = _group_starts(pf)
    groups = np.unique(np.searchsorted(starts, rows, side="right") - 1)
    if not len(groups):
        return pa.array([], pf.schema_arrow.field(column).type)
    t = pf.read_row_groups(groups.tolist(), columns=[column])
    local = np.concatenate([np.arange(starts[g], starts[g + 1]) for g in groups])  # file rows of ``t``
    return t.column(column).take(pa.array(np.searchsorted(local, rows))).combine_chunks()
