"""Near-duplicate removal: MinHash signatures, LSH buckets, distributed connected components.

```yaml
near: {type: minhash_dedup, input: exact, ngram: 5, num_perm: 128, threshold: 0.8, keep: first}
```

Every document gets a global int64 index: its position in (upstream shard key, row) order.
Phases, each a set of Ray tasks whose output does not depend on the worker count:

1. signatures (one task per upstream shard): MinHash signatures of word n-grams
   (``curation.dedup.minhash``), cut into ``bands`` x ``rows`` (chosen for ``threshold`` by
   minimising the weighted false positive / negative areas, as datasketch does). Writes
   ``signatures/<shard>.parquet`` and ``buckets/<shard>.parquet`` (band, bucket hash, doc)
   sorted by partition = prefix of the bucket hash. A killed run keeps finished shards.
2. candidates (one task per partition): group that partition's bucket rows by (band,
   bucket); each bucket links its members to its smallest doc (a star: edges grow with
   members, not with their square, and the components are those of all pairs). With
   ``verify_jaccard`` an edge survives only if the true shingle Jaccard reaches the threshold.
3. components (``curation.dedup.components``): large-star / small-star rounds over
   hash-partitioned edge files; no task holds more than its partition's edges. A component
   is named by its smallest doc index.
4. keepers (``keep: highest_quality`` only): per shard, (component, doc, quality) rows go
   to the component's partition; per partition, the document with the highest ``quality``
   (then the smallest index) is the keeper. With ``keep: first`` the keeper is the
   component's smallest index.
5. apply (one task per upstream shard): ``dup_cluster`` (component id, or the document's
   own index when it has no near-duplicate) on every row; non-keepers are rejected as
   ``minhash_dedup:cluster=<id>``.

Artifacts carry a header (algorithm, version, seed, parameters); ``_work/<params>/header.json``
is checked on every run and a mismatch is refused (``ArtifactMismatch``), never reused.
``RUN/STAGE/_minhash_report.json`` records (b, r), counts, the largest edge set one task held,
per-phase seconds and docs/s, and peak worker RSS.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field, model_validator

from curation.dedup.components import connected_components, edge_header, read_labels, symmetric, write_edges
from curation.io.files import safe_names, write_json
from curation.io.shards import split_kept_rejected
from curation.dedup.minhash import (
    MINHASH_VERSION,
    MinHasher,
    band_hashes,
    jaccard,
    lsh_params,
    read_artifact,
    shingle_sets,
    write_artifact,
)
if TYPE_CHECKING:  # pragma: no cover
    from curation.pipeline.context import GlobalContext
    from curation.pipeline.rundir import RunDir

from curation.stages.base import GlobalStage, Resources, registry

#: Bump when buckets, edges or the choice of keepers change for the same parameters.
MINHASH_DEDUP_VERSION = 1
REPORT = "_minhash_report.json"
REASON_PREFIX = "minhash_dedup:cluster="
_SIG_BATCH = 4096  # documents per signature batch: bounds a task's working memory


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


def _sig_table(doc: np.ndarray, sig: np.ndarray, n: np.ndarray, quality: np.ndarray | None) -> pa.Table:
    cols = {"doc": pa.array(doc, pa.int64()),
            "signature": pa.FixedSizeListArray.from_arrays(pa.array(sig.ravel(), pa.uint32()), sig.shape[1]),
            "num_shingles": pa.array(n.astype(np.int32))}
    if quality is not None:
        cols["quality"] = pa.array(quality, pa.float64())
    return pa.table(cols)


def read_signatures(path: str | Path, header: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(doc, signatures uint32[n, num_perm], num_shingles) of a persisted signature file."""
    t = read_artifact(path, header)
    sig = t.column("signature").combine_chunks()
    k = sig.type.list_size
    return (t.column("doc").to_numpy(), sig.values.to_numpy().reshape(-1, k),
            t.column("num_shingles").to_numpy())


# ---------------------------------------------------------------------------------------------
# Ray tasks


