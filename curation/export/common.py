"""What every export format shares: the tokenizer the tokens were made with, batches of documents
or packed rows as numpy arrays, and files written under a temporary name and hashed on the way.

An export unit is either a batch of **documents** (``Docs``: tokens concatenated, one length per
document) or a batch of **packed rows** (``Rows``: fixed-width rows with padding at the end and the
lengths of the document pieces each row holds). Token-stream formats (Megatron, nanotron, OLMo)
store the non-padding tokens of rows piece by piece (``Rows.docs``); MDS stores rows as they are.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from curation.io.files import StagedFile


class ExportError(ValueError):
    """A stage or option that cannot be exported; the message (one line) says what to do."""


@dataclass(frozen=True)
class TokenInfo:
    """The tokenizer the tokens were made with (``Tokenizer.describe()``), and its directory when
    it is known (to detokenize, and to name it for trainers that load it)."""

    kind: str | None
    fingerprint: str
    vocab_size: int
    eos_id: int
    pad_id: int
    dir: str | None = None

    @classmethod
    def of(cls, desc: dict, directory: str | None = None) -> TokenInfo:
        return cls(desc.get("kind"), desc["fingerprint"], int(desc["vocab_size"]), int(desc["eos_id"]),
                   int(desc["pad_id"]), directory)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def name(self) -> str:
        """How a trainer's metadata names the tokenizer: its directory, else kind and fingerprint."""
        return self.dir or f"refinery-{self.kind or 'tokenizer'}-{self.fingerprint[:16]}"


def smallest_uint(vocab_size: int) -> np.dtype:
    """The smallest unsigned little-endian dtype holding ids ``0 .. vocab_size - 1``."""
    for dt in ("<u1", "<u2", "<u4", "<u8"):
        if vocab_size - 1 <= np.iinfo(np.dtype(dt)).max:
            return np.dtype(dt)
    raise ExportError(f"vocab size {vocab_size} does not fit 64 bits")


def cast_tokens(tokens: np.ndarray, dtype: np.dtype, where: str) -> np.ndarray:
    """``tokens`` as ``dtype``, refusing ids that do not fit (a tokenizer/vocab mismatch)."""
    dtype = np.dtype(dtype)
    if tokens.size:
        lo, hi = int(tokens.min()), int(tokens.max())
        info = np.iinfo(dtype)
        if lo < info.min or hi > info.max:
            raise ExportError(f"{where}: token id {hi if hi > info.max else lo} does not fit {dtype.name}; "
                              "the tokens were not made with this tokenizer")
    return np.ascontiguousarray(tokens.astype(dtype, copy=False))


# ---------------------------------------------------------------------------------------------
# units


@dataclass
class Docs:
    """A batch of documents: ``tokens`` concatenated (int32), ``lengths[i]`` tokens each.

    ``group_sizes``: for pieces of packed rows, how many consecutive pieces each row holds
    (Megatron keeps a row as one document of several sequences); None for documents."""

    tokens: np.ndarray
    lengths: np.ndarray
    ids: list[str]
    sources: list[str | None]
    texts: list[str | None] | None = None
    group_sizes: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def offsets(self) -> np.ndarray:
        out = np.zeros(len(self.lengths) + 1, np.int64)
        np.cumsum(self.lengths, out=out[1:])
        return out

    def doc(self, i: int) -> np.ndarray:
        o = self.offsets
        return self.tokens[o[i]:o[i + 1]]


