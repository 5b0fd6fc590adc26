"""Near-duplicate removal: MinHash signatures, LSH buckets, distributed connected components.

```yaml
near: {type: minhash_dedup, input: exact, ngram: 5, num_perm: 128, threshold: 0.8, keep: first}
```

Every document gets a global int64 index: its position in (upstream shard key, row) order.
Phases, each a set of Ray tasks whose output does not depend on the worker count:

1. signatures (one task per block of upstream shards, ``curation.io.shards.blocks``): MinHash
   signatures of word n-grams (``curation.dedup.minhash``; Markdown's of its plain view,
   ``curation.text.markup``, here and in every Jaccard after), cut into ``bands`` x ``rows``
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
4. keepers (a ``keep`` other than ``first``: ``latest``, ``highest_quality``, ``source_rank``,
   see ``curation.dedup.keeper``): per block, (component, doc, score) rows go to the
   component's partition; per partition, the document with the best score (then the smallest
   index) is the keeper. With ``keep: first`` the keeper is the component's smallest index.
   Against a corpus index, the indexed clusters' nodes take part scored by their keepers'
   stored attribute: where a new document wins, it is kept and the indexed keeper goes to
   ``RUN/STAGE/_superseded/<block>.parquet``.
5. partner check (``partner_check: true``; ``curation.dedup.partners``): per block, the
   clustered documents' (component, doc, keeper score, text) go to the component's partition
   (``partner_members``: the block's shards are read once); per partition (``partners``),
   each component's members are taken in keeper order and each is removed only if its exact
   shingle Jaccard (the signatures' own word n-grams) to a member kept before it reaches
   ``threshold - partner_slack``; otherwise it is kept (*rescued*) and later members may be
   removed against it. Every removal then has a kept partner in its component at or above
   that floor. The partition writes (doc, cluster, kept) of the components it changed; the
   rescued members' sub-clusters are named by their smallest index. Components holding an
   indexed cluster (``against``) are not checked: the indexed keeper's text is in another run.
6. apply (one task per block, one output per upstream shard or per run of small ones,
   ``curation.io.shards.output_groups``): ``dup_cluster`` (component id, or the document's
   own index when it has no near-duplicate; with the partner check, its sub-cluster) on every
   row; non-keepers are rejected as ``minhash_dedup:cluster=<id>``. With the partner check,
   each output's manifest entry says how many of its documents were rescued
   (``partner_rescued``).

Artifacts carry a header (algorithm, version, seed, parameters); ``_work/<params>/header.json``
is checked on every run and a mismatch is refused (``ArtifactMismatch``), never reused.
``RUN/STAGE/_minhash_report.json`` records (b, r), counts, the largest edge set one task held,
per-phase seconds and docs/s, and peak worker RSS; with the partner check, ``rescued`` and a
``partner_check`` section (removals checked, rescued, components split, Jaccards computed, the
partners' Jaccard histogram).
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
from curation.dedup import keeper as keepers
from curation.dedup.index import CorpusIndex, NearPart, near_rows
from curation.dedup.components import connected_components, edge_header, read_labels, symmetric, write_edges
from curation.dedup.lsh import EMPTY_BUCKETS, bucket_partition, candidate_edges
from curation.dedup.partner_check import PartnerJob, partner_task
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
from curation.stages.paths import PathStr
from curation.stages.context import GroupedOutputs, StageContext, block_outputs, output_keys
from curation.text.markup import markup_of, plain_texts

#: Bump when buckets, edges or the choice of keepers change for the same parameters.
#: 2: bucket files indexed by partition; 3: one per block, no signature files; 4: Markdown (the text
#: field's mark) shingled by its plain view
MINHASH_DEDUP_VERSION = 4
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
    keep: str = "highest_quality"  # with quality_out: the policy whose score it holds
    rank_column: str = "quality"
    source_rank: tuple[str, ...] = ()


def _score(col: pa.Array | pa.ChunkedArray, job: SignatureJob) -> np.ndarray:
    """A keeper policy's score (higher wins; NaN or -inf lowest): the quality itself for
    ``highest_quality``, minus the policy's rank otherwise."""
    if job.keep == "highest_quality":
        return pc.fill_null(col.cast(pa.float64()), float("nan")).to_numpy(zero_copy_only=False)
    return -keepers.rank(keepers.attribute(col, job.keep), job.keep, job.source_rank)


