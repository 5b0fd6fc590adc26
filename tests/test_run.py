"""End-to-end runs on Ray: accounting, determinism across worker counts, resume after SIGKILL,
config errors that start nothing."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from curation.pipeline.dag import load_dag, parse_dag
from curation.pipeline.executor import RunDirError, run_dag
from curation.pipeline.stats import connect, stage_table

REFINERY = [sys.executable, "-m", "curation.cli"]


def _shard_hashes(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run_dir.rglob("*.parquet")) if "_work" not in p.parts}


def _manifests(run_dir: Path) -> dict[str, str]:
    return {str(p.relative_to(run_dir)): p.read_text() for p in sorted(run_dir.rglob("_manifest.jsonl"))}


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, ray_session):
    os.chdir(REPO)
    out = tmp_path_factory.mktemp("demo") / "run"
    run_dag(load_dag(REPO / "pipelines/demo.yaml"), out, workers=2, quiet=True)
    return out


def test_accounting_every_stage_in_equals_kept_plus_rejected(demo_run):
    con = connect(demo_run)
    dag = load_dag(REPO / "pipelines/demo.yaml")
    for name, st in dag.stages.items():
        if st.kind == "union":
            continue
        rows_in = con.execute("select sum(rows_in) from manifest where stage = ?", [name]).fetchone()[0]
        kept = con.execute(f'select count(*) from "{name}"').fetchone()[0]
        rejected = con.execute("select count(*) from rejected where stage = ?", [name]).fetchone()[0]
        assert rows_in == kept + rejected, name
        # and what came in is exactly what the upstream kept
        (up,) = st.upstreams()
        if up in dag.inputs:
            up_rows = con.execute("select sum(rows) from manifest where stage = ?", [up]).fetchone()[0]
        else:
            up_rows = con.execute(f'select count(*) from "{up}"').fetchone()[0]
        assert rows_in == up_rows, name
    kept_ids = con.execute("select count(*), count(distinct id) from kept").fetchone()
    assert kept_ids[0] == kept_ids[1] > 0
    # the CLI answers the same question
    out = subprocess.run(REFINERY + ["sql", str(demo_run), "select source, count(*) as n from kept group by 1 order by 1"],
                         capture_output=True, text=True, check=True).stdout
    assert "math" in out and "web" in out


def test_a_query_gets_only_the_views_it_reads(demo_run):
    from curation.pipeline.rundir import RunDir

    rd = RunDir(demo_run)
    q = 'select count(*) from "gopher" where id in (select id from c4)'
    assert rd.views_in(q) == {"gopher", "c4"}
    con = connect(demo_run, query=q)
    made = {r[0] for r in con.execute("select view_name from duckdb_views() where not internal").fetchall()}
    # gopher and c4 and what they read (gopher_rep, web, extract, ccnet): no rejected, no manifest
    assert made <= RunDir.view_closure(rd.load_dag(), {"gopher", "c4"})
    assert {"gopher", "c4", "web"} <= made and not made & {"rejected", "manifest", "kept", "fineweb", "math"}
    full = connect(demo_run)
    assert con.execute(q).fetchone() == full.execute(q).fetchone()


def test_stats_table_and_reasons(demo_run):
    rows = {r["stage"]: r for r in stage_table(demo_run)}
    assert rows["extract"]["docs_in"] > 30 and rows["gopher"]["rejected"] > 0
    out = subprocess.run(REFINERY + ["stats", str(demo_run)], capture_output=True, text=True, check=True).stdout
    assert "gopher_quality:" in out and "docs in" in out


def test_one_and_two_workers_give_identical_shards(demo_run, tmp_path, ray_session):
    one = tmp_path / "one"
    run_dag(load_dag(REPO / "pipelines/demo.yaml"), one, workers=1, quiet=True)
    assert _shard_hashes(one) == _shard_hashes(demo_run)
    assert _manifests(one) == _manifests(demo_run)


def test_rerun_skips_everything_and_other_dag_is_refused(demo_run, ray_session):
    before = {p: p.stat().st_mtime_ns for p in demo_run.rglob("*.parquet")}
    run_dag(load_dag(REPO / "pipelines/demo.yaml"), demo_run, workers=2, quiet=True)
    assert before == {p: p.stat().st_mtime_ns for p in demo_run.rglob("*.parquet")}
    other = yaml.safe_load((REPO / "pipelines/demo.yaml").read_text())
    # a threshold alone would rerun in place and re-decide (tests/test_rethreshold.py); what is measured may not
    other["stages"]["gopher_rep"]["dup_line_frac"] = 0.25
    other["stages"]["extract"]["engine"] = "trafilatura"
    with pytest.raises(RunDirError, match=r"different DAG.*stages\.extract\.engine"):
        run_dag(parse_dag(other), demo_run, workers=2, quiet=True)


def test_overwrite_recomputes_only_what_changed(demo_run, tmp_path, ray_session):
    run = tmp_path / "partial"
    shutil.copytree(demo_run, run)
    mtimes = lambda stage: {p.name: p.stat().st_mtime_ns for p in (run / stage).glob("*.parquet")}  # noqa: E731
    extract, c4, fineweb = mtimes("extract"), mtimes("c4"), mtimes("fineweb")
    d = yaml.safe_load((REPO / "pipelines/demo.yaml").read_text())
    d["stages"]["fineweb"]["short_line_length"] = 20
    run_dag(parse_dag(d), run, workers=2, quiet=True, overwrite=True)
    assert mtimes("extract") == extract and mtimes("c4") == c4  # read back, not recomputed
    assert all(mtimes("fineweb")[k] != v for k, v in fineweb.items())
    con = connect(run)
    assert con.execute("select count(*) from kept").fetchone()[0] > 0
    rows_in = con.execute("select sum(rows_in) from manifest where stage = 'fineweb'").fetchone()[0]
    assert rows_in == con.execute("select count(*) from c4").fetchone()[0]


SLOW_DAG = """
name: resume
inputs:
  math: {format: jsonl, paths: ["%(data)s/jsonl/gsm8k_train_head400.jsonl"], source: math, text_field: question, split_bytes: 2500}
  crawl: {format: warc, paths: ["%(data)s/warc/*.warc.gz"], source: web}
