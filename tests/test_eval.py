"""``refinery eval``: the figures on labelled fixtures are real, and a broken configuration
shows in them (tests/data/eval, tests/data/decontam, tests/data/dedup, tests/data/langid)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from curation.cli import app
from curation.pipeline.dag import parse_dag
from curation.pipeline.evaluate import EvalError, decontam_flagger, eval_dedup, eval_langid, eval_rules
from curation.quality.evaluate import LEAK_FORMS, decontam_figures
from curation.stages.decontaminate import Decontaminate

DATA = Path(__file__).parent / "data"
EVAL = DATA / "eval"
DEDUP_DOCS = [str(DATA / "dedup" / "dclm_docs_150.jsonl.gz"), str(DATA / "dedup" / "near_dups.jsonl.gz")]


def _jsonl(path: Path) -> list[dict]:
    op = gzip.open if path.suffix == ".gz" else open
    with op(path, "rt", encoding="utf-8") as f:
        return [json.loads(x) for x in f if x.strip()]


def _hosts() -> list[str]:
    return [r["text"] for f in ("dolma_cc_en_head-0091.jsonl.gz", "dolma_cc_en_head-0174.jsonl.gz")
            for r in _jsonl(DATA / "jsonl" / f)]


def _items(stage: Decontaminate, n: int = 6) -> list[tuple[str, str, str]]:
    out, seen = [], {}
    for it in stage.items():
        if seen.get(it.benchmark, 0) < n:
            seen[it.benchmark] = seen.get(it.benchmark, 0) + 1
            out.append((it.benchmark, it.item, it.texts[0]))
    return out


def _dag_file(tmp_path: Path, stages: dict, name: str = "eval-test") -> str:
    p = tmp_path / f"{name}.yaml"
    p.write_text(yaml.safe_dump({"name": name, "inputs": {"docs": {"format": "jsonl", "paths": DEDUP_DOCS,
                                                                   "source": "web", "id_field": "id"}},
                                 "stages": stages, "output": list(stages)[-1]}))
    return str(p)


def test_decontam_every_form_found_and_a_broken_stage_shows():
    st = Decontaminate(type="decontaminate", eval_sets=["gsm8k", "math", "humaneval"], eval_dir=str(DATA / "decontam"))
    items, hosts = _items(st), _hosts()
    neg = [r["question"] + "\n" + r["answer"] for r in _jsonl(DATA / "decontam" / "gsm8k_train_head.jsonl")]
    rep = decontam_figures(decontam_flagger(st), items, hosts, negatives=neg)
    assert rep["planted"] == len(items) * len(LEAK_FORMS) == (6 + 6 + 5) * 9  # HumanEval fixture: 5 items
    for form, v in rep["recall_per_form"].items():
        assert v["recall"] == 1.0 and v["attributed"] == 1.0, form
    assert rep["false_drops"]["flagged"] == 0 and rep["negatives"]["flagged"] == 0
    assert rep["tables"][0]["rows"][0][:4] == ["verbatim", 17, 17, "100.0%"]
    # a stage that needs 40 matched windows misses the short items: recall drops below 1
    broken = Decontaminate(type="decontaminate", eval_sets=["gsm8k", "math", "humaneval"],
                           eval_dir=str(DATA / "decontam"), min_overlaps=40)
    bad = decontam_figures(decontam_flagger(broken), items, hosts)
    assert bad["recall_all"] < 0.9
    assert bad["recall_per_form"]["verbatim"]["recall"] < 1.0


def test_rules_per_language_and_a_broken_rule_shows(tmp_path):
    rep = eval_rules(str(EVAL / "rules_pages.jsonl.gz"), lang_configs=["english", "fineweb2"])
    langs = rep["languages"]
    assert rep["pages"] == 132 and langs["all"]["natural"] == 48 and langs["all"]["unnatural"] == 84
    # English rules drop natural non-English pages; fineweb2's entries keep most of them
    assert langs["all"]["english"]["natural_kept"] < 0.3 < 0.8 < langs["all"]["fineweb2"]["natural_kept"]
    assert langs["en"]["english"]["natural_kept"] == 1.0
    assert set(rep["forms"]) == {"keywords", "menu", "salad", "boilerplate", "repeated", "teasers", "listing"}
    assert rep["forms"]["repeated"]["fineweb2"] == 1.0
    # the same chain from a DAG file, once as published and once with a broken stop-word rule
    chain = {"gopher_rep": {"type": "gopher_repetition", "input": "docs", "lang_config": "fineweb2"},
             "gopher": {"type": "gopher_quality", "input": "gopher_rep", "lang_config": "fineweb2"},
             "fineweb": {"type": "fineweb_quality", "input": "gopher", "lang_config": "fineweb2"}}
    good = eval_rules(str(EVAL / "rules_pages.jsonl.gz"), _dag_file(tmp_path, chain, "good") + ":fineweb")
    assert good["stages"]["as run"] == ["gopher_repetition", "gopher_quality", "fineweb_quality"]
    assert good["languages"]["all"]["as run"] == langs["all"]["fineweb2"]
    chain["gopher"]["by_lang"] = {lang: {"min_stop_words": 60} for lang in ("de", "fr", "es", "ru")}
    broken = eval_rules(str(EVAL / "rules_pages.jsonl.gz"), _dag_file(tmp_path, chain, "broken"))
    for lang in ("de", "fr", "es", "ru"):
        assert broken["languages"][lang]["as run"]["natural_kept"] == 0.0
    assert broken["languages"]["all"]["as run"]["natural_kept"] < good["languages"]["all"]["as run"]["natural_kept"]
    assert broken["languages"]["zh"]["as run"] == good["languages"]["zh"]["as run"]


def test_langid_accuracy_and_a_strict_threshold_shows(tmp_path):
    rep = eval_langid(str(DATA / "langid" / "lingua_docs_gt200chars_14lang.jsonl.gz"))
    assert rep["documents"] == 280 and rep["accuracy"] > 0.97
    assert len(rep["languages"]) == 15 and rep["languages"]["all"]["kept"] > 0.95
    strict = _dag_file(tmp_path, {"lid": {"type": "langid", "input": "docs", "min_score": 0.99, "keep": ["en"]}})
    rep2 = eval_langid(str(DATA / "langid" / "lingua_docs_gt200chars_14lang.jsonl.gz"), strict)
    assert rep2["accuracy"] == rep["accuracy"]  # the same detector
    assert rep2["languages"]["de"]["kept"] == 0.0 and rep2["languages"]["all"]["kept"] < 0.1


def test_dedup_pairs_and_a_higher_threshold_shows(tmp_path):
    rep = eval_dedup(str(EVAL / "dedup_pairs.jsonl"), docs=DEDUP_DOCS)
    assert rep["pairs"] == 300 and rep["positives"] == 150
    d = rep["decisions"]
    assert d["stage: lsh"]["precision"] == 1.0 and 0.7 < d["stage: lsh"]["recall"] < 0.95
    assert d["jaccard>=t"]["recall"] == pytest.approx(1 - rep["positives_below_threshold"] / 150)
    assert set(rep["recall_per_kind"]) == {"insert", "delete", "boilerplate", "reorder", "typos", "boilerplate+typos"}
    strict = _dag_file(tmp_path, {"near": {"type": "minhash_dedup", "input": "docs", "threshold": 0.95,
                                           "verify_jaccard": True}})
    rep2 = eval_dedup(str(EVAL / "dedup_pairs.jsonl"), strict + ":near", docs=DEDUP_DOCS)
    assert rep2["decisions"]["stage: lsh+verify"]["recall"] < d["stage: lsh"]["recall"] - 0.2
    with pytest.raises(EvalError, match="not found"):
        eval_dedup(str(EVAL / "dedup_pairs.jsonl"), docs=DEDUP_DOCS[:1])


def test_eval_over_a_run(tmp_path, ray_session):
    """A run with decontaminate then minhash_dedup: ``refinery eval decontam`` plants into the
    stage's kept documents, ``refinery eval dedup`` reads the run's own clusters; both write
    their report into the stage's folder and where --json says."""
    from curation.pipeline.executor import run_dag

    docs = _jsonl(DATA / "dedup" / "dclm_docs_150.jsonl.gz")[:60] + _jsonl(DATA / "dedup" / "near_dups.jsonl.gz")[:40]
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs]}), src)
    dag = parse_dag({
        "name": "eval-run",
        "inputs": {"docs": {"format": "parquet", "paths": [str(src)], "source": "web", "id_field": "id"}},
        "stages": {"decontam": {"type": "decontaminate", "input": "docs", "eval_sets": ["gsm8k", "humaneval"],
                                "eval_dir": str(DATA / "decontam")},
                   "near": {"type": "minhash_dedup", "input": "decontam", "partitions": 2}},
        "output": "near"})
    run = tmp_path / "run"
    run_dag(dag, run, workers=1, quiet=True)
    out = CliRunner().invoke(app, ["eval", "decontam", str(run / "decontam"), "--plant", "5", "--json",
                                   str(tmp_path / "d.json")])
    assert out.exit_code == 0, out.output
    assert "verbatim" in out.output and "_eval_decontam.json" in out.output
    rep = json.loads((run / "decontam" / "_eval_decontam.json").read_text())
    assert rep == json.loads((tmp_path / "d.json").read_text())
    assert rep["hosts"] == 100 and rep["items"] == 10 and rep["recall_per_form"]["verbatim"]["recall"] == 1.0
    assert rep["recall_all"] >= 0.99
    # the hosts are documents this stage kept: they cannot show a false drop, so none is claimed
    assert rep["false_drops"]["flagged"] is None and rep["false_drops"]["on"].startswith("not measured")
    clean = DATA / "filters" / "real_docs.jsonl.gz"  # real web documents the stage never judged
    out = CliRunner().invoke(app, ["eval", "decontam", str(run / "decontam"), "--plant", "5", "--clean", str(clean),
                                   "--json", str(tmp_path / "d2.json")])
    assert out.exit_code == 0, out.output
    fd = json.loads((tmp_path / "d2.json").read_text())["false_drops"]
    assert fd["documents"] == len(_jsonl(clean)) > 0 and fd["flagged"] == 0 and fd["on"] == "clean documents given"

    pairs = [r for r in _jsonl(EVAL / "dedup_pairs.jsonl")
             if r["b"] in {d["id"] for d in docs} and r["a"] in {d["id"] for d in docs}]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in pairs))
    out = CliRunner().invoke(app, ["eval", "dedup", str(run / "near"), "--pairs", str(tmp_path / "pairs.jsonl")])
    assert out.exit_code == 0, out.output
    rep = json.loads((run / "near" / "_eval_dedup.json").read_text())
    assert rep["positives"] >= 20
    # connected components only add links: the run finds every pair LSH links, and more
    assert rep["decisions"]["run clusters"]["tp"] >= rep["decisions"]["stage: lsh"]["tp"]
    out = CliRunner().invoke(app, ["eval", "decontam", str(run / "near")])
    assert out.exit_code == 2 and "not decontaminate" in out.output


