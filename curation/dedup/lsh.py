"""LSH over MinHash signatures: bucket rows, their partitions, and the candidate edges of the
documents that share a bucket (pure numpy/Arrow, no Ray, no run directory). The
``minhash_dedup`` stage (``curation/stages/minhash_dedup.py``) runs these as phases.

A bucket row is (band, bucket hash, doc). ``bucket_partition`` sends a bucket to a partition by
its hash's top 32 bits; ``candidate_edges`` links each bucket's members to its smallest doc (a
star: the same connected components as all pairs, with edges growing with members, not with
their square).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa


#: a bucket file with no rows
EMPTY_BUCKETS = pa.table({"band": pa.array([], pa.int32()), "bucket": pa.array([], pa.uint64()),
                          "doc": pa.array([], pa.int64())})


def bucket_partition(buckets: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of a bucket from its hash's top 32 bits."""
    return ((buckets >> np.uint64(32)) * np.uint64(partitions) >> np.uint64(32)).astype(np.int32)


def bucket_groups(band: np.ndarray, bucket: np.ndarray, doc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sort bucket rows by (band, bucket, doc); returns (order, group start offsets + end)."""
    order = np.lexsort((doc, bucket, band))
    b, h = band[order], bucket[order]
    new = np.r_[True, (b[1:] != b[:-1]) | (h[1:] != h[:-1])] if len(order) else np.zeros(0, bool)
    return order, np.r_[np.flatnonzero(new), len(order)]


def candidate_edges(band: np.ndarray, bucket: np.ndarray, doc: np.ndarray, all_pairs: bool = False
                    ) -> tuple[np.ndarray, np.ndarray]:
    """Candidate edges (u < v) of LSH buckets, deduplicated. Default: a star per bucket (its
    smallest doc to each other member), which has the same connected components as all
    pairs; ``all_pairs=True`` lists every pair sharing a bucket (datasketch's candidates)."""
    order, bounds = bucket_groups(band, bucket, doc)
    d = doc[order]
    sizes = np.diff(bounds)
    multi = sizes >= 2
    if not multi.any():
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    starts, sizes = bounds[:-1][multi], sizes[multi]
    if not all_pairs:
        u = np.repeat(d[starts], sizes - 1)
        idx = np.arange(int((sizes - 1).sum())) + np.repeat(starts + 1 - (np.cumsum(sizes - 1) - (sizes - 1)), sizes - 1)
        v = d[idx]
    else:
        us, vs = [], []
        for s, n in zip(starts.tolist(), sizes.tolist()):
            i, j = np.triu_indices(n, 1)
            us.append(d[s + i])
            vs.append(d[s + j])
        u, v = np.concatenate(us), np.concatenate(vs)
    keep = u != v  # a document never pairs with itself (duplicate rows)
    u, v = np.minimum(u[keep], v[keep]), np.maximum(u[keep], v[keep])
    if len(u) == 0:
        return u, v
    o = np.lexsort((v, u))
    u, v = u[o], v[o]
    first = np.r_[True, (u[1:] != u[:-1]) | (v[1:] != v[:-1])]
    return u[first].astype(np.int64), v[first].astype(np.int64)
