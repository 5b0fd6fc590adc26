"""Packed 16-byte keys: a span of at most 16 bytes as one 64-bit key (``kernels.short_key``),
tables of the keys looked for, and the (first byte, last byte; length, second byte) sieve that
rules out almost every span before its key is computed."""

from __future__ import annotations

import numpy as np

from curation.hashing import splitmix64
from curation.text import kernels

def py_short_key(s: str) -> int:
    """``kernels.short_key`` of one Python string (for the keys we look for)."""
    raw = s.encode()
    assert len(raw) <= 16
    lo = int.from_bytes(raw[:8], "little")
    hi = int.from_bytes(raw[8:16], "little")
    hi_len = np.array([(hi + len(raw)) & ((1 << 64) - 1)], np.uint64)
    return int(splitmix64(np.array([lo], np.uint64) ^ splitmix64(hi_len))[0])


def key_table(values) -> tuple[np.ndarray, np.ndarray]:
    """Sorted short keys of ``values`` (each at most 16 UTF-8 bytes) and their indices."""
    keys = np.array([py_short_key(v) for v in values], dtype=np.uint64)
    order = np.argsort(keys, kind="stable")
    return keys[order], order


def find_keys(b, start, n_bytes, keys, order, sieve, carry):
    """The spans whose bytes equal one of the keys: (their ``carry`` values, key indices).

    A table over (first byte, last byte; length, second byte) rules out almost every span
    before the exact 64-bit key is computed (compiled: ``kernels.find_keys``; ``key_sieve``)."""
    if not len(start):
        return carry, np.zeros(0, np.int64)
    idx, hit = kernels.find_keys(b, np.ascontiguousarray(start, np.int64), np.ascontiguousarray(n_bytes, np.int64),
                            keys, order.astype(np.int64), sieve)
    return carry[idx], hit


def key_sieve(values) -> np.ndarray:
    """Per (first byte, last byte): bits 1-16, a bit for each length a key with those ends has
    (keys are at most 16 bytes); bits 17-31, a bit for each second byte (mod 15) such a key has
    (0 for a one-byte key). A span is probed only if both its bits are set
    (``kernels._sieved``): on the long bench pages the length alone let 8% of the whole-core
    words through to a binary search ("his" for "hes"); with the second byte the special
    cases run x1.10. 256 KiB, so the probe per span stays in cache."""
    sieve = np.zeros(1 << 16, dtype=np.uint32)
    for v in values:
        raw = v.encode()
        second = raw[1] % 15 if len(raw) > 1 else 0
        sieve[(raw[0] << 8) | raw[-1]] |= np.uint32((1 << len(raw)) | (1 << (17 + second)))
    return sieve
