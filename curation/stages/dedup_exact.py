"""Exact deduplication of documents or paragraphs, with one Bloom filter per hash partition.

```yaml
exact: {type: exact_dedup, input: c4, level: document, bloom: {expected_items: 100_000_000, false_positive_rate: 1.0e-6}}
```

A key is the 64-bit xxh3 hash of the normalised text (NFKC, casefold, whitespace runs
collapsed to one space): of the whole document (``level: document``) or of each non-blank
line (``level: paragraph``; lines are paragraphs in extracted web text, as in cc_net).

Phases, each a set of Ray tasks whose results do not depend on the worker count:

1. keys (one task per upstream shard): hash every document or paragraph; write the keys
   with their partition ``(hash >> 32) * P >> 32`` (a hash prefix, P fixed by
   ``partitions``) to ``_work/<params>/keys/<shard>.parquet``.
2. partitions (one task per partition): read that partition's keys from every shard, sort
   them by (id, paragraph), so the surviving copy is the one with the lowest ``id``; feed
   them in that order to the partition's own Bloom filter (pre-loaded with the filters of
   earlier dumps named in ``against``). A key the filter already holds is a duplicate.
   The filter is saved to ``_work/<params>/bloom/part-NNNNN.bloom`` (header + bits) for
   incremental dedup of a later dump, and the duplicates to ``dups/part-NNNNN.parquet``.
3. apply (one task per upstream shard): drop duplicate documents (``exact_dedup:duplicate``)
   or remove duplicate paragraphs, dropping documents left without text
   (``exact_dedup:empty_after_paragraph_dedup``). One output shard per upstream shard key.

``RUN/STAGE/_bloom_report.json`` holds each partition's keys, duplicates, fill ratio and
predicted false-positive rate. A killed run resumes: finished key files, partitions and
output shards are not redone.
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import xxhash
from pydantic import BaseModel, ConfigDict, Field

from curation.dedup.bloom import BloomFilter
from curation.pipeline.context import GlobalContext
from curation.io.shards import split_kept_rejected, write_stage_shard
from curation.dedup.minhash import (
    NORMALIZATION,
    check_header,
    collapse_whitespace,
    normalize_text,
    read_artifact,
    write_artifact,
)
from curation.stages.base import GlobalStage, registry

#: Bump when keys or the choice of duplicates change for the same parameters.
EXACT_VERSION = 1
REPORT = "_bloom_report.json"
PARAGRAPH_SEPARATOR = "\n"
REASON_DUPLICATE = "exact_dedup:duplicate"
REASON_EMPTY = "exact_dedup:empty_after_paragraph_dedup"
_HASH_BATCH = 2048  # documents normalised at once: peak memory is ~15 bytes per text byte of a batch
_BLOOM_CHUNK = 1 << 20  # keys queried-then-inserted together (in id order)


class BloomConfig(BaseModel):
    """Bloom filter sizing for the whole corpus (split evenly over the partitions)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    expected_items: int = Field(default=10_000_000, ge=1)
    false_positive_rate: float = Field(default=1e-6, gt=0, lt=1)


def key_partition(hashes: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of each key from its top 32 bits (a hash prefix)."""
    return ((hashes >> np.uint64(32)) * np.uint64(partitions) >> np.uint64(32)).astype(np.int32)


def hash_texts(norm: pa.Array, seed: int) -> np.ndarray:
    """xxh3-64 of each (already normalised) string. One C call per string, no per-character
    Python: the strings are handed over as bytes."""
    raw = norm.cast(pa.binary()).to_pylist()
    return np.fromiter((xxhash.xxh3_64_intdigest(b, seed) for b in raw), dtype=np.uint64, count=len(raw))


def _normalized(texts: pa.Array) -> pa.Array:
    return collapse_whitespace(normalize_text(texts))


def text_keys(texts: pa.Array, level: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(row, paragraph, hash) of every key of a batch of texts. Document level: one key per
    row (paragraph -1). Paragraph level: one per non-blank line, paragraph = line index."""
    n = len(texts)
    if level == "document":
        return np.arange(n, dtype=np.int32), np.full(n, -1, np.int32), hash_texts(_normalized(texts), seed)
    lines = pc.split_pattern(pc.fill_null(texts, ""), PARAGRAPH_SEPARATOR)
    counts = pc.list_value_length(lines).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(lines)
    rows = np.repeat(np.arange(n, dtype=np.int32), counts)
    para = (np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)).astype(np.int32)
    norm = _normalized(flat)
    keep = pc.greater(pc.binary_length(norm), 0).to_numpy(zero_copy_only=False)
    norm = norm.filter(pa.array(keep))
    return rows[keep], para[keep], hash_texts(norm, seed)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


