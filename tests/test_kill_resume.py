"""Faults, survived (issue 29): ``refinery run`` is a real process, SIGKILLed inside a global
stage's phase (REFINERY_FAULT_KILL_AT: the driver kills itself once some of the phase's jobs
are recorded), then run again into the same directory: every shard and manifest is byte-identical
to an undisturbed run, and the jobs recorded before the kill are not run again.
(tests/test_global_resume.py raises inside the driver instead; this one loses the process,
its embedded Ray and everything in memory.)"""

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
from test_global_resume import _digests

pytestmark = pytest.mark.slow  # ~4 min on 2 cores: every run is a fresh process with its own Ray


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
def dedup(short_tmp, request):
    d = yaml.safe_load((REPO / "pipelines" / "dedup.yaml").read_text())
    d["stages"]["exact"]["partitions"] = d["stages"]["near"]["partitions"] = 4
    dag = short_tmp / "dedup.yaml"
    dag.write_text(yaml.safe_dump(d))
    ref = short_tmp / "dedup-ref"
    # the reference and the selected labels' kill-and-resume runs share nothing but the
    # machine: they start at once, two at a time (each is mostly a Ray starting and a driver
    # waiting), and a test waits for its own and the reference only to compare
    test = "test_dedup_driver_sigkilled_mid_phase_resumes_byte_identical"
    labels = [label for label in DEDUP_LABELS if any(item.nodeid.endswith(f"::{test}[{label}]") for item in request.session.items)]
    pool = ThreadPoolExecutor(2)
    ref_run = pool.submit(_cli_run, dag, ref, short_tmp)
    killed = {label: pool.submit(_kill_and_resume, dag, short_tmp / label.replace(":", "-"), short_tmp, label)
              for label in labels}
    yield dag, ref, ref_run, killed
    pool.shutdown()


def _reference(ref: Path, ref_run) -> Path:
    done = ref_run.result()
    assert done.returncode == 0, done.stdout[-3000:]
    return ref


@pytest.mark.parametrize("label", DEDUP_LABELS)
def test_dedup_driver_sigkilled_mid_phase_resumes_byte_identical(dedup, short_tmp, label):
    dag, ref, ref_run, killed = dedup
    run = short_tmp / label.replace(":", "-")
    stats, seconds = killed[label].result()
    assert _digests(run) == _digests(_reference(ref, ref_run)), label
    assert 0 < stats["ran"] < stats["jobs"], (label, stats)  # the jobs recorded before the kill were kept
    print(f"{label}: killed and resumed in {seconds:.1f} s, {stats}")


def test_mix_and_pack_driver_sigkilled_mid_phase_resume_byte_identical(short_tmp, tmp_path_factory):
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
    # the reference and the three kill-and-resume runs share nothing but the machine: two at a
    # time (each is mostly a Ray starting and a driver waiting): 74 s -> 55 s on 2 cores
    with ThreadPoolExecutor(2) as pool:
        ref_run = pool.submit(_cli_run, dag, ref, short_tmp)
        killed = {label: pool.submit(_kill_and_resume, dag, short_tmp / label.replace(":", "-"), short_tmp, label)
                  for label in labels}
        assert ref_run.result().returncode == 0
    for label in labels:
        run = short_tmp / label.replace(":", "-")
        stats, seconds = killed[label].result()
        assert _digests(run) == _digests(ref), label
        assert 0 < stats["ran"] < stats["jobs"], (label, stats)
        print(f"{label}: killed and resumed in {seconds:.1f} s, {stats}")


def test_quality_top_driver_sigkilled_mid_phase_resumes_byte_identical(short_tmp, trained):
    import gzip

    from test_quality import CRAWL, REFERENCE

    plain = []  # uncompressed, so split_bytes cuts them: a phase of several jobs to kill between
    for f in (CRAWL, REFERENCE):
        plain.append(short_tmp / f.name.removesuffix(".gz"))
        plain[-1].write_bytes(gzip.decompress(f.read_bytes()))
    dag = short_tmp / "quality-top.yaml"
    dag.write_text(yaml.safe_dump({
        "name": "quality-top",
        "inputs": {"docs": {"format": "jsonl", "paths": [str(p) for p in plain], "source": "web",
                            "split_bytes": 40_000}},
        "stages": {"quality": {"type": "quality_top", "model": str(trained), "keep_top": 0.3}}}))
    ref = short_tmp / "quality-ref"
    label = "quality:score"
    run = short_tmp / "quality-score"
    with ThreadPoolExecutor(2) as pool:  # the reference beside the killed run: they share nothing
        ref_run = pool.submit(_cli_run, dag, ref, short_tmp)
        stats, seconds = _kill_and_resume(dag, run, short_tmp, label)
        assert ref_run.result().returncode == 0
    assert _digests(run) == _digests(ref), label
    assert 0 < stats["ran"] < stats["jobs"], (label, stats)
    print(f"{label}: killed and resumed in {seconds:.1f} s, {stats}")


from test_quality import trained  # noqa: E402,F401  (the module-scoped classifier fixture)
