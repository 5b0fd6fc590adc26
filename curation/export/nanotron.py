"""datatrove's tokenized format, which nanotron's Nanoset reads through datatrove's
``DatatroveFolderDataset``: per output shard

    NAME.ds           the tokens, raw little-endian: uint16 (token size 2) for vocabularies of
                      at most 65,536 ids, else uint32 (token size 4)
    NAME.ds.index     u64 per document: where it ends, in tokens from the start of NAME.ds
    NAME.ds.metadata  three lines: ``<tokenizer name or path>|<token size>``, the token count,
                      the count in words

The reader cuts each file into windows of ``seq_len + 1`` tokens (dropping the remainder) and
takes positions from the index. Files are read in name order, which is the run's order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from curation.export.common import Docs, TokenInfo, Writer, cast_tokens, finish_nothing, write_array

SUFFIXES = (".ds", ".ds.index", ".ds.metadata")
finish = finish_nothing


def token_size(vocab_size: int) -> int:
    return 2 if vocab_size <= 65536 else 4


def human(n: int) -> str:
    for unit, scale in (("GT", 1e9), ("MT", 1e6), ("kT", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} T"


class NanotronWriter(Writer):
    def __init__(self, out_dir: Path, name: str, info: TokenInfo, index: int, options: dict[str, Any]):
        super().__init__(out_dir, name, info, index, options)
        self.size = token_size(info.vocab_size)
        self.dtype = np.dtype("<u2" if self.size == 2 else "<u4")
        self._ds = self._file(f"{name}.ds")
        self._index = self._file(f"{name}.ds.index")
        self._tokens = 0

    def write_docs(self, docs: Docs) -> None:
        write_array(self._ds, cast_tokens(docs.tokens, self.dtype, self.name))
        ends = self._tokens + np.cumsum(docs.lengths, dtype=np.int64)
        write_array(self._index, ends.astype("<u8"))
        self._tokens += int(docs.lengths.sum())

    def close(self) -> list[dict[str, Any]]:
        if self._tokens == 0:
            return self.close_empty()
        meta = self._file(f"{self.name}.ds.metadata")
        meta.write(f"{self.info.name}|{self.size}\n{self._tokens}\n{human(self._tokens)}".encode())
        return [self._ds.close(), self._index.close(), meta.close()]


WRITER = NanotronWriter
