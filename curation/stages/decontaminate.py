"""Drop training documents that share a word n-gram (13 by default) with an evaluation set.

The eval set (``eval_paths``: JSONL(.gz/.zst), Parquet, plain text (.txt, .xz/.gz/.bz2) or
CoNLL-U, whose ``# text =`` lines are the sentences) is read once per worker in ``setup``:
every window of ``ngram`` consecutive normalised words (lowercased, split on whitespace) of
every eval document is hashed to a uint64 and inserted into a ``curation.dedup.bloom.BloomFilter``
sized for the eval set at ``false_positive_rate``. The filter is then only queried.

Each training document gets ``decontam_overlaps`` (how many of its n-gram windows are in the
filter) and is dropped as ``decontaminate:ngram_overlap`` when that count reaches
``min_overlaps`` (1: any shared n-gram, the GPT-3 / Llama recipe). Documents shorter than
``ngram`` words are never dropped (the rule has nothing to compare). A Bloom false positive
can drop a clean document with probability ~ ``windows x false_positive_rate``; there are no
false negatives.

The eval files' content (sha256) is part of the params hash: a changed eval set reruns.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, PrivateAttr, field_validator

from curation.dedup.bloom import BloomFilter
from curation.io.evalsets import base_name, read_eval_texts
from curation.io.files import cached_file_sha256
from curation.stages.base import MapStage, StageResult, registry

REASON = "decontaminate:ngram_overlap"
_MUL = np.uint64(0x9E3779B97F4A7C15)


def normalise_words(text: str | None) -> list[str]:
    """Lowercased whitespace words."""
    return (text or "").lower().split()


@lru_cache(maxsize=1 << 20)
def _word_hash(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def ngram_hashes(words: list[str], n: int) -> np.ndarray:
    """uint64 hash of every window of ``n`` words (empty if fewer than ``n`` words).

    Polynomial combination of per-word blake2b hashes: h = sum_i w_i * M^(n-1-i) mod 2^64,
    computed for all windows at once."""
    if len(words) < n:
        return np.zeros(0, np.uint64)
    w = np.fromiter((_word_hash(x) for x in words), dtype=np.uint64, count=len(words))
    nwin = len(words) - n + 1
    h = np.zeros(nwin, np.uint64)
    with np.errstate(over="ignore"):
        for i in range(n):
            h = h * _MUL + w[i:i + nwin]
    return h


def eval_ngram_hashes(paths: list[str], n: int, text_field: str = "text") -> np.ndarray:
    """Unique n-gram hashes of a whole eval set.

    Text files are read as one stream of words (an eval passage may run over line breaks);
    JSONL / Parquet / CoNLL-U documents stay separate."""
    parts = []
    for p in paths:
        base = base_name(Path(p))
        if base.endswith((".parquet", ".jsonl", ".json", ".ndjson", ".conllu")):
            for doc in read_eval_texts(p, text_field):
                parts.append(ngram_hashes(normalise_words(doc), n))
        else:
            words: list[str] = []
            for line in read_eval_texts(p, text_field):
                words.extend(normalise_words(line))
            parts.append(ngram_hashes(words, n))
    return np.unique(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)


@registry.register("decontaminate")
class Decontaminate(MapStage):
    """Drop documents sharing an ``ngram``-word window with the eval set (``eval_paths``)."""

    type: Literal["decontaminate"] = "decontaminate"
    columns: ClassVar[tuple[str, ...]] = ('decontam_overlaps',)
    eval_paths: list[str] = Field(min_length=1)
    ngram: int = Field(default=13, gt=0)
    text_field: str = "text"  # of the training documents
    eval_text_field: str = "text"  # of JSONL / Parquet eval files
    min_overlaps: int = Field(default=1, ge=1)
    false_positive_rate: float = Field(default=1e-9, gt=0, lt=1)

    _bloom: BloomFilter | None = PrivateAttr(default=None)

    @field_validator("eval_paths")
    @classmethod
    def _exist(cls, v: list[str]) -> list[str]:
        out = []
        for p in v:
            ap = Path(p).expanduser().resolve()
            if not ap.is_file():
                raise ValueError(f"eval file {p} does not exist")
            out.append(str(ap))
        return out

    def params(self) -> dict[str, Any]:
        p = super().params()
        p["eval_paths"] = []
        for path in self.eval_paths:
            p["eval_paths"].append({"name": Path(path).name, "sha256": cached_file_sha256(path)})
        return p

    def build_filter(self) -> BloomFilter:
        hashes = eval_ngram_hashes(self.eval_paths, self.ngram, self.eval_text_field)
        bf = BloomFilter.for_capacity(max(1, len(hashes)), self.false_positive_rate,
                                      params={"ngram": self.ngram, "normalise": "lower-whitespace"})
        bf.add(hashes)
        return bf

    def setup(self) -> None:
        if self._bloom is None:
            self._bloom = self.build_filter()

    def process(self, batch: pa.Table) -> StageResult:
        if self._bloom is None:
            self.setup()
        if self.text_field not in batch.column_names:
            raise ValueError(f"decontaminate: input has no {self.text_field!r} column")
        texts = batch.column(self.text_field).to_pylist()
        counts = np.zeros(len(texts), np.int32)
        for i, t in enumerate(texts):
            h = ngram_hashes(normalise_words(t), self.ngram)
            if len(h):
                counts[i] = int(self._bloom.contains(h).sum())
        reasons = pa.array([REASON if c >= self.min_overlaps else None for c in counts], pa.string())
        idx = batch.schema.get_field_index("decontam_overlaps")
        col = pa.array(counts, pa.int32())
        table = batch.set_column(idx, "decontam_overlaps", col) if idx >= 0 else batch.append_column("decontam_overlaps", col)
        return StageResult(table, reasons)
