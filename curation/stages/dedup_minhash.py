"""Near-duplicate removal: MinHash signatures, LSH buckets, distributed connected components.

```yaml
near: {type: minhash_dedup, input: exact, ngram: 5, num_perm: 128, threshold: 0.8, keep: first}
```

Every document gets a global int64 index: its position in (upstream shard key, row) order.
Phases, each a set of Ray tasks whose output does not depend on the worker count:

1. signatures (one task per block of upstream shards, ``curation.io.shards.blocks``): MinHash
   signatures of word n-grams (``curation.dedup.minhash``), cut into ``bands`` x ``rows``
   (chosen for ``threshold`` by minimising the weighted false positive / negative areas, as
   datasketch does). Writes ``buckets/<block>.parquet`` (band, bucket hash, doc) sorted by
   partition = prefix of the bucket hash (and, for ``keep: highest_quality``,
   ``quality/<block>.parquet``); the signatures are not kept. A killed run keeps finished
   blocks.
2. candidates (one task per partition): group that partition's bucket rows by (band,
   bucket); each bucket links its members to its smallest doc (a star: edges grow with
   members, not with their square, and the components are those of all pairs;
   ``curation.dedup.lsh``). With
   ``verify_jaccard`` an edge survives only if the true shingle Jaccard reaches the threshold.
3. components (``curation.dedup.components``): large-star / small-star rounds over
   hash-partitioned edge files; no task holds more than its partition's edges. A component
   is named by its smallest doc index.
4. keepers (``keep: highest_quality`` only): per block, (component, doc, quality) rows go
   to the component's partition; per partition, the document with the highest ``quality``
   (then the smallest index) is the keeper. With ``keep: first`` the keeper is the
   component's smallest index.
5. apply (one task per block, one output per upstream shard): ``dup_cluster`` (component id, or the document's
   own index when it has no near-duplicate) on every row; non-keepers are rejected as
   ``minhash_dedup:cluster=<id>``.

Artifacts carry a header (algorithm, version, seed, parameters); ``_work/<params>/header.json``
is checked on every run and a mismatch is refused (``ArtifactMismatch``), never reused.
``RUN/STAGE/_minhash_report.json`` records (b, r), counts, the largest edge set one task held,
per-phase seconds and docs/s, and peak worker RSS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, model_validator

from curation.hashing import GOLDEN
from curation.io import files, location
from curation.dedup.index import CorpusIndex, NearPart, near_rows
from curation.dedup.components import connected_components, edge_header, read_labels, symmetric, write_edges
from curation.dedup.lsh import EMPTY_BUCKETS, bucket_partition, candidate_edges
from curation.io.artifacts import read_partition, write_partitioned
from curation.io.rows import take_rows
from curation.io.shards import block_name, blocks, split_kept_rejected
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
from curation.stages.base import GlobalStage, Resources, registry
from curation.stages.context import ShardSink, StageContext

#: Bump when buckets, edges or the choice of keepers change for the same parameters.
MINHASH_DEDUP_VERSION = 3  # 2: bucket files indexed by partition; 3: one per block, no signature files
REPORT = "_minhash_report.json"
REASON_PREFIX = "minhash_dedup:cluster="
#: the stage's LSH state kept with its output (``_lsh/<params hash>/``: bucket files and
#: (doc, id, cluster, kept) files per block, ``meta.json``), what ``refinery index build`` reads
LSH_DIR = "_lsh"
_SIG_BATCH = 4096  # documents per signature batch: bounds a task's working memory


# ---------------------------------------------------------------------------------------------
# jobs and tasks (run in Ray workers)


@dataclass(frozen=True)
class SignatureJob:
    paths: tuple[str, ...]  # a block of upstream shards
    first_doc: int
    quality_out: str | None  # (doc, quality) of the block, for keep: highest_quality
    bucket_out: str
    hasher: MinHasher
    bands: int
    rows: int
    partitions: int
    header: dict


def signature_task(job: SignatureJob) -> dict:
    """Phase 1 for one block of upstream shards: its documents' signatures, cut into bands,
    as bucket rows in one file indexed by partition (each candidates task reads only its own
    row groups). Signatures themselves are not kept: nothing after this phase reads them."""
    cols = ["text"] + (["quality"] if job.quality_out is not None else [])
    bucket_parts, parts, qual_parts = [], [], []
    lo = 0
    for path in job.paths:
        pf = location.parquet_file(path)
        for batch in pf.iter_batches(batch_size=_SIG_BATCH, columns=cols):
            sig, n = job.hasher.signatures(batch.column("text"))
            doc = np.arange(job.first_doc + lo, job.first_doc + lo + batch.num_rows, dtype=np.int64)
            lo += batch.num_rows
            if job.quality_out is not None:
                q = pc.fill_null(batch.column("quality").cast(pa.float64()), float("nan")).to_numpy(zero_copy_only=False)
                qual_parts.append(pa.table({"doc": pa.array(doc), "quality": pa.array(q, pa.float64())}))
            has = n > 0  # a document without words has no shingles: it never collides
            flat = band_hashes(sig[has], job.bands, job.rows, job.hasher.seed).ravel()
            parts.append(bucket_partition(flat, job.partitions))
            bucket_parts.append(pa.table({
                "band": pa.array(np.tile(np.arange(job.bands, dtype=np.int32), int(has.sum()))),
                "bucket": pa.array(flat), "doc": pa.array(np.repeat(doc[has], job.bands))}))
    buckets = pa.concat_tables(bucket_parts) if bucket_parts else EMPTY_BUCKETS
    part = np.concatenate(parts) if parts else np.zeros(0, np.int32)
    order = np.lexsort((buckets.column("doc").to_numpy(), buckets.column("bucket").to_numpy(),
                        buckets.column("band").to_numpy(), part))
    if job.quality_out is not None:
        quality = pa.concat_tables(qual_parts) if qual_parts else pa.table(
            {"doc": pa.array([], pa.int64()), "quality": pa.array([], pa.float64())})
        write_artifact(quality, job.quality_out, job.header, row_group_size=65536)
    write_partitioned(buckets.take(pa.array(order)), part[order], job.bucket_out, job.header)
    return {"docs": lo, "bucket_rows": buckets.num_rows}


@dataclass(frozen=True)
class Verify:
    """What ``verify_jaccard`` needs to recompute a candidate edge's true Jaccard."""

    paths: tuple[str, ...]
    doc_offsets: tuple[int, ...]
    ngram: int
    threshold: float


