"""A corpus index: what a deduplicated corpus' dedup stages saw, kept so that the next snapshot
is deduplicated against it without rereading the corpus (no Ray, no run directory: the CLI
hands in the stage folders, the stages hand in the files their tasks read).

Layout (a local folder or an object-storage URL)::

    INDEX/_index.json                      the manifest: format version, generation, the key
                                           parameters of each side, the members in order
    INDEX/_history/gen-000003.json         every generation's manifest, as committed
    INDEX/members/NAME-IDENT/exact/keys/part-00007.parquet   (hash, hash2, id) of the member's
                                           surviving keys in exact partition 7, sorted
    INDEX/members/NAME-IDENT/exact/bloom/part-00007.bloom    their Bloom filter (a pre-filter)
    INDEX/members/NAME-IDENT/near/bands/part-00007.parquet   (band, bucket, doc) LSH band keys
                                           of the member's documents in bucket partition 7,
                                           sorted by (bucket, band, doc)
    INDEX/members/NAME-IDENT/near/docs.parquet               (doc, id, cluster, kept) by doc:
                                           the member's documents, the cluster each belongs to
                                           (its smallest document number) and whether it is
                                           the cluster's keeper

A member is one run (a snapshot) added with ``build``/``add``; its files are written first and
become part of the index only when the manifest naming them is committed (one atomic write), so
a crash mid-add leaves the index as it was. A member's identity is its run and the params
hashes of its stages: adding it again is a no-op.

Matching (called from the stages' tasks):
- ``exact_matches``: a join on the persisted (hash, hash2) keys, the Bloom filter only as a
  pre-filter (a key it rejects is not looked up; a key it passes is matched exactly).
- ``near_rows``: the index band rows of one bucket partition that share a (band, bucket) with
  the new documents, streamed by row group (memory bounded by a row group and the matches,
  not by the index), each mapped to its cluster's node (a negative number, see ``near_node``)
  and the cluster's name ``MEMBER:ID``.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from curation.dedup.bloom import BloomFilter
from curation.io import files, location
from curation.io.artifacts import read_partition

FORMAT = "refinery-corpus-index"
FORMAT_VERSION = 1
MANIFEST = "_index.json"
HISTORY = "_history"
#: rows per row group of the index's sorted files: the unit a lookup reads
ROW_GROUP = 65536


class IndexMismatch(ValueError):
    """An index made with other key parameters than the stage asking it."""


def is_index(path: str) -> bool:
    return location.exists(location.join(str(path).rstrip("/"), MANIFEST))


def params_hash(params: dict) -> str:
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class ExactPart:
    """One member's files for one exact partition (what a partition task reads)."""

    member: str
    keys: str
    bloom: str


@dataclass(frozen=True)
class NearPart:
    """One member's files for one band partition; ``base`` turns its document numbers into
    nodes of the new run's graph (see ``near_node``)."""

    member: str
    bands: str
    docs: str
    base: int


def near_node(base: int, doc: np.ndarray) -> np.ndarray:
    """The graph node of an indexed document ``doc`` of a member with ``base``: negative, so
    that a component holding indexed documents is named by one of them, and the first-added
    member's documents are the smallest (its keeper wins: ``keep: first`` across snapshots)."""
    return (np.asarray(doc, np.int64) + np.int64(base)).astype(np.int64)


