"""A corpus index (issue 31): snapshot A deduplicated and indexed (``refinery index build``,
reading no text), snapshot B deduplicated ``against`` it: B's exact and near copies of A's
documents are rejected naming the member and A's id, B's unique documents are all kept, and the
corpus A + B equals deduplicating both from scratch. ``index add`` is idempotent and atomic. The
same bytes (shards, manifests, index files) with 1, 2, 3, 4 and 8 workers, and after a run killed
with 2 workers and resumed with 4 (and on a two-node cluster: tests/test_cluster.py)."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from typer.testing import CliRunner

import curation.stages  # noqa: F401
from conftest import DATA
from curation.cli import app
from curation.dedup.index import CorpusIndex, IndexMismatch
from curation.pipeline import corpus_index
from curation.pipeline.context import GlobalContext
from curation.pipeline.dag import parse_dag
from curation.pipeline.executor import run_dag
from curation.pipeline.stats import connect

DEDUP = DATA / "dedup"


def _jsonl(name: str) -> list[dict]:
    with gzip.open(DEDUP / name, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _snapshots() -> tuple[list[dict], list[dict], dict]:
    """A: 100 real documents and near copies of some of them. B: 50 other real documents
    (unique), verbatim and spacing/case copies of A's documents, near copies of A's and of
    B's own documents. Returns A, B and what B's documents are (kind per id)."""
    base = _jsonl("dclm_docs_150.jsonl.gz")
    near = _jsonl("near_dups.jsonl.gz")
    a_ids = {d["id"] for d in base[:100]}
    A = [{"id": "a-" + d["id"], "text": d["text"]} for d in base[:100]]
    A += [{"id": f"a-near-{i:03d}", "text": d["text"]} for i, d in enumerate(near) if d["origin"] in a_ids][:40]
    B, kind = [], {}
    for d in base[100:]:
        B.append({"id": "b-" + d["id"], "text": d["text"]})
        kind[B[-1]["id"]] = "unique"
    for i, d in enumerate(base[:30]):
        text = d["text"] if i % 2 else "  " + d["text"].upper().replace(" ", "   ") + "\n"
        B.append({"id": f"b-exact-{i:03d}", "text": text})
        kind[B[-1]["id"]] = "exact_of_a"
    a_near = [d for d in near if d["origin"] in a_ids][40:70]
    for i, d in enumerate(a_near):
        B.append({"id": f"b-near-{i:03d}", "text": d["text"]})
        kind[B[-1]["id"]] = "near_of_a"
    for i, d in enumerate(base[100:120]):  # a word or two changed in B's own documents
        B.append({"id": f"b-self-{i:03d}", "text": d["text"].replace(" the ", " a ", 2)})
        kind[B[-1]["id"]] = "near_of_b"
    return A, B, kind


def _write(path: Path, docs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d) + "\n")


def _dag(paths: list[str], against: list[str] | None = None, name: str = "snap"):
    d = {"name": name,
         "inputs": {"docs": {"format": "jsonl", "paths": paths, "source": "web", "id_field": "id", "split_bytes": 60000}},
         "stages": {"exact": {"type": "exact_dedup", "input": "docs", "partitions": 4,
                              "bloom": {"expected_items": 10_000, "false_positive_rate": 1e-6}},
                    "near": {"type": "minhash_dedup", "input": "exact", "partitions": 4}},
         "output": "near"}
    if against:
        d["stages"]["exact"]["against"] = list(against)
        d["stages"]["near"]["against"] = list(against)
    return parse_dag(yaml.safe_load(yaml.safe_dump(d)), "snap.yaml")


def _digests(root: Path) -> dict[str, str]:
    """Shards, rejected shards, manifests and the stages' persisted keys / LSH state."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "_work" not in p.parts
            and (p.suffix in (".parquet", ".bloom") or p.name == "_manifest.jsonl")}


def _index_digests(root: Path) -> dict[str, str]:
    out = {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
           for p in sorted((root / "members").rglob("*")) if p.is_file()}
    m = json.loads((root / "_index.json").read_text())
    for mem in m["members"]:
        mem.pop("run")
    out["_index.json"] = hashlib.sha256(json.dumps(m, sort_keys=True).encode()).hexdigest()
    return out


