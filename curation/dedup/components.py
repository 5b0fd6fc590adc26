"""Connected components of a graph too large for one process: alternating large-star and
small-star rounds (Kiveris et al., "Connected Components in MapReduce and Beyond", SoCC 2014)
over hash-partitioned edge files, one Ray task per partition per round.

Nodes are int64 (document indexes). Every edge file lives under ``root``::

    root/s000/from-0007.parquet           edges sent by task 7 for step 0, sorted by receiving
                                          partition (row groups indexed by partition: each
                                          receiver reads only its own byte ranges); from step
                                          1 on, the sender's statistics are in its footer and
                                          the file (written even when empty) is the marker
                                          that the task finished
    root/labels/s004/part-0003.parquet    (node, component) of partition 3's nodes, written
                                          at a large-star step where partition 3 was stars
    root/labels/local.parquet             every label, when the rest of the graph was small
                                          enough for one task (``local_max_edges``)

Even steps are large-star inputs (every undirected edge present in both directions, each
direction in the partition of its source node); odd steps are small-star inputs (each edge
once, as (larger, smaller), in the larger node's partition). Step 0 is written by the caller
(``write_edges``), e.g. the candidate pairs of MinHash LSH.

- large-star(u): m = min(u, N(u)); link every larger neighbour v > u to m.
- small-star(u): m = min(u, N(u)) over the smaller neighbours; link u and every smaller
  neighbour to m.

The alternation converges in O(log² n) rounds to one star per component centred on the
component's minimum node. Each large-star task checks whether its nodes already look like
that (every node with a smaller neighbour has no other neighbour) and then writes their
labels (the minimum of the closed neighbourhood); when all partitions pass at the same step
the run stops. Near-duplicate graphs are mostly pairs and small stars, so this is often step
0. No task ever holds more than its partition's edges; a task that died leaves no output
file and is rerun, so a killed run resumes at the step it was in.

Once a step's input has at most ``local_max_edges`` edges (known from the senders' footers
before the step runs), one task reads them all and finishes with an in-memory connected
components (scipy's): a step costs a shuffle of P files, and a near-duplicate graph that
fits one worker's memory should not pay O(log² n) of them.
"""

from __future__ import annotations

import json
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pyarrow as pa

from curation.io import location
from curation.dedup.minhash import read_artifact, write_artifact
from curation.hashing import fmix64
from curation.io.artifacts import read_partition, write_partitioned

CC_ALGORITHM = "connected-components-large-small-star"
CC_VERSION = 3  # 2: one edge file per sender, indexed by receiving partition; 3: stats in footers, local finish

#: ``mapper(fn, items, phase) -> results in item order``: ``GlobalContext.map`` or a plain loop.
Mapper = Callable[[Callable[..., Any], list[tuple], str], list[Any]]

_EDGE_SCHEMA = pa.schema([pa.field("src", pa.int64()), pa.field("dst", pa.int64())])
#: footer key of a star task's edge file: the task's statistics (JSON)
STATS_KEY = b"refinery.cc_stats"


def node_partition(nodes: np.ndarray, partitions: int) -> np.ndarray:
    """Partition of each node: a hash of the node id, so consecutive documents (and the hub
    of a big component) spread over all partitions."""
    h = fmix64(np.asarray(nodes, dtype=np.int64).astype(np.uint64)) >> np.uint64(32)
    return ((h * np.uint64(partitions)) >> np.uint64(32)).astype(np.int64)


def edge_header(params: dict[str, Any]) -> dict[str, Any]:
    """Header of every edge and label file: the algorithm plus the caller's parameters."""
    return {"algorithm": CC_ALGORITHM, "version": CC_VERSION, "params": params}


def _step_dir(root: str, step: int) -> str:
    return location.join(root, f"s{step:03d}")


def _senders(step_dir: str) -> list[str]:
    """The edge files of a step (one per sender), sorted."""
    return location.listdir(step_dir, "from-*.parquet")