class CorpusIndex:
    """An index's manifest and paths (read-only view; ``add_member`` commits a new generation)."""

    def __init__(self, root: str, manifest: dict | None = None):
        self.root = str(root).rstrip("/")
        self.manifest = manifest if manifest is not None else self._read()

    def _read(self) -> dict:
        f = location.join(self.root, MANIFEST)
        if not location.exists(f):
            return {"format": FORMAT, "version": FORMAT_VERSION, "generation": 0, "exact": None, "near": None,
                    "members": []}
        m = json.loads(location.read_text(f))
        if m.get("format") != FORMAT or m.get("version") != FORMAT_VERSION:
            raise IndexMismatch(f"{f}: {m.get('format')} v{m.get('version')}, this refinery reads {FORMAT} "
                                f"v{FORMAT_VERSION}")
        return m

    @property
    def name(self) -> str:
        return location.name(self.root)

    @property
    def members(self) -> list[dict]:
        return self.manifest["members"]

    def member_dir(self, m: dict) -> str:
        return location.join(self.root, m["dir"])

    # -- exact side -------------------------------------------------------------------------

    def _check_side(self, side: str, keys: str, params: dict, where: str) -> None:
        """The index holds ``side`` keys (``"exact"``/``"near"``, named ``keys`` in messages)
        made with ``params``; IndexMismatch otherwise."""
        entry = self.manifest.get(side)
        if entry is None or not any(m.get(side) for m in self.members):
            raise IndexMismatch(f"{where}: index {self.root} holds no {keys}")
        if entry["params"] != params:
            diff = {k: (entry["params"].get(k), params.get(k)) for k in set(entry["params"]) | set(params)
                    if entry["params"].get(k) != params.get(k)}
            raise IndexMismatch(f"{where}: index {self.root} has {keys} made with other "
                                f"parameters (index, stage): {diff}")

    def check_keep(self, side: str, attribute: str | None, keep: str, ranks: str, where: str) -> None:
        """Every ``side`` member stores ``attribute``, what the keeper policy ``keep`` ranks
        ``ranks`` by (None: the policy needs nothing stored); IndexMismatch otherwise."""
        lacking = [m["name"] for m in self.members if m.get(side) and attribute
                   and attribute not in m[side].get("attributes", [])]
        if lacking:
            raise IndexMismatch(f"{where}: member(s) {lacking} hold no {attribute!r} of their documents (indexed "
                                f"from a run with another keep), so keep: {keep} cannot rank {ranks}; index runs "
                                "made with this keep policy")

    def check_exact(self, key_params: dict, where: str) -> None:
        self._check_side("exact", "exact keys", key_params, where)

    def exact_parts(self, p: int) -> tuple[ExactPart, ...]:
        out = []
        for m in self.members:
            if m.get("exact"):
                d = location.join(self.member_dir(m), "exact")
                out.append(ExactPart(m["name"], location.join(d, "keys", f"part-{p:05d}.parquet"),
                                     location.join(d, "bloom", f"part-{p:05d}.bloom")))
        return tuple(out)

    # -- near side --------------------------------------------------------------------------

    def check_near(self, lsh_params: dict, where: str) -> None:
        self._check_side("near", "MinHash band keys", lsh_params, where)

    def near_docs(self) -> int:
        return sum(m["near"]["docs"] for m in self.members if m.get("near"))

    def near_parts(self, p: int, start: int) -> tuple[NearPart, ...]:
        """The members' files of band partition ``p``; their documents are numbered from
        ``start`` (a negative number) on, member after member."""
        out, base = [], start
        for m in self.members:
            if m.get("near"):
                d = location.join(self.member_dir(m), "near")
                out.append(NearPart(m["name"], location.join(d, "bands", f"part-{p:05d}.parquet"),
                                    location.join(d, "docs.parquet"), base))
                base += m["near"]["docs"]
        return tuple(out)

    def size(self) -> dict:
        """Files and bytes on disk, per side."""
        found = location.files_under(self.root)
        out = {"files": len(found), "bytes": sum(found.values()), "exact_bytes": 0, "near_bytes": 0}
        for f, n in found.items():
            if "/exact/" in f:
                out["exact_bytes"] += n
            elif "/near/" in f:
                out["near_bytes"] += n
        return out

    # -- append -----------------------------------------------------------------------------

    def find(self, ident: str) -> dict | None:
        return next((m for m in self.members if m["ident"] == ident), None)

    def commit(self, member: dict, exact_params: dict | None, near_params: dict | None) -> dict:
        """Add ``member`` (its files already written) in one atomic manifest write."""
        m = json.loads(json.dumps(self.manifest))
        for side, params in (("exact", exact_params), ("near", near_params)):
            if params is None:
                continue
            if m[side] is None:
                m[side] = {"params": params, "params_hash": params_hash(params)}
            elif m[side]["params"] != params:
                raise IndexMismatch(f"index {self.root}: the run's {side} keys were made with other parameters "
                                    f"than the index's: {params} vs {m[side]['params']}")
        m["generation"] += 1
        m["members"].append(member)
        files.write_json(location.join(self.root, HISTORY, f"gen-{m['generation']:06d}.json"), m)
        files.write_json(location.join(self.root, MANIFEST), m)  # the commit
        self.manifest = m
        return m