# ---------------------------------------------------------------------------------------------
# Ray tasks


def keys_task(path: str, shard: int, out: str, level: str, partitions: int, seed: int, header: dict) -> dict:
    """Phase 1 for one upstream shard: its keys, sorted by partition, in one file."""
    t0 = time.perf_counter()
    table = pq.read_table(path, columns=["id", "text"])
    parts = []
    for lo in range(0, max(table.num_rows, 1), _HASH_BATCH):
        batch = table.slice(lo, _HASH_BATCH)
        if batch.num_rows == 0:
            break
        rows, para, h = text_keys(batch.column("text").combine_chunks(), level, seed)
        rows = rows + lo
        ids = table.column("id").take(pa.array(rows))
        parts.append(pa.table({
            "part": pa.array(key_partition(h, partitions)), "id": ids, "shard": pa.array(np.full(len(rows), shard, np.int32)),
            "row": pa.array(rows), "para": pa.array(para), "hash": pa.array(h),
        }))
    keys = pa.concat_tables(parts) if parts else pa.table({
        "part": pa.array([], pa.int32()), "id": pa.array([], pa.string()), "shard": pa.array([], pa.int32()),
        "row": pa.array([], pa.int32()), "para": pa.array([], pa.int32()), "hash": pa.array([], pa.uint64())})
    keys = keys.take(pc.sort_indices(keys, [("part", "ascending"), ("row", "ascending"), ("para", "ascending")]))
    write_artifact(keys, out, header, row_group_size=16384)
    return {"shard": shard, "keys": keys.num_rows, "rows": table.num_rows, "seconds": time.perf_counter() - t0,
            "rss_mb": _rss_mb()}


def partition_task(p: int, key_files: list[str], dups_out: str, bloom_out: str, against: list[str],
                   bloom_cfg: dict, seed: int, bloom_params: dict, header: dict) -> dict:
    """Phase 2 for one partition: find its duplicate keys with its own Bloom filter."""
    t0 = time.perf_counter()
    tables = [read_artifact(f, header, columns=["id", "shard", "row", "para", "hash"], filters=[("part", "=", p)])
              for f in key_files]
    keys = pa.concat_tables(tables) if tables else None
    bloom = BloomFilter.for_capacity(bloom_cfg["expected_items"], bloom_cfg["false_positive_rate"], seed, bloom_params)
    for path in against:
        bloom.merge(BloomFilter.load(path, expected=bloom.header))
    n = keys.num_rows if keys is not None else 0
    if n:
        # corpus order: id, then paragraph; shard and row only break ties between equal ids
        keys = keys.take(pc.sort_indices(keys, [("id", "ascending"), ("para", "ascending"),
                                                ("shard", "ascending"), ("row", "ascending")]))
        h = keys.column("hash").to_numpy()
        seen = np.zeros(n, dtype=bool)
        for lo in range(0, n, _BLOOM_CHUNK):
            seen[lo:lo + _BLOOM_CHUNK] = bloom.add_new(h[lo:lo + _BLOOM_CHUNK])
        dups = keys.select(["shard", "row", "para"]).filter(pa.array(seen))
    else:
        dups = pa.table({"shard": pa.array([], pa.int32()), "row": pa.array([], pa.int32()),
                         "para": pa.array([], pa.int32())})
    dups = dups.take(pc.sort_indices(dups, [("shard", "ascending"), ("row", "ascending"), ("para", "ascending")]))
    bloom.save(bloom_out)
    write_artifact(dups, dups_out, header, row_group_size=16384)
    stats = {"partition": p, "keys": n, "duplicates": dups.num_rows, "m": bloom.m, "k": bloom.k,
             "fill_ratio": bloom.fill_ratio(), "predicted_false_positive_rate": bloom.predicted_false_positive_rate(),
             "loaded_filters": len(against), "seconds": time.perf_counter() - t0, "rss_mb": _rss_mb()}
    Path(dups_out).with_suffix(".json").write_text(json.dumps(stats, sort_keys=True))
    return stats


