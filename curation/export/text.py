"""Documents for anyone else (Hugging Face ``datasets``, pandas, DuckDB): ``NAME.parquet`` or
``NAME.jsonl`` per output shard, one record per document::

    id          the document id (for packed rows: the piece, ``<id>@<piece>/<pieces>``)
    source      its source (for pieces of packed rows: the row's, when the row holds one source,
                as pack's per_source makes them; else null)
    text        the stage's raw text when it kept it, else the tokens decoded (special tokens
                such as the EOS skipped)
    input_ids   the tokens, exactly as the stage holds them
    num_tokens  len(input_ids)

Detokenizing needs the tokenizer the tokens were made with (``TokenInfo.dir``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from curation.export.common import Docs, ExportError, TokenInfo, Writer, finish_nothing
from curation.io.files import StagedFile, file_sha256

finish = finish_nothing
SCHEMA = pa.schema([
    pa.field("id", pa.string()),
    pa.field("source", pa.string()),
    pa.field("text", pa.string()),
    pa.field("input_ids", pa.list_(pa.int32())),
    pa.field("num_tokens", pa.int32()),
])


def texts_of(docs: Docs, info: TokenInfo) -> list[str | None]:
    if docs.texts is not None:
        return docs.texts
    if not info.dir:
        raise ExportError("parquet/jsonl export of a stage without text decodes the tokens and needs their "
                          "tokenizer: pass --tokenizer DIR")
    from curation.tokenizer.model import load_cached  # noqa: PLC0415 (only when decoding)

    tok = load_cached(info.dir)
    offsets = docs.offsets
    return [tok.decode(docs.tokens[offsets[i]:offsets[i + 1]]) for i in range(len(docs))]


def table_of(docs: Docs, info: TokenInfo) -> pa.Table:
    offsets = docs.offsets.astype(np.int32)
    return pa.Table.from_arrays([
        pa.array(docs.ids, pa.string()),
        pa.array(docs.sources, pa.string()),
        pa.array(texts_of(docs, info), pa.string()),
        pa.ListArray.from_arrays(pa.array(offsets), pa.array(docs.tokens.astype(np.int32, copy=False))),
        pa.array(docs.lengths.astype(np.int32)),
    ], schema=SCHEMA)


class ParquetWriter(Writer):
    def __init__(self, out_dir: Path, name: str, info: TokenInfo, index: int, options: dict[str, Any]):
        super().__init__(out_dir, name, info, index, options)
        self.path = self.out_dir / f"{name}.parquet"
        self._staged = StagedFile(self.path)
        self._pq = pq.ParquetWriter(self._staged.tmp, SCHEMA, compression="zstd")
        self._rows = 0

    def write_docs(self, docs: Docs) -> None:
        self._pq.write_table(table_of(docs, self.info), row_group_size=1024)
        self._rows += len(docs)

    def close(self) -> list[dict[str, Any]]:
        if self._rows == 0:
            return self.close_empty()
        self._pq.close()
        tmp = self._staged.tmp
        info = {"path": self.path.name, "bytes": tmp.stat().st_size, "sha256": file_sha256(tmp)}
        self._staged.commit()
        return [info]

    def abort(self) -> None:
        self._pq.close()
        self._staged.abort()


class JsonlWriter(Writer):
    def __init__(self, out_dir: Path, name: str, info: TokenInfo, index: int, options: dict[str, Any]):
        super().__init__(out_dir, name, info, index, options)
        self._f = self._file(f"{name}.jsonl")
        self._rows = 0

    def write_docs(self, docs: Docs) -> None:
        self._rows += len(docs)
        texts = texts_of(docs, self.info)
        offsets = docs.offsets
        lines = []
        for i in range(len(docs)):
            ids = docs.tokens[offsets[i]:offsets[i + 1]].tolist()
            lines.append(json.dumps({"id": docs.ids[i], "source": docs.sources[i], "text": texts[i],
                                     "input_ids": ids, "num_tokens": len(ids)}, ensure_ascii=False) + "\n")
        self._f.write("".join(lines).encode("utf-8"))

    def close(self) -> list[dict[str, Any]]:
        if self._rows == 0:
            return self.close_empty()
        return [self._f.close()]


def writer(fmt: str):
    return {"parquet": ParquetWriter, "jsonl": JsonlWriter}[fmt]