# ---------------------------------------------------------------------------------------------
# building a member from what the stages persisted


def copy_file(src: str, dst: str) -> int:
    with files.atomic_path(dst) as tmp, location.open_read(src) as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 22)
        n = fout.tell()
    return n


def build_exact(keys_dir: str, bloom_dir: str, partitions: int, out: str, false_positive_rate: float) -> dict:
    """A member's exact side: the stage's sorted key files, copied, and a Bloom filter per
    partition over exactly those keys (the stage's own filters are sized for its expected
    corpus and hold its duplicates' keys too: a pre-filter sized for the survivors is smaller)."""
    keys = nbytes = 0
    for p in range(partitions):
        src = location.join(keys_dir, f"part-{p:05d}.parquet")
        if not location.exists(src):
            raise FileNotFoundError(f"{src}: the exact_dedup stage did not persist its keys (a run made before "
                                    "the corpus index; rerun the stage)")
        nbytes += copy_file(src, location.join(out, "keys", f"part-{p:05d}.parquet"))
        h = location.read_parquet(src, columns=["hash"]).column("hash").to_numpy()
        keys += len(h)
        stage_filter = BloomFilter.read_header(location.join(bloom_dir, f"part-{p:05d}.bloom"))
        key_params = {k: v for k, v in stage_filter["params"].items() if k not in ("expected_items", "false_positive_rate")}
        bf = BloomFilter.for_capacity(max(1, len(h)), false_positive_rate, stage_filter["seed"], key_params)
        bf.add(h)
        f = location.join(out, "bloom", f"part-{p:05d}.bloom")
        bf.save(f)
        nbytes += (bf.m + 63) // 64 * 8
    attributes = [c for c in location.parquet_file(location.join(out, "keys", "part-00000.parquet")).schema_arrow.names
                  if c not in ("hash", "hash2", "id")] if partitions else []
    return {"keys": keys, "bytes": nbytes, "attributes": attributes}