def _dedupe(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Unique (src, dst) pairs sorted by src then dst."""
    if len(src) == 0:
        return src, dst
    order = np.lexsort((dst, src))
    src, dst = src[order], dst[order]
    keep = np.r_[True, (src[1:] != src[:-1]) | (dst[1:] != dst[:-1])]
    return src[keep], dst[keep]


def write_edges(step_dir: str | Path, sender: int, src: np.ndarray, dst: np.ndarray, partitions: int,
                header: dict[str, Any], stats: dict[str, Any] | None = None) -> int:
    """Send directed edges to the partition of their ``src``: one file per sender, its rows
    grouped by receiving partition (so a step writes ``partitions`` files, not their square).
    With ``stats`` the file is written even without edges and carries them in its footer.
    Returns the number of edges written."""
    if len(src) == 0 and stats is None:
        return 0
    part = node_partition(src, partitions)
    order = np.argsort(part, kind="stable")
    t = pa.Table.from_arrays([pa.array(src[order], pa.int64()), pa.array(dst[order], pa.int64())], schema=_EDGE_SCHEMA)
    if stats is not None:
        t = t.replace_schema_metadata({STATS_KEY: json.dumps({**stats, "edges_out": int(len(src))}, sort_keys=True).encode()})
    write_partitioned(t, part[order], location.join(step_dir, f"from-{sender:04d}.parquet"), header)
    return int(len(src))


def read_edges(step_dir: str | Path, partition: int, header: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """All edges sent to ``partition`` for a step, header-checked: its row groups of every
    sender's file."""
    files = _senders(str(step_dir))
    tables = [t for t in (read_partition(f, partition, header) for f in files) if t.num_rows]
    if not tables:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    t = pa.concat_tables(tables)
    return (t.column("src").to_numpy().astype(np.int64, copy=False),
            t.column("dst").to_numpy().astype(np.int64, copy=False))


def symmetric(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both directions of undirected edges, self-loops dropped."""
    keep = a != b
    a, b = a[keep], b[keep]
    return np.concatenate([a, b]), np.concatenate([b, a])


# ---------------------------------------------------------------------------------------------
# the two star operations on one partition's edges (pure numpy)


def _groups(src: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    starts = np.flatnonzero(np.r_[True, src[1:] != src[:-1]])
    sizes = np.diff(np.r_[starts, len(src)])
    return starts, sizes


def large_star(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Large-star over deduped, src-sorted directed edges (both directions present).
    Returns undirected edges as (smaller, larger)."""
    if len(src) == 0:
        return src, dst
    starts, sizes = _groups(src)
    m = np.minimum(src[starts], np.minimum.reduceat(dst, starts))
    m_e = np.repeat(m, sizes)
    sel = dst > src
    return m_e[sel], dst[sel]


def small_star(src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Small-star over deduped, src-sorted edges (src, dst) with dst < src. Returns
    undirected edges as (smaller, larger), self-loops removed."""
    if len(src) == 0:
        return src, dst
    starts, sizes = _groups(src)
    m = np.minimum.reduceat(dst, starts)  # every dst < src: m is the closed neighbourhood's min
    m_e = np.repeat(m, sizes)
    leaf = dst != m_e
    a = np.concatenate([m_e[leaf], m])
    b = np.concatenate([dst[leaf], src[starts]])
    return a, b


# ---------------------------------------------------------------------------------------------
# Ray tasks


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _labels_dir(root: str, step: int) -> str:
    return location.join(root, "labels", f"s{step:03d}")


def star_task(root: str, step: int, partition: int, partitions: int, header: dict[str, Any]) -> dict:
    """One partition of one step: large-star on even steps, small-star on odd ones. Writes
    the next step's edges and a ``_done`` marker with statistics.

    A large-star input in which every node that has a smaller neighbour has exactly one
    neighbour is a forest of stars centred on their minimum (the fixpoint). Each large-star
    task checks that for its nodes (``star``) and, when it holds, also writes its nodes'
    labels: once every partition holds it, the driver stops and those labels are final.
    """
    t0 = time.perf_counter()
    root_p = str(root)
    src, dst = _dedupe(*read_edges(_step_dir(root_p, step), partition, header))
    stats: dict[str, Any] = {"step": step, "partition": partition, "edges_in": int(len(src))}
    nxt = _step_dir(root_p, step + 1)
    if step % 2 == 0:
        if len(src):
            starts, sizes = _groups(src)
            nodes = src[starts]
            m = np.minimum(nodes, np.minimum.reduceat(dst, starts))
            star = not bool(np.any((m < nodes) & (sizes != 1)))
        else:
            nodes = m = src
            star = True
        if star:
            t = pa.Table.from_arrays([pa.array(nodes, pa.int64()), pa.array(m, pa.int64())],
                                     names=["node", "component"])
            write_artifact(t, location.join(_labels_dir(root_p, step), f"part-{partition:04d}.parquet"), header)
        stats["star"] = star
        a, b = large_star(src, dst)
        a, b = b, a  # keyed by the larger node
    else:
        a, b = symmetric(*small_star(src, dst))
    stats.update(edges_out=int(len(a)), seconds=time.perf_counter() - t0, rss_mb=_rss_mb())
    write_edges(nxt, partition, a, b, partitions, header, stats)  # the file is the done marker
    return stats


def local_task(root: str, step: int, header: dict[str, Any]) -> dict:
    """The rest of the graph in one task: every edge of step ``step``, components by scipy,
    one label file (node, component = the component's smallest node), sorted by node."""
    from scipy.sparse import coo_matrix  # noqa: PLC0415 (only this task needs scipy)
    from scipy.sparse.csgraph import connected_components as scipy_components  # noqa: PLC0415

    t0 = time.perf_counter()
    files = _senders(_step_dir(str(root), step))
    src, dst = [], []
    for f in files:
        t = read_artifact(f, header)
        src.append(t.column("src").to_numpy().astype(np.int64, copy=False))
        dst.append(t.column("dst").to_numpy().astype(np.int64, copy=False))
    a = np.concatenate(src) if src else np.zeros(0, np.int64)
    b = np.concatenate(dst) if dst else np.zeros(0, np.int64)
    nodes, inv = np.unique(np.concatenate([a, b]), return_inverse=True)
    n = len(nodes)
    comp = np.zeros(0, np.int64)
    if n:
        graph = coo_matrix((np.ones(len(a), np.int8), (inv[:len(a)], inv[len(a):])), shape=(n, n))
        comp = scipy_components(graph, directed=False)[1]
    smallest = np.full(int(comp.max()) + 1 if n else 0, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(smallest, comp, nodes)  # nodes ascend, so this is each component's minimum
    t = pa.Table.from_arrays([pa.array(nodes, pa.int64()), pa.array(smallest[comp], pa.int64())], names=["node", "component"])
    write_artifact(t, _local_labels(str(root)), header)
    return {"step": step, "kind": "local", "edges_in": int(len(a)), "nodes": int(n),
            "seconds": time.perf_counter() - t0, "rss_mb": _rss_mb()}


def _local_labels(root: str) -> str:
    return location.join(root, "labels", "local.parquet")


# ---------------------------------------------------------------------------------------------
# the driver


@dataclass
class ComponentsResult:
    """What a run of ``connected_components`` did."""

    steps: int = 0  # star steps run (large and small); the labels come from the last one
    label_files: list[str] = field(default_factory=list)
    max_task_edges: int = 0  # largest edge set any one task held
    input_edges: int = 0  # directed edges of step 0 (each undirected edge twice)
    max_rss_mb: float = 0.0
    seconds: float = 0.0
    per_step: list[dict] = field(default_factory=list)


def _done_stats(step_dir: str, partitions: int) -> dict[int, dict]:
    """The statistics of the star tasks that finished the step writing into ``step_dir``."""
    out = {}
    present = set(_senders(step_dir))  # one listing, not one request per partition
    for q in range(partitions):
        f = location.join(step_dir, f"from-{q:04d}.parquet")
        if f in present:
            raw = (location.read_schema(f).metadata or {}).get(STATS_KEY)
            if raw is not None:
                out[q] = json.loads(raw)
    return out


def _input_edges(root: str, step: int, partitions: int) -> int:
    """Edges a step reads: step 0's from the caller's file footers, later steps' from the
    statistics the previous step's tasks wrote."""
    if step == 0:
        return sum(location.parquet_file(f).metadata.num_rows for f in _senders(_step_dir(root, 0)))
    return sum(s["edges_out"] for s in _done_stats(_step_dir(root, step), partitions).values())


def connected_components(mapper: Mapper, root: str | Path, partitions: int, header: dict[str, Any],
                         max_steps: int = 200, phase: str = "components", local_max_edges: int = 0) -> ComponentsResult:
    """Label every node of the graph whose step-0 edges are under ``root``.

    ``mapper`` runs the per-partition tasks (``GlobalContext.map`` for Ray); steps whose
    tasks already wrote their files are not redone, so a killed run resumes at its last step.
    A step whose input has at most ``local_max_edges`` edges is finished by one task.
    """
    t0 = time.perf_counter()
    root = str(root).rstrip("/")
    res = ComponentsResult()
    step = 0
    while True:
        if step >= max_steps:
            raise RuntimeError(f"connected components did not converge in {max_steps} steps")
        edges = _input_edges(root, step, partitions)
        if step == 0:
            res.input_edges = edges
        if edges <= local_max_edges:
            local = _local_labels(root)
            if not location.exists(local):
                st = mapper(local_task, [(root, step, header)], f"{phase}:local")[0]
                res.max_rss_mb = max(res.max_rss_mb, st["rss_mb"])
            res.max_task_edges = max(res.max_task_edges, edges)
            res.per_step.append({"step": step, "kind": "local", "edges_in": edges, "max_task_edges": edges})
            res.steps = step + 1
            res.label_files = [local]
            res.seconds = time.perf_counter() - t0
            return res
        have = _done_stats(_step_dir(root, step + 1), partitions)
        # a partition that passed as stars must still have its labels (else redo it)
        have = {q: st for q, st in have.items()
                if not st.get("star") or location.exists(location.join(_labels_dir(root, step), f"part-{q:04d}.parquet"))}
        todo = [(root, step, q, partitions, header) for q in range(partitions) if q not in have]
        for st in mapper(star_task, todo, f"{phase}:step{step}"):
            have[st["partition"]] = st
        stats = [have[q] for q in range(partitions)]
        edges_in = sum(s["edges_in"] for s in stats)
        res.max_task_edges = max(res.max_task_edges, max(s["edges_in"] for s in stats))
        res.max_rss_mb = max(res.max_rss_mb, max(s.get("rss_mb", 0.0) for s in stats))
        res.per_step.append({"step": step, "kind": "large" if step % 2 == 0 else "small", "edges_in": edges_in,
                             "max_task_edges": max(s["edges_in"] for s in stats)})
        if step % 2 == 0 and all(s["star"] for s in stats):
            break  # every partition is a star forest: the labels written at this step are final
        step += 1
    res.steps = step + 1
    res.label_files = [location.join(_labels_dir(root, step), f"part-{q:04d}.parquet") for q in range(partitions)]
    res.seconds = time.perf_counter() - t0
    return res


def read_labels(label_files: list[str], header: dict[str, Any], lo: int | None = None,
                hi: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(node, component) of the nodes in ``[lo, hi)`` (all when omitted), sorted by node.
    Nodes without any edge are absent: they are their own component."""
    filters = None
    if lo is not None and hi is not None:
        filters = [("node", ">=", int(lo)), ("node", "<", int(hi))]
    nodes, comps = [], []
    for f in label_files:
        if not location.exists(f):
            continue
        t = read_artifact(f, header, filters=filters)
        nodes.append(t.column("node").to_numpy())
        comps.append(t.column("component").to_numpy())
    if not nodes:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    n, c = np.concatenate(nodes).astype(np.int64), np.concatenate(comps).astype(np.int64)
    order = np.argsort(n, kind="stable")
    return n[order], c[order]
