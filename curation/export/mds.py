"""MosaicML Streaming's MDS, what ``streaming.StreamingDataset`` (Composer, LLM Foundry) reads:
``index.json`` plus ``shard.NNNNN.PPP.mds`` files (upstream shard NNNNN, part PPP: a part is
cut at ``size_limit`` bytes, 64 MiB by default, as Streaming's own writer does).

Columns (sorted by name, as MDS requires): documents ``id`` (str), ``input_ids``
(``ndarray:int32``, the tokens with the tokenize stage's EOS), ``source`` (str); packed rows
``doc_ids`` (json list), ``doc_lens`` (``ndarray:int32``), ``input_ids`` (``ndarray:int32``,
the whole row with its padding), ``source`` (str, the row's majority source).

A shard file, little-endian::

    u32         number of samples N
    u32[N + 1]  byte offset of each sample in this file, and of the end
    bytes       the shard's config: JSON (sorted keys) of version, format, compression,
                hashes, size_limit, column_names, column_encodings, column_sizes
    samples     each: u32 size of every variable-size column (in column order), then the
                columns' bytes in column order

Encodings: ``str`` UTF-8; ``json`` UTF-8 JSON; ``ndarray:<dtype>`` with a fixed dtype and a
free shape is ``[ndim << 2 | shape dtype code][shape][values]`` (shape dtype code 0 uint8,
1 uint16, 2 uint32, 3 uint64: the smallest holding every dimension). ``index.json`` is
``{"version": 2, "shards": [...]}``, each shard its config plus ``samples``, ``raw_data``
(basename, bytes, hashes) and ``zip_data`` (null: no compression).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from curation.export.common import Docs, ExportError, HashedFile, Rows, TokenInfo, Writer

INDEX = "index.json"
SUFFIXES = (".mds",)
DEFAULT_SIZE_LIMIT = 1 << 26
DOC_COLUMNS = {"id": "str", "input_ids": "ndarray:int32", "source": "str"}
ROW_COLUMNS = {"doc_ids": "json", "doc_lens": "ndarray:int32", "input_ids": "ndarray:int32", "source": "str"}
SHAPE_DTYPES = ("<u1", "<u2", "<u4", "<u8")


def shard_config(columns: dict[str, str], size_limit: int) -> dict[str, Any]:
    names = sorted(columns)
    return {"version": 2, "format": "mds", "compression": None, "hashes": [], "size_limit": size_limit,
            "column_names": names, "column_encodings": [columns[n] for n in names],
            "column_sizes": [None] * len(names)}


def encode_ndarray(arr: np.ndarray, dtype: str) -> bytes:
    """``ndarray:<dtype>`` of a 1-D array (fixed dtype, free shape)."""
    if arr.size == 0:
        raise ExportError("mds: an ndarray column cannot hold an empty array")
    n = int(arr.shape[0])
    code = 0 if n < 1 << 8 else 1 if n < 1 << 16 else 2 if n < 1 << 32 else 3
    return bytes([(1 << 2) | code]) + np.array([n], SHAPE_DTYPES[code]).tobytes() + \
        np.ascontiguousarray(arr, np.dtype(dtype).newbyteorder("<")).tobytes()


def encode_sample(columns: list[str], encodings: list[str], values: dict[str, Any]) -> bytes:
    parts = []
    for name, enc in zip(columns, encodings):
        v = values[name]
        if enc == "str":
            parts.append((v or "").encode("utf-8"))
        elif enc == "json":
            parts.append(json.dumps(v, sort_keys=True).encode("utf-8"))
        elif enc.startswith("ndarray:"):
            parts.append(encode_ndarray(v, enc.split(":", 1)[1]))
        else:  # pragma: no cover (only the encodings above are written)
            raise ExportError(f"mds: encoding {enc!r} is not written by refinery")
    # every column here has a variable size: all sizes first, then the bytes
    return np.array([len(p) for p in parts], "<u4").tobytes() + b"".join(parts)


class MdsWriter(Writer):
    def __init__(self, out_dir: Path, name: str, info: TokenInfo, index: int, options: dict[str, Any]):
        super().__init__(out_dir, name, info, index, options)
        self.size_limit = int(options.get("size_limit") or DEFAULT_SIZE_LIMIT)
        if not 0 < self.size_limit < 1 << 32:
            raise ExportError(f"mds: size_limit {self.size_limit} must be below 4 GiB (u32 offsets)")
        self._columns: dict[str, str] | None = None
        self._samples: list[bytes] = []
        self._size = 0
        self._parts: list[dict[str, Any]] = []
        self._files: list[dict[str, Any]] = []

    def _start(self, columns: dict[str, str]) -> None:
        if self._columns is None:
            self._columns = columns
            self._config = shard_config(columns, self.size_limit)
            self._config_bytes = json.dumps(self._config, sort_keys=True).encode("utf-8")
            self._names = self._config["column_names"]
            self._encodings = self._config["column_encodings"]

    def _add(self, sample: bytes) -> None:
        # as Streaming's writer: a new shard file when this sample would pass the size limit
        overhead = 4 + 4 + len(self._config_bytes)
        if self._samples and overhead + self._size + len(sample) + 4 > self.size_limit:
            self._flush()
        self._samples.append(sample)
        self._size += len(sample) + 4

    def _flush(self) -> None:
        if not self._samples:
            return
        basename = f"shard.{self.index:05d}.{len(self._parts):03d}.mds"
        n = len(self._samples)
        head = 4 + 4 * (n + 1) + len(self._config_bytes)
        offsets = head + np.concatenate([[0], np.cumsum([len(s) for s in self._samples])])
        if offsets[-1] >= 1 << 32:
            raise ExportError(f"mds: {basename} would pass 4 GiB; lower size_limit")
        f = HashedFile(self.out_dir / basename)
        self._open.append(f)
        f.write(np.array([n], "<u4").tobytes())
        f.write(offsets.astype("<u4").tobytes())
        f.write(self._config_bytes)
        for s in self._samples:
            f.write(s)
        info = f.close()
        self._files.append(info)
        self._parts.append({**self._config, "samples": n, "zip_data": None,
                            "raw_data": {"basename": basename, "bytes": info["bytes"], "hashes": {}}})
        self._samples, self._size = [], 0

    def write_docs(self, docs: Docs) -> None:
        self._start(DOC_COLUMNS)
        offsets = docs.offsets
        tokens = docs.tokens.astype(np.int32, copy=False)
        for i in range(len(docs)):
            self._add(encode_sample(self._names, self._encodings, {
                "id": docs.ids[i], "source": docs.sources[i], "input_ids": tokens[offsets[i]:offsets[i + 1]]}))

    def write_rows(self, rows: Rows) -> None:
        self._start(ROW_COLUMNS)
        starts = np.concatenate([[0], np.cumsum(rows.pieces)]).astype(np.int64)
        lens = rows.doc_lens.astype(np.int32, copy=False)
        tokens = rows.tokens.astype(np.int32, copy=False)
        for r in range(len(rows)):
            a, b = int(starts[r]), int(starts[r + 1])
            self._add(encode_sample(self._names, self._encodings, {
                "doc_ids": rows.doc_ids[a:b], "doc_lens": lens[a:b], "input_ids": tokens[r],
                "source": rows.sources[r]}))

    def close(self) -> list[dict[str, Any]]:
        self._flush()
        return self._files

    def extra(self) -> dict[str, Any]:
        return {"mds_shards": self._parts}


WRITER = MdsWriter


def index_json(results: list[dict[str, Any]]) -> bytes:
    shards = [s for r in results for s in r.get("mds_shards", [])]
    return (json.dumps({"version": 2, "shards": shards}, sort_keys=True)).encode("utf-8")


def finish(out_dir: Path, results: list[dict[str, Any]], info: TokenInfo) -> list[dict[str, Any]]:
    """``index.json`` over every output shard's parts, in the run's order."""
    f = HashedFile(Path(out_dir) / INDEX)
    f.write(index_json(results))
    return [f.close()]
