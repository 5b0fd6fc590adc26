"""Packed shards in, per-step model inputs out.

- ``shards``   the committed shards of a pack directory (local or any fsspec URL),
               fingerprinted; rows read block by block, with read accounting
- ``order``    which rows each step consumes: pure arithmetic (a block permutation per epoch
               plus a bounded shuffle window), so resume is arithmetic
- ``batches``  rows -> micro-batches and loss targets, prepared on a background thread
- ``eval``     the held-out split, prepared once
"""

from training.data.batches import IGNORE, Prefetcher, build_micro_batches, build_step
from training.data.eval import EvalData, eval_rows
from training.data.order import DataChangedError, DataOrder, check_resume, order_settings
from training.data.shards import DataError, PackedDataset, RowBatch

__all__ = [
    "IGNORE", "DataChangedError", "DataError", "DataOrder", "EvalData", "PackedDataset", "Prefetcher", "RowBatch",
    "build_micro_batches", "build_step", "check_resume", "eval_rows",
]