def signature_task(job: SignatureJob) -> dict:
    """Phase 1 for one block of upstream shards: its documents' signatures, cut into bands,
    as bucket rows in one file indexed by partition (each candidates task reads only its own
    row groups). Signatures themselves are not kept: nothing after this phase reads them."""
    cols = ["text"] + ([job.rank_column] if job.quality_out is not None else [])
    bucket_parts, parts, qual_parts = [], [], []
    lo = 0
    pending: list[pa.RecordBatch] = []
    pending_rows = 0

    def flush() -> None:
        # documents of consecutive shards hashed together: a block of many small shards makes
        # as few signature calls as one large shard (same signatures: each is per document)
        nonlocal lo, pending_rows
        if not pending:
            return
        batch = pa.Table.from_batches(pending).combine_chunks()
        pending.clear()
        pending_rows = 0
        # Markdown's shingles are its plain view's words (``markup``), not its markup
        sig, n = job.hasher.signatures(plain_texts(batch.column("text"), markup_of(batch.schema.field("text"))))
        doc = np.arange(job.first_doc + lo, job.first_doc + lo + batch.num_rows, dtype=np.int64)
        lo += batch.num_rows
        if job.quality_out is not None:
            q = _score(batch.column(job.rank_column), job)
            qual_parts.append(pa.table({"doc": pa.array(doc), "quality": pa.array(q, pa.float64())}))
        has = n > 0  # a document without words has no shingles: it never collides
        flat = band_hashes(sig[has], job.bands, job.rows, job.hasher.seed).ravel()
        parts.append(bucket_partition(flat, job.partitions))
        bucket_parts.append(pa.table({
            "band": pa.array(np.tile(np.arange(job.bands, dtype=np.int32), int(has.sum()))),
            "bucket": pa.array(flat), "doc": pa.array(np.repeat(doc[has], job.bands))}))

    for path in job.paths:
        pf = location.parquet_file(path)
        for batch in pf.iter_batches(batch_size=_SIG_BATCH, columns=cols, use_threads=False):
            if pending and (batch.schema != pending[0].schema
                            or markup_of(batch.schema.field("text")) != markup_of(pending[0].schema.field("text"))):
                flush()  # shards of a union may type a column differently, or mark their text so
            pending.append(batch)
            pending_rows += batch.num_rows
            if pending_rows >= _SIG_BATCH:
                flush()
    flush()
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


def _plain_rows(path: str, rows: np.ndarray) -> pa.Array:
    """The text of a shard's sorted ``rows`` as the signatures shingled it: a Markdown shard's
    plain view (its text field's mark), so verified and partner Jaccards are the signatures'."""
    return plain_texts(take_rows(path, rows, "text"), markup_of(location.read_schema(path).field("text")))


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
        texts = _plain_rows(spec.paths[s], mine - offsets[s])
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
    keep: str = "first"  # with an index and another policy: the indexed keepers' scores go to matches_out
    source_rank: tuple[str, ...] = ()


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
        attr = keepers.attribute_column(job.keep)
        ib, ih, inode, names, lookup = near_rows(job.index, band, bucket, attr)
        if attr:  # the indexed keeper's score, as signature_task scores the new documents
            score = -keepers.rank(names.column(attr), job.keep, job.source_rank)
            names = names.drop_columns([attr]).append_column("quality", pa.array(score, pa.float64()))
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
    quality_file: str | None
    lo: int
    hi: int
    label_files: tuple[str, ...]
    out: str
    partitions: int
    header: dict
    cc_head: dict
    match_files: tuple[str, ...] = ()  # for the indexed clusters' nodes [lo, 0): their keepers' scores


