"""Live progress (curation/pipeline/progress.py): per task phase, documents and bytes per second
overall and over the last minute, an ETA, tasks per node, and the stragglers (the running tasks
that have run longest); ``refinery status RUN`` shows them. A fake clock drives the arithmetic;
then a real run's progress.json carries them."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from conftest import DATA
from curation.pipeline.progress import RunProgress


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_rates_eta_and_stragglers_from_task_events():
    clock, stored = Clock(), []
    p = RunProgress(lambda s: stored.append(json.loads(json.dumps(s))), "x", quiet=True, clock=clock, workers=2)
    p.tasks_planned("read+map", total_bytes=1000)
    p.phase("read+map", 0, 10)
    for i in range(4):
        p.task_started("read+map", i, f"in-{i}.warc.gz", 100)
        clock.t += 1
    clock.t = 1010.0
    p.task_finished("read+map", 1, docs=50, node="n1")
    p.task_finished("read+map", 2, docs=30, node="n2")
    p.task_finished("read+map", 3, docs=0, node=None, ok=False)
    p.phase("read+map", 2, 10)
    live = stored[-1]["live"]["read+map"]
    assert (live["running"], live["done"], live["failed"], live["total"]) == (1, 2, 1, 10)
    assert (live["docs"], live["bytes"]) == (80, 200)
    assert live["docs_per_s"] == pytest.approx(8.0) and live["bytes_per_s"] == pytest.approx(20.0)
    assert live["docs_per_s_1m"] == pytest.approx(8.0)  # the window is the 10 s the phase has run
    assert live["eta_s"] == pytest.approx(800 / 20.0)  # remaining bytes at the last minute's byte rate
    assert live["stragglers"] == [{"task": "in-0.warc.gz", "bytes": 100, "running_s": 10.0}]
    assert live["nodes"] == {"n1": {"done": 1, "failed": 0}, "n2": {"done": 1, "failed": 0},
                             "-": {"done": 0, "failed": 1}}
    # two minutes later with nothing finished: the last minute's rates fall to 0, the overall ones stay
    clock.t = 1130.0
    p.write()
    live = stored[-1]["live"]["read+map"]
    assert live["docs_per_s_1m"] == 0 and live["docs_per_s"] == pytest.approx(80 / 130, abs=1e-3)
    assert live["stragglers"][0]["running_s"] == 130.0
    assert live["eta_s"] == pytest.approx(7 * 8.5 / 2, abs=0.1)  # no byte rate: remaining tasks x mean task time / workers


def test_a_run_writes_live_figures_and_status_shows_them(tmp_path, ray_session):
    from curation.cli import app
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag

    dag = parse_dag({"name": "live", "inputs": {"math": {"format": "jsonl", "source": "math", "text_field": "question",
                                                          "paths": [str(DATA / "jsonl" / "gsm8k_train_head400.jsonl")],
                                                          "split_bytes": 40_000}},
                     "stages": {"g": {"type": "gopher_quality", "min_doc_words": 1}}}, "live.yaml")
    run_dag(dag, tmp_path / "run", workers=2, quiet=True)
    prog = json.loads((tmp_path / "run" / "progress.json").read_text())
    live = prog["live"]["read+map"]
    assert live["done"] == live["total"] == prog["phases"]["read+map"]["total"] > 1
    assert live["running"] == 0 and live["stragglers"] == [] and live["eta_s"] == 0
    assert live["docs"] == 400 and live["bytes"] == (DATA / "jsonl" / "gsm8k_train_head400.jsonl").stat().st_size
    assert live["docs_per_s"] > 0 and sum(n["done"] for n in live["nodes"].values()) == live["total"]
    out = CliRunner().invoke(app, ["status", str(tmp_path / "run")])
    assert out.exit_code == 0, out.output
    assert "read+map" in out.output and "docs/s" in out.output and "done" in out.output
    out = CliRunner().invoke(app, ["status", str(tmp_path / "run"), "--json"])
    assert json.loads(out.output)["live"]["read+map"]["docs"] == 400


def test_shuffle_partition_sizes_and_retries_in_progress():
    from rich.console import Console

    from curation.pipeline.progress import prometheus_text, render_status

    clock, stored = Clock(), []
    p = RunProgress(lambda s: stored.append(json.loads(json.dumps(s))), "x", quiet=True, clock=clock)
    p.phase("exact:partitions", 0, 4)
    for part, rows in ((0, 100), (2, 500), (3, 120)):
        p.partition_size("exact:partitions", part, rows)
    p.retried(3)
    p.retried(2)
    p.phase("exact:partitions", 3, 4)
    got = stored[-1]
    assert got["partitions"]["exact:partitions"] == {"done": 3, "largest": 500, "median": 120, "smallest": 100,
                                                     "skew": round(500 / 120, 3)}
    assert got["retries"] == 5
    p.partition_size("exact:partitions", 1, 130)  # an even count: the median is the mean of the middle two
    p.write()
    assert stored[-1]["partitions"]["exact:partitions"]["median"] == 125
    console = Console(width=150, record=True)
    console.print(render_status(stored[-1]))
    text = console.export_text()
    assert "shuffle partitions" in text and "4.00" in text and "5 storage requests retried" in text
    prom = prometheus_text({"r1": stored[-1]})
    assert 'refinery_shuffle_partition_largest{run="r1",phase="exact:partitions"} 500' in prom
    assert 'refinery_storage_retries_total{run="r1"} 5' in prom


def test_storage_retries_are_counted_from_the_libraries_decisions_and_not_printed(capsys):
    import logging

    from curation.io import retries

    retries.install()
    retries.install()  # idempotent: one filter per logger
    n = retries.count()
    logging.getLogger("botocore.retries.standard").debug("Retry needed, retrying request after delay of: %s", 0.5)
    logging.getLogger("botocore.retries.standard").debug("Not retrying request.")
    logging.getLogger("botocore.retryhandler").debug("Retry needed, action of: %s", 0.2)
    logging.getLogger("botocore.retryhandler").debug("No retry needed.")
    logging.getLogger("s3fs").debug("Retryable error: %s", ConnectionResetError("reset"))
    logging.getLogger("s3fs").debug("Client error (maybe retryable): %s", Exception("An error occurred (SlowDown)"))
    logging.getLogger("s3fs").debug("Client error (maybe retryable): %s", Exception("An error occurred (NoSuchKey)"))
    assert retries.count() - n == 4
    assert len(logging.getLogger("s3fs").filters) == 1
    out = capsys.readouterr()
    assert "Retry" not in out.out + out.err


def test_a_shuffle_run_reports_its_partition_sizes(tmp_path, ray_session):
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag

    dag = parse_dag({"name": "shuffle", "inputs": {"math": {"format": "jsonl", "source": "math", "text_field": "question",
                                                             "paths": [str(DATA / "jsonl" / "gsm8k_train_head400.jsonl")],
                                                             "split_bytes": 40_000}},
                     "stages": {"d": {"type": "exact_dedup", "partitions": 3}}}, "shuffle.yaml")
    run_dag(dag, tmp_path / "run", workers=2, quiet=True)
    prog = json.loads((tmp_path / "run" / "progress.json").read_text())
    parts = prog["partitions"]["d:partitions"]
    assert parts["done"] == 3 and parts["largest"] >= parts["median"] >= parts["smallest"] > 0
    assert prog["retries"] == 0  # a local run sends no storage request
    # the phase's partition sizes are the keys the run hashed: 400 documents, one key each
    assert parts["largest"] + parts["median"] + parts["smallest"] == 400


def test_stragglers_are_aged_to_now_between_writes():
    from curation.pipeline.progress import as_of

    prog = {"state": "running", "updated": 1000.0,
            "live": {"read+map": {"elapsed_s": 50.0, "stragglers": [{"task": "a", "bytes": 1, "running_s": 10.0}]}}}
    now = as_of(prog, 1030.0)
    assert now["live"]["read+map"]["stragglers"][0]["running_s"] == 40.0
    assert now["live"]["read+map"]["elapsed_s"] == 80.0 and now["as_of"] == 1030.0
    assert prog["live"]["read+map"]["stragglers"][0]["running_s"] == 10.0  # the stored state is left as it is
    assert as_of({**prog, "state": "done"}, 1030.0)["live"]["read+map"]["stragglers"][0]["running_s"] == 10.0


def test_watch_waits_for_the_run_to_start(tmp_path):
    import subprocess
    import sys
    import time

    from conftest import REPO

    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "curation.cli", "status", str(run), "--watch", "--interval", "0.2"],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    assert proc.poll() is None  # no progress.json yet: it waits, it does not fail
    (run / "progress.json").write_text(json.dumps({"name": "late", "state": "done", "started": 1.0, "finished": 2.0,
                                                   "updated": 2.0, "phases": {}, "stages": {}, "live": {}}))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "waiting for" in err and "late: done" in out
