"""The held-out split: a fixed set of rows spread over a pack, prepared once."""

from __future__ import annotations

import numpy as np

from training.data.batches import MicroBatch, build_micro_batches
from training.data.shards import PackedDataset, RowBatch


def eval_rows(num_rows: int, wanted: int) -> np.ndarray:
    """``wanted`` row indices evenly spaced over ``num_rows`` (all of them if fewer)."""
    if wanted >= num_rows:
        return np.arange(num_rows, dtype=np.int64)
    return (np.arange(wanted, dtype=np.int64) * num_rows) // wanted


def padded_rank_rows(rows: np.ndarray, rank: int, world: int, micro_rows: int) -> np.ndarray:
    """This rank's share of ``rows``, with -1 for padding rows: the list is padded to a
    multiple of ``world x micro_rows``, so every rank runs the same number of full
    micro-batches (under FSDP2 each forward is a collective: unequal counts would deadlock)."""
    per = world * micro_rows
    padded = np.full(-(-len(rows) // per) * per, -1, dtype=np.int64)
    padded[: len(rows)] = rows
    return padded[rank::world]


class EvalData:
    """A held-out pack: ``batches * global_batch`` rows spread evenly over it (a pack lists its
    sources one after another, so the first rows would be one source), split ``rank::world``
    and padded with loss-free rows to whole micro-batches on every rank, prepared once and
    kept in memory. ``max_docs``: varlen boundaries of one fixed length (CUDA graphs)."""

    def __init__(self, path: str, batches: int, global_batch: int, micro_rows: int, rank: int, world: int, seq_len: int, document_mask: bool, pad_id: int, vocab_size: int | None, max_docs: int | None = None):
        ds = PackedDataset(path)
        rows = padded_rank_rows(eval_rows(ds.num_rows, batches * global_batch), rank, world, micro_rows)
        self.micro: list[MicroBatch] = []
        for a in range(0, len(rows), micro_rows):
            part = rows[a : a + micro_rows]
            real = ds.read_rows(part[part >= 0], pad_id)
            pad = int((part < 0).sum())
            if pad:  # rows of padding only: their targets are all IGNORE
                width = real.ids.shape[1] if len(real.ids) else seq_len + 1
                real = RowBatch(np.concatenate([real.ids.reshape(-1, width), np.full((pad, width), pad_id, np.int64)]),
                                list(real.doc_lens) + [np.zeros(0, np.int64)] * pad, list(real.source_tokens) + [None] * pad)
            mb, _, _ = build_micro_batches(real, seq_len, seq_len, micro_rows, document_mask, vocab_size, max_docs)
            self.micro.extend(mb)