def build_near(lsh_dir: str, out: str) -> dict:
    """A member's near side from the stage's persisted LSH state (``_lsh/HASH``: its bucket
    files per block, its docs files per block, ``meta.json``): band keys regrouped by bucket
    partition and sorted; documents in order. Documents the stage matched to an earlier index
    (cluster < 0) are left out: the index already holds their cluster. Reads no text."""
    meta = json.loads(location.read_text(location.join(lsh_dir, "meta.json")))
    header, P = meta["header"], meta["partitions"]
    bucket_files = [location.join(lsh_dir, "buckets", f"{n}.parquet") for n in meta["blocks"]]
    doc_files = [location.join(lsh_dir, "docs", f"{n}.parquet") for n in meta["blocks"]]
    # documents: streamed block by block; the ones left out are remembered (few)
    docs_out = location.join(out, "docs.parquet")
    fields = [("doc", pa.int64()), ("id", pa.string()), ("cluster", pa.int64()), ("kept", pa.bool_())]
    first = location.parquet_file(doc_files[0]).schema_arrow if doc_files else pa.schema(fields)
    attributes = [c for c in first.names if c not in {f for f, _ in fields}]
    fields += [(c, first.field(c).type) for c in attributes]
    # each cluster's keeper where it is not the cluster's smallest document (a keeper policy
    # other than first): pass 1 collects them (few), pass 2 writes them beside every document
    other: dict[int, int] = {}
    for f in doc_files:
        t = location.read_parquet(f, columns=["doc", "cluster", "kept"])
        d, c, k = (t.column(x).to_numpy(zero_copy_only=False) for x in ("doc", "cluster", "kept"))
        sel = k & (c != d) & (c >= 0)
        other.update(zip(c[sel].tolist(), d[sel].tolist()))
    schema = pa.schema(fields + ([("keeper", pa.int64())] if other else []))
    dropped, ndocs, nbytes = [], 0, 0
    staged = files.StagedFile(docs_out)
    try:
        with pq.ParquetWriter(staged.tmp, schema, compression="zstd") as w:
            for f in doc_files:
                t = location.read_parquet(f).select([n for n, _ in fields]).cast(pa.schema(fields))
                neg = pc.less(t.column("cluster"), 0)
                if pc.any(neg).as_py():
                    dropped.append(t.column("doc").filter(neg).to_numpy())
                    t = t.filter(pc.invert(neg))
                if other:
                    c = t.column("cluster").to_numpy()
                    t = t.append_column("keeper", pa.array([other.get(x, x) for x in c.tolist()], pa.int64()))
                ndocs += t.num_rows
                w.write_table(t, row_group_size=ROW_GROUP)
        nbytes += staged.tmp.stat().st_size
        staged.commit()
    finally:
        staged.abort()
    drop = np.sort(np.concatenate(dropped)) if dropped else np.zeros(0, np.int64)
    rows = 0
    for p in range(P):
        parts = [read_partition(f, p, header, columns=["band", "bucket", "doc"]) for f in bucket_files]
        t = pa.concat_tables(parts) if parts else None
        if t is None:
            continue
        doc = t.column("doc").to_numpy()
        if len(drop):
            t = t.filter(pa.array(~np.isin(doc, drop)))
            doc = t.column("doc").to_numpy()
        order = np.lexsort((doc, t.column("band").to_numpy(), t.column("bucket").to_numpy()))
        t = t.take(pa.array(order))
        rows += t.num_rows
        f = location.join(out, "bands", f"part-{p:05d}.parquet")
        with files.atomic_path(f) as tmp:
            pq.write_table(t, tmp, compression="zstd", row_group_size=ROW_GROUP)
            nbytes += tmp.stat().st_size
    return {"docs": int(meta["docs"]), "indexed_docs": ndocs, "band_rows": rows, "bytes": nbytes,
            "partitions": P, "attributes": attributes}


# ---------------------------------------------------------------------------------------------
# lookups (in the stages' tasks)


def _groups_in_range(pf: pq.ParquetFile, column: int, sorted_keys: np.ndarray) -> list[int]:
    """Row groups of a file sorted by ``column`` whose [min, max] holds one of ``sorted_keys``."""
    out = []
    for g in range(pf.num_row_groups):
        st = pf.metadata.row_group(g).column(column).statistics
        if st is None or not st.has_min_max:
            out.append(g)
            continue
        lo = np.searchsorted(sorted_keys, np.uint64(st.min), side="left")
        hi = np.searchsorted(sorted_keys, np.uint64(st.max), side="right")
        if hi > lo:
            out.append(g)
    return out


