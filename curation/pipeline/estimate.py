"""What a DAG will read and cost, before it runs (``refinery plan DAG``).

Each input is planned as the run would plan it (``make_plan``'s ``plan_input``: globs expanded,
files cut into shards; a ``cc_index`` input's records selected from its index, the ``where``
checked and pushed into the scan), and nothing else is read: for a ``cc_index`` input the
records and bytes it will read, in total and per WARC file, and the projected core-hours of
the run at a measured rate (documents per second per core of the whole DAG); for a file input
its files, bytes and shards.

The default rate is the web DAG's (extract -> langid -> Gopher -> C4 -> FineWeb -> exact ->
near, ``format: text``) as ``tests/benchmarks/bench_scale.py``'s cost line measured it (4,488
core-hours for a 90,000-WARC snapshot of 3.96e9 responses): ``bench_scale.py --index`` measured
a document read from an index selection at the same cost as one of a full scan (13.70 against
13.68 ms of the whole DAG a document: the ranged read costs what the full scan's read of a
response does), so the full scan's rate prices a selection's documents. ``--docs-per-core-s``
gives another (your DAG, your cores).
"""

from __future__ import annotations

from curation.io.inputs import InputError, plan_index, plan_input
from curation.io.sql_where import unpushed
from curation.pipeline.dag import Dag

#: documents per second per core of the web DAG (bench_scale.py's cost line: 3.96e9 responses
#: in 4,488 core-hours)
DEFAULT_DOCS_PER_CORE_S = 245.0


def estimate(dag: Dag, docs_per_core_s: float = DEFAULT_DOCS_PER_CORE_S) -> dict:
    """Per input, what the run will read (and for index inputs, cost); raises ``InputError``
    as ``refinery run`` would (a glob matching nothing, a where naming an unknown column)."""
    out: dict = {"dag": dag.name, "docs_per_core_s": docs_per_core_s, "inputs": {}}
    for name, spec in dag.inputs.items():
        if spec.format == "run":
            out["inputs"][name] = {"format": "run", "note": "another run's committed shards (read through its manifest)"}
            continue
        if spec.format == "cc_index":
            p = plan_index(name, spec, dag.base_dir, rows=False)  # counted, not written
            sc = p.scan
            files = sorted(p.files.items(), key=lambda kv: (-kv[1][1], kv[0]))
            out["inputs"][name] = {
                "format": "cc_index", "where": spec.where, "records": p.records, "bytes": p.bytes,
                "warc_files": len(p.files), "tasks": len(p.shards),
                "bytes_per_record": p.bytes / p.records if p.records else 0.0,
                "index": {"files": sc.index_files, "bytes": sc.index_bytes, "bytes_read": sc.bytes_read,
                          "seconds": round(sc.seconds, 3), "duplicates": sc.duplicates, "query": sc.query,
                          # conjuncts no row-group statistics rule out: their columns read in every row group
                          "not_pushed": unpushed(spec.where) if spec.where else []},
                "core_hours": p.records / docs_per_core_s / 3600 if docs_per_core_s > 0 else None,
                "per_file": [{"warc_filename": f, "records": r, "bytes": b} for f, (r, b) in files],
            }
            continue
        shards = plan_input(name, spec, dag.base_dir)
        paths = {s.path: s.size for s in shards}
        out["inputs"][name] = {"format": spec.format, "files": len(paths), "bytes": sum(paths.values()),
                               "tasks": len(shards)}
    idx = [v for v in out["inputs"].values() if v.get("format") == "cc_index"]
    if idx:
        out["total"] = {"records": sum(v["records"] for v in idx), "bytes": sum(v["bytes"] for v in idx),
                        "core_hours": sum(v["core_hours"] or 0 for v in idx)}
    return out


__all__ = ["DEFAULT_DOCS_PER_CORE_S", "InputError", "estimate"]