def cluster_quality_task(job: ClusterQualityJob) -> dict:
    """Phase 4a for one block: (component, doc, quality) of its clustered docs, in one file
    indexed by the component's partition. With ``match_files``, the same for the indexed
    clusters' nodes (negative) the run's components hold, scored by their keepers."""
    nodes, comps = read_labels(list(job.label_files), job.cc_head, job.lo, job.hi)
    if job.match_files:
        t = pa.concat_tables([read_artifact(f, job.header, columns=["node", "quality"]) for f in job.match_files])
        n, first = np.unique(t.column("node").to_numpy(), return_index=True)
        sc = t.column("quality").to_numpy(zero_copy_only=False)[first]
        q = sc[np.searchsorted(n, nodes)] if len(nodes) else np.zeros(0)
    else:
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
    index_out: str | None = None  # (component, keeper, node) of the components holding indexed clusters
    new_wins_ties: bool = False  # keep: latest: a new document beats an indexed one of the same date


def keeper_task(job: KeeperJob) -> dict:
    """Phase 4b for one partition: the keeper of each of its components (highest quality,
    then smallest doc index; a missing quality ranks lowest). Indexed clusters' nodes
    (negative) take part with their keepers' scores: they win ties (they came first), unless
    ``new_wins_ties``; ``index_out`` lists, per component holding one, its keeper and every
    indexed node in it (what apply names, or lists as superseded where a new document won)."""
    t = pa.concat_tables([read_partition(f, job.q, job.header, columns=["component", "doc", "quality"])
                          for f in job.files])
    comp, doc = t.column("component").to_numpy(), t.column("doc").to_numpy()
    qual = np.nan_to_num(t.column("quality").to_numpy(zero_copy_only=False), nan=-np.inf)
    keeper_docs = np.zeros(0, np.int64)
    idx_rows = {"component": np.zeros(0, np.int64), "keeper": np.zeros(0, np.int64), "node": np.zeros(0, np.int64)}
    if len(comp):
        tie = (doc < 0) if job.new_wins_ties else np.zeros(len(doc), bool)
        order = np.lexsort((doc, tie, -qual, comp))  # per component: best quality first, then smallest doc
        c = comp[order]
        first = np.r_[True, c[1:] != c[:-1]]
        keeper_docs = np.sort(doc[order][first])
        if job.index_out is not None:
            heads = doc[order][first]
            comp_keeper = heads[np.cumsum(first) - 1]  # each sorted row's component keeper
            neg = doc[order] < 0
            idx_rows = {"component": c[neg], "keeper": comp_keeper[neg], "node": doc[order][neg]}
    write_artifact(pa.table({"doc": pa.array(keeper_docs, pa.int64())}), job.out, job.header)
    if job.index_out is not None:
        rows = pa.table({k: pa.array(v, pa.int64()) for k, v in idx_rows.items()})
        write_artifact(rows.take(pc.sort_indices(rows, [("component", "ascending"), ("node", "ascending")])),
                       job.index_out, job.header)
    return {"components": int(len(keeper_docs)), "index_components_won": int(
        len(np.unique(idx_rows["component"][idx_rows["keeper"] >= 0])))}


@dataclass(frozen=True)
class PartnerMembersJob:
    paths: tuple[str, ...]  # the block's shards
    offsets: tuple[int, ...]  # each shard's first doc index, and the block's end
    label_files: tuple[str, ...]
    quality_file: str | None  # (doc, score) of the block: a keeper policy other than first
    out: str
    partitions: int
    header: dict
    cc_head: dict


def partner_members_task(job: PartnerMembersJob) -> dict:
    """Partner check, step 1, for one block: (component, doc, score, text) of its clustered
    documents, in one file indexed by the component's partition (the partition the keepers
    phase uses), so a partition's task holds its components' members whole. The block's
    shards are read once, only the row groups holding clustered documents. Components
    holding an indexed cluster (negative ids) are left out: they are not checked."""
    b_lo, b_hi = job.offsets[0], job.offsets[-1]
    nodes, comps = read_labels(list(job.label_files), job.cc_head, b_lo, b_hi)
    skipped = int((comps < 0).sum())
    nodes, comps = nodes[comps >= 0], comps[comps >= 0]
    if job.quality_file is not None and len(nodes):
        q = read_artifact(job.quality_file, job.header, columns=["quality"]).column("quality")
        score = q.to_numpy(zero_copy_only=False)[nodes - b_lo]
    else:
        score = np.zeros(len(nodes))
    texts = []
    for path, lo, hi in zip(job.paths, job.offsets[:-1], job.offsets[1:]):
        mine = nodes[(nodes >= lo) & (nodes < hi)]
        if len(mine):
            texts.append(_plain_rows(path, mine - lo).cast(pa.large_string()))
    text = pa.concat_arrays(texts) if texts else pa.array([], pa.large_string())
    part = bucket_partition(comps.astype(np.uint64) * np.uint64(GOLDEN), job.partitions)
    order = np.lexsort((nodes, comps, part))
    rows = pa.table({"component": pa.array(comps, pa.int64()), "doc": pa.array(nodes, pa.int64()),
                     "score": pa.array(score, pa.float64()), "text": text}).take(pa.array(order))
    write_partitioned(rows, part[order], job.out, job.header)
    return {"rows": rows.num_rows, "index_rows": skipped}