def exact_matches(parts: tuple[ExactPart, ...], h: np.ndarray, h2: np.ndarray, attribute: str | None = None,
                  latest_member_first: bool = False) -> tuple[np.ndarray, list]:
    """For keys (h, h2) of one partition: (bool per key: held by a member, 'MEMBER:ID' or None
    per key). The first member holding a key names it (``latest_member_first``: the last one,
    the current keeper where a later member superseded an earlier one's copy). Exact: both
    64-bit hashes must match a persisted key; the Bloom filter only spares the lookup of keys
    it never saw. Returns also counters in ``exact_matches.last`` (bloom positives, row groups
    read) and, with ``attribute`` (a keeper policy's stored column), the matched copies' values
    in ``exact_matches.values`` (a list, None where no match)."""
    n = len(h)
    found = np.zeros(n, dtype=bool)
    names: list = [None] * n
    values: list = [None] * n
    stats = {"bloom_positive": 0, "row_groups_read": 0, "row_groups": 0}
    cols = ["hash", "hash2", "id"] + ([attribute] if attribute else [])
    for part in (parts[::-1] if latest_member_first else parts):
        todo = ~found
        if not todo.any():
            break
        bf = BloomFilter.load(part.bloom)
        pos = np.flatnonzero(todo)[bf.contains(h[todo])]
        stats["bloom_positive"] += int(len(pos))
        if not len(pos):
            continue
        cand = np.unique(h[pos])
        pf = location.parquet_file(part.keys)
        stats["row_groups"] += pf.num_row_groups
        col = pf.schema_arrow.get_field_index("hash")
        if attribute and attribute not in pf.schema_arrow.names:
            raise IndexMismatch(f"{part.keys}: member {part.member} holds no {attribute!r} of its documents (made "
                                f"with keep: first); a keeper policy ranking by {attribute} cannot compare with it")
        hits: dict[tuple[int, int], tuple] = {}
        for g in _groups_in_range(pf, col, cand):
            stats["row_groups_read"] += 1
            rh = pf.read_row_group(g, columns=["hash"], use_threads=False).column(0).to_numpy()
            m = np.isin(rh, cand)
            if not m.any():
                continue
            t = pf.read_row_group(g, columns=cols, use_threads=False).filter(pa.array(m))
            vals = t.column(attribute).to_pylist() if attribute else [None] * t.num_rows
            for a, b, i, v in zip(t.column("hash").to_numpy().tolist(), t.column("hash2").to_numpy().tolist(),
                                  t.column("id").to_pylist(), vals):
                hits.setdefault((a, b), (i, v))
        if not hits:
            continue
        for i, a, b in zip(pos.tolist(), h[pos].tolist(), h2[pos].tolist()):
            got = hits.get((a, b))
            if got is not None:
                found[i] = True
                names[i] = f"{part.member}:{got[0]}"
                values[i] = got[1]
    exact_matches.last = stats
    exact_matches.values = values
    return found, names


def _lookup_docs(docs_file: str, want: np.ndarray, columns: list[str]) -> pa.Table:
    """Rows of a member's docs file (sorted by doc) for the sorted document numbers ``want``:
    only the row groups holding them are read."""
    pf = location.parquet_file(docs_file)
    groups = _groups_in_range(pf, pf.schema_arrow.get_field_index("doc"), want.astype(np.uint64)) if len(want) else []
    if not groups:
        return pa.table({c: pa.array([], pf.schema_arrow.field(c).type) for c in columns})
    t = pf.read_row_groups(groups, columns=columns, use_threads=False)
    return t.filter(pa.array(np.isin(t.column("doc").to_numpy(), want)))


