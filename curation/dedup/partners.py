"""Near-duplicate removals with a partner: after connected components, every document a
cluster would remove is checked against the documents the cluster keeps, in exact shingle
Jaccard, so that no removal rests on a chain of links alone (A~B and B~C put A and C in one
component although A and C may share nothing).

The rule (``partner_clusters``), per component, members in keeper order (the keeper policy's
order: best score, then smallest index; with ``keep: first`` the index order):

- the first member (the component's keeper) is kept;
- each next member is compared with every member kept so far; if its best exact Jaccard
  reaches ``floor`` (``threshold - slack``) it is removed, its partner being that best kept
  member; otherwise it is kept too (*rescued*) and later members may be removed against it.

So every removal has a kept partner at Jaccard >= ``floor`` in its own component, by
construction, and a component that needs no rescue is decided exactly as without the check.
The rescued members split the component into sub-clusters (each kept member and the
removals whose partner it is), each named by its smallest document index: a component with
no rescue keeps its name (its smallest index), and with ``keep: first`` a sub-cluster's name
is its kept member, as a component's is.

Cost: one Jaccard per (member, kept member so far) pair whose sizes allow the floor
(``min/max`` of the two shingle counts bounds their Jaccard); a component of mutually far
documents costs the square of its kept members. No Ray, no run directory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class PartnerResult:
    """Per input row (same order): ``kept``, ``cluster`` (the sub-cluster's name, a document
    index), ``partner`` (the kept member a removal was matched to; the row's own doc for a
    kept one) and ``jaccard`` (a removal's to its partner; 1.0 for a component's keeper; a
    rescued member's best to the members kept before it, below the floor); plus counts."""

    kept: np.ndarray
    cluster: np.ndarray
    partner: np.ndarray
    jaccard: np.ndarray
    rescued: np.ndarray  # kept although not its component's keeper
    pairs: int = 0  # exact Jaccards computed
    pruned: int = 0  # pairs skipped because their sizes cannot reach the floor


def _inter(a: np.ndarray, b: np.ndarray) -> int:
    """Size of the intersection of two sorted unique arrays."""
    if len(a) > len(b):
        a, b = b, a
    if not len(a):
        return 0
    pos = np.searchsorted(b, a)
    pos[pos == len(b)] = 0
    return int(np.count_nonzero(b[pos] == a))


def partner_clusters(comp: np.ndarray, doc: np.ndarray, sets: list[np.ndarray], floor: float) -> PartnerResult:
    """The rule of the module docstring over rows sorted by component, then keeper order
    (``comp`` int64, ``doc`` int64, ``sets[i]`` the sorted unique shingle hashes of row i)."""
    n = len(doc)
    kept = np.zeros(n, dtype=bool)
    group = np.arange(n, dtype=np.int64)  # row of the kept member each row belongs to
    partner = np.asarray(doc, dtype=np.int64).copy()
    jac = np.ones(n, dtype=np.float64)
    rescued = np.zeros(n, dtype=bool)
    sizes = np.fromiter((len(s) for s in sets), dtype=np.int64, count=n)
    pairs = pruned = 0
    starts = np.flatnonzero(np.r_[True, comp[1:] != comp[:-1]]) if n else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], n].astype(np.int64)
    for s, e in zip(starts.tolist(), ends.tolist()):
        leaders = [s]
        kept[s] = True
        for i in range(s + 1, e):
            best, best_j = -1, -1.0
            a, na = sets[i], int(sizes[i])
            for L in leaders:
                nb = int(sizes[L])
                hi, lo = max(na, nb), min(na, nb)
                bound = 1.0 if hi == 0 else lo / hi  # Jaccard <= min/max of the sizes
                if bound < floor or bound <= best_j:
                    pruned += 1
                    continue
                pairs += 1
                x = _inter(a, sets[L])
                union = na + nb - x
                j = 1.0 if union == 0 else x / union
                if j > best_j:
                    best, best_j = L, j
            if best >= 0 and best_j >= floor:
                group[i] = best
                partner[i] = doc[best]
                jac[i] = best_j
            else:
                kept[i] = rescued[i] = True
                leaders.append(i)
                jac[i] = max(best_j, 0.0)
    # each sub-cluster is named by its smallest document index
    cluster = np.asarray(doc, dtype=np.int64).copy()
    if n:
        order = np.lexsort((doc, group))
        g = group[order]
        head = np.r_[True, g[1:] != g[:-1]]
        name = doc[order][head][np.cumsum(head) - 1]
        cluster[order] = name
    return PartnerResult(kept, cluster, partner, jac, rescued, pairs, pruned)