@dataclass(frozen=True)
class ApplyJob:
    outs: GroupedOutputs  # the block's outputs (small shards share one)
    paths: tuple[str, ...]
    offsets: tuple[int, ...]  # each shard's first doc index, and the block's end
    label_files: tuple[str, ...]
    keeper_files: tuple[str, ...] | None
    header: dict
    cc_head: dict
    docs_out: str | None = None  # (doc, id, cluster, kept) of the block, for a corpus index
    match_files: tuple[str, ...] = ()  # (node, MEMBER:ID) of indexed clusters (``against``)
    keep: str = "first"  # another policy: its attribute goes to docs_out
    rank_column: str | None = None
    index_keeper_files: tuple[str, ...] = ()  # (component, keeper, node): a policy across the index
    superseded_out: str | None = None
    stage: str = ""
    partner_files: tuple[str, ...] = ()  # (doc, cluster, kept) the partner check changed


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
    won: dict[int, list[int]] = {}  # a new keeper of a component holding indexed clusters: their nodes
    if job.index_keeper_files and in_index.any():
        ik = pa.concat_tables([read_artifact(f, job.header) for f in job.index_keeper_files])
        ic, ikeep, inode = (ik.column(c).to_numpy() for c in ("component", "keeper", "node"))
        uc, at = np.unique(ic, return_index=True)
        pos = np.searchsorted(uc, cluster_all[in_index])
        cluster_all[in_index] = ikeep[at][pos]  # the component's keeper: new (it won) or an indexed cluster
        mine = (ikeep >= b_lo) & (ikeep < b_hi)
        for kd, nd in zip(ikeep[mine].tolist(), inode[mine].tolist()):
            won.setdefault(kd, []).append(nd)
        in_index = cluster_all < 0
    wanted = np.r_[cluster_all[in_index], np.array([n for v in won.values() for n in v], np.int64)]
    names = _index_names(job.match_files, job.header, wanted) if len(wanted) else {}
    if job.keeper_files is not None:
        is_keeper = np.zeros(b_hi - b_lo, dtype=bool)
        for f in job.keeper_files:
            k = read_artifact(f, job.header, filters=[("doc", ">=", b_lo), ("doc", "<", b_hi)]).column("doc").to_numpy()
            is_keeper[k - b_lo] = True
        in_cluster = np.zeros(b_hi - b_lo, dtype=bool)
        in_cluster[nodes - b_lo] = True
        kept_all = (~in_cluster | is_keeper) & ~in_index
    rescued_all = None
    if job.partner_files:  # the partner check's decisions replace the components' own
        before = kept_all.copy()
        for f in job.partner_files:
            t = read_artifact(f, job.header, filters=[("doc", ">=", b_lo), ("doc", "<", b_hi)])
            d = t.column("doc").to_numpy() - b_lo
            cluster_all[d] = t.column("cluster").to_numpy()
            kept_all[d] = t.column("kept").to_numpy(zero_copy_only=False)
        rescued_all = kept_all & ~before
    doc_ids, attrs = [], []
    w = job.outs.writer()
    collect_ids = job.docs_out is not None or job.superseded_out is not None
    for path, lo, hi in zip(job.paths, job.offsets[:-1], job.offsets[1:]):
        table = location.read_parquet(path)
        mine = cluster_all[lo - b_lo:hi - b_lo]
        ids = pa.array(mine, pa.int64())
        label = pc.cast(ids, pa.string())
        if (mine < 0).any():
            label = pa.array([names[c] if c < 0 else s for c, s in zip(mine.tolist(), label.to_pylist())], pa.string())
        reasons = pc.binary_join_element_wise(pa.scalar(REASON_PREFIX), label, "")
        reasons = pc.if_else(pa.array(kept_all[lo - b_lo:hi - b_lo]), pa.scalar(None, pa.string()), reasons)
        if collect_ids:
            doc_ids.append(table.column("id"))
        if job.docs_out is not None and job.rank_column is not None:
            attrs.append(keepers.attribute(table.column(job.rank_column), job.keep))
        table = table.append_column("dup_cluster", ids)
        kept_t, rejected = split_kept_rejected(table, reasons, job.outs.stage)
        extra = {} if rescued_all is None else {"partner_rescued": int(rescued_all[lo - b_lo:hi - b_lo].sum())}
        w.add(kept_t, rejected, table.num_rows, **extra)
    entries = w.done()
    all_ids = pa.chunked_array([c.cast(pa.string()) for ids_ in doc_ids for c in ids_.chunks], pa.string()) \
        if collect_ids else None
    if job.docs_out is not None:
        cols = {"doc": pa.array(np.arange(b_lo, b_hi, dtype=np.int64)), "id": all_ids,
                "cluster": pa.array(cluster_all), "kept": pa.array(kept_all)}
        attr = keepers.attribute_column(job.keep)
        if attr and job.rank_column is not None:
            cols[attr] = pa.chunked_array(attrs, keepers.attribute_type(job.keep))
        files.write_parquet(pa.table(cols), job.docs_out, row_group_size=65536)
    if job.superseded_out is not None:  # indexed keepers a new document of this block replaced
        kd = sorted(won)
        by = all_ids.take(pa.array(np.array(kd, np.int64) - b_lo)).to_pylist() if kd else []
        olds, bys = [], []
        for d, b in zip(kd, by):
            for n in sorted(won[d]):
                olds.append(names[n])
                bys.append(b)
        t = keepers.superseded_table(olds, bys, job.stage)
        files.write_parquet(t.take(pc.sort_indices(t, [("member", "ascending"), ("id", "ascending"),
                                                        ("by", "ascending")])), job.superseded_out)
    return entries