def near_rows(parts: tuple[NearPart, ...], band: np.ndarray, bucket: np.ndarray, attribute: str | None = None
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, pa.Table, dict]:
    """Index band rows sharing a (band, bucket) with the new rows ``(band, bucket)`` of one
    partition, as (band, bucket, node) with each indexed document replaced by its cluster's
    node; and (node, match[, attribute]) naming each such node ``MEMBER:ID`` (the id of the
    cluster's keeper, the document the member kept; with ``attribute``, a keeper policy's
    stored column, the keeper's value). The members' files are streamed a row group at a time."""
    keys = np.unique(bucket)
    out_b, out_h, out_n, names = [], [], [], []
    stats = {"row_groups": 0, "row_groups_read": 0, "matched_rows": 0}
    for part in parts:
        if not location.exists(part.bands):
            continue
        pf = location.parquet_file(part.bands)
        stats["row_groups"] += pf.num_row_groups
        col = pf.schema_arrow.get_field_index("bucket")
        mb, mh, md = [], [], []
        for g in _groups_in_range(pf, col, keys):
            stats["row_groups_read"] += 1
            rh = pf.read_row_group(g, columns=["bucket"], use_threads=False).column(0).to_numpy()
            m = np.isin(rh, keys)
            if not m.any():
                continue
            t = pf.read_row_group(g, columns=["band", "bucket", "doc"], use_threads=False).filter(pa.array(m))
            mb.append(t.column("band").to_numpy())
            mh.append(t.column("bucket").to_numpy())
            md.append(t.column("doc").to_numpy())
        if not mb:
            continue
        b, hh, d = np.concatenate(mb), np.concatenate(mh), np.concatenate(md)
        # (band, bucket) must both match: keep index rows whose pair is among the new rows'
        new_pairs = np.unique(np.stack([bucket, band.astype(np.uint64)], axis=1), axis=0)
        pairs = np.stack([hh, b.astype(np.uint64)], axis=1)
        ok = _rows_in(pairs, new_pairs)
        b, hh, d = b[ok], hh[ok], d[ok]
        if not len(d):
            continue
        docs = _lookup_docs(part.docs, np.unique(d), ["doc", "cluster"])
        dd, cc = docs.column("doc").to_numpy(), docs.column("cluster").to_numpy()
        order = np.argsort(dd)
        cluster = cc[order][np.searchsorted(dd[order], d)]
        clusters = np.unique(cluster)
        have = location.parquet_file(part.docs).schema_arrow.names
        if attribute and attribute not in have:
            raise IndexMismatch(f"{part.docs}: member {part.member} holds no {attribute!r} of its documents (made "
                                f"with keep: first); a keeper policy ranking by {attribute} cannot compare with it")
        want = ["doc", "id"] + ([attribute] if attribute else [])
        if "keeper" in have:  # a keeper policy: the keeper may be another document than the cluster's head
            heads = _lookup_docs(part.docs, clusters, ["doc", "keeper"])
            hd, keeper = heads.column("doc").to_numpy(), heads.column("keeper").to_numpy()
            kt = _lookup_docs(part.docs, np.unique(keeper), want)
        else:  # keep: first: the head is the keeper (one lookup)
            kt = _lookup_docs(part.docs, clusters, want)
            hd = keeper = kt.column("doc").to_numpy()
        order = np.argsort(kt.column("doc").to_numpy())
        at = order[np.searchsorted(kt.column("doc").to_numpy()[order], keeper)]
        node = near_node(part.base, cluster)
        out_b.append(b)
        out_h.append(hh)
        out_n.append(node)
        cols = {"node": pa.array(near_node(part.base, hd), pa.int64()),
                "match": pc.binary_join_element_wise(pa.scalar(part.member + ":"),
                                                     kt.column("id").take(pa.array(at)), "")}
        if attribute:
            cols[attribute] = kt.column(attribute).take(pa.array(at))
        names.append(pa.table(cols))
        stats["matched_rows"] += int(len(d))
    if not out_b:
        empty = np.zeros(0, np.int64)
        cols = {"node": pa.array([], pa.int64()), "match": pa.array([], pa.string())}
        if attribute:
            from curation.dedup.keeper import attribute_type
            cols[attribute] = pa.array([], attribute_type({"date": "latest", "quality": "highest_quality",
                                                           "source": "source_rank"}[attribute]))
        return (np.zeros(0, np.int32), np.zeros(0, np.uint64), empty, pa.table(cols), stats)
    return (np.concatenate(out_b).astype(np.int32), np.concatenate(out_h), np.concatenate(out_n),
            pa.concat_tables(names), stats)


def _rows_in(rows: np.ndarray, table: np.ndarray) -> np.ndarray:
    """bool per row of ``rows`` (n x 2 uint64): whether it is a row of ``table`` (sorted unique)."""
    if not len(rows) or not len(table):
        return np.zeros(len(rows), dtype=bool)
    v = np.ascontiguousarray(rows).view([("a", np.uint64), ("b", np.uint64)]).ravel()
    t = np.ascontiguousarray(table).view([("a", np.uint64), ("b", np.uint64)]).ravel()
    i = np.searchsorted(t, v)
    i = np.minimum(i, len(t) - 1)
    return t[i] == v
