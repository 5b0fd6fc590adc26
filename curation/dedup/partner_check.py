"""The minhash stage's partner check, step 2, for one partition of clustered documents: each
removal verified against the members kept before it (``curation.dedup.partners``), the
components it changed written as (doc, cluster, kept) rows."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.dedup.minhash import shingle_sets
from curation.dedup.partners import partner_clusters
from curation.io.artifacts import read_partition, write_artifact

#: the partner check's (doc, cluster, kept) rows of the components it changed
_PARTNER_SCHEMA = pa.schema([("doc", pa.int64()), ("cluster", pa.int64()), ("kept", pa.bool_())])
_HIST_BINS = 20  # the partners' Jaccard histogram: bins of 0.05 over [0, 1]


@dataclass(frozen=True)
class PartnerJob:
    q: int
    files: tuple[str, ...]  # every block's partner_members file
    out: str
    header: dict
    ngram: int
    floor: float  # threshold - partner_slack


#: rows of one partner-check batch (whole components): bounds the shingle sets held at once
_PARTNER_BATCH = 8192


def partner_task(job: PartnerJob) -> dict:
    """Partner check, step 2, for one partition: its components' members in keeper order
    (best score, then smallest index: the keepers phase's order), each removal verified
    against the members kept before it (``curation.dedup.partners``); (doc, cluster, kept) of
    every member of a component the check changed go to ``out``, sorted by doc."""
    parts = [read_partition(f, job.q, job.header, columns=["component", "doc", "score", "text"]) for f in job.files]
    t = pa.concat_tables(parts) if parts else pa.table({"component": pa.array([], pa.int64())})
    stats = {"partition": job.q, "members": t.num_rows, "components": 0, "checked": 0, "rescued": 0,
             "components_split": 0, "jaccard_pairs": 0, "pruned_pairs": 0, "largest_component": 0,
             "most_kept_in_component": 0, "min_partner_jaccard": None, "hist": [0] * _HIST_BINS}
    out = []
    if t.num_rows:
        comp, doc = t.column("component").to_numpy(), t.column("doc").to_numpy()
        score = np.nan_to_num(t.column("score").to_numpy(zero_copy_only=False), nan=-np.inf)
        order = np.lexsort((doc, -score, comp))
        comp, doc, text = comp[order], doc[order], t.column("text").take(pa.array(order))
        starts = np.flatnonzero(np.r_[True, comp[1:] != comp[:-1]])
        sizes = np.diff(np.r_[starts, len(comp)])
        stats.update(components=int(len(starts)), checked=int(len(comp) - len(starts)),
                     largest_component=int(sizes.max()))
        cuts = [0]  # batches of whole components
        for s in starts.tolist():
            if s - cuts[-1] >= _PARTNER_BATCH:
                cuts.append(s)
        cuts.append(len(comp))
        for lo, hi in zip(cuts[:-1], cuts[1:]):
            c, d = comp[lo:hi], doc[lo:hi]
            res = partner_clusters(c, d, shingle_sets(text.slice(lo, hi - lo), job.ngram), job.floor)
            stats["jaccard_pairs"] += res.pairs
            stats["pruned_pairs"] += res.pruned
            stats["rescued"] += int(res.rescued.sum())
            removed = ~res.kept
            if removed.any():
                j = res.jaccard[removed]
                m = float(j.min())
                cur = stats["min_partner_jaccard"]
                stats["min_partner_jaccard"] = m if cur is None else min(cur, m)
                h = np.bincount(np.minimum((j * _HIST_BINS).astype(np.int64), _HIST_BINS - 1), minlength=_HIST_BINS)
                stats["hist"] = [a + int(b) for a, b in zip(stats["hist"], h)]
            changed = np.isin(c, np.unique(c[res.rescued]))
            if changed.any():
                kept_per = np.bincount(np.unique(c[changed], return_inverse=True)[1], weights=res.kept[changed])
                stats["components_split"] += int(len(kept_per))
                stats["most_kept_in_component"] = max(stats["most_kept_in_component"], int(kept_per.max()))
                out.append(pa.table({"doc": pa.array(d[changed], pa.int64()),
                                     "cluster": pa.array(res.cluster[changed], pa.int64()),
                                     "kept": pa.array(res.kept[changed], pa.bool_())}, schema=_PARTNER_SCHEMA))
        stats["most_kept_in_component"] = max(stats["most_kept_in_component"], 1)
    rows = pa.concat_tables(out) if out else _PARTNER_SCHEMA.empty_table()
    write_artifact(rows.take(pc.sort_indices(rows, [("doc", "ascending")])), job.out, job.header)
    return stats