stages:
  extract: {type: extract, input: crawl, engine: trafilatura}
  gopher_rep: {type: gopher_repetition, input: extract}
  merged: {type: union, inputs: [gopher_rep, math]}
"""


@pytest.mark.slow
def test_sigkill_mid_run_then_resume_equals_uninterrupted(tmp_path, ray_session):
    dag_file = tmp_path / "resume.yaml"
    dag_file.write_text(SLOW_DAG % {"data": REPO / "tests/data"})
    straight = tmp_path / "straight"
    killed = tmp_path / "killed"
    proc = subprocess.Popen(REFINERY + ["run", str(dag_file), "--out", str(killed), "--workers", "1", "-q"],
                            start_new_session=True)
    manifest = killed / "math" / "_manifest.jsonl"

    def kill_mid_run() -> bool:
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            if manifest.exists() and len(manifest.read_text().splitlines()) >= 3:
                break
            time.sleep(0.05)
        if proc.poll() is not None:
            return False
        os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray cluster it started
        proc.wait()
        return True

    # the uninterrupted run (this process's Ray) runs while a thread waits for the kill point
    # of the other (its own Ray): they share nothing but the machine
    with ThreadPoolExecutor(1) as pool:
        killed_mid_run = pool.submit(kill_mid_run)
        run_dag(load_dag(dag_file), straight, workers=2, quiet=True)
        assert killed_mid_run.result(), "run finished before it could be killed"
    n_math = len(manifest.read_text().splitlines())
    assert 3 <= n_math < len((straight / "math" / "_manifest.jsonl").read_text().splitlines())

    subprocess.run(REFINERY + ["run", str(dag_file), "--out", str(killed), "--workers", "2", "-q"], check=True)
    assert _shard_hashes(killed) == _shard_hashes(straight)
    assert _manifests(killed) == _manifests(straight)
    con = connect(killed)
    n, distinct = con.execute("select count(*), count(distinct id) from kept").fetchone()
    assert n == distinct == connect(straight).execute("select count(*) from kept").fetchone()[0]


@pytest.mark.parametrize(
    "edit, expect",
    [
        (lambda d: d["stages"]["gopher"].update(type="gopher_qualty"), "stages.gopher.type: unknown stage type 'gopher_qualty'"),
        (lambda d: d["stages"]["gopher"].update(min_doc_words="many"), "stages.gopher.min_doc_words"),
        (lambda d: d["inputs"]["math"].update(paths=["tests/data/nope/*.jsonl"]), "inputs.math.paths: no file matches"),
        (lambda d: d["stages"]["c4"].update(input="gopherr"), "stages.c4.input: 'gopherr' is neither an input nor a stage"),
        (lambda d: d["inputs"]["crawl"].update(format="warcz"), "inputs.crawl.format"),
    ],
)
def test_config_error_is_one_clear_line_and_starts_nothing(tmp_path, edit, expect):
    d = yaml.safe_load((REPO / "pipelines/demo.yaml").read_text())
    edit(d)
    f = tmp_path / "bad.yaml"
    f.write_text(yaml.safe_dump(d))
    r = subprocess.run(REFINERY + ["run", str(f), "--out", str(tmp_path / "run")], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 2
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and str(f) in lines[0] and expect in lines[0], r.stderr
    assert not (tmp_path / "run").exists()  # validation happens before the run dir or Ray exist
