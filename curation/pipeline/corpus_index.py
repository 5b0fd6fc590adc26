"""``refinery index build|add``: a run's dedup stages into a corpus index (``curation.dedup.index``),
from what the stages persisted (exact keys and Bloom filters, LSH bucket and docs files): no
text is read. The run directory's layout stays here and in ``RunDir``; the index's in
``curation.dedup.index``.

A member is identified by the content of its stages (their params hashes and the sha256 of
every committed shard), so adding the same run twice, or a copy of it, is a no-op. Its files
are written under ``INDEX/members/NAME-IDENT/`` first and the manifest naming them is committed
last, in one atomic write: a crash in between leaves the index as it was (the orphan files are
rewritten by the next add).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from curation.dedup.index import CorpusIndex, IndexMismatch, build_exact, build_near
from curation.dedup.keeper import SUPERSEDED_DIR, SUPERSEDED_SCHEMA
from curation.io import files, location
from curation.pipeline.rundir import RunDir

KINDS = {"exact": "exact_dedup", "near": "minhash_dedup"}


@dataclass(frozen=True)
class IndexedStage:
    """A finished dedup stage of a run: its name (folder), the stage and its params hash."""

    name: str
    stage: Any
    params_hash: str


def stages_of(rundir: RunDir, wanted: list[str]) -> dict[str, IndexedStage]:
    """The run's dedup stages for ``wanted`` items: a kind (``exact``/``near``: the DAG's one stage
    of that type) or a stage name."""
    dag = rundir.load_dag()
    hashes = dag.hashes()
    out: dict[str, IndexedStage] = {}
    for w in wanted:
        if w in dag.stages:
            st = dag.stages[w]
            kind = next((k for k, t in KINDS.items() if st.type == t), None)
            if kind is None:
                raise ValueError(f"{w}: a {st.type} stage; an index holds exact_dedup and minhash_dedup stages")
            out[kind] = IndexedStage(w, st, hashes[w])
            continue
        if w not in KINDS:
            raise ValueError(f"{w}: neither a stage of {rundir.root} nor one of {sorted(KINDS)}")
        found = [n for n, st in dag.stages.items() if st.type == KINDS[w]]
        if len(found) != 1:
            raise ValueError(f"{rundir.root}: {len(found)} {KINDS[w]} stages ({found}); name the one to index "
                             f"(--stages STAGE,...)")
        out[w] = IndexedStage(found[0], dag.stages[found[0]], hashes[found[0]])
    return out


def _identity(rundir: RunDir, stages: dict[str, IndexedStage]) -> str:
    h = hashlib.sha256()
    for kind in sorted(stages):
        s = stages[kind]
        committed = rundir.committed(s.name, s.params_hash)
        h.update(json.dumps([kind, s.params_hash, sorted((k, e.get("sha256"), e.get("rejected_sha256"))
                                                         for k, e in committed.items())]).encode())
    return h.hexdigest()[:12]


def add_run(index_root: str, rundir: RunDir, stages: dict[str, IndexedStage], name: str | None = None) -> dict:
    """Add a run's finished dedup stages to the index at ``index_root`` (created if absent).
    Returns {added: bool, member: {...}, generation}."""
    idx = CorpusIndex(index_root)
    name = name or location.name(rundir.root)
    if not name or any(c in name for c in "/:"):
        raise ValueError(f"{name!r}: a member name may not contain '/' or ':' (it names matches as NAME:ID)")
    for kind, s in stages.items():
        report = "_bloom_report.json" if kind == "exact" else "_minhash_report.json"
        if rundir.read_report(s.name, report) is None:
            raise ValueError(f"{rundir.stage_dir(s.name)}: the {s.name} stage has not finished (no {report})")
    ident = _identity(rundir, stages)
    have = idx.find(ident)
    if have is not None:
        return {"added": False, "member": have, "generation": idx.manifest["generation"]}
    if any(m["name"] == name for m in idx.members):
        raise IndexMismatch(f"index {index_root} already has a member {name!r} made from other data; "
                            "choose another --name")
    exact_params = near_params = None
    if "exact" in stages and idx.manifest.get("exact") and \
            stages["exact"].stage.index_params() != idx.manifest["exact"]["params"]:
        _refuse(idx, "exact", stages)
    t0 = time.perf_counter()
    member: dict[str, Any] = {"name": name, "ident": ident, "dir": f"members/{name}-{ident}", "run": rundir.root}
    out = location.join(index_root, member["dir"])
    if "exact" in stages:
        s = stages["exact"]
        exact_params = s.stage.index_params()
        d = rundir.stage_dir(s.name)
        member["exact"] = {"stage": s.name, "params_hash": s.params_hash, "partitions": s.stage.partitions,
                           **build_exact(location.join(d, "_keys"), location.join(d, "_bloom"), s.stage.partitions,
                                         location.join(out, "exact"), s.stage.bloom.false_positive_rate)}
    if "near" in stages:
        s = stages["near"]
        lsh = location.join(rundir.stage_dir(s.name), "_lsh", s.params_hash)
        if not location.exists(location.join(lsh, "meta.json")):
            raise FileNotFoundError(f"{lsh}: the minhash_dedup stage did not persist its LSH state (a run made "
                                    "before the corpus index; rerun the stage)")
        meta = json.loads(location.read_text(location.join(lsh, "meta.json")))
        near_params = meta["index_params"]
        if idx.manifest.get("near") and idx.manifest["near"]["params"] != near_params:
            _refuse(idx, "near", stages)
        member["near"] = {"stage": s.name, "params_hash": s.params_hash,
                          **build_near(lsh, location.join(out, "near"))}
    sup = _superseded(rundir, stages)
    if sup.num_rows:
        files.write_parquet(sup, location.join(out, "superseded.parquet"))
    member["superseded"] = sup.num_rows
    m = idx.commit(member, exact_params, near_params)
    return {"added": True, "member": member, "generation": m["generation"],
            "seconds": round(time.perf_counter() - t0, 3)}


def _refuse(idx: CorpusIndex, kind: str, stages: dict) -> None:
    raise IndexMismatch(f"index {idx.root}: the run's {stages[kind].name} stage made its keys with other "
                        f"parameters than the index's {kind} side ({idx.manifest[kind]['params']})")


def add_run_dir(index_root: str, run_root: str, wanted: list[str], name: str | None = None) -> dict:
    rundir = RunDir(run_root)
    return add_run(index_root, rundir, stages_of(rundir, wanted), name)


def _superseded(rundir: RunDir, stages: dict[str, IndexedStage]) -> pa.Table:
    """The run's superseded tables (indexed documents its keeper policy replaced), all stages,
    sorted by (member, id, by, stage), a (member, id, by) listed by two stages once."""
    parts = []
    for s in stages.values():
        d = location.join(rundir.stage_dir(s.name), SUPERSEDED_DIR)
        for f in sorted(location.files_under(d)) if location.exists(d) else []:
            if f.endswith(".parquet"):
                parts.append(location.read_parquet(f).select(SUPERSEDED_SCHEMA.names).cast(SUPERSEDED_SCHEMA))
    t = pa.concat_tables(parts) if parts else SUPERSEDED_SCHEMA.empty_table()
    t = t.take(pc.sort_indices(t, [(c, "ascending") for c in ("member", "id", "by", "stage")]))
    if t.num_rows > 1:  # a document both stages replaced (an exact copy is near too): listed once
        k = [t.column(c).to_pylist() for c in ("member", "id", "by")]
        first = [True] + [any(col[j] != col[j - 1] for col in k) for j in range(1, t.num_rows)]
        t = t.filter(pa.array(first))
    return t


def superseded(index_root: str, member: str | None = None) -> pa.Table:
    """Every member's superseded rows (``member``: only those replacing documents of that member)."""
    idx = CorpusIndex(index_root)
    parts = [location.read_parquet(location.join(idx.member_dir(m), "superseded.parquet"))
             for m in idx.members if m.get("superseded")]
    t = pa.concat_tables(parts) if parts else SUPERSEDED_SCHEMA.empty_table()
    if member is not None:
        t = t.filter(pc.equal(t.column("member"), member))
    return t


