"""A pack directory as random-access rows.

``PackedDataset`` indexes a pack directory once: the committed shards sorted by file name
(rows per shard from the stage manifest, or Parquet footers without one), global row ids
``offset[shard] + row``, each row's ``source`` (and ``quality`` for a curriculum), and a
fingerprint of the shard set and tokenizer. Rows are read lazily by row group with a small
LRU.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from curation.formats import manifest as manifest_format
from curation.formats.packed import PACK_REPORT


class DataError(ValueError):
    """Packed data the trainer cannot use as configured (row length, token ids, manifest)."""


@dataclass(frozen=True)
class Shard:
    """One committed Parquet shard of a pack directory."""

    file: str  # as the manifest names it (or the file name, without a manifest)
    path: Path
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


def _list_shards(root: Path) -> list[Shard]:
    manifest = root / manifest_format.MANIFEST
    if manifest.exists():
        try:
            entries = manifest_format.parse_lines(manifest.read_text().splitlines(), str(manifest), strict=True)
        except manifest_format.ManifestError as err:
            raise DataError(str(err)) from None
        # A pack that was re-run with other parameters can leave stale lines behind; its report
        # names the parameters hash of the shards that make up the current output.
        report = root / PACK_REPORT
        if report.exists():
            current = json.loads(report.read_text()).get("params_hash")
            if current:
                entries = {k: e for k, e in entries.items() if e.get("params_hash", current) == current}
        shards = []
        for rec in entries.values():
            if not rec.get("file"):
                continue  # a shard that committed no rows
            # refinery's stage manifests give paths relative to the run dir (the pack dir's
            # parent: "pack/xxx.parquet"); other writers relative to the pack dir itself.
            path = next((b / rec["file"] for b in (root, root.parent) if (b / rec["file"]).is_file()), None)
            if path is None:
                raise FileNotFoundError(f"{manifest}: shard {rec['shard']!r} lists {rec['file']}, which is missing")
            shards.append(Shard(rec["file"], path, int(rec["rows"]), path.stat().st_size))
    else:
        # No manifest: every Parquet file is taken as committed; row counts from the footers.
        shards = [
            Shard(p.name, p, pq.ParquetFile(p).metadata.num_rows, p.stat().st_size)
            for p in root.glob("*.parquet")
        ]
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


class PackedDataset:
    """A pack directory: shard index, fingerprint, per-row source/quality, lazy row reads."""

    def __init__(self, path: str | Path, tokenizer: str | None = None, row_group_cache: int = 32, need_quality: bool = False):
        self.root = Path(path)
        if not self.root.is_dir():
            raise FileNotFoundError(f"data path {self.root} is not a directory (expected a pack output dir)")
        self.shards = _list_shards(self.root)
        counts = np.array([s.rows for s in self.shards], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(counts)])
        self.num_rows = int(self.offsets[-1])
        payload = {
            "shards": [[s.file, s.rows, s.size] for s in self.shards],
            "tokenizer": _tokenizer_id(tokenizer),
        }
        self.fingerprint = hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()
        self._cache_size = row_group_cache
        self._cache: OrderedDict[tuple[int, int], dict] = OrderedDict()
        self._files: OrderedDict[int, tuple[pq.ParquetFile, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self._index_columns(need_quality)

    def _index_columns(self, need_quality: bool) -> None:
        """Per-row source index (and quality): one narrow column read per shard, once."""
        codes, quality, names = [], [], {}
        missing_quality = 0
        for shard in self.shards:
            pf = pq.ParquetFile(shard.path)
            schema_names = pf.schema_arrow.names
            if "source" in schema_names:
                col = pf.read(columns=["source"]).column("source").combine_chunks()
                col = pc.fill_null(col.cast(pa.string()), "unknown")
            else:
                col = pa.array(["unknown"] * shard.rows)
            enc = col.dictionary_encode()
            local = [names.setdefault(v, len(names)) for v in enc.dictionary.to_pylist()]
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

    def source_rows(self) -> dict[str, int]:
        """Rows per source."""
        counts = np.bincount(self.row_source, minlength=len(self.sources))
        return {s: int(n) for s, n in zip(self.sources, counts)}

    def _file(self, shard: int) -> tuple[pq.ParquetFile, np.ndarray]:
        """Open ParquetFile and the first row of each of its row groups (small LRU of handles)."""
        if shard in self._files:
            self._files.move_to_end(shard)
            return self._files[shard]
        pf = pq.ParquetFile(self.shards[shard].path)
        md = pf.metadata
        starts = np.cumsum([0] + [md.row_group(i).num_rows for i in range(md.num_row_groups)])
        self._files[shard] = (pf, starts)
        if len(self._files) > 64:
            self._files.popitem(last=False)
        return pf, starts

    def _row_group(self, shard: int, rg: int) -> dict:
        key = (shard, rg)
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        pf, _ = self._file(shard)
        names = pf.schema_arrow.names
        cols = [c for c in ("input_ids", "doc_lens", "source_tokens") if c in names]
        table = pf.read_row_group(rg, columns=cols)
        ids = table.column("input_ids").combine_chunks()
        width = np.diff(ids.offsets.to_numpy())
        if len(width) and (width != width[0]).any():
            raise DataError(f"{self.shards[shard].file} row group {rg}: rows have different lengths {sorted(set(width.tolist()))[:5]}")
        decoded = {
            "ids": ids.flatten().to_numpy(zero_copy_only=False).astype(np.int64).reshape(len(width), -1),
        }
        if "doc_lens" in names:
            dl = table.column("doc_lens").combine_chunks()
            decoded["dl_offsets"] = dl.offsets.to_numpy()
            decoded["dl_values"] = dl.flatten().to_numpy(zero_copy_only=False)
        if "source_tokens" in names:
            decoded["source_tokens"] = table.column("source_tokens").to_pylist()
        self._cache[key] = decoded
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return decoded

    def read_rows(self, rows: np.ndarray, pad_id: int) -> RowBatch:
        """Read global rows (any order). Thread-safe; row groups are cached."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= self.num_rows):
            raise IndexError(f"row id out of range 0..{self.num_rows - 1}")
        shard_of = np.searchsorted(self.offsets, rows, side="right") - 1
        local = rows - self.offsets[shard_of]
        out_ids, out_dl, out_st = [None] * len(rows), [None] * len(rows), [None] * len(rows)
        with self._lock:
            for i, (sh, lr) in enumerate(zip(shard_of.tolist(), local.tolist())):
                _, starts = self._file(sh)
                rg = int(np.searchsorted(starts, lr, side="right") - 1)
                dec = self._row_group(sh, rg)
                j = lr - int(starts[rg])
                out_ids[i] = dec["ids"][j]
                if "dl_offsets" in dec:
                    o = dec["dl_offsets"]
                    out_dl[i] = dec["dl_values"][o[j] : o[j + 1]]
                else:  # no doc_lens column: one document up to the trailing padding
                    nonpad = np.flatnonzero(dec["ids"][j] != pad_id)
                    out_dl[i] = np.array([nonpad[-1] + 1 if len(nonpad) else 0])
                out_st[i] = dec["source_tokens"][j] if "source_tokens" in dec else None
        ids = np.stack(out_ids) if out_ids else np.zeros((0, 0), np.int64)
        return RowBatch(ids, out_dl, out_st)