def _verify(u: np.ndarray, v: np.ndarray, spec: Verify) -> np.ndarray:
    """Which candidate edges reach the threshold in true shingle Jaccard (only the row groups
    holding the edges' documents are re-read)."""
    offsets = np.asarray(spec.doc_offsets)
    docs = np.unique(np.r_[u, v])
    shard = np.searchsorted(offsets, docs, side="right") - 1
    sets: dict[int, np.ndarray] = {}
    for s in np.unique(shard).tolist():
        mine = docs[shard == s]
        texts = take_rows(spec.paths[s], mine - offsets[s], "text")
        for d, sh in zip(mine.tolist(), shingle_sets(texts, spec.ngram)):
            sets[d] = sh
    return np.array([jaccard(sets[a], sets[b]) >= spec.threshold for a, b in zip(u.tolist(), v.tolist())], dtype=bool)


@dataclass(frozen=True)
class CandidatesJob:
    p: int
    bucket_files: tuple[str, ...]
    cc_root: str
    partitions: int
    header: dict
    cc_head: dict
    verify: Verify | None
    index: tuple[NearPart, ...] = ()  # corpus indexes' files of this partition (``against``)
    matches_out: str | None = None


def candidate_task(job: CandidatesJob) -> dict:
    """Phase 2 for one partition: its buckets' star edges, sent to step 0 of the components.
    With ``against`` indexes, the index band rows sharing a bucket with this partition's rows
    join the buckets as their clusters' (negative) nodes, so a new document near an indexed
    one lands in a component named by the indexed cluster; (node, MEMBER:ID) of those nodes go
    to ``matches_out``."""
    parts = [read_partition(f, job.p, job.header, columns=["band", "bucket", "doc"]) for f in job.bucket_files]
    t = pa.concat_tables(parts) if parts else EMPTY_BUCKETS
    band, bucket, doc = t.column("band").to_numpy(), t.column("bucket").to_numpy(), t.column("doc").to_numpy()
    lookup: dict = {}
    if job.index:
        ib, ih, inode, names, lookup = near_rows(job.index, band, bucket)
        band, bucket, doc = np.r_[band, ib].astype(np.int32), np.r_[bucket, ih], np.r_[doc, inode]
        names = names.take(pc.sort_indices(names, [("node", "ascending")]))
        write_artifact(names, job.matches_out, job.header)
    if len(doc):
        u, v = candidate_edges(band, bucket, doc)
    else:
        u = v = np.zeros(0, np.int64)
    candidates = len(u)
    if job.verify is not None and len(u):
        new = u >= 0  # an indexed cluster's edge has no text to verify: kept
        ok = np.ones(len(u), dtype=bool)
        ok[new] = _verify(u[new], v[new], job.verify)
        u, v = u[ok], v[ok]
    s, d = symmetric(u, v)
    write_edges(location.join(job.cc_root, "s000"), job.p, s, d, job.partitions, job.cc_head)
    return {"partition": job.p, "bucket_rows": t.num_rows, "candidate_edges": candidates, "edges": int(len(u)),
            "index_edges": int((u < 0).sum()), "index_lookup": lookup}