@dataclass
class Rows:
    """A batch of packed rows: ``tokens`` (rows x width, int32) with padding at the end of each
    row, ``doc_lens`` the pieces' lengths (all rows' pieces in order), ``pieces`` pieces per row,
    ``doc_ids`` the pieces' names (``<document id>@<piece>/<pieces>``), ``sources`` one per row
    (its majority source), ``piece_sources`` one per piece where known."""

    tokens: np.ndarray
    doc_lens: np.ndarray
    pieces: np.ndarray
    doc_ids: list[str]
    sources: list[str | None]
    piece_sources: list[str | None] | None = None  # known when a row holds one source

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def used(self) -> np.ndarray:
        """Non-padding tokens per row."""
        starts = np.zeros(len(self.pieces) + 1, np.int64)
        np.cumsum(self.pieces, out=starts[1:])
        csum = np.concatenate([[0], np.cumsum(self.doc_lens, dtype=np.int64)])
        return csum[starts[1:]] - csum[starts[:-1]]

    def docs(self) -> Docs:
        """The rows' non-padding tokens as pieces (documents), grouped by row."""
        width = self.tokens.shape[1] if self.tokens.ndim == 2 else 0
        mask = np.arange(width)[None, :] < self.used[:, None]
        sources = list(self.piece_sources) if self.piece_sources is not None else [None] * len(self.doc_ids)
        return Docs(self.tokens[mask], np.asarray(self.doc_lens, np.int64), list(self.doc_ids), sources, None,
                    np.asarray(self.pieces, np.int64))


# ---------------------------------------------------------------------------------------------
# files


class HashedFile:
    """A file written under a temporary dot-name beside ``path`` (``files.StagedFile``), sha256
    computed as it is written, put in place by ``close`` (a kill mid-write leaves only the
    dot-file)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._staged = StagedFile(self.path)
        self._f = open(self._staged.tmp, "wb")
        self._h = hashlib.sha256()
        self.bytes = 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B") if not isinstance(data, (bytes, bytearray)) else data
        self._f.write(view)
        self._h.update(view)
        self.bytes += len(view)
        return len(view)

    def flush(self) -> None:
        self._f.flush()

    def tell(self) -> int:
        return self.bytes

    @property
    def closed(self) -> bool:
        return self._f.closed

    def close(self) -> dict[str, Any]:
        """Put in place; ``{"path": name, "bytes", "sha256"}``."""
        self._f.close()
        self._staged.commit()
        return {"path": self.path.name, "bytes": self.bytes, "sha256": self._h.hexdigest()}

    def abort(self) -> None:
        if not self._f.closed:
            self._f.close()
        self._staged.abort()


def write_array(f: HashedFile, arr: np.ndarray) -> None:
    arr = np.ascontiguousarray(arr)
    if arr.size:
        f.write(arr.reshape(-1).view(np.uint8))


class Writer(ABC):
    """One output shard of a format (one upstream shard in, its files out).

    ``write_docs`` / ``write_rows`` take batches in order; ``close`` returns the files written,
    in order, each ``{"path", "bytes", "sha256"}`` (path relative to the output folder);
    ``extra`` what the format's ``finish`` needs from this shard (MDS: its shards' index entries).
    """

    def __init__(self, out_dir: Path, name: str, info: TokenInfo, index: int, options: dict[str, Any]):
        self.out_dir = Path(out_dir)
        self.name = name
        self.info = info
        self.index = index
        self.options = options
        self._open: list[HashedFile] = []

    def _file(self, filename: str) -> HashedFile:
        f = HashedFile(self.out_dir / filename)
        self._open.append(f)
        return f

    @abstractmethod
    def write_docs(self, docs: Docs) -> None:
        """Append documents (token arrays with their boundaries) to the open files."""

    def write_rows(self, rows: Rows) -> None:
        self.write_docs(rows.docs())

    @abstractmethod
    def close(self) -> list[dict[str, Any]]:
        """Finish the files (indexes, headers); return their records (name, bytes, sha256)."""

    def extra(self) -> dict[str, Any]:
        return {}

    def abort(self) -> None:
        for f in self._open:
            f.abort()

    def close_empty(self) -> list[dict[str, Any]]:
        """What ``close`` returns for a shard that received no tokens: no file at all (trainers'
        readers fail on an empty ``.bin``, ``.npy`` or ``.ds``: "cannot mmap an empty file"), its
        temporary files removed. The manifest keeps the shard with ``files: []`` and 0 documents."""
        self.abort()
        return []


def finish_nothing(out_dir: Path, results: list[dict[str, Any]], info: TokenInfo) -> list[dict[str, Any]]:
    """A format whose shards need no folder-level file."""
    return []
