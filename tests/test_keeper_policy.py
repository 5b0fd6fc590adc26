"""Keeper policies (issue 31 item 4): ``keep: first|latest|highest_quality|source_rank`` in
exact_dedup and minhash_dedup, within a run and against a corpus index. Where the policy prefers
a new document to an indexed one, the new one is kept, the old one is listed in the stage's
``_superseded/`` table (then in the index member), and ``refinery index apply-superseded``
writes filtered copies of the old shards."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import curation.stages  # noqa: F401
from conftest import DATA
from curation.cli import app
from curation.dedup.index import CorpusIndex, IndexMismatch
from curation.pipeline.context import GlobalContext
from curation.pipeline.corpus_index import IndexedStage, add_run, superseded
from curation.pipeline.rundir import RunDir
from curation.stages.exact_dedup import ExactDedup
from curation.stages.minhash_dedup import MinHashDedup

RANK = ["wiki", "books", "web"]


def _texts() -> list[str]:
    with gzip.open(DATA / "dedup" / "dclm_docs_150.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def _write(path: Path, rows: list[dict]) -> list[tuple[str, str]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    t = pa.table({"id": [r["id"] for r in rows], "text": [r["text"] for r in rows],
                  "source": [r.get("source", "web") for r in rows],
                  "quality": pa.array([r.get("quality", 0.5) for r in rows], pa.float64()),
                  "date": pa.array([r.get("date", "2024-01-01") for r in rows], pa.string())})
    pq.write_table(t, path)
    return [(path.stem, str(path))]


def _run(root: Path, upstream, against=(), workers=2, **keep) -> dict:
    """exact_dedup then minhash_dedup over ``upstream`` in RUN ``root``; kept ids and reasons."""
    rd = RunDir(root)
    exact = ExactDedup(input="up", partitions=2, against=list(against), **keep)
    near = MinHashDedup(input="exact", partitions=2, against=list(against), **keep)
    ctx = GlobalContext(rd, "exact", exact.params_hash(["up"]), workers, upstream, exact.resources)
    exact.run(ctx)
    ctx.finish()
    near_up = sorted((k, rd.path(e["file"])) for k, e in rd.committed("exact", ctx.params_hash).items() if e.get("file"))
    nctx = GlobalContext(rd, "near", near.params_hash([ctx.params_hash]), workers, near_up, near.resources)
    near.run(nctx)
    nctx.finish()
    kept = [i for k, e in rd.committed("near", nctx.params_hash).items() if e.get("file")
            for i in pq.read_table(rd.path(e["file"]), columns=["id"]).column("id").to_pylist()]
    reasons = {}
    for stage in ("exact", "near"):
        for f in sorted((root / "rejected" / stage).glob("*.parquet")):
            t = pq.read_table(f, columns=["id", "reason"])
            reasons.update(zip(t.column("id").to_pylist(), t.column("reason").to_pylist()))
    stages = {"exact": IndexedStage("exact", exact, ctx.params_hash), "near": IndexedStage("near", near, nctx.params_hash)}
    return {"kept": set(kept), "reasons": reasons, "rd": rd, "stages": stages,
            "near_files": [rd.path(e["file"]) for e in rd.committed("near", nctx.params_hash).values() if e.get("file")]}


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and "_work" not in p.parts
            and (p.suffix in (".parquet", ".bloom") or p.name == "_manifest.jsonl")}


def _near(text: str) -> str:
    return text.replace(" the ", " a ", 2)


@pytest.mark.parametrize("keep,winner", [("first", "x-0"), ("source_rank", "x-2"), ("latest", "x-1"),
                                         ("highest_quality", "x-3")])
def test_within_a_run_exact_and_near(tmp_path, ray_session, keep, winner):
    texts = _texts()
    attrs = [dict(source="web", date="2024-01-01", quality=0.2), dict(source="books", date="2025-06-01", quality=0.1),
             dict(source="wiki", date="2023-01-01", quality=0.3), dict(source="web", date=None, quality=0.9)]
    rows = [{"id": f"x-{i}", "text": texts[0], **a} for i, a in enumerate(attrs)]  # exact copies
    rows += [{"id": f"y-{i}", "text": texts[1] if i == 0 else _near(texts[1]) + " " * i, **a}
             for i, a in enumerate(attrs)]  # a near cluster (y-1.. are exact copies of one another too)
    rows += [{"id": f"u-{i}", "text": t} for i, t in enumerate(texts[2:12])]
    kw = {"keep": keep, **({"source_rank": RANK} if keep == "source_rank" else {})}
    r = _run(tmp_path / "run", _write(tmp_path / "in" / "up-0.parquet", rows), **kw)
    assert {i for i in r["kept"] if i.startswith("x-")} == {winner}
    assert all(f"u-{i}" in r["kept"] for i in range(10))
    assert len({i for i in r["kept"] if i.startswith("y-")}) == 1
    assert {i for i in r["kept"] if i.startswith("y-")} == {"y" + winner[1:]}  # the same policy, near side


def test_source_rank_across_the_index_supersedes_and_applies(tmp_path, ray_session):
    texts = _texts()
    kw = {"keep": "source_rank", "source_rank": RANK}
    A = [{"id": f"a-{i:03d}", "text": t, "source": "web"} for i, t in enumerate(texts[:60])]
    a = _run(tmp_path / "cc-a", _write(tmp_path / "in" / "a.parquet", A), **kw)
    assert len(a["kept"]) == 60
    index = str(tmp_path / "index")
    add_run(index, a["rd"], a["stages"], "cc-a")
    B = [{"id": f"b-wiki-{i:03d}", "text": texts[i], "source": "wiki"} for i in range(10)]  # exact, better source
    B += [{"id": f"b-web-{i:03d}", "text": texts[i], "source": "web"} for i in range(10, 20)]  # exact, same source
    B += [{"id": f"b-nwiki-{i:03d}", "text": _near(texts[i]), "source": "wiki"} for i in range(20, 30)
          if _near(texts[i]) != texts[i]]  # near copies, better source
    B += [{"id": f"b-nweb-{i:03d}", "text": _near(texts[i]), "source": "web"} for i in range(30, 40)
          if _near(texts[i]) != texts[i]]
    B += [{"id": f"b-new-{i:03d}", "text": t, "source": "web"} for i, t in enumerate(texts[100:120])]
    b = _run(tmp_path / "cc-b", _write(tmp_path / "in" / "b.parquet", B), against=[index], **kw)
    kept, reasons = b["kept"], b["reasons"]
    assert {i for i in kept if i.startswith("b-wiki-")} == {f"b-wiki-{i:03d}" for i in range(10)}
    assert all(reasons[f"b-web-{i:03d}"] == f"exact_dedup:in_index=cc-a:a-{i:03d}" for i in range(10, 20))
    assert all(f"b-new-{i:03d}" in kept for i in range(20))
    nwiki = [d["id"] for d in B if d["id"].startswith("b-nwiki-")]
    nweb = [d["id"] for d in B if d["id"].startswith("b-nweb-")]
    assert all(i in kept for i in nwiki)  # wiki beats web (or was never near A's copy: kept as new)
    assert all(reasons[i].startswith("minhash_dedup:cluster=cc-a:a-") for i in nweb if i not in kept)
    assert sum(i not in kept for i in nweb) >= len(nweb) // 2
    # the superseded tables: A's ids replaced, by whom (an exact winner is near A's copy too:
    # the near stage lists it again)
    sup: dict = {}
    for stage in ("exact", "near"):
        for f in sorted((tmp_path / "cc-b" / stage / "_superseded").glob("*.parquet")):
            t = pq.read_table(f)
            for m, i, by, st in zip(*(t.column(c).to_pylist() for c in ("member", "id", "by", "stage"))):
                sup.setdefault((m, i), set()).add((by, st))
    for i in range(10):
        assert (f"b-wiki-{i:03d}", "exact") in sup[("cc-a", f"a-{i:03d}")]
    near_sup = {by: i for (m, i), v in sup.items() for by, st in v if by.startswith("b-nwiki-")}
    assert len(near_sup) >= len(nwiki) // 2  # LSH recall: not every near copy collides
    assert all(i == "a-" + by.rsplit("-", 1)[1] and sup[("cc-a", i)] == {(by, "near")} for by, i in near_sup.items())
    assert all(len({by for by, _ in v}) == 1 for v in sup.values())
    assert len(sup) == 10 + len(near_sup)
    # the same bytes with one worker (shards, manifests, superseded tables, persisted keys and LSH state)
    one = _run(tmp_path / "cc-b1", _write(tmp_path / "in1" / "b.parquet", B), against=[index], workers=1, **kw)
    assert _digests(tmp_path / "cc-b1") == _digests(tmp_path / "cc-b") and one["kept"] == kept
    assert any("_superseded" in k for k in _digests(tmp_path / "cc-b"))
    # into the index; the winners are B's member's; apply to A's shards
    res = add_run(index, b["rd"], b["stages"], "cc-b")  # (stages run without a DAG: refinery index add needs one)
    assert res["member"]["superseded"] == CorpusIndex(index).members[1]["superseded"] == len(sup)
    show = CliRunner().invoke(app, ["index", "show", index])
    assert show.exit_code == 0 and "superseded" in show.output
    assert superseded(index, "cc-a").num_rows == len(sup)
    out = tmp_path / "a-applied"
    cli = CliRunner().invoke(app, ["index", "apply-superseded", index, *a["near_files"], "--out", str(out)])
    assert cli.exit_code == 0, cli.output
    left = set(pq.read_table(sorted(out.glob("*.parquet"))).column("id").to_pylist())
    assert left == a["kept"] - {i for _, i in sup}
    assert (left | kept).isdisjoint({i for _, i in sup})
    assert json.loads((out / "_superseded_applied.json").read_text())["removed"] == len(sup)
    # not in place
    bad = CliRunner().invoke(app, ["index", "apply-superseded", index, str(Path(a["near_files"][0]).parent),
                                   "--out", str(Path(a["near_files"][0]).parent)])
    assert bad.exit_code != 0 and "in place" in bad.output
    # a third snapshot: a web copy of a superseded A text is named by B's wiki winner (the current keeper)
    C = [{"id": "c-000", "text": texts[0], "source": "web"}, {"id": "c-001", "text": texts[0], "source": "wiki"}]
    c = _run(tmp_path / "cc-c", _write(tmp_path / "in" / "c.parquet", C), against=[index], **kw)
    assert c["reasons"]["c-000"] == "exact_dedup:in_index=cc-b:b-wiki-000"
    assert c["reasons"]["c-001"] == "exact_dedup:in_index=cc-b:b-wiki-000"  # a tie: the indexed copy stays


def test_latest_new_wins_ties_and_an_index_without_the_attribute_is_refused(tmp_path, ray_session):
    texts = _texts()
    A = [{"id": f"a-{i:03d}", "text": t, "date": "2024-01-01"} for i, t in enumerate(texts[:20])]
    a = _run(tmp_path / "cc-a", _write(tmp_path / "in" / "a.parquet", A), keep="latest")
    index = str(tmp_path / "index")
    add_run(index, a["rd"], a["stages"], "cc-a")
    B = [{"id": "b-same", "text": texts[0], "date": "2024-01-01"}, {"id": "b-old", "text": texts[1], "date": "2020-01-01"},
         {"id": "b-new", "text": texts[2], "date": "2025-01-01"}]
    b = _run(tmp_path / "cc-b", _write(tmp_path / "in" / "b.parquet", B), against=[index], keep="latest")
    assert b["kept"] == {"b-same", "b-new"}
    assert b["reasons"]["b-old"] == "exact_dedup:in_index=cc-a:a-001"
    # an index made with keep: first holds no dates: keep: latest against it is refused before any work
    f = _run(tmp_path / "cc-f", _write(tmp_path / "in" / "f.parquet", A))
    add_run(str(tmp_path / "index-f"), f["rd"], f["stages"], "cc-f")
    with pytest.raises(IndexMismatch, match="date"):
        _run(tmp_path / "cc-g", _write(tmp_path / "in" / "g.parquet", B), against=[str(tmp_path / "index-f")],
             keep="latest")
    assert CorpusIndex(str(tmp_path / "index-f")).members[0]["exact"]["attributes"] == []