def test_run_reports_lists_each_stages_latest_report(tmp_path):
    """What the dashboard's Evaluations panel reads: each stage's ``_eval_<kind>.json`` with its
    headline figures, a broken file listed with an error, a link leading out of the run not read."""
    import os
    import time

    from curation.pipeline.evaluate import run_reports
    from curation.pipeline.rundir import RunDir

    run = tmp_path / "run"
    run.mkdir()
    dag = parse_dag({"name": "reports", "inputs": {"docs": {"format": "jsonl", "paths": DEDUP_DOCS, "source": "web"}},
                     "stages": {"rep": {"type": "gopher_repetition", "input": "docs"},
                                "gopher": {"type": "gopher_quality", "input": "rep"}}}, "reports.yaml")
    (run / "dag.yaml").write_text(yaml.safe_dump(dag.to_dict(), sort_keys=False))
    rep = eval_rules(str(EVAL / "rules_pages.jsonl.gz"), str(run / "gopher"))
    (run / "rep").mkdir()
    (run / "rep" / "_eval_langid.json").write_text("{not json")
    secret = tmp_path / "outside.json"
    secret.write_text(json.dumps({"kind": "langid", "accuracy": 1.0}))
    os.symlink(secret, run / "gopher" / "_eval_langid.json")
    got = run_reports(RunDir(run))
    assert [(e["stage"], e["kind"]) for e in got] == [("rep", "langid"), ("gopher", "rules")]
    assert got[0]["error"].startswith("unreadable report")
    g = got[1]
    every = rep["languages"]["all"]["as run"]
    assert g["headline"] == [{"name": "as run: natural kept", "value": every["natural_kept"], "unit": "share"},
                             {"name": "as run: unnatural caught", "value": every["unnatural_caught"], "unit": "share"}]
    assert g["tables"] == rep["tables"] and g["target"] == "RUN/gopher" and g["file"] == "gopher/_eval_rules.json"
    assert abs(g["modified"] - time.time()) < 60
