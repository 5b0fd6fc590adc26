"""``format: run`` inputs (curation/pipeline/run_input.py): a second run reads a stage of a first
run through its manifest: committed shards only, a union's branches, a signals-only stage joined
back to whole rows, refused while the first run is unfinished unless ``allow_partial``, an empty
shard counted as 0 documents (never a rejected one), and where each shard came from recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from conftest import DATA, REPO
from curation.io.inputs import InputError
from curation.pipeline.dag import DagError, parse_dag
from curation.pipeline.executor import make_plan, run_dag
from curation.pipeline.rundir import RunDir
from curation.pipeline.stats import stage_table

GSM = DATA / "jsonl" / "gsm8k_train_head400.jsonl.gz"
CC = DATA / "jsonl" / "dolma_cc_en_head-0091.jsonl.gz"


@pytest.fixture(scope="module")
def first(tmp_path_factory, ray_session) -> Path:
    """A first run: web (gopher -> c4, c4 the output branch) and math (with an input file whose
    every line is rejected: a 0-row shard) in a union ``merged``; gopher writes its signals only
    (its input is on disk for the union... no: gopher's own input is the web input, materialized
    because ``all`` (a union) reads it too)."""
    root = tmp_path_factory.mktemp("run-input")
    bad = root / "no-question.jsonl"
    bad.write_text("".join(json.dumps({"answer": str(i)}) + "\n" for i in range(3)))
    dag = parse_dag({
        "name": "first",
        "inputs": {"web": {"format": "jsonl", "paths": [str(CC)], "source": "web", "url_field": "id"},
                   "math": {"format": "jsonl", "paths": [str(GSM), str(bad)], "source": "math", "text_field": "question"}},
        "stages": {"gopher": {"type": "gopher_quality", "input": "web"},
                   "c4": {"type": "c4_quality", "input": "gopher"},
                   "merged": {"type": "union", "inputs": ["c4", "math"]},
                   "all": {"type": "union", "inputs": ["web", "math"]}},
        "output": "merged"}, "first.yaml")
    run_dag(dag, root / "first", workers=2, quiet=True)
    return root / "first"


def _second(root: Path, first: Path, stage: str, name: str, **extra) -> tuple[Path, dict]:
    dag = parse_dag({"name": name, "inputs": {"docs": {"format": "run", "run": str(first), "stage": stage, **extra}},
                     "stages": {"gopher2": {"type": "gopher_quality", "input": "docs", "min_doc_words": 1}},
                     "output": "gopher2", "rejected_text": "all"}, f"{name}.yaml")
    out = root / name
    state = run_dag(dag, out, workers=2, quiet=True)
    return out, state


def _rows(run: Path, node: str) -> list[dict]:
    rd = RunDir(run)
    dag = rd.load_dag()
    return [r for _, p, _ in rd.shard_entries(dag, node, dag.hashes()) for r in pq.read_table(p).to_pylist()]


def test_reads_a_union_through_the_manifest_with_provenance(first, tmp_path):
    out, _ = _second(tmp_path, first, "merged", "second")
    want = sorted((r["id"], r["text"], r["source"]) for r in _rows(first, "merged"))
    con = RunDir(out).connect(["gopher2", "rejected"])
    got = sorted(con.execute("select id, text, source from gopher2").fetchall())
    rej = con.execute("select id, text, source from rejected").fetchall()
    assert sorted(got + rej) == want  # ids and sources kept, every row once
    assert not [r for r in rej if r[0] is None]
    rd = RunDir(out)
    entries = rd.entries("docs")
    first_dag = RunDir(first).load_dag()
    hashes = first_dag.hashes()
    assert sum(e["rows_in"] for e in entries.values()) == len(want)
    for key, e in entries.items():
        up = e["upstream"]
        assert key == f"docs-{up['key']}" and up["run"] == str(first) and up["stage"] == "merged"
        assert up["leaf"] in ("c4", "math") and up["params_hash"] == hashes[up["leaf"]]
        assert e["rejected_rows"] == 0 and e["rows_in"] == up["rows"]
    # the 0-row shard of math: 0 documents, not a rejected one
    empty = [e for e in entries.values() if e["upstream"]["rows"] == 0]
    assert len(empty) == 1 and empty[0]["rows_in"] == 0 and empty[0]["rejected_file"] is None
    docs_row = next(r for r in stage_table(str(out)) if r["stage"] == "docs")
    assert docs_row["docs_in"] == len(want) and docs_row["rejected"] == 0


def test_a_signals_only_stage_is_joined_back_to_whole_rows(first, tmp_path):
    dag = RunDir(first).load_dag()
    assert not dag.writes_rows("gopher")  # ids and signals on disk: the case to join
    out, _ = _second(tmp_path, first, "gopher", "signals")
    con = RunDir(first).connect(["gopher"])
    want = sorted(con.execute("select id, text, gopher_n_words from gopher").fetchall())
    rd = RunDir(out)
    c2 = rd.connect(["gopher2", "rejected"])
    kept = c2.execute("select id, text, gopher_n_words from gopher2").fetchall()
    rej = [r[0] for r in c2.execute("select id from rejected").fetchall()]
    assert sorted([r[0] for r in kept] + rej) == [w[0] for w in want]
    texts = {i: (t, n) for i, t, n in want}
    assert kept and all(texts[i] == (t, n) for i, t, n in kept)  # the text joined back, signals as measured
    cols = {d[0] for d in c2.execute("select * from gopher2 limit 0").description}
    assert {"text", "url", "meta", "source"} <= cols


def test_an_unfinished_upstream_is_refused_unless_allow_partial(first, tmp_path):
    import shutil

    live = tmp_path / "live"
    shutil.copytree(first, live)
    prog = json.loads((live / "progress.json").read_text())
    (live / "progress.json").write_text(json.dumps({**prog, "state": "running"}))
    spec = {"format": "run", "run": str(live), "stage": "merged"}
    dag = parse_dag({"name": "x", "inputs": {"docs": spec}, "stages": {"g": {"type": "gopher_quality"}}}, "x.yaml")
    with pytest.raises(InputError, match="not finished.*allow_partial: true"):
        make_plan(dag)
    dag = parse_dag({"name": "x", "inputs": {"docs": {**spec, "allow_partial": True}}, "stages": {"g": {"type": "gopher_quality"}}}, "x.yaml")
    assert sum(len(v) for v in make_plan(dag).input_shards.values()) == len(RunDir(first).entries("c4")) + 2


@pytest.mark.parametrize("spec, match", [
    ({"format": "run", "run": "runs/x"}, "give run .* and stage"),
    ({"format": "run", "run": "runs/x", "stage": "s", "paths": ["a"]}, "not paths"),
    ({"format": "jsonl", "paths": ["a"], "source": "web", "stage": "s"}, "belong to format: run"),
])
def test_spec_errors_are_one_line(spec, match):
    with pytest.raises(DagError, match=match):
        parse_dag({"name": "x", "inputs": {"docs": spec}, "stages": {"g": {"type": "gopher_quality"}}}, "x.yaml")


def test_missing_run_or_stage_is_refused_before_anything_runs(first, tmp_path):
    for spec, match in [({"run": str(tmp_path / "nope"), "stage": "merged"}, "not a refinery run directory"),
                        ({"run": str(first), "stage": "nope"}, "not a node of")]:
        dag = parse_dag({"name": "x", "inputs": {"docs": {"format": "run", **spec}}, "stages": {"g": {"type": "gopher_quality"}}}, "x.yaml")
        with pytest.raises(InputError, match=match):
            make_plan(dag)


def test_other_inputs_hash_as_before():
    """format: run's fields are left out of every other input's dump: params hashes, and so the
    resume of every existing run directory, are unchanged."""
    d = yaml.safe_load((REPO / "pipelines" / "demo.yaml").read_text())
    dag = parse_dag(d, "pipelines/demo.yaml", base_dir=str(REPO))
    for spec in dag.to_dict()["inputs"].values():
        assert not {"run", "stage", "allow_partial"} & set(spec)


def test_demo_pack_reads_the_demo_through_format_run():
    d = yaml.safe_load((REPO / "pipelines" / "demo-pack.yaml").read_text())
    assert [s["format"] for s in d["inputs"].values()] == ["run"]
    assert d["inputs"]["docs"] == {"format": "run", "run": "runs/demo", "stage": "merged"}


def _chained(root: Path, upstream: Path, name: str, with_global: bool) -> tuple[object, Path]:
    stages = {"gopher2": {"type": "gopher_quality", "input": "docs", "min_doc_words": 1}}
    if with_global:
        stages["exact"] = {"type": "exact_dedup", "input": "gopher2", "partitions": 2}
    dag = parse_dag({"name": name, "inputs": {"docs": {"format": "run", "run": str(upstream), "stage": "merged"}},
                     "stages": stages}, f"{name}.yaml")
    return dag, root / name


def test_a_shard_gone_upstream_is_refused_not_left_stale(first, tmp_path):
    """The second run read every shard of ``merged``; one of them is then no longer committed
    upstream (its file removed): rerunning the second run refuses, naming the shard, before any
    work (its rows would otherwise stay in the second run's stages and outputs)."""
    import shutil

    up = tmp_path / "up"
    shutil.copytree(first, up)
    dag, out = _chained(tmp_path, up, "chained", with_global=False)
    run_dag(dag, out, workers=2, quiet=True)
    c4 = RunDir(up).entries("c4")
    key = sorted(k for k, e in c4.items() if e.get("file"))[0]
    (up / c4[key]["file"]).unlink()  # no longer committed in the upstream run
    manifest = (out / "gopher2" / "_manifest.jsonl").read_text()
    with pytest.raises(InputError, match=rf"inputs.docs: .*merged: 1 shard\(s\) this run read are no longer "
                                         rf"committed there \(docs-{key}\).*new --out"):
        run_dag(dag, out, workers=2, quiet=True)
    assert (out / "gopher2" / "_manifest.jsonl").read_text() == manifest  # nothing ran
    # a fresh run directory reads the upstream as it is now
    fresh = run_dag(dag, tmp_path / "fresh", workers=2, quiet=True)
    assert fresh["state"] == "done" and f"docs-{key}" not in RunDir(tmp_path / "fresh").entries("docs")


def test_a_changed_upstream_shard_below_a_finished_global_stage_is_refused(first, tmp_path):
    import shutil

    up = tmp_path / "up"
    shutil.copytree(first, up)
    dag, out = _chained(tmp_path, up, "chained-global", with_global=True)
    run_dag(dag, out, workers=2, quiet=True)
    run_dag(dag, out, workers=2, quiet=True)  # unchanged upstream: the rerun is a no-op, not refused
    c4 = RunDir(up).entries("c4")
    key = sorted(k for k, e in c4.items() if e.get("file"))[0]
    with open(up / "c4" / "_manifest.jsonl", "a") as f:  # the shard rewritten upstream: another sha256
        f.write(json.dumps({**c4[key], "sha256": "0" * 64}, sort_keys=True) + "\n")
    with pytest.raises(InputError, match=rf"1 shard\(s\) this run read changed since \(docs-{key}\) and the "
                                         r"global stage\(s\) exact below them"):
        run_dag(dag, out, workers=2, quiet=True)