# ---------------------------------------------------------------------------------------------
# the stage


@dataclass(frozen=True)
class _Layout:
    """Where a run of the stage keeps what its phases share: the upstream shards, their blocks
    (``spans``) and first document indexes (``offsets``), the blocks' names and quality files, the
    work folder, the artifacts' and components' headers, the partitions."""

    paths: tuple[str, ...]
    spans: tuple[tuple[int, int], ...]
    offsets: np.ndarray
    names: tuple[str, ...]
    quality_files: tuple[str | None, ...]
    work: str
    header: dict
    cc_head: dict
    partitions: int


@registry.register("minhash_dedup")
class MinHashDedup(GlobalStage):
    """Remove near-duplicate documents: documents whose MinHash signatures share an LSH
    bucket are linked, linked documents form clusters (connected components), one document
    per cluster is kept (``keep: first`` = smallest index, ``highest_quality`` = largest
    ``quality`` column, ``latest`` = latest ``date_column``, ``source_rank`` = ``source`` first
    in ``source_rank``; then smallest index).

    ``threshold`` picks (bands, rows) like datasketch's ``MinHashLSH`` (``weights`` = FP, FN
    weights), unless ``bands`` and ``rows`` are given. ``verify_jaccard`` keeps only
    candidate links whose exact shingle Jaccard reaches the threshold. ``partitions`` fixes
    how bucket and edge work is split (not the worker count), so results never depend on
    the number of workers.

    ``partner_check`` makes every removal have a partner: connected components chain A~B~C
    into one cluster although A and C may share nothing, so each document a cluster would
    remove is compared, in exact shingle Jaccard, with the members the cluster keeps (in
    keeper order); below ``threshold - partner_slack`` against all of them it is kept
    (rescued) and becomes a keeper later members may be removed against. Off by default (the
    outputs, params hash and artifacts are then those of a stage without it); it costs a read
    of the clustered documents' text and their shingle sets, see ``_minhash_report.json``.
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
    #: which document of a cluster survives (``curation.dedup.keeper``): first (smallest index),
    #: latest (``date_column``), highest_quality (``quality``) or source_rank (``source`` by
    #: ``source_rank``); against a corpus index, a new document the policy prefers to the
    #: indexed cluster's keeper is kept and that keeper is listed in ``RUN/STAGE/_superseded/``
    keep: keepers.Keep = "first"
    source_rank: list[str] = Field(default_factory=list)
    date_column: str = "date"
    verify_jaccard: bool = False
    partitions: int = Field(default=16, ge=1, le=4096)
    seed: int = Field(default=1, ge=0)
    hash_family: Literal["affine32", "multiply_shift64"] = "affine32"
    #: connected components finish in one task once a step has at most this many edges;
    #: None: what half the task's declared memory holds at ~64 bytes per edge
    local_components_edges: int | None = Field(default=None, ge=0)
    #: corpus indexes (``refinery index build``) to deduplicate against: a new document near
    #: an indexed one is rejected as ``minhash_dedup:cluster=MEMBER:ID``
    against: list[PathStr] = Field(default_factory=list)
    #: verify every removal against the members its cluster keeps (exact Jaccard >= threshold -
    #: partner_slack), keeping the ones without such a partner (``curation.dedup.partners``)
    partner_check: bool = False
    #: how far below ``threshold`` a removal's exact Jaccard to its kept partner may be
    partner_slack: float = Field(default=0.0, ge=0, lt=1)

    def params(self) -> dict[str, Any]:
        p = super().params()
        if not p.get("partner_check"):  # runs made before the partner check keep their params hash
            p.pop("partner_check", None)
            p.pop("partner_slack", None)
        if not p.get("against"):
            p.pop("against", None)  # runs made before ``against`` existed keep their params hash
        for k, default in (("source_rank", []), ("date_column", "date")):
            if p.get(k) == default:
                p.pop(k, None)  # nor before keeper policies
        return p

    def keeper(self) -> dict[str, Any]:
        """The keeper policy's parameters beyond ``keep``."""
        return {**({"source_rank": list(self.source_rank)} if self.keep == "source_rank" else {}),
                **({"date_column": self.date_column} if self.keep == "latest" else {})}

    def index_params(self) -> dict[str, Any]:
        """What a corpus index's band keys must have been made with for this stage to query
        them (the keeper policy, verification and threshold do not change the keys)."""
        b, r = self.band_rows()
        return {"algorithm": "minhash-lsh-dedup", "minhash_version": MINHASH_VERSION,
                **self.hasher().header()["params"], "seed": self.seed, "bands": b, "rows": r,
                "partitions": self.partitions}

    def indexes(self) -> list[CorpusIndex]:
        out = []
        attr = keepers.attribute_column(self.keep)
        for entry in self.against:
            idx = CorpusIndex(str(entry))
            idx.check_near(self.index_params(), f"minhash_dedup.against: {entry}")
            idx.check_keep("near", attr, self.keep, "their clusters' keepers", f"minhash_dedup.against: {entry}")
            out.append(idx)
        return out

    @model_validator(mode="after")
    def _check_bands(self) -> MinHashDedup:
        if (self.bands is None) != (self.rows is None):
            raise ValueError("give both bands and rows, or neither (then the threshold chooses them)")
        if self.bands is not None and self.bands * self.rows > self.num_perm:
            raise ValueError(f"bands * rows = {self.bands * self.rows} exceeds num_perm = {self.num_perm}")
        if self.keep == "source_rank" and not self.source_rank:
            raise ValueError("keep: source_rank needs source_rank: [a source, ...] (best first)")
        if self.partner_check and self.partner_slack >= self.threshold:
            raise ValueError(f"partner_slack = {self.partner_slack} must be below threshold = {self.threshold} "
                             "(a removal's partner must share something with it)")
        return self

    def partner_floor(self) -> float:
        """The exact Jaccard a removal's kept partner must reach with the partner check."""
        return self.threshold - self.partner_slack

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
                           "keep": self.keep, **self.keeper(),
                           **({"partner_check": True, "partner_slack": self.partner_slack}
                              if self.partner_check else {})}}

    def run(self, ctx: StageContext) -> None:
        keys = [k for k, _ in ctx.upstream]
        paths = [p for _, p in ctx.upstream]
        ctx.check_work_header(self.header(), create=False)
        sizes = location.sizes(paths)
        spans = blocks(sizes)
        outputs = block_outputs(ctx, keys, sizes, spans)
        if ctx.finished(output_keys(outputs), REPORT):
            return
        rank_column = keepers.source_column(self.keep, self.date_column)
        if rank_column is not None:
            missing = [p for p in paths if rank_column not in location.read_schema(p).names]
            if missing:
                raise ValueError(f"{ctx.name}: keep: {self.keep} needs a {rank_column!r} column, which {missing[0]} "
                                 "lacks; put a stage that adds it upstream or use keep: first")
        work, header, P = ctx.work_dir, self.header(), self.partitions
        ctx.check_work_header(header)
        cc_head, (b, r) = edge_header(header), self.band_rows()
        offsets = np.r_[0, np.cumsum([location.parquet_file(p).metadata.num_rows for p in paths])].astype(np.int64)
        names = [block_name(keys[lo:hi]) for lo, hi in spans]
        with_quality = self.keep != "first"
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
                         P, header, self.keep, rank_column or "quality", tuple(self.source_rank))
            for k, (lo, hi) in enumerate(spans)])
        verify = (Verify(tuple(paths), tuple(offsets.tolist()), self.ngram, self.threshold)
                  if self.verify_jaccard else None)
        cand = ctx.phase("candidates", candidate_task, [
            CandidatesJob(p, bucket_files, cc_root, P, header, cc_head, verify,
                          tuple(x for i, s in zip(indexes, starts) for x in i.near_parts(p, int(s))),
                          match_files[p] if indexes else None, self.keep, tuple(self.source_rank)) for p in range(P)])
        # the components algorithm keeps its own per-step markers, so it resumes mid-way
        local_edges = self.local_components_edges
        if local_edges is None:
            local_edges = (self.resources.memory_mb or 1024) * 2**20 // 2 // 64
        comp = connected_components(lambda fn, items, phase: ctx.map(fn, items, phase), cc_root, P, cc_head,
                                    phase=f"{ctx.name}:components", local_max_edges=local_edges)
        labels = tuple(comp.label_files)
        superseding = with_quality and bool(indexes)  # the policy decides between new and indexed keepers
        lay = _Layout(tuple(paths), tuple(spans), offsets, tuple(names), tuple(quality_files), work, header, cc_head, P)
        keeper_files, index_keepers = (self._keeper_phases(ctx, lay, labels, match_files, total, superseding)
                                       if with_quality else (None, ()))
        partner_files, partners = self._partner_phases(ctx, lay, labels) if self.partner_check else ((), None)
        sup_dir = location.join(ctx.stage_dir, keepers.SUPERSEDED_DIR)
        ctx.phase("apply", apply_task, [
            ApplyJob(outputs[k], tuple(paths[lo:hi]),
                     tuple(int(o) for o in offsets[lo:hi + 1]), labels, keeper_files, header, cc_head, doc_files[k],
                     match_files, self.keep, rank_column, index_keepers,
                     location.join(sup_dir, f"{names[k]}.parquet") if superseding else None, ctx.name,
                     partner_files)
            for k, (lo, hi) in enumerate(spans)], commit=True)
        files.write_json(location.join(lsh, "meta.json"), {
            "header": header, "index_params": self.index_params(), "partitions": P, "blocks": names,
            "docs": int(offsets[-1])})
        self._write_report(ctx, output_keys(outputs), int(offsets[-1]), cand, comp, header, partners)

    def _keeper_phases(self, ctx: StageContext, lay: _Layout, labels: tuple[str, ...], match_files: tuple[str, ...],
                       total: int, superseding: bool) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """A keep policy other than first: each cluster's best score (``cluster_quality``), then its
        keeper per partition (``keepers``); against an index, the indexed clusters' keepers too.
        Returns the keeper files and the index keeper files."""
        work, P, header, cc_head = lay.work, lay.partitions, lay.header, lay.cc_head
        cq_files = tuple(location.join(work, "cluster_quality", f"{n}.parquet") for n in lay.names)
        cq_jobs = [ClusterQualityJob(lay.quality_files[k], int(lay.offsets[lo]), int(lay.offsets[hi]), labels,
                                     cq_files[k], P, header, cc_head) for k, (lo, hi) in enumerate(lay.spans)]
        index_keepers: tuple[str, ...] = ()
        if superseding:  # the indexed clusters' nodes, scored by their keepers
            cq_files += (location.join(work, "cluster_quality", "_index.parquet"),)
            cq_jobs.append(ClusterQualityJob(None, -total, 0, labels, cq_files[-1], P, header, cc_head, match_files))
            index_keepers = tuple(location.join(work, "index_keepers", f"part-{q:04d}.parquet") for q in range(P))
        keeper_files = tuple(location.join(work, "keepers", f"part-{q:04d}.parquet") for q in range(P))
        ctx.phase("cluster_quality", cluster_quality_task, cq_jobs)
        ctx.phase("keepers", keeper_task, [
            KeeperJob(q, cq_files, keeper_files[q], header, index_keepers[q] if superseding else None,
                      self.keep == "latest") for q in range(P)])
        return keeper_files, index_keepers

    def _partner_phases(self, ctx: StageContext, lay: _Layout, labels: tuple[str, ...]
                        ) -> tuple[tuple[str, ...], list[dict]]:
        """``partner_check``: each block's clustered members (``partner_members``), then every
        removal verified per partition (``partners``). Returns the partner files and figures."""
        work, P = lay.work, lay.partitions
        pm_files = tuple(location.join(work, "partner_members", f"{n}.parquet") for n in lay.names)
        ctx.phase("partner_members", partner_members_task, [
            PartnerMembersJob(lay.paths[lo:hi], tuple(int(o) for o in lay.offsets[lo:hi + 1]), labels,
                              lay.quality_files[k], pm_files[k], P, lay.header, lay.cc_head)
            for k, (lo, hi) in enumerate(lay.spans)])
        partner_files = tuple(location.join(work, "partners", f"part-{q:04d}.parquet") for q in range(P))
        partners = ctx.phase("partners", partner_task, [
            PartnerJob(q, pm_files, partner_files[q], lay.header, self.ngram, self.partner_floor()) for q in range(P)])
        return partner_files, partners

    def _partner_report(self, partners: list[dict]) -> dict[str, Any]:
        """The partner check's figures, summed over its partitions."""
        mins = [p["min_partner_jaccard"] for p in partners if p["min_partner_jaccard"] is not None]
        hist = np.sum([p["hist"] for p in partners], axis=0).astype(int).tolist() if partners else []
        return {"slack": self.partner_slack, "floor": self.partner_floor(),
                **{k: sum(p[k] for p in partners) for k in ("members", "components", "checked", "rescued",
                                                             "components_split", "jaccard_pairs", "pruned_pairs")},
                "largest_component": max((p["largest_component"] for p in partners), default=0),
                "most_kept_in_component": max((p["most_kept_in_component"] for p in partners), default=0),
                "min_partner_jaccard": min(mins) if mins else None,
                "partner_jaccard_histogram": {f"{i / len(hist):.2f}": n for i, n in enumerate(hist) if n}}

    def _write_report(self, ctx: StageContext, keys: list[str], total_docs: int, cand: list[dict],
                      comp: Any, header: dict, partners: list[dict] | None = None) -> None:
        entries = ctx.committed()
        removed = sum(int(entries[k].get("rejected_rows", 0)) for k in keys if k in entries)
        b, r = self.band_rows()
        extra: dict[str, Any] = {}
        if partners is not None:
            pr = self._partner_report(partners)
            extra = {"rescued": pr["rescued"], "partner_check": pr,
                     "reasons": {REASON_PREFIX.rstrip("="): removed,
                                 "kept:partner_rescued": pr["rescued"]}}
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
            **extra,
        }, timings=True)
