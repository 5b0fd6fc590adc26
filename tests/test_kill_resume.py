"""Faults, survived (issue 29): ``refinery run`` is a real process, SIGKILLed inside a global
stage's phase (REFINERY_FAULT_KILL_AT: the driver kills itself once some of the phase's jobs
are recorded), then run again into the same directory: every shard and manifest is byte-identical
to an undisturbed run, and the jobs recorded before the kill are not run again.
(tests/test_global_resume.py raises inside the driver instead; this one loses the process,
its embedded Ray and everything in memory.) The undisturbed reference runs are this process's
(``run_dag`` on the session's Ray), made while the killed ``refinery run`` processes run:
a CLI run's shards and manifests are the same bytes, and a reference needs no process and
Ray of its own. The dedup reference is test_global_resume's, made once per session."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from test_global_resume import _digests, _in_repo, dedup_reference_run, dedup_spec

pytestmark = pytest.mark.slow  # minutes on 2 cores: every killed or resumed run is a fresh process with its own Ray


def _cli_run(dag: Path, run: Path, tmp: Path, kill_at: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_TMPDIR": str(tmp)}
    env.pop("RAY_ADDRESS", None)
    env.pop("REFINERY_FAULT_KILL_AT", None)
    if kill_at:
        env["REFINERY_FAULT_KILL_AT"] = kill_at
    proc = subprocess.Popen([sys.executable, "-m", "curation.cli", "run", str(dag), "--out", str(run), "--workers", "2",
                             "-q"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    out, _ = proc.communicate(timeout=600)
    # whatever the dead driver's embedded Ray left in its session
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return subprocess.CompletedProcess(proc.args, proc.returncode, out.decode(errors="replace"))


def _kill_and_resume(dag: Path, run: Path, tmp: Path, label: str) -> tuple[dict, float]:
    t0 = time.time()
    killed = _cli_run(dag, run, tmp, kill_at=label)
    assert killed.returncode == -signal.SIGKILL, (label, killed.returncode, killed.stdout[-3000:])
    assert f"REFINERY_FAULT_KILL_AT={label}: SIGKILL" in killed.stdout
    again = _cli_run(dag, run, tmp)
    assert again.returncode == 0, (label, again.stdout[-3000:])
    stage, phase = label.split(":", 1)
    return json.loads((run / stage / "_phases.json").read_text())["phases"][phase], time.time() - t0


@pytest.fixture(scope="module")
def short_tmp(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("k")  # short: Ray's socket paths under RAY_TMPDIR are capped at 107 bytes


DEDUP_LABELS = ("exact:partitions", "near:candidates")


@pytest.fixture(scope="module")
def dedup(short_tmp, request, tmp_path_factory, ray_session):
    dag = short_tmp / "dedup.yaml"
    dag.write_text(yaml.safe_dump(dedup_spec()))
    # the selected labels' kill-and-resume runs share nothing but the machine: they start at
    # once, two at a time (each is mostly a Ray starting and a driver waiting), beside the
    # reference (test_global_resume's: already made when that module ran first)
    test = "test_dedup_driver_sigkilled_mid_phase_resumes_byte_identical"
    labels = [label for label in DEDUP_LABELS if any(item.nodeid.endswith(f"::{test}[{label}]") for item in request.session.items)]
    pool = ThreadPoolExecutor(2)
    try:
        killed = {label: pool.submit(_kill_and_resume, dag, short_tmp / label.replace(":", "-"), short_tmp, label)
                  for label in labels}
        _, ref = dedup_reference_run(tmp_path_factory)
        yield ref, killed
    finally:
        pool.shutdown()


@pytest.mark.parametrize("label", DEDUP_LABELS)
def test_dedup_driver_sigkilled_mid_phase_resumes_byte_identical(dedup, short_tmp, label):
    ref, killed = dedup
    run = short_tmp / label.replace(":", "-")
    stats, seconds = killed[label].result()
    assert _digests(run) == _digests(ref), label
    assert 0 < stats["ran"] < stats["jobs"], (label, stats)  # the jobs recorded before the kill were kept
    print(f"{label}: killed and resumed in {seconds:.1f} s, {stats}")


def test_mix_and_pack_driver_sigkilled_mid_phase_resume_byte_identical(short_tmp, tmp_path_factory, ray_session):
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag
    from test_mix import mix_multi_tokenizer

    tok = mix_multi_tokenizer(tmp_path_factory.getbasetemp() / "mix-multi-kill")
    d = yaml.safe_load((REPO / "pipelines" / "mix-multi.yaml").read_text())
    d["stages"]["tokenize"]["tokenizer"] = str(tok)
    # several output shards and pack windows: jobs to kill between
    d["stages"]["mix"]["rows_per_shard"] = d["stages"]["pack"]["window"] = 100
    dag = short_tmp / "mix-multi.yaml"
    dag.write_text(yaml.safe_dump(d))
    ref = short_tmp / "mix-ref"
    labels = ("mix:scatter", "mix:gather", "pack:pack")
    # the three kill-and-resume runs share nothing but the machine: two at a time (each is
    # mostly a Ray starting and a driver waiting), the reference in this process meanwhile
    with ThreadPoolExecutor(2) as pool:
        killed = {label: pool.submit(_kill_and_resume, dag, short_tmp / label.replace(":", "-"), short_tmp, label)
                  for label in labels}
        _in_repo(lambda: run_dag(parse_dag(d, "pipelines/mix-multi.yaml", base_dir=str(REPO)), ref, workers=2,
                                 quiet=True))
    for label in labels:
        run = short_tmp / label.replace(":", "-")
        stats, seconds = killed[label].result()
        assert _digests(run) == _digests(ref), label
        assert 0 < stats["ran"] < stats["jobs"], (label, stats)
        print(f"{label}: killed and resumed in {seconds:.1f} s, {stats}")


def test_quality_top_driver_sigkilled_mid_phase_resumes_byte_identical(short_tmp, trained, ray_session):
    import gzip

    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag
    from test_quality import CRAWL, REFERENCE

    plain = []  # uncompressed, so split_bytes cuts them: a phase of several jobs to kill between
    for f in (CRAWL, REFERENCE):
        plain.append(short_tmp / f.name.removesuffix(".gz"))
        plain[-1].write_bytes(gzip.decompress(f.read_bytes()))
    spec = {"name": "quality-top",
            "inputs": {"docs": {"format": "jsonl", "paths": [str(p) for p in plain], "source": "web",
                                "split_bytes": 40_000}},
            "stages": {"quality": {"type": "quality_top", "model": str(trained), "keep_top": 0.3}}}
    dag = short_tmp / "quality-top.yaml"
    dag.write_text(yaml.safe_dump(spec))
    ref = short_tmp / "quality-ref"
    label = "quality:score"
    run = short_tmp / "quality-score"
    with ThreadPoolExecutor(1) as pool:  # the reference (this process) beside the killed run: they share nothing
        killed = pool.submit(_kill_and_resume, dag, run, short_tmp, label)
        _in_repo(lambda: run_dag(parse_dag(spec, str(dag), base_dir=str(REPO)), ref, workers=2, quiet=True))
        stats, seconds = killed.result()
    assert _digests(run) == _digests(ref), label
    assert 0 < stats["ran"] < stats["jobs"], (label, stats)
    print(f"{label}: killed and resumed in {seconds:.1f} s, {stats}")


from test_quality import trained  # noqa: E402,F401  (the module-scoped classifier fixture)