def signature_task(path: str, first_doc: int, sig_out: str, bucket_out: str, hasher: MinHasher, bands: int,
                   rows: int, partitions: int, with_quality: bool, header: dict) -> dict:
    """Phase 1 for one upstream shard."""
    t0 = time.perf_counter()
    cols = ["text"] + (["quality"] if with_quality else [])
    table = pq.read_table(path, columns=cols)
    sig_parts, bucket_parts = [], []
    for lo in range(0, table.num_rows, _SIG_BATCH):
        batch = table.slice(lo, _SIG_BATCH)
        sig, n = hasher.signatures(batch.column("text").combine_chunks())
        doc = np.arange(first_doc + lo, first_doc + lo + batch.num_rows, dtype=np.int64)
        q = None
        if with_quality:
            q = pc.fill_null(batch.column("quality").combine_chunks().cast(pa.float64()), float("nan")).to_numpy(
                zero_copy_only=False)
        sig_parts.append(_sig_table(doc, sig, n, q))
        has = n > 0  # a document without words has no shingles: it never collides
        bh = band_hashes(sig[has], bands, rows, hasher.seed)
        d = np.repeat(doc[has], bands)
        flat = bh.ravel()
        bucket_parts.append(pa.table({
            "part": pa.array(bucket_partition(flat, partitions)),
            "band": pa.array(np.tile(np.arange(bands, dtype=np.int32), int(has.sum()))),
            "bucket": pa.array(flat), "doc": pa.array(d)}))
    k = hasher.num_perm
    sigs = pa.concat_tables(sig_parts) if sig_parts else _sig_table(
        np.zeros(0, np.int64), np.zeros((0, k), np.uint32), np.zeros(0, np.int64),
        np.zeros(0) if with_quality else None)
    buckets = pa.concat_tables(bucket_parts) if bucket_parts else pa.table({
        "part": pa.array([], pa.int32()), "band": pa.array([], pa.int32()), "bucket": pa.array([], pa.uint64()),
        "doc": pa.array([], pa.int64())})
    buckets = buckets.take(pc.sort_indices(buckets, [("part", "ascending"), ("band", "ascending"),
                                                     ("bucket", "ascending"), ("doc", "ascending")]))
    write_artifact(sigs, sig_out, header, row_group_size=8192)
    write_artifact(buckets, bucket_out, header, row_group_size=65536)
    return {"docs": table.num_rows, "bucket_rows": buckets.num_rows, "seconds": time.perf_counter() - t0,
            }


def _verify(u: np.ndarray, v: np.ndarray, paths: list[str], doc_offsets: np.ndarray, ngram: int,
            threshold: float) -> np.ndarray:
    """Which candidate edges reach ``threshold`` in true shingle Jaccard (texts re-read)."""
    docs = np.unique(np.r_[u, v])
    shard = np.searchsorted(doc_offsets, docs, side="right") - 1
    sets: dict[int, np.ndarray] = {}
    for s in np.unique(shard).tolist():
        mine = docs[shard == s]
        texts = pq.read_table(paths[s], columns=["text"]).column("text").take(pa.array(mine - doc_offsets[s]))
        for d, sh in zip(mine.tolist(), shingle_sets(texts.combine_chunks(), ngram)):
            sets[d] = sh
    return np.array([jaccard(sets[a], sets[b]) >= threshold for a, b in zip(u.tolist(), v.tolist())], dtype=bool)


def candidate_task(p: int, bucket_files: list[str], cc_root: str, partitions: int, header: dict, cc_head: dict,
                   verify: dict | None) -> dict:
    """Phase 2 for one partition: its buckets' star edges, sent to step 0 of the components."""
    t0 = time.perf_counter()
    parts = [read_artifact(f, header, columns=["band", "bucket", "doc"], filters=[("part", "=", p)])
             for f in bucket_files]
    t = pa.concat_tables(parts) if parts else None
    rows = t.num_rows if t is not None else 0
    if rows:
        u, v = candidate_edges(t.column("band").to_numpy(), t.column("bucket").to_numpy(), t.column("doc").to_numpy())
    else:
        u = v = np.zeros(0, np.int64)
    candidates = len(u)
    if verify is not None and len(u):
        ok = _verify(u, v, verify["paths"], np.asarray(verify["doc_offsets"]), verify["ngram"], verify["threshold"])
        u, v = u[ok], v[ok]
    s, d = symmetric(u, v)
    write_edges(Path(cc_root) / "s000", p, s, d, partitions, cc_head)
    stats = {"partition": p, "bucket_rows": rows, "candidate_edges": candidates, "edges": int(len(u)),
             "seconds": time.perf_counter() - t0}
    marker = Path(cc_root) / "s000" / "_candidates" / f"from-{p:04d}.json"
    marker.parent.mkdir(parents=True, exist_ok=True)
    write_json(marker, stats)
    return stats


