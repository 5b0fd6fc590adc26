"""The held-out split: a fixed set of rows spread over a pack, prepared once."""

from __future__ import annotations

import numpy as np

from training.data.batches import MicroBatch, build_micro_batches
from training.data.shards import PackedDataset


def eval_rows(num_rows: int, wanted: int) -> np.ndarray:
    """``wanted`` row indices evenly spaced over ``num_rows`` (all of them if fewer)."""
    if wanted >= num_rows:
        return np.arange(num_rows, dtype=np.int64)
    return (np.arange(wanted, dtype=np.int64) * num_rows) // wanted


class EvalData:
    """A held-out pack: ``batches * global_batch`` rows spread evenly over it (a pack lists its
    sources one after another, so the first rows would be one source), split ``rank::world``,
    prepared once and kept in memory."""

    def __init__(self, path: str, batches: int, global_batch: int, micro_rows: int, rank: int, world: int, seq_len: int, document_mask: bool, pad_id: int, vocab_size: int | None):
        ds = PackedDataset(path)
        rows = eval_rows(ds.num_rows, batches * global_batch)[rank::world]
        self.micro: list[MicroBatch] = []
        for a in range(0, len(rows), micro_rows):
            part = ds.read_rows(rows[a : a + micro_rows], pad_id)
            mb, _, _ = build_micro_batches(part, seq_len, seq_len, micro_rows, document_mask, vocab_size)
            self.micro.extend(mb)
