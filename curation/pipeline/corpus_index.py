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

from curation.dedup.index import CorpusIndex, IndexMismatch, build_exact, build_near
from curation.io import location
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
    m = idx.commit(member, exact_params, near_params)
    return {"added": True, "member": member, "generation": m["generation"],
            "seconds": round(time.perf_counter() - t0, 3)}


def _refuse(idx: CorpusIndex, kind: str, stages: dict) -> None:
    raise IndexMismatch(f"index {idx.root}: the run's {stages[kind].name} stage made its keys with other "
                        f"parameters than the index's {kind} side ({idx.manifest[kind]['params']})")


def add_run_dir(index_root: str, run_root: str, wanted: list[str], name: str | None = None) -> dict:
    rundir = RunDir(run_root)
    return add_run(index_root, rundir, stages_of(rundir, wanted), name)