def cluster_quality_task(sig_file: str, lo: int, hi: int, label_files: list[str], out: str, partitions: int,
                         header: dict, cc_head: dict) -> dict:
    """Phase 4a for one shard: (component, doc, quality) of its clustered docs, by partition."""
    nodes, comps = read_labels(label_files, cc_head, lo, hi)
    t = read_artifact(sig_file, header, columns=["doc", "quality"])
    q = t.column("quality").to_numpy(zero_copy_only=False)[nodes - lo] if len(nodes) else np.zeros(0)
    rows = pa.table({"part": pa.array(bucket_partition(comps.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15),
                                                       partitions)),
                     "component": pa.array(comps, pa.int64()), "doc": pa.array(nodes, pa.int64()),
                     "quality": pa.array(q, pa.float64())})
    rows = rows.take(pc.sort_indices(rows, [("part", "ascending"), ("component", "ascending"), ("doc", "ascending")]))
    write_artifact(rows, out, header)
    return {"rows": rows.num_rows}


def keeper_task(q: int, files: list[str], out: str, header: dict) -> dict:
    """Phase 4b for one partition: the keeper of each of its components (highest quality,
    then smallest doc index; a missing quality ranks lowest)."""
    parts = [read_artifact(f, header, columns=["component", "doc", "quality"], filters=[("part", "=", q)])
             for f in files]
    t = pa.concat_tables(parts)
    comp, doc = t.column("component").to_numpy(), t.column("doc").to_numpy()
    qual = np.nan_to_num(t.column("quality").to_numpy(zero_copy_only=False), nan=-np.inf)
    keepers = np.zeros(0, np.int64)
    if len(comp):
        order = np.lexsort((doc, -qual, comp))  # per component: best quality first, then smallest doc
        c = comp[order]
        first = np.r_[True, c[1:] != c[:-1]]
        keepers = np.sort(doc[order][first])
    write_artifact(pa.table({"doc": pa.array(keepers, pa.int64())}), out, header)
    return {"components": int(len(keepers))}


def apply_task(run_dir: RunDir, stage: str, params_hash: str, key: str, path: str, lo: int, hi: int,
               label_files: list[str], keeper_files: list[str] | None, header: dict, cc_head: dict) -> dict:
    """Phase 5 for one upstream shard: ``dup_cluster`` on every row, non-keepers rejected."""
    table = pq.read_table(path)
    own = np.arange(lo, hi, dtype=np.int64)
    cluster = own.copy()
    nodes, comps = read_labels(label_files, cc_head, lo, hi)
    cluster[nodes - lo] = comps
    if keeper_files is None:
        kept = cluster == own
    else:
        keepers = [read_artifact(f, header, filters=[("doc", ">=", lo), ("doc", "<", hi)]).column("doc").to_numpy()
                   for f in keeper_files]
        is_keeper = np.zeros(hi - lo, dtype=bool)
        for k in keepers:
            is_keeper[k - lo] = True
        in_cluster = np.zeros(hi - lo, dtype=bool)
        in_cluster[nodes - lo] = True
        kept = ~in_cluster | is_keeper
    ids = pa.array(cluster, pa.int64())
    reasons = pc.binary_join_element_wise(pa.scalar(REASON_PREFIX), pc.cast(ids, pa.string()), "")
    reasons = pc.if_else(pa.array(kept), pa.scalar(None, pa.string()), reasons)
    table = table.append_column("dup_cluster", ids)
    kept_t, rejected = split_kept_rejected(table, reasons, stage)
    return run_dir.write_stage_shard(stage, key, kept_t, rejected, table.num_rows, params_hash)