def _ids(run: Path, sql: str) -> dict:
    """{id: value} of a query, ids and values without the input's ``docs/`` prefix."""
    strip = lambda x: x.replace("docs/", "") if isinstance(x, str) else x  # noqa: E731
    return {strip(k): strip(v) for k, v in connect(run).execute(sql).fetchall()}


@pytest.fixture(scope="module")
def snaps(tmp_path_factory, ray_session):
    root = tmp_path_factory.mktemp("idx")
    A, B, kind = _snapshots()
    _write(root / "in" / "a.jsonl.gz", A)
    _write(root / "in" / "b.jsonl.gz", B)
    run_dag(_dag([str(root / "in" / "a.jsonl.gz")]), root / "cc-a", workers=2, quiet=True)
    res = CliRunner().invoke(app, ["index", "build", str(root / "cc-a"), "--stages", "exact,near",
                                   "--out", str(root / "index")])
    assert res.exit_code == 0, res.output
    run_dag(_dag([str(root / "in" / "b.jsonl.gz")], [str(root / "index")]), root / "cc-b", workers=2, quiet=True)
    return root, A, B, kind


def test_new_snapshot_against_the_index(snaps):
    root, A, B, kind = snaps
    idx = CorpusIndex(str(root / "index"))
    assert idx.manifest["generation"] == 1 and [m["name"] for m in idx.members] == ["cc-a"]
    near_side = idx.members[0]["near"]
    assert near_side["docs"] == near_side["indexed_docs"] > 100
    assert idx.members[0]["exact"]["keys"] == len({d["text"] for d in A})  # A had no exact copies
    # every rejected row of B and its reason
    reasons = _ids(root / "cc-b", "select id, reason from rejected")
    kept = set(_ids(root / "cc-b", "select id, 1 from near"))
    a_kept = set(_ids(root / "cc-a", "select id, 1 from near"))
    for i, k in kind.items():
        if k == "unique":
            assert i in kept, i  # no unique document dropped
        elif k == "exact_of_a":
            # the A survivor with the same text is named
            assert reasons[i].startswith("exact_dedup:in_index=cc-a:a-"), (i, reasons.get(i))
    exact_named = {reasons[i].split("cc-a:")[1] for i, k in kind.items() if k == "exact_of_a"}
    assert exact_named <= {d["id"] for d in A}
    near_of_a = [i for i, k in kind.items() if k == "near_of_a"]
    found = [i for i in near_of_a if reasons.get(i, "").startswith("minhash_dedup:cluster=cc-a:")]
    assert len(found) >= len(near_of_a) // 2, (len(found), len(near_of_a))  # recall vs one run: next test
    assert {reasons[i].split("cc-a:")[1] for i in found} <= a_kept  # named by A's keeper
    assert any(reasons.get(i, "").startswith("minhash_dedup:cluster=") and "cc-a" not in reasons[i]
               for i, k in kind.items() if k == "near_of_b")  # new vs new: as in one run
    rep = json.loads((root / "cc-b" / "exact" / "_bloom_report.json").read_text())
    assert rep["index_duplicates"] == sum(r.startswith("exact_dedup:in_index=") for r in reasons.values()) >= 30


def test_incremental_equals_from_scratch(snaps, tmp_path):
    root, A, B, kind = snaps
    run_dag(_dag([str(root / "in" / "a.jsonl.gz"), str(root / "in" / "b.jsonl.gz")]), tmp_path / "all",
            workers=2, quiet=True)
    scratch = set(_ids(tmp_path / "all", "select id, 1 from near"))
    incremental = set(_ids(root / "cc-a", "select id, 1 from near")) | set(_ids(root / "cc-b", "select id, 1 from near"))
    assert incremental == scratch


