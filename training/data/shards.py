"""A pack directory as blocks of rows, on a local disk or object storage.

``PackedDataset`` indexes a pack directory once: the committed shards sorted by file name
(rows per shard from the stage manifest, or Parquet footers without one), global row ids
``offset[shard] + row``, each row's ``source`` (and ``quality`` for a curriculum), the
*blocks* (a shard's Parquet row groups: the unit a reader decodes; block ``b`` holds the
global rows ``block_starts[b]:block_starts[b + 1]``), and a fingerprint of the shard set and
tokenizer.

The path is a local directory or any fsspec URL (``s3://bucket/run/pack``, ``file://``,
``memory://``): files are opened through fsspec, so only the row groups asked for are
fetched. Decoded blocks stay in a small LRU (``row_group_cache``); ``read_stats`` counts
bytes decoded against bytes handed out, so a data order's read amplification is measured,
not guessed.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from curation.formats import manifest as manifest_format
from curation.formats.packed import PACK_REPORT, SOURCE_TOKENS_METADATA, source_token_counts

#: Columns a training read decodes.
READ_COLUMNS = ("input_ids", "doc_lens", "source_tokens")


class DataError(ValueError):
    """Packed data the trainer cannot use as configured (row length, token ids, manifest)."""


@dataclass(frozen=True)
class Shard:
    """One committed Parquet shard of a pack directory."""

    file: str  # as the manifest names it (or the file name, without a manifest)
    path: str  # the path inside the dataset's filesystem
    rows: int
    size: int


def _tokenizer_id(path: str | None) -> str | None:
    """sha256 of a tokenizer card file, or of every file of a tokenizer dir (names + bytes)."""
    if not path:
        return None
    p = Path(path)
    files = sorted(f for f in p.rglob("*") if f.is_file()) if p.is_dir() else [p]
    if not files:
        raise FileNotFoundError(f"tokenizer {path}: no such file or directory")
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(p) if p.is_dir() else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def _join(a: str, b: str) -> str:
    return a.rstrip("/") + "/" + b


def _parent(p: str) -> str:
    return p.rstrip("/").rsplit("/", 1)[0] if "/" in p.rstrip("/") else p


def list_shards(fs: fsspec.AbstractFileSystem, root: str) -> list[Shard]:
    """The committed shards of the pack directory ``root`` in ``fs``, sorted by file name."""
    manifest = _join(root, manifest_format.MANIFEST)
    lines = manifest_format.log_lines(fs, manifest)  # with a remote run's uncompacted segments
    if lines:
        try:
            entries = manifest_format.parse_lines(lines, manifest, strict=True)
        except manifest_format.ManifestError as err:
            raise DataError(str(err)) from None
        # A pack that was re-run with other parameters can leave stale lines behind; its report
        # names the parameters hash of the shards that make up the current output.
        report = _join(root, PACK_REPORT)
        if fs.exists(report):
            current = json.loads(fs.cat_file(report)).get("params_hash")
            if current:
                entries = {k: e for k, e in entries.items() if e.get("params_hash", current) == current}
        shards = []
        for rec in entries.values():
            if not rec.get("file"):
                continue  # a shard that committed no rows
            # refinery's stage manifests give paths relative to the run dir (the pack dir's
            # parent: "pack/xxx.parquet"); other writers relative to the pack dir itself.
            path = next((p for p in (_join(root, rec["file"]), _join(_parent(root), rec["file"])) if fs.isfile(p)), None)
            if path is None:
                raise FileNotFoundError(f"{manifest}: shard {rec['shard']!r} lists {rec['file']}, which is missing")
            shards.append(Shard(rec["file"], path, int(rec["rows"]), int(fs.size(path))))
    else:
        # No manifest: every Parquet file is taken as committed; row counts from the footers.
        shards = []
        for p in fs.glob(_join(root, "*.parquet")):
            with fs.open(p, "rb") as f:
                rows = pq.ParquetFile(f).metadata.num_rows
            shards.append(Shard(p.rstrip("/").rsplit("/", 1)[-1], p, rows, int(fs.size(p))))
    shards = [s for s in shards if s.rows > 0]
    if not shards:
        raise FileNotFoundError(f"{root}: no packed Parquet shards found")
    return sorted(shards, key=lambda s: s.file)


@dataclass
class RowBatch:
    """Rows read from shards, in the order they were asked for."""

    ids: np.ndarray  # (n, seq_len + 1) int64
    doc_lens: list[np.ndarray]
    source_tokens: list[str | None]


@dataclass
class _Block:
    """One decoded row group."""

    ids: np.ndarray  # (rows, width) in the file's integer type
    dl_offsets: np.ndarray | None
    dl_values: np.ndarray | None
    source_tokens: list | None
    row_bytes: float  # decoded bytes per row (Arrow buffers of the read columns)


class PackedDataset:
    """A pack directory: shard and block index, fingerprint, per-row source/quality, block reads."""

    def __init__(self, path: str | Path, tokenizer: str | None = None, row_group_cache: int = 32, need_quality: bool = False):
        self.path = str(path)
        self.fs, self.root = fsspec.core.url_to_fs(self.path)
        if not self.fs.isdir(self.root):
            raise FileNotFoundError(f"data path {self.path} is not a directory (expected a pack output dir)")
        self.shards = list_shards(self.fs, self.root)
        counts = np.array([s.rows for s in self.shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(counts)])
        self.num_rows = int(self.offsets[-1])
        payload = {
            "shards": [[s.file, s.rows, s.size] for s in self.shards],
            "tokenizer": _tokenizer_id(tokenizer),
        }
        self.fingerprint = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        self.cache_size = row_group_cache
        self._cache: OrderedDict[int, _Block] = OrderedDict()
        self._files: OrderedDict[int, tuple] = OrderedDict()
        self._lock = threading.Lock()
        self.reset_read_stats()
        self._index(need_quality)

    def url(self, shard: Shard) -> str:
        """A shard's full URL (``file:///...``, ``s3://...``): what a reader elsewhere opens."""
        return self.fs.unstrip_protocol(shard.path)

    # -- the index ------------------------------------------------------------------------

    def _index(self, need_quality: bool) -> None:
        """Blocks, per-row source index (and quality): footers plus one narrow column read per shard."""
        codes, quality, names, block_rows, block_ref = [], [], {}, [], []
        missing_quality = 0
        tokens: dict[str, int] = {}  # content tokens per source (footers; else counted)
        for i, shard in enumerate(self.shards):
            pf = self._file(i)
            md = pf.metadata
            if md.num_rows != shard.rows:
                raise DataError(f"{shard.file}: the manifest says {shard.rows} rows, the file has {md.num_rows}")
            for g in range(md.num_row_groups):
                if md.row_group(g).num_rows:
                    block_rows.append(md.row_group(g).num_rows)
                    block_ref.append((i, g))
            schema_names = pf.schema_arrow.names
            if "source" in schema_names:
                col = pf.read(columns=["source"]).column("source").combine_chunks()
                col = pc.fill_null(col.cast(pa.string()), "unknown")
            else:
                col = pa.array(["unknown"] * shard.rows)
            enc = col.dictionary_encode()
            local = [names.setdefault(v, len(names)) for v in enc.dictionary.to_pylist()]
            for s, (_, n) in self._shard_source_tokens(pf, col).items():
                tokens[s] = tokens.get(s, 0) + n
            codes.append(np.asarray(local, dtype=np.int32)[enc.indices.to_numpy(zero_copy_only=False)])
            if need_quality and "quality" in schema_names:
                q = pf.read(columns=["quality"]).column("quality").combine_chunks().cast(pa.float64())
                quality.append(q.to_numpy(zero_copy_only=False))
            else:
                missing_quality += need_quality
                quality.append(np.full(shard.rows, np.nan))
        #: False when a curriculum was asked for but some shards have no quality column.
        self.has_quality = not missing_quality
        # Source indices follow sorted names, so they do not depend on shard order.
        self.sources = sorted(names)
        remap = np.array([self.sources.index(n) for n in sorted(names, key=names.get)], dtype=np.int32)
        self.row_source = remap[np.concatenate(codes)]
        self.row_quality = np.concatenate(quality)
        #: content (non-padding) tokens of each source's rows, by source index
        self.content_tokens = np.array([tokens.get(s, 0) for s in self.sources], dtype=np.int64)
        #: global row id of each block's first row, then num_rows
        self.block_starts = np.concatenate([[0], np.cumsum(block_rows)]).astype(np.int64)
        self._block_ref = block_ref  # block -> (shard index, row group)

    @staticmethod
    def _shard_source_tokens(pf: pq.ParquetFile, source: pa.Array) -> dict[str, list[int]]:
        """``{source: [rows, content tokens]}`` of one shard: the footer ``pack`` writes, else
        counted from ``doc_lens`` (one more narrow column read), else one token per row."""
        meta = pf.schema_arrow.metadata or {}
        if SOURCE_TOKENS_METADATA in meta:
            return json.loads(meta[SOURCE_TOKENS_METADATA])
        if "doc_lens" in pf.schema_arrow.names:
            return source_token_counts(pa.table({"doc_lens": pf.read(columns=["doc_lens"]).column("doc_lens"), "source": source}))
        counts = pc.value_counts(source).to_pylist()
        return {c["values"]: [c["counts"], c["counts"]] for c in counts}

    @property
    def num_blocks(self) -> int:
        return len(self._block_ref)

    def block_of(self, rows: np.ndarray) -> np.ndarray:
        """The block holding each global row."""
        return np.searchsorted(self.block_starts, rows, side="right") - 1

    def source_tokens(self) -> dict[str, int]:
        """Content (non-padding) tokens per source: what a phase's mixture weights divide."""
        return {s: int(n) for s, n in zip(self.sources, self.content_tokens)}

    def source_rows(self) -> dict[str, int]:
        """Rows per source."""
        counts = np.bincount(self.row_source, minlength=len(self.sources))
        return {s: int(n) for s, n in zip(self.sources, counts)}

    def max_docs_per_row(self) -> int:
        """The most ``doc_lens`` entries (documents) one row holds: one narrow column read per
        shard. What ``data.max_docs_per_row`` must cover under CUDA graphs (training/static_shapes.py)."""
        most = 0
        for i in range(len(self.shards)):
            pf = self._file(i)
            if "doc_lens" not in pf.schema_arrow.names:  # read as one document a row
                most = max(most, 1)
                continue
            most = max(most, pc.max(pc.list_value_length(pf.read(columns=["doc_lens"]).column("doc_lens"))).as_py() or 0)
        return most

    # -- reads ----------------------------------------------------------------------------

    def _file(self, shard: int) -> pq.ParquetFile:
        """An open ParquetFile (small LRU of handles: on object storage opening costs a request)."""
        if shard in self._files:
            self._files.move_to_end(shard)
            return self._files[shard][0]
        handle = self.fs.open(self.shards[shard].path, "rb")
        pf = pq.ParquetFile(handle)
        self._files[shard] = (pf, handle)
        if len(self._files) > 64:
            _, (_, old) = self._files.popitem(last=False)
            old.close()
        return pf

    def _block(self, b: int) -> _Block:
        if b in self._cache:
            self._cache.move_to_end(b)
            return self._cache[b]
        shard, rg = self._block_ref[b]
        pf = self._file(shard)
        names = pf.schema_arrow.names
        cols = [c for c in READ_COLUMNS if c in names]
        table = pf.read_row_group(rg, columns=cols)
        ids = table.column("input_ids").combine_chunks()
        width = np.diff(ids.offsets.to_numpy())
        if len(width) and (width != width[0]).any():
            raise DataError(f"{self.shards[shard].file} row group {rg}: rows have different lengths {sorted(set(width.tolist()))[:5]}")
        dl_off = dl_val = st = None
        if "doc_lens" in names:
            dl = table.column("doc_lens").combine_chunks()
            dl_off, dl_val = dl.offsets.to_numpy(), dl.flatten().to_numpy(zero_copy_only=False)
        if "source_tokens" in names:
            st = table.column("source_tokens").to_pylist()
        md = pf.metadata.row_group(rg)
        read_idx = [i for i in range(md.num_columns) if md.column(i).path_in_schema.split(".")[0] in cols]
        self.stats["blocks_decoded"] += 1
        self.stats["bytes_decoded"] += table.nbytes
        self.stats["bytes_read"] += sum(md.column(i).total_compressed_size for i in read_idx)
        block = _Block(
            ids.flatten().to_numpy(zero_copy_only=False).reshape(len(width), -1),
            dl_off, dl_val, st, table.nbytes / max(table.num_rows, 1),
        )
        self._cache[b] = block
        if len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)
        return block

    def read_rows(self, rows: np.ndarray, pad_id: int) -> RowBatch:
        """Read global rows (any order), block by block. Thread-safe."""
        rows = np.asarray(rows, dtype=np.int64)
        n = len(rows)
        if n and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise IndexError(f"row id out of range 0..{self.num_rows - 1}")
        blocks = self.block_of(rows)
        ids = None
        out_dl: list = [None] * n
        out_st: list = [None] * n
        with self._lock:
            for b in np.unique(blocks).tolist():
                sel = np.flatnonzero(blocks == b)
                dec = self._block(b)
                local = rows[sel] - self.block_starts[b]
                if ids is None:
                    ids = np.empty((n, dec.ids.shape[1]), dtype=np.int64)
                elif dec.ids.shape[1] != ids.shape[1]:
                    raise DataError(f"packed rows have different lengths ({dec.ids.shape[1]} and {ids.shape[1]} tokens)")
                ids[sel] = dec.ids[local]
                for i, j in zip(sel.tolist(), local.tolist()):
                    if dec.dl_offsets is not None:
                        out_dl[i] = dec.dl_values[dec.dl_offsets[j] : dec.dl_offsets[j + 1]]
                    else:  # no doc_lens column: one document up to the trailing padding
                        nonpad = np.flatnonzero(dec.ids[j] != pad_id)
                        out_dl[i] = np.array([nonpad[-1] + 1 if len(nonpad) else 0])
                    out_st[i] = dec.source_tokens[j] if dec.source_tokens is not None else None
                self.stats["rows_delivered"] += len(sel)
                self.stats["bytes_delivered"] += dec.row_bytes * len(sel)
        if ids is None:
            ids = np.zeros((0, 0), np.int64)
        return RowBatch(ids, out_dl, out_st)

    # -- read accounting ------------------------------------------------------------------

    def reset_read_stats(self) -> None:
        self.stats = {"blocks_decoded": 0, "bytes_decoded": 0, "bytes_read": 0, "rows_delivered": 0, "bytes_delivered": 0.0}

    def read_stats(self) -> dict:
        """Counters since the last reset, and ``read_amplification``: bytes decoded per byte
        handed out (a row decoded once and trained on once: 1.0)."""
        with self._lock:
            s = dict(self.stats)
        s["read_amplification"] = s["bytes_decoded"] / s["bytes_delivered"] if s["bytes_delivered"] else None
        return s