def _drop_paragraphs(text: str, drop: list[int]) -> str:
    lines = text.split(PARAGRAPH_SEPARATOR)
    gone = set(drop)
    return PARAGRAPH_SEPARATOR.join(line for j, line in enumerate(lines) if j not in gone)


def apply_task(run_dir: str, stage: str, params_hash: str, key: str, path: str, shard: int, dup_files: list[str],
               level: str, header: dict) -> dict:
    """Phase 3 for one upstream shard: write its deduplicated shard and rejections."""
    table = pq.read_table(path)
    parts = [read_artifact(f, header, filters=[("shard", "=", shard)]) for f in dup_files]
    dups = pa.concat_tables(parts) if parts else None
    rows = dups.column("row").to_numpy() if dups is not None else np.zeros(0, np.int32)
    reasons = np.full(table.num_rows, None, dtype=object)
    if level == "document":
        reasons[rows] = REASON_DUPLICATE
    else:
        paras = dups.column("para").to_numpy() if dups is not None else np.zeros(0, np.int32)
        removed = np.zeros(table.num_rows, dtype=np.int32)
        if len(rows):
            order = np.lexsort((paras, rows))
            rows, paras = rows[order], paras[order]
            np.add.at(removed, rows, 1)
            texts = table.column("text").to_pylist()
            bounds = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1], True])
            for lo, hi in zip(bounds[:-1], bounds[1:]):
                r = int(rows[lo])
                texts[r] = _drop_paragraphs(texts[r] or "", paras[lo:hi].tolist())
                if not texts[r].strip():
                    reasons[r] = REASON_EMPTY
            idx = table.schema.get_field_index("text")
            table = table.set_column(idx, "text", pa.array(texts, table.schema.field("text").type))
        table = table.append_column("dup_paragraphs", pa.array(removed, pa.int32()))
    kept, rejected = split_kept_rejected(table, pa.array(reasons.tolist(), pa.string()), stage)
    return write_stage_shard(run_dir, stage, key, kept, rejected, table.num_rows, params_hash)


# ---------------------------------------------------------------------------------------------
# driver helpers shared with MinHash dedup


