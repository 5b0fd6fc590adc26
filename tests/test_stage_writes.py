"""What a map stage writes: an intermediate stage writes ``id`` and its own columns, whole rows
are written where the text changes or something reads them back, rejected rows keep their text
for a sample per reason; the SQL views, the document browser and resume see whole rows."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from conftest import REPO
from curation.pipeline.dag import parse_dag
from curation.pipeline.executor import run_dag
from curation.pipeline.rundir import RunDir, RunDirError
from curation.service.browse import documents


def _demo(**top) -> dict:
    d = yaml.safe_load((REPO / "pipelines/demo.yaml").read_text())
    d.update(top)
    return d


def _run(d: dict, out: Path, overwrite: bool = False) -> RunDir:
    os.chdir(REPO)
    run_dag(parse_dag(d, "demo.yaml"), out, workers=2, quiet=True, overwrite=overwrite)
    return RunDir(out)


def _materialized(d: dict) -> dict:
    d = yaml.safe_load(yaml.safe_dump(d))
    for st in d["stages"].values():
        if st["type"] != "union":
            st["materialize"] = True
    return d


def _view(run: RunDir, node: str) -> list[tuple]:
    con = run.connect()
    cols = sorted(c[0] for c in con.execute(f'select * from "{node}" limit 0').description)
    rows = con.execute(f'select {", ".join(cols)} from "{node}" order by id').fetchall()
    return [cols] + rows


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ray_session):
    tmp = tmp_path_factory.mktemp("writes")
    return {"slim": _run(_demo(rejected_text_sample=2), tmp / "slim"),
            "whole": _run(_materialized(_demo(rejected_text="all")), tmp / "whole")}


def test_intermediate_stages_write_id_and_their_signals_only(runs):
    slim, whole = runs["slim"], runs["whole"]
    dag = slim.load_dag()
    # gopher and gopher_rep sit between extract (text changes) and c4 (text changes): signals only
    assert not dag.writes_rows("gopher") and not dag.writes_rows("gopher_rep")
    assert dag.writes_rows("extract") and dag.writes_rows("c4") and dag.writes_rows("fineweb")
    for key, e in slim.entries("gopher").items():
        assert e["whole_rows"] is False
        if e["file"] is None:  # a shard that kept no row has no file, either way
            assert e["rows"] == 0 and whole.entries("gopher")[key]["file"] is None
            continue
        assert pq.read_schema(slim.path(e["file"])).names == ["id", *[c for c in pq.read_schema(
            whole.path(whole.entries("gopher")[key]["file"])).names if c in dag.own_columns("gopher")]]
    slim_bytes = sum(e.get("bytes", 0) for s in ("gopher", "gopher_rep") for e in slim.entries(s).values())
    whole_bytes = sum(e.get("bytes", 0) for s in ("gopher", "gopher_rep") for e in whole.entries(s).values())
    assert slim_bytes < 0.2 * whole_bytes
    # whole-row stages write the same bytes either way
    for s in ("extract", "c4", "fineweb"):
        assert {k: e.get("sha256") for k, e in slim.entries(s).items()} == \
               {k: e.get("sha256") for k, e in whole.entries(s).items()}


def test_views_show_whole_rows_as_if_every_stage_wrote_them(runs):
    dag = runs["slim"].load_dag()
    for node in ["kept", *dag.stages]:
        assert _view(runs["slim"], node) == _view(runs["whole"], node), node
    con = runs["slim"].connect()
    n_text = con.execute("select count(*) from gopher where text is not null and length(text) > 0").fetchone()[0]
    assert n_text == con.execute("select count(*) from gopher").fetchone()[0] > 0


def test_rejected_rows_keep_text_for_a_sample_per_reason(runs, tmp_path):
    con = runs["slim"].connect()
    per = con.execute("""select stage, reason, filename, count(*) n, count(text) with_text
                         from read_parquet('%s/rejected/*/*.parquet', filename=true, union_by_name=true)
                         where not starts_with(reason, 'read:') group by all""" % runs["slim"].root).fetchall()
    assert per and all(r[4] == min(r[3], 2) for r in per)  # the first 2 per reason per shard
    assert any(r[3] > r[4] for r in per)  # and the others without their text
    whole = runs["whole"].connect().execute("select count(*), count(text) from rejected").fetchone()
    slim = con.execute("select count(*), count(text) from rejected").fetchone()
    assert slim[0] == whole[0] and slim[1] < whole[1]  # the same rows, less text
    for policy, check in [("all", lambda n, t: n == t), ("none", lambda n, t: t == 0)]:
        run = _run(_demo(rejected_text=policy), tmp_path / policy)
        n, t = run.connect().execute("""select count(*), count(text) from rejected
                                        where not starts_with(reason, 'read:')""").fetchone()
        assert n > 0 and check(n, t), (policy, n, t)


def test_browser_shows_whole_rows_of_a_signals_only_stage(runs):
    page = documents(runs["slim"], "gopher", "kept", limit=5)
    assert len(page["documents"]) == 5
    for doc in page["documents"]:
        assert doc["text_chars"] > 0  # the text, from extract's shard
        assert doc["fields"]["source"] == "web" and "url" in doc["fields"]
        assert doc["fields"]["gopher_n_words"] > 0  # its own signals
        assert "gopher_dup_line_frac" in doc["fields"]  # and gopher_rep's, also signals only


def test_signals_only_stage_has_no_shard_rows_to_read_back(runs):
    dag = runs["slim"].load_dag()
    with pytest.raises(RunDirError, match="writes its signals only"):
        runs["slim"].shard_files(dag, "gopher", dag.hashes())


def test_rerun_of_a_later_stage_recomputes_the_signals_only_stage_it_reads(tmp_path, ray_session):
    run = _run(_demo(), tmp_path / "run")
    before = {k: e.get("sha256") for k, e in run.entries("gopher").items()}  # none: a shard that kept no row
    d = _demo()
    d["stages"]["c4"]["min_num_sentences"] = 3  # c4 reruns: it needs gopher's whole rows
    run = _run(d, tmp_path / "run", overwrite=True)
    assert {k: e.get("sha256") for k, e in run.entries("gopher").items()} == before
    fresh = _run(d, tmp_path / "fresh")
    for node in ("c4", "fineweb", "kept"):
        assert _view(run, node) == _view(fresh, node)


def test_rejected_rows_split_copies_only_the_sampled_text():
    """``_RejectedText.split`` (the executor's split of a stage's output) gives the rows and
    columns ``split_kept_rejected`` and the policy give, with the text only of the sampled
    rejected rows (taken, not copied then nulled), over batches that share a reason's count."""
    import numpy as np
    import pyarrow as pa

    from curation.io.shards import split_kept_rejected
    from curation.pipeline.executor import _RejectedText

    rng = np.random.default_rng(3)
    for policy in ("sample", "none", "all"):
        new, old = _RejectedText(policy, 3), _RejectedText(policy, 3)
        for b in range(3):
            n = 40
            text = pa.chunked_array([[f"t{b}-{i}" * 3 for i in range(25)], [None] + [f"u{b}-{i}" for i in range(26, n)]])
            table = pa.table({"id": [f"{b}-{i}" for i in range(n)], "text": text, "x": np.arange(n)})
            reasons = pa.array([None if r == 0 else f"r{r}" for r in rng.integers(0, 4, n)], pa.string())
            got_kept, got_rej = new.split(table, reasons, "st")
            want_kept, want_rej = split_kept_rejected(table, reasons, "st")
            assert got_kept.equals(want_kept)
            assert got_rej.equals(old(want_rej)), (policy, b)
            with_text = got_rej.filter(got_rej.column("text").is_valid())
            assert all(t.startswith(("t", "u")) and i.split("-")[0] == str(b) for t, i in
                       zip(with_text.column("text").to_pylist(), with_text.column("id").to_pylist()))
            if policy == "none":
                assert got_rej.column("text").null_count == got_rej.num_rows
    assert new.split(table, pa.nulls(n, pa.string()), "st") == (table, None)
