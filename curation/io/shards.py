"""A processed batch split into kept rows and rejected rows (with ``stage`` and ``reason``)."""

from __future__ import annotations

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
