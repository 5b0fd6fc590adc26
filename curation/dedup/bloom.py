"""A Bloom filter over uint64 key hashes, vectorised with numpy, persistable and mergeable.

Sizing (for n expected keys and false-positive rate p): ``m = ceil(-n ln p / ln² 2)`` bits
and ``k = round(m / n · ln 2)`` probes. Probe i of key h is ``(h1 + i·h2) mod m`` (Kirsch &
Mitzenmacher double hashing) with ``h1 = mix(h ^ seed) mod m`` and ``h2 = mix(h1') mod (m-1)
+ 1`` (never 0, so the k probes are distinct positions). Bits live in a ``uint64`` array;
inserts use ``np.bitwise_or.at`` (handles repeated positions), queries gather words and test
bits, a whole batch of keys at once.

Persisted form (``save``/``load``): an 8-byte magic, a little-endian uint64 header length, the
header as JSON (algorithm, version, seed, m, k, params) and the raw bits. ``load`` refuses a
file whose header differs from the expected one; ``merge`` ORs filters of identical shape and
parameters, which is how an earlier dump's filter joins a new run's (incremental dedup).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from curation.hashing import fmix64
from curation.io import location
from curation.io.files import atomic_path

ALGORITHM = "bloom-double-hashing-splitmix64"
VERSION = 1
MAGIC = b"RFBLOOM\x01"

_U64 = np.uint64
_CHUNK = 1 << 16  # keys per vectorised step


class BloomHeaderMismatch(ValueError):
    """Persisted Bloom bits made with other parameters than the ones asked for."""


def bloom_size(expected_items: int, false_positive_rate: float) -> tuple[int, int]:
    """(m bits, k probes) for ``expected_items`` keys at ``false_positive_rate``."""
    if expected_items < 1:
        raise ValueError("expected_items must be >= 1")
    if not 0.0 < false_positive_rate < 1.0:
        raise ValueError("false_positive_rate must be in (0, 1)")
    m = max(64, math.ceil(-expected_items * math.log(false_positive_rate) / math.log(2) ** 2))
    k = max(1, round(m / expected_items * math.log(2)))
    return m, k


class BloomFilter:
    """A Bloom filter of ``m`` bits and ``k`` probes over uint64 key hashes.

    ``params`` is free-form (what the keys mean: level, normalisation, partitioning...) and
    is part of the header: two filters merge, and persisted bits load, only when the header
    (algorithm, version, seed, m, k, params) is identical.
    """

    def __init__(self, m: int, k: int, seed: int = 0, params: dict[str, Any] | None = None,
                 bits: np.ndarray | None = None):
        if m < 2 or k < 1:
            raise ValueError("a Bloom filter needs m >= 2 bits and k >= 1 probes")
        self.m, self.k, self.seed = int(m), int(k), int(seed)
        self.params = dict(params or {})
        words = (self.m + 63) // 64
        if bits is None:
            bits = np.zeros(words, dtype=np.uint64)
        elif bits.dtype != np.uint64 or bits.shape != (words,):
            raise ValueError(f"bits must be uint64[{words}]")
        self.bits = bits

    @classmethod
    def for_capacity(cls, expected_items: int, false_positive_rate: float, seed: int = 0,
                     params: dict[str, Any] | None = None) -> BloomFilter:
        """A filter sized for ``expected_items`` keys at ``false_positive_rate``."""
        m, k = bloom_size(expected_items, false_positive_rate)
        p = {"expected_items": int(expected_items), "false_positive_rate": float(false_positive_rate)}
        return cls(m, k, seed, {**p, **(params or {})})

    # -- header ---------------------------------------------------------------------------

    @property
    def header(self) -> dict[str, Any]:
        return self.make_header(self.m, self.k, self.seed, self.params)

    @staticmethod
    def make_header(m: int, k: int, seed: int, params: dict[str, Any]) -> dict[str, Any]:
        """The header a filter of this shape has (checked before loading bits)."""
        return {"algorithm": ALGORITHM, "version": VERSION, "seed": int(seed), "m": int(m), "k": int(k),
                "params": dict(params)}

    @staticmethod
    def check_header(found: dict[str, Any], expected: dict[str, Any], where: str) -> None:
        """Raise ``BloomHeaderMismatch`` naming the differing fields unless equal."""
        if found == expected:
            return
        diffs = [f"{k}: {json.dumps(found.get(k), sort_keys=True)} vs {json.dumps(expected.get(k), sort_keys=True)}"
                 for k in sorted(set(found) | set(expected)) if found.get(k) != expected.get(k)]
        raise BloomHeaderMismatch(f"{where}: Bloom filter parameters differ ({'; '.join(diffs)}); "
                                  "bits of differently built filters cannot be combined")

    # -- probes ---------------------------------------------------------------------------

    def _positions(self, hashes: np.ndarray) -> np.ndarray:
        """uint64[k, n] bit positions of each key (all < m)."""
        h = np.asarray(hashes, dtype=np.uint64)
        m = _U64(self.m)
        x = fmix64(h ^ _U64(self.seed & 0xFFFFFFFFFFFFFFFF))
        h1 = x % m
        h2 = fmix64(x ^ _U64(0x5851F42D4C957F2D)) % _U64(self.m - 1) + _U64(1)
        pos = np.empty((self.k, len(h)), dtype=np.uint64)
        pos[0] = h1
        for i in range(1, self.k):
            # (prev + h2) mod m without overflow: both terms are < m <= 2^63
            nxt = pos[i - 1] + h2
            nxt[nxt >= m] -= m
            pos[i] = nxt
        return pos

    def add(self, hashes: np.ndarray) -> None:
        """Insert a batch of keys."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        for lo in range(0, len(hashes), _CHUNK):  # k x chunk positions at a time: bounded memory
            pos = self._positions(hashes[lo:lo + _CHUNK]).ravel()
            np.bitwise_or.at(self.bits, (pos >> _U64(6)).astype(np.intp), _U64(1) << (pos & _U64(63)))

    def contains(self, hashes: np.ndarray) -> np.ndarray:
        """bool[n]: True where every probe bit is set (a key possibly inserted before)."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        out = np.zeros(len(hashes), dtype=bool)
        for lo in range(0, len(hashes), _CHUNK):
            pos = self._positions(hashes[lo:lo + _CHUNK])
            words = self.bits[(pos >> _U64(6)).astype(np.intp)]
            out[lo:lo + _CHUNK] = np.all((words >> (pos & _U64(63))) & _U64(1), axis=0)
        return out

    def add_new(self, hashes: np.ndarray) -> np.ndarray:
        """Query, then insert, a batch of keys in order: bool[n], True for a key the filter
        already held or that occurs earlier in the same batch (its duplicate)."""
        hashes = np.asarray(hashes, dtype=np.uint64)
        seen = np.ones(len(hashes), dtype=bool)
        if len(hashes) == 0:
            return seen
        uniq, first = np.unique(hashes, return_index=True)
        seen[first] = self.contains(uniq)
        self.add(uniq)
        return seen

    # -- statistics -----------------------------------------------------------------------

    def fill_ratio(self) -> float:
        """Share of bits set."""
        return float(np.bitwise_count(self.bits).sum()) / self.m

    def predicted_false_positive_rate(self) -> float:
        """FP rate of a query given the current fill: ``fill ** k``."""
        return self.fill_ratio() ** self.k

    # -- merge and persistence ------------------------------------------------------------

    def _check_same(self, header: dict[str, Any], where: str) -> None:
        self.check_header(header, self.header, where)

    def merge(self, other: BloomFilter) -> BloomFilter:
        """OR ``other``'s bits into this filter (same algorithm, seed, m, k and params only)."""
        self._check_same(other.header, "merge")
        np.bitwise_or(self.bits, other.bits, out=self.bits)
        return self

    def save(self, path: str | Path) -> None:
        """Write header + bits atomically (a local path or a URL)."""
        head = json.dumps(self.header, sort_keys=True).encode()
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            f.write(MAGIC)
            f.write(np.uint64(len(head)).tobytes())
            f.write(head)
            f.write(self.bits.astype("<u8", copy=False).tobytes())

    @staticmethod
    def read_header(path: str | Path) -> dict[str, Any]:
        """The header of a persisted filter."""
        with location.open_read(path) as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise BloomHeaderMismatch(f"{path}: not a refinery Bloom filter file")
            n = int(np.frombuffer(f.read(8), dtype="<u8")[0])
            return json.loads(f.read(n))

    @classmethod
    def load(cls, path: str | Path, expected: dict[str, Any] | None = None) -> BloomFilter:
        """Read a persisted filter. With ``expected`` (a header, e.g. ``other.header``), refuse
        the file unless its header is identical."""
        with location.open_read(path) as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise BloomHeaderMismatch(f"{path}: not a refinery Bloom filter file")
            n = int(np.frombuffer(f.read(8), dtype="<u8")[0])
            header = json.loads(f.read(n))
            if header.get("algorithm") != ALGORITHM or header.get("version") != VERSION:
                raise BloomHeaderMismatch(f"{path}: made by {header.get('algorithm')} v{header.get('version')}, "
                                          f"this is {ALGORITHM} v{VERSION}")
            bf = cls(header["m"], header["k"], header["seed"], header["params"])
            if expected is not None:
                bf._check_same(expected, str(path))
            raw = f.read()
        words = (bf.m + 63) // 64
        if len(raw) != words * 8:
            raise BloomHeaderMismatch(f"{path}: truncated ({len(raw)} bytes of bits, expected {words * 8})")
        bf.bits = np.frombuffer(raw, dtype="<u8").astype(np.uint64)
        return bf
