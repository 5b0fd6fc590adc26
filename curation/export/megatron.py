"""Megatron-LM's indexed dataset: ``PREFIX.bin`` (the tokens) and ``PREFIX.idx`` (the index),
one pair per output shard, what ``megatron.core.datasets.indexed_dataset.IndexedDataset``
opens (and ``tools/preprocess_data.py`` writes).

``.idx``, little-endian::

    9 bytes   b"MMIDIDX\\x00\\x00"
    u64       version, 1
    u8        dtype code of the tokens (1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
              7 float32, 8 uint16)
    u64       sequence count S
    u64       document index count D (documents + 1)
    i32[S]    tokens per sequence
    i64[S]    byte offset of each sequence in .bin
    i64[D]    document indices: document d is sequences [idx[d], idx[d + 1])

Token dtype as Megatron's ``DType.optimal_dtype``: uint16 below 65,500 ids, else int32.
A document is one sequence; a packed row is one document whose sequences are its pieces (padding
is not written: every token in .bin is data).
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np

from curation.export.common import Docs, TokenInfo, Writer, cast_tokens, finish_nothing, write_array

HEADER = b"MMIDIDX\x00\x00"
VERSION = 1
DTYPE_CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}
SUFFIXES = (".bin", ".idx")
finish = finish_nothing


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype("<u2") if vocab_size < 65500 else np.dtype("<i4")


def index_bytes(seq_lens: np.ndarray, doc_idx: np.ndarray, dtype: np.dtype) -> bytes:
    """The whole .idx file for these sequence lengths and document indices."""
    seq_lens = np.asarray(seq_lens, np.int64)
    ptrs = np.zeros(len(seq_lens), np.int64)
    if len(seq_lens) > 1:
        np.cumsum(seq_lens[:-1] * np.dtype(dtype).itemsize, out=ptrs[1:])
    head = HEADER + struct.pack("<QBQQ", VERSION, DTYPE_CODES[np.dtype(dtype).name], len(seq_lens), len(doc_idx))
    return b"".join([head, seq_lens.astype("<i4").tobytes(), ptrs.astype("<i8").tobytes(),
                     np.asarray(doc_idx, "<i8").tobytes()])


class MegatronWriter(Writer):
    def __init__(self, out_dir: Path, name: str, info: TokenInfo, index: int, options: dict[str, Any]):
        super().__init__(out_dir, name, info, index, options)
        self.dtype = token_dtype(info.vocab_size)
        self._bin = self._file(f"{name}.bin")
        self._seq: list[np.ndarray] = []  # 4-12 bytes per sequence: bounded by the shard, not the corpus
        self._docs: list[np.ndarray] = []
        self._n_seq = 0

    def write_docs(self, docs: Docs) -> None:
        write_array(self._bin, cast_tokens(docs.tokens, self.dtype, self.name))
        self._seq.append(np.asarray(docs.lengths, np.int64))
        groups = docs.group_sizes if docs.group_sizes is not None else np.ones(len(docs), np.int64)
        self._docs.append(self._n_seq + np.cumsum(groups, dtype=np.int64))
        self._n_seq += len(docs)

    def close(self) -> list[dict[str, Any]]:
        if self._n_seq == 0:
            return self.close_empty()
        seq = np.concatenate(self._seq) if self._seq else np.zeros(0, np.int64)
        doc_idx = np.concatenate([np.zeros(1, np.int64), *self._docs])
        idx = self._file(f"{self.name}.idx")
        idx.write(index_bytes(seq, doc_idx, self.dtype))
        return [self._bin.close(), idx.close()]


WRITER = MegatronWriter


def data_path(shards: list[dict[str, Any]], out_dir: str, weights: dict[str, float] | None = None) -> str:
    """Megatron's ``--data-path`` from an export manifest's ``shards``: the prefixes in order, or,
    with per-source ``weights``, each prefix weighted by its source's weight times its share of
    that source's tokens (Megatron normalizes the weights; a prefix whose sources have no weight
    is left out). A shard without files (no documents) has no prefix."""
    prefixes = [(str(Path(out_dir) / bin_[:-4]), s) for s in shards
                for bin_ in [next((f for f in s["files"] if f.endswith(".bin")), None)] if bin_ is not None]
    if not weights:
        return " ".join(p for p, _ in prefixes)
    per_source: dict[str, int] = {}
    for _, s in prefixes:
        for src, n in s["source_tokens"].items():
            per_source[src] = per_source.get(src, 0) + n
    parts = []
    for p, s in prefixes:
        w = sum(weights.get(src, 0.0) * n / per_source[src] for src, n in s["source_tokens"].items() if per_source[src])
        if w > 0:
            parts.append(f"{w:.6g} {p}")
    return " ".join(parts)