@dataclass(frozen=True)
class ClusterQualityJob:
    quality_file: str
    lo: int
    hi: int
    label_files: tuple[str, ...]
    out: str
    partitions: int
    header: dict
    cc_head: dict


def cluster_quality_task(job: ClusterQualityJob) -> dict:
    """Phase 4a for one block: (component, doc, quality) of its clustered docs, in one file
    indexed by the component's partition."""
    nodes, comps = read_labels(list(job.label_files), job.cc_head, job.lo, job.hi)
    t = read_artifact(job.quality_file, job.header, columns=["doc", "quality"])
    q = t.column("quality").to_numpy(zero_copy_only=False)[nodes - job.lo] if len(nodes) else np.zeros(0)
    part = bucket_partition(comps.astype(np.uint64) * np.uint64(GOLDEN), job.partitions)
    order = np.lexsort((nodes, comps, part))
    rows = pa.table({"component": pa.array(comps[order], pa.int64()), "doc": pa.array(nodes[order], pa.int64()),
                     "quality": pa.array(q[order], pa.float64())})
    write_partitioned(rows, part[order], job.out, job.header)
    return {"rows": rows.num_rows}


@dataclass(frozen=True)
class KeeperJob:
    q: int
    files: tuple[str, ...]
    out: str
    header: dict


def keeper_task(job: KeeperJob) -> dict:
    """Phase 4b for one partition: the keeper of each of its components (highest quality,
    then smallest doc index; a missing quality ranks lowest)."""
    t = pa.concat_tables([read_partition(f, job.q, job.header, columns=["component", "doc", "quality"])
                          for f in job.files])
    comp, doc = t.column("component").to_numpy(), t.column("doc").to_numpy()
    qual = np.nan_to_num(t.column("quality").to_numpy(zero_copy_only=False), nan=-np.inf)
    keepers = np.zeros(0, np.int64)
    if len(comp):
        order = np.lexsort((doc, -qual, comp))  # per component: best quality first, then smallest doc
        c = comp[order]
        first = np.r_[True, c[1:] != c[:-1]]
        keepers = np.sort(doc[order][first])
    write_artifact(pa.table({"doc": pa.array(keepers, pa.int64())}), job.out, job.header)
    return {"components": int(len(keepers))}


@dataclass(frozen=True)
class ApplyJob:
    outs: tuple[ShardSink, ...]  # one per shard of the block
    paths: tuple[str, ...]
    offsets: tuple[int, ...]  # each shard's first doc index, and the block's end
    label_files: tuple[str, ...]
    keeper_files: tuple[str, ...] | None
    header: dict
    cc_head: dict
    docs_out: str | None = None  # (doc, id, cluster, kept) of the block, for a corpus index
    match_files: tuple[str, ...] = ()  # (node, MEMBER:ID) of indexed clusters (``against``)


def _index_names(files_: tuple[str, ...], header: dict, nodes: np.ndarray) -> dict[int, str]:
    """MEMBER:ID of the indexed clusters' nodes among ``nodes``."""
    want = np.unique(nodes)
    out: dict[int, str] = {}
    for f in files_:
        t = read_artifact(f, header)
        n = t.column("node").to_numpy()
        hit = np.isin(n, want)
        if hit.any():
            out.update(zip(n[hit].tolist(), t.column("match").filter(pa.array(hit)).to_pylist()))
    return out


