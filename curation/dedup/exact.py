"""Exact duplicates by key: hashing normalised documents or paragraphs, and deciding which
copies are duplicates. No Ray, no run directory (``curation.stages.exact_dedup`` runs it).

A key is two independent 64-bit hashes of the normalised text (NFKC, casefold, whitespace runs
collapsed): xxh3-64 with the stage's seed and with a second seed. Within a run, duplicates are
decided exactly: the keys of a partition are sorted, and a key equal to the one before it in
both hashes is a duplicate (a false drop needs a 128-bit collision, ~n²/2^129). Bloom filters
are only the compact record of what a run saw, queried by a later run (``against``).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash

from curation.dedup.bloom import BloomFilter
from curation.hashing import GOLDEN
from curation.dedup.minhash import normalize_collapsed

PARAGRAPH_SEPARATOR = "\n"
#: xor-ed into the seed of the confirming hash (any constant that makes it another function)
_SECOND_SEED = GOLDEN
_MASK64 = (1 << 64) - 1


def key_partition(hashes: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of each key from its top 32 bits (a hash prefix)."""
    return ((hashes >> np.uint64(32)) * np.uint64(partitions) >> np.uint64(32)).astype(np.int32)


def hash_texts(norm: pa.Array, seed: int) -> np.ndarray:
    """xxh3-64 of each (already normalised) string. One C call per string, no per-character
    Python: the strings are handed over as bytes."""
    raw = norm.cast(pa.binary()).to_pylist()
    return np.fromiter((xxhash.xxh3_64_intdigest(b, seed) for b in raw), dtype=np.uint64, count=len(raw))


def _normalized(texts: pa.Array) -> pa.Array:
    return normalize_collapsed(texts)


def text_keys(texts: pa.Array, level: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(row, paragraph, hash, confirming hash) of every key of a batch of texts. Document
    level: one key per row (paragraph -1). Paragraph level: one per non-blank line."""
    n = len(texts)
    seed2 = (seed ^ _SECOND_SEED) & _MASK64
    if level == "document":
        norm = _normalized(texts)
        return np.arange(n, dtype=np.int32), np.full(n, -1, np.int32), hash_texts(norm, seed), hash_texts(norm, seed2)
    lines = pc.split_pattern(pc.fill_null(texts, ""), PARAGRAPH_SEPARATOR)
    counts = pc.list_value_length(lines).to_numpy(zero_copy_only=False).astype(np.int64)
    flat = pc.list_flatten(lines)
    rows = np.repeat(np.arange(n, dtype=np.int32), counts)
    para = (np.arange(len(flat)) - np.repeat(np.cumsum(counts) - counts, counts)).astype(np.int32)
    norm = _normalized(flat)
    keep = pc.greater(pc.binary_length(norm), 0).to_numpy(zero_copy_only=False)
    norm = norm.filter(pa.array(keep))
    return rows[keep], para[keep], hash_texts(norm, seed), hash_texts(norm, seed2)


def duplicate_keys(keys: pa.Table, rank: np.ndarray | None = None) -> np.ndarray:
    """bool per row of ``keys`` (columns hash, hash2, id, para, shard, row): True for every copy
    of a key but the first in corpus order (lowest id, then paragraph; shard and row only
    break ties between equal ids), or with ``rank`` (a keeper policy's, lower wins) the best
    ranked copy, ties as before. Exact: equal means equal in both 64-bit hashes."""
    n = keys.num_rows
    dup = np.zeros(n, dtype=bool)
    if n < 2:
        return dup
    by = [("hash", "ascending"), ("hash2", "ascending"), ("id", "ascending"), ("para", "ascending"),
          ("shard", "ascending"), ("row", "ascending")]
    if rank is not None:
        keys = keys.append_column("__rank", pa.array(rank, pa.float64()))
        by.insert(2, ("__rank", "ascending"))
    order = pc.sort_indices(keys, by).to_numpy()
    h = keys.column("hash").to_numpy()[order]
    h2 = keys.column("hash2").to_numpy()[order]
    same = (h[1:] == h[:-1]) & (h2[1:] == h2[:-1])
    dup[order[1:][same]] = True
    return dup


def filter_health(bf: BloomFilter, samples: int = 1 << 18, seed: int = 0) -> dict:
    """How a filter will answer for keys it never saw: its fill, the false-positive rate its
    fill implies (``fill ** k``, from the actual bits) and the rate measured on ``samples``
    random keys."""
    rng = np.random.default_rng(seed)
    probe = rng.integers(0, np.iinfo(np.uint64).max, size=samples, dtype=np.uint64, endpoint=True)
    fill = bf.fill_ratio()
    return {"fill_ratio": fill, "false_positive_rate_from_fill": fill ** bf.k,
            "measured_false_positive_rate": float(bf.contains(probe).mean()), "probes": samples}


def drop_paragraphs(text: str, drop: list[int]) -> str:
    lines = text.split(PARAGRAPH_SEPARATOR)
    gone = set(drop)
    return PARAGRAPH_SEPARATOR.join(line for j, line in enumerate(lines) if j not in gone)
