"""OLMo-core's numpy token files (the Dolma toolkit's layout), what its ``NumpyFSLDataset`` /
``NumpyPaddedFSLDataset`` / ``NumpyPackedFSLDataset`` read: per output shard

    NAME.npy      a flat memmapped array of token ids, no header, documents one after another,
                  each ending with the EOS id (as the tokenize stage writes them, ``add_eos``);
                  dtype the smallest of uint8/16/32/64 holding the vocabulary (OLMo's rule)
    NAME.csv.gz   one line per document: ``start,end,id,source`` (token offsets, end exclusive);
                  OLMo reads the first two fields when it takes boundaries from metadata

Nothing is inserted: a document that does not end with EOS (tokenize with ``add_eos: false``,
or a non-final piece of a document a pack stage split across rows) is counted in the shard's
``docs_without_eos``; its boundary is in the metadata file, which OLMo reads with
``OLMO_DATA_PREP_USE_ARRAY_IF_LOCAL=metadata`` (otherwise it infers boundaries from EOS).
"""

from __future__ import annotations

import csv
import gzip
import io
from pathlib import Path
from typing import Any

import numpy as np

from curation.export.common import Docs, TokenInfo, Writer, cast_tokens, finish_nothing, smallest_uint, write_array

SUFFIXES = (".npy", ".csv.gz")
finish = finish_nothing


def token_dtype(vocab_size: int) -> np.dtype:
    return smallest_uint(vocab_size)


class OlmoWriter(Writer):
    def __init__(self, out_dir: Path, name: str, info: TokenInfo, index: int, options: dict[str, Any]):
        super().__init__(out_dir, name, info, index, options)
        self.dtype = token_dtype(info.vocab_size)
        self._npy = self._file(f"{name}.npy")
        self._meta_file = self._file(f"{name}.csv.gz")
        # mtime 0 and no file name in the gzip header: the same export gives the same bytes
        self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._meta_file, mtime=0)
        self._text = io.TextIOWrapper(self._gz, encoding="utf-8", newline="")
        self._csv = csv.writer(self._text, lineterminator="\n")
        self._tokens = 0
        self.docs_without_eos = 0

    def write_docs(self, docs: Docs) -> None:
        write_array(self._npy, cast_tokens(docs.tokens, self.dtype, self.name))
        offsets = docs.offsets
        ends = offsets[1:]
        nonempty = docs.lengths > 0
        last = docs.tokens[ends[nonempty] - 1] if len(docs.tokens) else np.zeros(0, np.int32)
        self.docs_without_eos += int((last != self.info.eos_id).sum())
        starts = (self._tokens + offsets[:-1]).tolist()
        stops = (self._tokens + ends).tolist()
        self._csv.writerows(zip(starts, stops, docs.ids, (s or "" for s in docs.sources)))
        self._tokens += int(offsets[-1])

    def close(self) -> list[dict[str, Any]]:
        self._text.flush()
        self._text.detach()
        self._gz.close()
        if self._tokens == 0:
            return self.close_empty()
        return [self._npy.close(), self._meta_file.close()]

    def extra(self) -> dict[str, Any]:
        return {"docs_without_eos": self.docs_without_eos}


WRITER = OlmoWriter