def apply_task(job: ApplyJob) -> list[dict]:
    """Phase 5 for one block: ``dup_cluster`` on every row of its shards, non-keepers
    rejected. The labels and keepers of the block's documents are read once. A document in a
    component holding an indexed cluster (a negative ``dup_cluster``) is rejected as
    ``minhash_dedup:cluster=MEMBER:ID``: the index's copy is kept."""
    b_lo, b_hi = job.offsets[0], job.offsets[-1]
    nodes, comps = read_labels(list(job.label_files), job.cc_head, b_lo, b_hi)
    cluster_all = np.arange(b_lo, b_hi, dtype=np.int64)
    cluster_all[nodes - b_lo] = comps
    kept_all = cluster_all == np.arange(b_lo, b_hi, dtype=np.int64)
    in_index = cluster_all < 0
    names = _index_names(job.match_files, job.header, cluster_all[in_index]) if in_index.any() else {}
    if job.keeper_files is not None:
        is_keeper = np.zeros(b_hi - b_lo, dtype=bool)
        for f in job.keeper_files:
            k = read_artifact(f, job.header, filters=[("doc", ">=", b_lo), ("doc", "<", b_hi)]).column("doc").to_numpy()
            is_keeper[k - b_lo] = True
        in_cluster = np.zeros(b_hi - b_lo, dtype=bool)
        in_cluster[nodes - b_lo] = True
        kept_all = (~in_cluster | is_keeper) & ~in_index
    entries, doc_ids = [], []
    for out, path, lo, hi in zip(job.outs, job.paths, job.offsets[:-1], job.offsets[1:]):
        table = location.read_parquet(path)
        mine = cluster_all[lo - b_lo:hi - b_lo]
        ids = pa.array(mine, pa.int64())
        label = pc.cast(ids, pa.string())
        if (mine < 0).any():
            label = pa.array([names[c] if c < 0 else s for c, s in zip(mine.tolist(), label.to_pylist())], pa.string())
        reasons = pc.binary_join_element_wise(pa.scalar(REASON_PREFIX), label, "")
        reasons = pc.if_else(pa.array(kept_all[lo - b_lo:hi - b_lo]), pa.scalar(None, pa.string()), reasons)
        if job.docs_out is not None:
            doc_ids.append(table.column("id"))
        table = table.append_column("dup_cluster", ids)
        kept_t, rejected = split_kept_rejected(table, reasons, out.stage)
        entries.append(out.write(kept_t, rejected, table.num_rows))
    if job.docs_out is not None:
        files.write_parquet(pa.table({
            "doc": pa.array(np.arange(b_lo, b_hi, dtype=np.int64)),
            "id": pa.chunked_array([c.cast(pa.string()) for ids_ in doc_ids for c in ids_.chunks], pa.string()),
            "cluster": pa.array(cluster_all), "kept": pa.array(kept_all)}), job.docs_out, row_group_size=65536)
    return entries


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
    columns: ClassVar[tuple[str, ...]] = ('dup_cluster',)
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
    #: connected components finish in one task once a step has at most this many edges;
    #: None: what half the task's declared memory holds at ~64 bytes per edge
    local_components_edges: int | None = Field(default=None, ge=0)
    #: corpus indexes (``refinery index build``) to deduplicate against: a new document near
    #: an indexed one is rejected as ``minhash_dedup:cluster=MEMBER:ID``
    against: list[str] = Field(default_factory=list)

    def params(self) -> dict[str, Any]:
        p = super().params()
        if not p.get("against"):
            p.pop("against", None)  # runs made before ``against`` existed keep their params hash
        return p

    def index_params(self) -> dict[str, Any]:
        """What a corpus index's band keys must have been made with for this stage to query
        them (the keeper policy, verification and threshold do not change the keys)."""
        b, r = self.band_rows()
        return {"algorithm": "minhash-lsh-dedup", "minhash_version": MINHASH_VERSION,
                **self.hasher().header()["params"], "seed": self.seed, "bands": b, "rows": r,
                "partitions": self.partitions}

    def indexes(self) -> list[CorpusIndex]:
        out = []
        for entry in self.against:
            idx = CorpusIndex(str(entry))
            idx.check_near(self.index_params(), f"minhash_dedup.against: {entry}")
            out.append(idx)
        return out

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

    def run(self, ctx: StageContext) -> None:
        keys = [k for k, _ in ctx.upstream]
        paths = [p for _, p in ctx.upstream]
        ctx.check_work_header(self.header(), create=False)
        if ctx.finished(keys, REPORT):
            return
        if self.keep == "highest_quality":
            missing = [p for p in paths if "quality" not in location.read_schema(p).names]
            if missing:
                raise ValueError(f"{ctx.name}: keep: highest_quality needs a 'quality' column, which {missing[0]} "
                                 "lacks; put a quality stage upstream or use keep: first")
        work, header, P = ctx.work_dir, self.header(), self.partitions
        ctx.check_work_header(header)
        cc_head, (b, r) = edge_header(header), self.band_rows()
        offsets = np.r_[0, np.cumsum([location.parquet_file(p).metadata.num_rows for p in paths])].astype(np.int64)
        spans = blocks(location.sizes(paths))
        names = [block_name(keys[lo:hi]) for lo, hi in spans]
        with_quality = self.keep == "highest_quality"
        quality_files = [location.join(work, "quality", f"{n}.parquet") if with_quality else None for n in names]
        lsh = location.join(ctx.stage_dir, LSH_DIR, ctx.params_hash)
        bucket_files = tuple(location.join(lsh, "buckets", f"{n}.parquet") for n in names)
        doc_files = tuple(location.join(lsh, "docs", f"{n}.parquet") for n in names)
        cc_root = location.join(work, "cc")
        indexes = self.indexes()  # checked before any work
        total = sum(i.near_docs() for i in indexes)
        starts = np.cumsum([0] + [i.near_docs() for i in indexes])[:-1] - total
        match_files = tuple(location.join(work, "index_matches", f"part-{p:05d}.parquet") for p in range(P)
                            ) if indexes else ()

        ctx.phase("signatures", signature_task, [
            SignatureJob(tuple(paths[lo:hi]), int(offsets[lo]), quality_files[k], bucket_files[k], self.hasher(), b, r,
                         P, header) for k, (lo, hi) in enumerate(spans)])
        verify = (Verify(tuple(paths), tuple(offsets.tolist()), self.ngram, self.threshold)
                  if self.verify_jaccard else None)
        cand = ctx.phase("candidates", candidate_task, [
            CandidatesJob(p, bucket_files, cc_root, P, header, cc_head, verify,
                          tuple(x for i, s in zip(indexes, starts) for x in i.near_parts(p, int(s))),
                          match_files[p] if indexes else None) for p in range(P)])
        # the components algorithm keeps its own per-step markers, so it resumes mid-way
        local_edges = self.local_components_edges
        if local_edges is None:
            local_edges = (self.resources.memory_mb or 1024) * 2**20 // 2 // 64
        comp = connected_components(lambda fn, items, phase: ctx.map(fn, items, phase), cc_root, P, cc_head,
                                    phase=f"{ctx.name}:components", local_max_edges=local_edges)
        labels = tuple(comp.label_files)
        keeper_files = None
        if with_quality:
            cq_files = tuple(location.join(work, "cluster_quality", f"{n}.parquet") for n in names)
            keeper_files = tuple(location.join(work, "keepers", f"part-{q:04d}.parquet") for q in range(P))
            ctx.phase("cluster_quality", cluster_quality_task, [
                ClusterQualityJob(quality_files[k], int(offsets[lo]), int(offsets[hi]), labels, cq_files[k], P,
                                  header, cc_head) for k, (lo, hi) in enumerate(spans)])
            ctx.phase("keepers", keeper_task, [KeeperJob(q, cq_files, keeper_files[q], header) for q in range(P)])
        ctx.phase("apply", apply_task, [
            ApplyJob(tuple(ctx.output(k) for k in keys[lo:hi]), tuple(paths[lo:hi]),
                     tuple(int(o) for o in offsets[lo:hi + 1]), labels, keeper_files, header, cc_head, doc_files[k],
                     match_files)
            for k, (lo, hi) in enumerate(spans)], commit=True)
        files.write_json(location.join(lsh, "meta.json"), {
            "header": header, "index_params": self.index_params(), "partitions": P, "blocks": names,
            "docs": int(offsets[-1])})
        self._write_report(ctx, keys, int(offsets[-1]), cand, comp, header)

    def _write_report(self, ctx: StageContext, keys: list[str], total_docs: int, cand: list[dict],
                      comp: Any, header: dict) -> None:
        entries = ctx.committed()
        removed = sum(int(entries[k].get("rejected_rows", 0)) for k in keys if k in entries)
        b, r = self.band_rows()
        ctx.write_report(REPORT, {
            "header": header, "bands": b, "rows": r,
            "documents": total_docs, "removed": removed, "kept": total_docs - removed,
            "bucket_rows": sum(c["bucket_rows"] for c in cand),
            "candidate_edges": sum(c["candidate_edges"] for c in cand),
            "edges": sum(c["edges"] for c in cand),
            "index_edges": sum(c.get("index_edges", 0) for c in cand),
            "indexes": [{"index": i.root, "generation": i.manifest["generation"]} for i in self.indexes()],
            "largest_task_bucket_rows": max((c["bucket_rows"] for c in cand), default=0),
            "components": {"steps": comp.steps, "input_directed_edges": comp.input_edges,
                           "largest_task_edges": comp.max_task_edges, "per_step": comp.per_step},
            "docs_per_s": {k: round(total_docs / v["seconds"], 1) for k, v in ctx.phases.items() if v["seconds"] > 0},
        }, timings=True)