def shard_files(inputs: list[str]) -> list[str]:
    """Parquet shards named by ``inputs``: files, or folders (their top-level ``*.parquet``)."""
    out = []
    for x in inputs:
        if x.endswith(".parquet"):
            out.append(x)
        else:
            out += sorted(f for f in location.files_under(x) if f.endswith(".parquet")
                          and location.parent(f).rstrip("/") == str(x).rstrip("/"))
    return out


def apply_superseded(index_root: str, inputs: list[str], out: str, member: str | None = None) -> dict:
    """Copies of the old shards ``inputs`` without the documents the index lists as superseded
    (``member``: only those of that member), written to ``out`` under the same file names;
    the old shards are not changed. Returns {files, rows, removed, superseded}."""
    ids = superseded(index_root, member).column("id")
    paths = shard_files(inputs)
    if not paths:
        raise ValueError(f"{inputs}: no Parquet shards")
    outs = [location.join(out, location.name(p)) for p in paths]
    if len(set(outs)) != len(outs):
        raise ValueError("two input shards have the same file name; apply them to separate --out folders")
    if any(o == p for o, p in zip(outs, paths)):
        raise ValueError(f"{out}: the input's own folder; old shards are not rewritten in place (choose another --out)")
    want = pc.unique(ids)
    report = {"index": index_root, "generation": CorpusIndex(index_root).manifest["generation"], "member": member,
              "superseded": len(want), "files": []}
    for p, o in zip(paths, outs):
        t = location.read_parquet(p)
        gone = pc.is_in(t.column("id").cast(pa.string()), value_set=want)
        kept = t.filter(pc.invert(gone))
        with files.atomic_path(o) as tmp:
            pq.write_table(kept, tmp, compression="zstd")
        report["files"].append({"file": location.name(p), "rows": t.num_rows, "removed": t.num_rows - kept.num_rows})
    report["rows"] = sum(f["rows"] for f in report["files"])
    report["removed"] = sum(f["removed"] for f in report["files"])
    files.write_json(location.join(out, "_superseded_applied.json"), report)
    return report
