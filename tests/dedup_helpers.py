"""What the dedup tests and benchmark share: upstream shards for a global stage, running it,
and datasketch's near-duplicate pipeline as the reference our removals are compared with."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from curation.pipeline.context import GlobalContext
from curation.pipeline.rundir import RunDir


def write_upstream(root: Path, docs: list[dict], shards: int) -> list[tuple[str, str]]:
    """``docs`` dealt round-robin to ``shards`` Parquet files under root/up, as (key, path);
    a ``quality`` column is written when the documents have one."""
    out = []
    for s in range(shards):
        part = docs[s::shards]
        cols = {"id": [d["id"] for d in part], "text": [d["text"] for d in part], "source": ["web"] * len(part)}
        if any("quality" in d for d in docs):
            cols["quality"] = [d.get("quality") for d in part]
        path = root / "up" / f"crawl-{s:03d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table(cols), path)
        out.append((f"crawl-{s:03d}", str(path)))
    return out


def run_global(stage, run_dir: Path, name: str, upstream, workers: int = 2) -> GlobalContext:
    """Run a global stage named ``name`` over ``upstream`` (input "up") into ``run_dir``."""
    ctx = GlobalContext(RunDir(run_dir), name, stage.params_hash(["up"]), workers, upstream, stage.resources)
    stage.run(ctx)
    return ctx


def union_find(n: int, pairs) -> np.ndarray:
    """Component root (its lowest member) of each of ``n`` nodes joined by ``pairs``."""
    parent = list(range(n))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)
    return np.array([find(i) for i in range(n)])


def datasketch_removals(docs: list[dict], threshold: float = 0.8, num_perm: int = 128, ngram: int = 5) -> set[str]:
    """The ids datasketch would remove: its own MinHash of our normalised word n-grams, its
    ``MinHashLSH`` candidates, clusters by union-find, the lowest id of each cluster kept."""
    from datasketch import MinHash, MinHashLSH

    from curation.dedup.minhash import normalize_text

    norm = normalize_text(pa.array([d["text"] for d in docs])).to_pylist()
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    hashes = []
    for i, t in enumerate(norm):
        w = t.split()
        m = MinHash(num_perm=num_perm, seed=1)
        m.update_batch([" ".join(w[j:j + ngram]).encode() for j in range(max(1, len(w) - ngram + 1))])
        lsh.insert(i, m)
        hashes.append(m)
    pairs = {(min(i, j), max(i, j)) for i, m in enumerate(hashes) for j in lsh.query(m) if j != i}
    comp = union_find(len(docs), pairs)
    keeper: dict[int, int] = {}
    for i in sorted(range(len(docs)), key=lambda i: docs[i]["id"]):
        keeper.setdefault(comp[i], i)
    return {docs[i]["id"] for i in range(len(docs)) if keeper[comp[i]] != i}