def write_json(path: Path, obj: Any) -> None:
    """Write a JSON report atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def check_work_header(work: Path, header: dict) -> None:
    """``work/header.json`` records what the stage's intermediate files were made with; a
    run with another header (e.g. a newer algorithm version) refuses them."""
    f = work / "header.json"
    if f.exists():
        check_header(json.loads(f.read_text()), header, f)
    else:
        write_json(f, header)


def shard_names(keys: list[str]) -> list[str]:
    """File-safe names for upstream shard keys (keys may contain '/')."""
    return [k.replace("/", "__") for k in keys]


# ---------------------------------------------------------------------------------------------
# the stage


@registry.register("exact_dedup")
class ExactDedup(GlobalStage):
    """Remove exact duplicate documents (``level: document``) or paragraphs (``level:
    paragraph``) across the whole upstream, keeping the copy with the lowest ``id``.

    ``bloom`` sizes the filters for the corpus (``expected_items`` keys at
    ``false_positive_rate``, split over ``partitions``); ``against`` lists earlier runs'
    filters (a stage directory holding ``_bloom_report.json``, or its ``bloom`` folder) to
    drop what an earlier dump already had. Their parameters must be identical.
    """

    type: Literal["exact_dedup"] = "exact_dedup"
    level: Literal["document", "paragraph"] = "document"
    bloom: BloomConfig = BloomConfig()
    partitions: int = Field(default=16, ge=1, le=4096)
    seed: int = Field(default=0, ge=0)
    against: list[str] = Field(default_factory=list)

    def header(self) -> dict[str, Any]:
        """What every artifact of this stage depends on."""
        return {"algorithm": "exact-dedup-xxh3-bloom", "version": EXACT_VERSION, "seed": self.seed,
                "params": {"level": self.level, "partitions": self.partitions, "normalization": NORMALIZATION,
                           "paragraph_separator": PARAGRAPH_SEPARATOR, "bloom": self.bloom.model_dump()}}

    def bloom_params(self) -> dict[str, Any]:
        """The Bloom header params: filters merge only when what their keys mean is the same."""
        return {"level": self.level, "partitions": self.partitions, "normalization": NORMALIZATION,
                "hash": "xxh3_64", "key_seed": self.seed}

    def partition_capacity(self) -> int:
        return max(1, -(-self.bloom.expected_items // self.partitions))

    def against_files(self, p: int) -> list[str]:
        """Persisted filters of partition ``p`` from the runs listed in ``against``."""
        out = []
        for entry in self.against:
            d = Path(entry)
            if (d / REPORT).exists():
                d = Path(json.loads((d / REPORT).read_text())["bloom_dir"])
            f = d / f"part-{p:05d}.bloom"
            if not f.exists():
                raise FileNotFoundError(f"exact_dedup.against: {f} does not exist (is {entry} an exact_dedup "
                                        f"stage directory, or its bloom folder, with {self.partitions} partitions?)")
            # checked here, on the driver: one clear error before any task starts
            expected = BloomFilter.capacity_header(self.partition_capacity(), self.bloom.false_positive_rate,
                                                   self.seed, self.bloom_params())
            BloomFilter.check_header(BloomFilter.read_header(f), expected, f"exact_dedup.against: {f}")
            out.append(str(f))
        return out

    def run(self, ctx: GlobalContext) -> None:
        keys = [k for k, _ in ctx.upstream]
        paths = [p for _, p in ctx.upstream]
        names = shard_names(keys)
        header = self.header()
        work = ctx.work_dir
        check_work_header(work, header)
        key_dir, dup_dir, bloom_dir = work / "keys", work / "dups", work / "bloom"
        done = ctx.done_keys()
        todo_out = [i for i, k in enumerate(keys) if k not in done]
        P = self.partitions
        dup_files = [str(dup_dir / f"part-{p:05d}.parquet") for p in range(P)]
        t_phase: dict[str, float] = {}
        if todo_out:
            against = [self.against_files(p) for p in range(P)]  # fail before any work
            todo_p = [p for p in range(P) if not (Path(dup_files[p]).exists() and (bloom_dir / f"part-{p:05d}.bloom").exists())]
            key_files = [str(key_dir / f"{n}.parquet") for n in names]
            if todo_p:
                t0 = time.perf_counter()
                items = [(paths[i], i, key_files[i], self.level, P, self.seed, header)
                         for i in range(len(keys)) if not Path(key_files[i]).exists()]
                ctx.map(keys_task, items, phase=f"{ctx.name}:keys")
                t_phase["keys"] = time.perf_counter() - t0
                t0 = time.perf_counter()
                cfg = {"expected_items": self.partition_capacity(), "false_positive_rate": self.bloom.false_positive_rate}
                items = [(p, key_files, dup_files[p], str(bloom_dir / f"part-{p:05d}.bloom"), against[p], cfg,
                          self.seed, self.bloom_params(), header) for p in todo_p]
                ctx.map(partition_task, items, phase=f"{ctx.name}:partitions")
                t_phase["partitions"] = time.perf_counter() - t0
            t0 = time.perf_counter()
            items = [(str(ctx.run_dir), ctx.name, ctx.params_hash, keys[i], paths[i], i, dup_files, self.level, header)
                     for i in todo_out]
            ctx.map_and_commit(apply_task, items, f"{ctx.name}:apply")
            t_phase["apply"] = time.perf_counter() - t0
        self._write_report(ctx, dup_files, bloom_dir, t_phase)

    def _write_report(self, ctx: GlobalContext, dup_files: list[str], bloom_dir: Path, t_phase: dict) -> None:
        parts = []
        for f in dup_files:
            s = Path(f).with_suffix(".json")
            if s.exists():
                parts.append(json.loads(s.read_text()))
        keys = sum(p["keys"] for p in parts)
        report = {
            "stage": ctx.name, "params_hash": ctx.params_hash, "level": self.level, "partitions": self.partitions,
            "bloom_dir": str(bloom_dir), "configured_false_positive_rate": self.bloom.false_positive_rate,
            "expected_items": self.bloom.expected_items, "keys": keys,
            "duplicates": sum(p["duplicates"] for p in parts),
            "fill_ratio": (sum(p["fill_ratio"] * p["m"] for p in parts) / sum(p["m"] for p in parts)) if parts else 0.0,
            "predicted_false_positive_rate": max((p["predicted_false_positive_rate"] for p in parts), default=0.0),
            "max_rss_mb": max((p["rss_mb"] for p in parts), default=0.0),
            "phase_seconds": t_phase, "per_partition": parts,
        }
        write_json(ctx.run_dir / ctx.name / REPORT, report)
