"""``minhash_dedup`` with ``partner_check`` (issue 30, item 3): connected components chain
A~B~C into one cluster although A and C are far apart; with the check every removed document
has a kept partner in its cluster at exact shingle Jaccard >= threshold - slack (checked here
over real text with planted near-duplicates and chains), the ones without are kept and counted;
with the check off the stage is the one it was (same params hash, same bytes); a killed run
resumes to the same bytes."""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import curation.stages  # noqa: F401  (registers the stages)
from conftest import DATA
from curation.dedup.minhash import jaccard, shingle_sets
from curation.dedup.partners import partner_clusters
from curation.pipeline.rundir import RunDir
from curation.stages.minhash_dedup import REPORT, MinHashDedup
from dedup_helpers import run_global, write_upstream

DEDUP = DATA / "dedup"
STAGE = dict(input="up", ngram=5, num_perm=128, threshold=0.8, partitions=4)


def _jsonl(name: str) -> list[dict]:
    with gzip.open(DEDUP / name, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _words() -> list[str]:
    return " ".join(d["text"] for d in _jsonl("dclm_docs_150.jsonl.gz")[:5]).split()


def _chain(prefix: str, step: int, n: int, offset: int = 0) -> list[dict]:
    """Documents of 400 words, each the previous one slid by ``step`` words."""
    w = _words()
    return [{"id": f"{prefix}-{i:03d}", "text": " ".join(w[offset + i * step: offset + i * step + 400])}
            for i in range(n)]


def corpus() -> list[dict]:
    """150 real documents, 150 planted near-duplicates of 100 of them (tests/data/dedup), and
    two chains of slid windows of real text (neighbours ~0.9, ends far apart); shuffled, with
    a quality column."""
    base = _jsonl("dclm_docs_150.jsonl.gz")
    near = _jsonl("near_dups.jsonl.gz")
    docs = [{"id": d["id"], "text": d["text"]} for d in base + near] + _chain("chain", 12, 30) + _chain(
        "slide", 25, 6, offset=2000)
    rng = np.random.default_rng(11)
    for d, q in zip(docs, rng.random(len(docs))):
        d["quality"] = float(q)
    return [docs[i] for i in rng.permutation(len(docs))]


def run(stage: MinHashDedup, run_dir: Path, upstream) -> None:
    run_global(stage, run_dir, "near", upstream, workers=2)


def outputs(run_dir: Path) -> tuple[pa.Table, pa.Table]:
    kept = pa.concat_tables([pq.read_table(f) for f in sorted((run_dir / "near").glob("*.parquet"))])
    rej = sorted((run_dir / "rejected" / "near").glob("*.parquet"))
    return kept, (pa.concat_tables([pq.read_table(f) for f in rej]) if rej else kept.schema.empty_table())


def digests(run_dir: Path) -> dict[str, tuple]:
    return {k: (e["sha256"], e.get("rejected_sha256")) for k, e in RunDir(run_dir).entries("near").items()}


def partnerless(kept: pa.Table, rejected: pa.Table, text: dict[str, str], floor: float) -> list[tuple[str, float]]:
    """Removed documents without a kept document of their ``dup_cluster`` at exact Jaccard >=
    floor (the stage's own shingles), with their best Jaccard."""
    members: dict[int, list[str]] = {}
    for i, c in zip(kept.column("id").to_pylist(), kept.column("dup_cluster").to_pylist()):
        members.setdefault(c, []).append(i)
    bad = []
    for i, c in zip(rejected.column("id").to_pylist(), rejected.column("dup_cluster").to_pylist()):
        ks = members.get(c, [])
        sets = shingle_sets([text[i]] + [text[k] for k in ks], 5)
        best = max((jaccard(sets[0], s) for s in sets[1:]), default=0.0)
        if best < floor:
            bad.append((i, best))
    return bad


@pytest.fixture(scope="module")
def base(tmp_path_factory, ray_session):
    """The corpus, its upstream shards, and the stage run without the check (as today)."""
    docs = corpus()
    root = tmp_path_factory.mktemp("partner")
    up = write_upstream(root, docs, 4)
    run(MinHashDedup(**STAGE), root / "off", up)
    return docs, up, root


# ---------------------------------------------------------------------------------------------
# the rule, alone


def test_rule_on_a_chain_keeps_the_far_end():
    """A~B (0.88), B~C (0.88), A~C (0.77): A kept, B removed against A, C kept (rescued), and
    a fourth document near C is removed against C, in C's sub-cluster."""
    texts = [d["text"] for d in _chain("x", 25, 3)]
    texts.append(" ".join(texts[2].split()[:395]))  # C without its last 5 words
    sets = shingle_sets(texts, 5)
    assert jaccard(sets[0], sets[1]) > 0.85 and jaccard(sets[0], sets[2]) < 0.8 < jaccard(sets[2], sets[3])
    comp = np.zeros(4, np.int64)
    doc = np.array([10, 11, 12, 13], np.int64)
    res = partner_clusters(comp, doc, sets, 0.8)
    assert res.kept.tolist() == [True, False, True, False]
    assert res.rescued.tolist() == [False, False, True, False]
    assert res.partner.tolist() == [10, 10, 12, 12]
    assert res.cluster.tolist() == [10, 10, 12, 12]
    assert res.jaccard[1] == pytest.approx(jaccard(sets[0], sets[1]))
    assert res.jaccard[2] == pytest.approx(max(jaccard(sets[2], sets[0]), 0.0))
    # a slack that lets the far end through: one cluster, as without the check
    loose = partner_clusters(comp, doc, sets, 0.7)
    assert loose.kept.tolist() == [True, False, False, False] and not loose.rescued.any()
    assert loose.cluster.tolist() == [10] * 4


def test_rule_names_subclusters_by_their_smallest_index():
    """Keeper order is not index order (a quality policy): the component's smallest document
    is rescued, so it names its own sub-cluster and the keeper's sub-cluster takes the next."""
    texts = [d["text"] for d in _chain("x", 25, 3)]
    sets = shingle_sets(texts, 5)
    # rows in keeper order: C (doc 7, best score) first, then B (doc 9), then A (doc 3)
    res = partner_clusters(np.zeros(3, np.int64), np.array([7, 9, 3]), [sets[2], sets[1], sets[0]], 0.8)
    assert res.kept.tolist() == [True, False, True]
    assert res.cluster.tolist() == [7, 7, 3]


# ---------------------------------------------------------------------------------------------
# the stage


def test_chain_of_three_rescues_the_far_end(tmp_path, ray_session):
    """Three documents A~B~C in one component (bands chosen so LSH links them surely): today
    one is kept; with the check C, 0.77 from A, is kept too and counted."""
    docs = _chain("c", 25, 3)
    up = write_upstream(tmp_path, docs, 2)
    lsh = dict(STAGE, bands=32, rows=4)
    run(MinHashDedup(**lsh), tmp_path / "off", up)
    kept, rej = outputs(tmp_path / "off")
    assert kept.column("id").to_pylist() == ["c-000"] and rej.num_rows == 2
    run(MinHashDedup(**lsh, partner_check=True), tmp_path / "on", up)
    kept, rej = outputs(tmp_path / "on")
    assert sorted(kept.column("id").to_pylist()) == ["c-000", "c-002"] and rej.column("id").to_pylist() == ["c-001"]
    rep = json.loads((tmp_path / "on" / "near" / REPORT).read_text())
    assert rep["rescued"] == 1 and rep["removed"] == 1 and rep["partner_check"]["checked"] == 2
    assert rep["reasons"] == {"minhash_dedup:cluster": 1, "kept:partner_rescued": 1}
    entries = RunDir(tmp_path / "on").entries("near")
    assert sum(e["partner_rescued"] for e in entries.values()) == 1
    # slack 0.1: the far end (0.77 >= 0.7) has its partner, so it goes as today
    run(MinHashDedup(**lsh, partner_check=True, partner_slack=0.1), tmp_path / "slack", up)
    kept, rej = outputs(tmp_path / "slack")
    assert kept.column("id").to_pylist() == ["c-000"] and rej.num_rows == 2


@pytest.mark.parametrize("keep,slack", [("first", 0.0), ("highest_quality", 0.0), ("first", 0.05)])
def test_every_removal_has_a_kept_partner_on_real_text(base, tmp_path, keep, slack):
    docs, up, root = base
    text = {d["id"]: d["text"] for d in docs}
    if keep != "first":  # the stage without the check, with the same keeper policy
        run(MinHashDedup(**STAGE, keep=keep), tmp_path / "off", up)
    off_kept, off_rej = outputs(root / "off" if keep == "first" else tmp_path / "off")
    # today: a chain's removals have no partner among the kept documents
    assert len(partnerless(off_kept, off_rej, text, 0.8 - slack)) >= 5
    stage = MinHashDedup(**STAGE, keep=keep, partner_check=True, partner_slack=slack)
    run(stage, tmp_path / "on", up)
    kept, rej = outputs(tmp_path / "on")
    assert kept.num_rows + rej.num_rows == len(docs)
    assert partnerless(kept, rej, text, 0.8 - slack) == []
    rep = json.loads((tmp_path / "on" / "near" / REPORT).read_text())
    pc_ = rep["partner_check"]
    assert rep["rescued"] == pc_["rescued"] > 0 and pc_["floor"] == pytest.approx(0.8 - slack)
    assert pc_["min_partner_jaccard"] >= 0.8 - slack and sum(pc_["partner_jaccard_histogram"].values()) == rej.num_rows
    assert sum(e["partner_rescued"] for e in RunDir(tmp_path / "on").entries("near").values()) == rep["rescued"]
    # the check only keeps more: the same components and keepers, fewer removals
    assert set(rej.column("id").to_pylist()) <= set(off_rej.column("id").to_pylist())
    assert off_rej.num_rows - rej.num_rows == rep["rescued"]
    # one kept document per (sub-)cluster, and every removal names a cluster that keeps one
    kept_clusters = kept.column("dup_cluster").to_pylist()
    assert len(kept_clusters) == len(set(kept_clusters))
    assert set(rej.column("dup_cluster").to_pylist()) <= set(kept_clusters)
    # the planted near-duplicates of tests/data/dedup are still removed (they have partners)
    planted = {d["id"] for d in _jsonl("near_dups.jsonl.gz")}
    removed = set(rej.column("id").to_pylist())
    assert len(planted & removed) >= 0.85 * len(planted & set(off_rej.column("id").to_pylist()))


def test_off_is_the_stage_of_today(base, tmp_path):
    """partner_check off (whatever the slack): the same params hash, header and bytes as a
    stage that never had the option."""
    docs, up, root = base
    plain, off = MinHashDedup(**STAGE), MinHashDedup(**STAGE, partner_check=False, partner_slack=0.1)
    assert "partner_check" not in plain.params() and "partner_slack" not in plain.params()
    assert plain.params_hash(["up"]) == off.params_hash(["up"]) and plain.header() == off.header()
    assert "partner_check" not in json.dumps(plain.header())
    on = MinHashDedup(**STAGE, partner_check=True)
    assert on.params_hash(["up"]) != plain.params_hash(["up"]) and on.header()["params"]["partner_check"] is True
    run(off, tmp_path / "off", up)
    assert digests(tmp_path / "off") == digests(root / "off")
    assert not any("partner_rescued" in e for e in RunDir(tmp_path / "off").entries("near").values())
    rep = json.loads((tmp_path / "off" / "near" / REPORT).read_text())
    assert "partner_check" not in rep and "rescued" not in rep
    with pytest.raises(ValueError, match="partner_slack"):
        MinHashDedup(**STAGE, partner_check=True, partner_slack=0.8)


def test_partner_check_resumes_and_is_idempotent(base, tmp_path):
    """Killed after the partner members were written (the partners and apply phases lost):
    the rerun redoes only those and writes the same bytes; a third run changes nothing."""
    docs, up, root = base
    stage = MinHashDedup(**STAGE, partner_check=True)
    run(stage, tmp_path / "a", up)
    want = digests(tmp_path / "a")
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    work = next((tmp_path / "b" / "near" / "_work").iterdir())
    members = {p: p.stat().st_mtime_ns for p in (work / "partner_members").glob("*.parquet")}
    assert members and (work / "partners").is_dir()
    shutil.rmtree(work / "partners")
    (work / "_phases" / "partners.jsonl").unlink()
    (tmp_path / "b" / "near" / "_manifest.jsonl").unlink()
    (tmp_path / "b" / "near" / REPORT).unlink()
    for p in (tmp_path / "b" / "near").glob("*.parquet"):
        p.unlink()
    run(stage, tmp_path / "b", up)
    assert digests(tmp_path / "b") == want
    assert members == {p: p.stat().st_mtime_ns for p in (work / "partner_members").glob("*.parquet")}
    run(stage, tmp_path / "b", up)  # already finished: nothing redone
    assert digests(tmp_path / "b") == want


def test_partner_check_is_independent_of_workers_and_partitions(base, tmp_path):
    docs, up, root = base
    run(MinHashDedup(**STAGE, partner_check=True), tmp_path / "p4", up)
    run_global(MinHashDedup(**STAGE, partner_check=True), tmp_path / "w1", "near", up, workers=1)
    assert digests(tmp_path / "w1") == digests(tmp_path / "p4")
    k4, r4 = outputs(tmp_path / "p4")
    run(MinHashDedup(**(STAGE | {"partitions": 7}), partner_check=True), tmp_path / "p7", up)
    k7, r7 = outputs(tmp_path / "p7")
    assert sorted(r7.column("id").to_pylist()) == sorted(r4.column("id").to_pylist())


def test_a_partner_checked_run_indexes_and_is_deduplicated_against(tmp_path, ray_session):
    """``refinery index build`` over a run made with the check: its rescued document is a
    kept keeper of its own cluster in the index, and a later snapshot's near copy of it is
    rejected against the index (components holding an indexed cluster are not re-checked)."""
    from typer.testing import CliRunner

    from curation.cli import app
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag
    from curation.pipeline.stats import connect

    chain = _chain("c", 25, 3)
    others = [{"id": d["id"], "text": d["text"]} for d in _jsonl("dclm_docs_150.jsonl.gz")[100:110]]
    copy = {"id": "b-copy", "text": " ".join(chain[2]["text"].split()[:395])}

    def dag(path: Path, against: list[str] | None = None):
        near = {"type": "minhash_dedup", "input": "docs", "partitions": 2, "bands": 32, "rows": 4,
                "partner_check": True, **({"against": against} if against else {})}
        return parse_dag({"name": "snap", "inputs": {"docs": {"format": "jsonl", "paths": [str(path)],
                                                               "source": "web", "id_field": "id"}},
                          "stages": {"near": near}, "output": "near"}, "snap.yaml")

    for name, docs in (("a", chain + others), ("b", [copy])):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    run_dag(dag(tmp_path / "a.jsonl"), tmp_path / "run-a", workers=2, quiet=True)
    kept = {r[0] for r in connect(tmp_path / "run-a").execute("select id from near").fetchall()}
    assert {"docs/c-000", "docs/c-002"} <= kept and "docs/c-001" not in kept
    res = CliRunner().invoke(app, ["index", "build", str(tmp_path / "run-a"), "--stages", "near",
                                   "--out", str(tmp_path / "index")])
    assert res.exit_code == 0, res.output
    docs = pq.read_table(next((tmp_path / "index" / "members").glob("*/near/docs.parquet"))).to_pylist()
    by_id = {d["id"]: d for d in docs}
    assert by_id["docs/c-002"]["kept"] and by_id["docs/c-002"]["cluster"] == by_id["docs/c-002"]["doc"]
    assert not by_id["docs/c-001"]["kept"] and by_id["docs/c-001"]["cluster"] == by_id["docs/c-000"]["doc"]
    run_dag(dag(tmp_path / "b.jsonl", [str(tmp_path / "index")]), tmp_path / "run-b", workers=2, quiet=True)
    reasons = dict(connect(tmp_path / "run-b").execute("select id, reason from rejected").fetchall())
    assert reasons["docs/b-copy"].startswith("minhash_dedup:cluster=run-a:docs/c-00"), reasons


def test_eval_dedup_shows_the_partner_decision(tmp_path):
    """``refinery eval dedup`` on a DAG whose stage has the check: its decision is collision +
    exact Jaccard >= threshold - slack (a pair alone is a two-document cluster)."""
    import yaml

    from curation.pipeline.evaluate import eval_dedup

    pairs = str(DATA / "eval" / "dedup_pairs.jsonl")
    docs = [str(DEDUP / "dclm_docs_150.jsonl.gz"), str(DEDUP / "near_dups.jsonl.gz")]

    def dag(**near):
        p = tmp_path / f"dag-{len(near)}.yaml"
        p.write_text(yaml.safe_dump({"name": "e", "inputs": {"docs": {"format": "jsonl", "paths": docs,
                                                                       "source": "web", "id_field": "id"}},
                                     "stages": {"near": {"type": "minhash_dedup", "input": "docs", **near}},
                                     "output": "near"}))
        return f"{p}:near"

    plain = eval_dedup(pairs, dag(), docs=docs)
    assert "stage: lsh" in plain["decisions"] and "partner_check" not in plain
    rep = eval_dedup(pairs, dag(partner_check=True, partner_slack=0.1), docs=docs)
    d = rep["decisions"]
    assert rep["partner_check"] is True and rep["partner_slack"] == 0.1 and "lsh" in d and "stage: lsh" not in d
    assert d["stage: lsh+partner"]["precision"] == 1.0
    assert d["lsh+verify"]["tp"] <= d["stage: lsh+partner"]["tp"] <= d["lsh"]["tp"]
    # The decision comes from the stage's own partner code (curation/dedup/partners.py): with no
    # slack its floor is the threshold, so it removes exactly the LSH links verification keeps,
    # and on this fixture that is fewer than LSH alone (a no-op check would equal LSH).
    strict = eval_dedup(pairs, dag(partner_check=True, partner_slack=0.0, threshold=0.8), docs=docs)["decisions"]
    assert strict["stage: lsh+partner"]["tp"] == strict["lsh+verify"]["tp"] < strict["lsh"]["tp"]