def test_add_is_idempotent_and_atomic(snaps, tmp_path, monkeypatch):
    root, A, B, kind = snaps
    import shutil

    index = tmp_path / "index"
    shutil.copytree(root / "index", index)
    before = (index / "_index.json").read_bytes()

    def crash(*a, **k):
        raise OSError("killed mid-append")

    monkeypatch.setattr(CorpusIndex, "commit", crash)
    with pytest.raises(OSError):
        corpus_index.add_run_dir(str(index), str(root / "cc-b"), ["exact", "near"])
    assert (index / "_index.json").read_bytes() == before  # as it was
    assert CorpusIndex(str(index)).manifest["generation"] == 1
    monkeypatch.undo()
    res = CliRunner().invoke(app, ["index", "add", str(index), str(root / "cc-b")])
    assert res.exit_code == 0 and "added" in res.output, res.output
    m = CorpusIndex(str(index)).manifest
    assert m["generation"] == 2 and [x["name"] for x in m["members"]] == ["cc-a", "cc-b"]
    again = CliRunner().invoke(app, ["index", "add", str(index), str(root / "cc-b")])
    assert again.exit_code == 0 and "nothing to do" in again.output
    assert CorpusIndex(str(index)).manifest["generation"] == 2
    # B's documents that matched A are not indexed twice
    assert m["members"][1]["near"]["indexed_docs"] < m["members"][1]["near"]["docs"]
    # a third snapshot: a copy of B's unique documents is caught by member cc-b
    C = [{"id": f"c-{i:03d}", "text": d["text"]} for i, d in enumerate(B[:5])]
    C += [{"id": f"c-a-{i:03d}", "text": d["text"]} for i, d in enumerate(A[:5])]
    _write(tmp_path / "c.jsonl.gz", C)
    run_dag(_dag([str(tmp_path / "c.jsonl.gz")], [str(index)]), tmp_path / "cc-c", workers=2, quiet=True)
    reasons = _ids(tmp_path / "cc-c", "select id, reason from rejected")
    assert all(reasons[f"c-{i:03d}"].startswith("exact_dedup:in_index=cc-b:") for i in range(5))
    assert all(reasons[f"c-a-{i:03d}"].startswith("exact_dedup:in_index=cc-a:") for i in range(5))
    # an index whose keys mean something else is refused before any work
    bad = _dag([str(tmp_path / "c.jsonl.gz")], [str(index)])
    bad.stages["near"] = bad.stages["near"].model_copy(update={"num_perm": 64})
    with pytest.raises(Exception, match="other parameters"):
        run_dag(bad, tmp_path / "bad", workers=2, quiet=True)


def test_same_bytes_with_one_to_eight_workers(snaps, tmp_path):
    root, A, B, kind = snaps
    ref_run, ref_index = _digests(root / "cc-b"), None
    dag = _dag([str(root / "in" / "b.jsonl.gz")], [str(root / "index")])
    for w in (1, 3, 4, 8):
        run_dag(dag, tmp_path / f"w{w}", workers=w, quiet=True)
        assert _digests(tmp_path / f"w{w}") == ref_run, w
        corpus_index.add_run_dir(str(tmp_path / f"index{w}"), str(tmp_path / f"w{w}"), ["exact", "near"], "cc-b")
        got = _index_digests(tmp_path / f"index{w}")
        ref_index = ref_index or got
        assert got == ref_index, w


def test_killed_with_two_workers_resumed_with_four_is_byte_identical(snaps, tmp_path, monkeypatch):
    root, A, B, kind = snaps
    dag = _dag([str(root / "in" / "b.jsonl.gz")], [str(root / "index")])
    orig = GlobalContext.phase

    class Killed(Exception):
        pass

    def phase(self, name, fn, jobs, *args, **kwargs):
        if f"{self.name}:{name}" == "near:candidates":  # 4 partitions: 2 recorded, then the kill
            orig(self, name, fn, jobs[: max(1, len(jobs) // 2)], *args, **kwargs)
            raise Killed()
        return orig(self, name, fn, jobs, *args, **kwargs)

    monkeypatch.setattr(GlobalContext, "phase", phase)
    with pytest.raises(Killed):
        run_dag(dag, tmp_path / "run", workers=2, quiet=True)
    monkeypatch.undo()
    assert (tmp_path / "run" / "exact" / "_manifest.jsonl").exists()  # exact had committed
    run_dag(dag, tmp_path / "run", workers=4, quiet=True)
    assert _digests(tmp_path / "run") == _digests(root / "cc-b")
    ph = json.loads((tmp_path / "run" / "near" / "_phases.json").read_text())["phases"]["candidates"]
    assert 0 < ph["ran"] < ph["jobs"]  # the jobs recorded before the kill were kept