# ---------------------------------------------------------------------------------------------
# the stage


@registry.register("minhash_dedup")
class MinHashDedup(GlobalStage):
    """Remove near-duplicate documents: documents whose MinHash signatures share an LSH
    bucket are linked, linked documents form clusters (connected components), one document
    per cluster is kept (``keep: first`` = smallest index, ``highest_quality`` = largest
    ``quality`` column, then smallest index).

    ``threshold`` picks (bands, rows) like datasketch's ``MinHashLSH`` (``weights`` = FP, FN
    weights), unless ``bands`` and ``rows`` are given. ``verify_jaccard`` keeps only
    candidate links whose exact shingle Jaccard reaches the threshold. ``partitions`` fixes
    how bucket and edge work is split (not the worker count), so results never depend on
    the number of workers.
    """

    type: Literal["minhash_dedup"] = "minhash_dedup"
    #: a candidates or components task holds a partition's buckets or edges
    resources: ClassVar[Resources] = Resources(cpus=1, memory_mb=1536)
    ngram: int = Field(default=5, ge=1, le=64)
    num_perm: int = Field(default=128, ge=2, le=1024)
    threshold: float = Field(default=0.8, gt=0, lt=1)
    weights: tuple[float, float] = (0.5, 0.5)
    bands: int | None = Field(default=None, ge=1)
    rows: int | None = Field(default=None, ge=1)
    keep: Literal["first", "highest_quality"] = "first"
    verify_jaccard: bool = False
    partitions: int = Field(default=16, ge=1, le=4096)
    seed: int = Field(default=1, ge=0)
    hash_family: Literal["affine32", "multiply_shift64"] = "affine32"

    @model_validator(mode="after")
    def _check_bands(self) -> MinHashDedup:
        if (self.bands is None) != (self.rows is None):
            raise ValueError("give both bands and rows, or neither (then the threshold chooses them)")
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands * rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        return self

    def band_rows(self) -> tuple[int, int]:
        """(bands, rows) used for LSH."""
        if self.bands is not None:
            return self.bands, self.rows
        return lsh_params(self.threshold, self.num_perm, self.weights)

    def hasher(self) -> MinHasher:
        return MinHasher(num_perm=self.num_perm, ngram=self.ngram, seed=self.seed, family=self.hash_family)

    def header(self) -> dict[str, Any]:
        """What every artifact of this stage depends on."""
        b, r = self.band_rows()
        return {"algorithm": "minhash-lsh-dedup", "version": MINHASH_DEDUP_VERSION,
                "minhash_version": MINHASH_VERSION, "seed": self.seed,
                "params": {**self.hasher().header()["params"], "bands": b, "rows": r, "threshold": self.threshold,
                           "partitions": self.partitions, "verify_jaccard": self.verify_jaccard,
                           "keep": self.keep}}

    def run(self, ctx: GlobalContext) -> None:
        keys = [k for k, _ in ctx.upstream]
        paths = [p for _, p in ctx.upstream]
        names = safe_names(keys)
        work = ctx.work_dir
        header = self.header()
        ctx.check_work_header(header)
        cc_head = edge_header(header)
        P = self.partitions
        b, r = self.band_rows()
        counts = [pq.ParquetFile(p).metadata.num_rows for p in paths]
        offsets = np.r_[0, np.cumsum(counts)].astype(np.int64)
        total_docs = int(offsets[-1])
        done = ctx.done_keys()
        todo_out = [i for i, k in enumerate(keys) if k not in done]
        if not todo_out and ctx.rundir.read_report(ctx.name, REPORT) is not None:
            return
        if self.keep == "highest_quality":
            missing = [p for p in paths if "quality" not in pq.read_schema(p).names]
            if missing:
                raise ValueError(f"{ctx.name}: keep: highest_quality needs a 'quality' column, which {missing[0]} "
                                 "lacks; put a quality stage upstream or use keep: first")
        sig_files = [str(work / "signatures" / f"{n}.parquet") for n in names]
        bucket_files = [str(work / "buckets" / f"{n}.parquet") for n in names]
        cc_root = work / "cc"
        phases: dict[str, dict] = {}

        def timed(name: str, fn, docs: int | None = None):
            t0 = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t0
            phases[name] = {"seconds": round(dt, 3)}
            if docs is not None and dt > 0:
                phases[name]["docs_per_s"] = round(docs / dt, 1)
            return out

        # phase 1: signatures and buckets, per shard
        todo = [i for i in range(len(paths)) if not (Path(sig_files[i]).exists() and Path(bucket_files[i]).exists())]
        hasher = self.hasher()
        items = [(paths[i], int(offsets[i]), sig_files[i], bucket_files[i], hasher, b, r, P,
                  self.keep == "highest_quality", header) for i in todo]
        timed("signatures", lambda: ctx.map(signature_task, items, phase=f"{ctx.name}:signatures"),
                          sum(counts[i] for i in todo))

        # phase 2: candidate edges, per partition
        marker = cc_root / "s000" / "_candidates"
        todo_p = [p for p in range(P) if not (marker / f"from-{p:04d}.json").exists()]
        verify = ({"paths": paths, "doc_offsets": offsets.tolist(), "ngram": self.ngram, "threshold": self.threshold}
                  if self.verify_jaccard else None)
        items = [(p, bucket_files, str(cc_root), P, header, cc_head, verify) for p in todo_p]
        timed("candidates", lambda: ctx.map(candidate_task, items, phase=f"{ctx.name}:candidates"), total_docs)
        cand = [json.loads((marker / f"from-{p:04d}.json").read_text()) for p in range(P)]

        # phase 3: connected components
        def mapper(fn, its, phase):
            return ctx.map(fn, its, phase=phase)

        comp = timed("components", lambda: connected_components(mapper, cc_root, P, cc_head,
                                                                phase=f"{ctx.name}:components"), total_docs)

        # phase 4: keepers (highest quality only)
        keeper_files = None
        if self.keep == "highest_quality":
            cq_files = [str(work / "cluster_quality" / f"{n}.parquet") for n in names]
            keeper_files = [str(work / "keepers" / f"part-{q:04d}.parquet") for q in range(P)]
            items = [(sig_files[i], int(offsets[i]), int(offsets[i + 1]), comp.label_files, cq_files[i], P, header,
                      cc_head) for i in range(len(paths)) if not Path(cq_files[i]).exists()]
            timed("cluster_quality", lambda: ctx.map(cluster_quality_task, items, phase=f"{ctx.name}:quality"),
                  total_docs)
            items = [(q, cq_files, keeper_files[q], header) for q in range(P) if not Path(keeper_files[q]).exists()]
            timed("keepers", lambda: ctx.map(keeper_task, items, phase=f"{ctx.name}:keepers"), total_docs)

        # phase 5: apply, per shard
        items = [(ctx.rundir, ctx.name, ctx.params_hash, keys[i], paths[i], int(offsets[i]), int(offsets[i + 1]),
                  comp.label_files, keeper_files, header, cc_head) for i in todo_out]
        timed("apply", lambda: ctx.map_and_commit(apply_task, items, f"{ctx.name}:apply"),
              sum(counts[i] for i in todo_out))

        entries = ctx.committed()
        removed = sum(int(entries[k].get("rejected_rows", 0)) for k in keys if k in entries)
        report = {
            "header": header, "bands": b, "rows": r,
            "documents": total_docs, "removed": removed, "kept": total_docs - removed,
            "bucket_rows": sum(c["bucket_rows"] for c in cand),
            "candidate_edges": sum(c["candidate_edges"] for c in cand),
            "edges": sum(c["edges"] for c in cand),
            "largest_task_bucket_rows": max((c["bucket_rows"] for c in cand), default=0),
            "components": {"steps": comp.steps, "input_directed_edges": comp.input_edges,
                           "largest_task_edges": comp.max_task_edges, "per_step": comp.per_step},
            "phase_docs": phases,
        }
        ctx.write_report(REPORT, report, timings=True)
