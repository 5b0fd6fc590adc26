"""Kill a global stage in the middle of a phase (half its jobs done, then the driver dies) and
rerun the same DAG into the same run directory: every shard and manifest is byte-identical to
an uninterrupted run, and the jobs that finished before the kill are not run again."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest
import yaml

from conftest import REPO
from curation.pipeline.context import GlobalContext
from curation.pipeline.dag import parse_dag
from curation.pipeline.executor import run_dag


class Killed(Exception):
    """The driver 'dies' here."""


def _digests(run: Path) -> dict[str, str]:
    files = [p for p in sorted(run.rglob("*")) if p.is_file() and "_work" not in p.parts
             and (p.suffix == ".parquet" or p.name == "_manifest.jsonl")]
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest() for p in files}


def _kill_in(monkeypatch, label: str) -> None:
    """Make ``GlobalContext.phase`` run only the first half of ``label``'s jobs, then raise."""
    orig = GlobalContext.phase

    def phase(self, name, fn, jobs, *args, **kwargs):
        if f"{self.name}:{name}" == label:
            orig(self, name, fn, jobs[: max(1, len(jobs) // 2)], *args, **kwargs)
            raise Killed(label)
        return orig(self, name, fn, jobs, *args, **kwargs)

    monkeypatch.setattr(GlobalContext, "phase", phase)


def _kill_and_resume(monkeypatch, dag, run: Path, label: str) -> dict:
    _kill_in(monkeypatch, label)
    with pytest.raises(Killed):
        run_dag(dag, run, workers=2, quiet=True)
    monkeypatch.undo()
    run_dag(dag, run, workers=2, quiet=True)
    stage, phase = label.split(":", 1)
    return json.loads((run / stage / "_phases.json").read_text())["phases"][phase]


def _in_repo(fn):
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        return fn()
    finally:
        os.chdir(cwd)


_REF: dict = {}


def dedup_spec() -> dict:
    """pipelines/dedup.yaml with 4 partitions per global stage: several jobs per phase to kill between."""
    d = yaml.safe_load((REPO / "pipelines" / "dedup.yaml").read_text())
    d["stages"]["exact"]["partitions"] = d["stages"]["near"]["partitions"] = 4
    return d


def dedup_reference_run(tmp_path_factory) -> tuple:
    """(dag, run dir) of the undisturbed ``dedup_spec`` run, made once per session in this
    process's Ray (the ``ray_session`` fixture): this module and tests/test_kill_resume.py (whose
    killed runs are ``refinery run`` processes, byte-identical to it) compare with the same run."""
    if "dedup" not in _REF:
        dag = parse_dag(dedup_spec(), "pipelines/dedup.yaml", base_dir=str(REPO))
        run = tmp_path_factory.mktemp("dedup-ref") / "run"
        _in_repo(lambda: run_dag(dag, run, workers=2, quiet=True))
        _REF["dedup"] = dag, run
    return _REF["dedup"]


@pytest.fixture(scope="module")
def dedup_reference(tmp_path_factory, ray_session):
    return dedup_reference_run(tmp_path_factory)


@pytest.mark.parametrize("label", ["exact:keys", "exact:partitions", "exact:apply", "near:signatures",
                                   "near:candidates", "near:apply"])
def test_dedup_killed_mid_phase_resumes_byte_identical(dedup_reference, tmp_path, monkeypatch, label):
    dag, ref = dedup_reference
    stats = _in_repo(lambda: _kill_and_resume(monkeypatch, dag, tmp_path / "run", label))
    assert _digests(tmp_path / "run") == _digests(ref)
    assert 0 < stats["ran"] < stats["jobs"]  # the jobs finished before the kill were kept


def test_mix_and_pack_killed_mid_phase_resume_byte_identical(tmp_path_factory, tmp_path, monkeypatch, ray_session):
    from test_mix import _RUNS, mix_multi_dag, mix_multi_run

    ref = mix_multi_run(tmp_path_factory, 2)
    dag = mix_multi_dag(_RUNS["tok"])
    for label in ("mix:count", "mix:scatter", "mix:gather", "pack:pack"):
        run = tmp_path / label.replace(":", "-")
        stats = _kill_and_resume(monkeypatch, dag, run, label)
        assert _digests(run) == _digests(ref), label
        assert 0 < stats["ran"] < stats["jobs"], label


def test_quality_top_killed_mid_phase_resumes_byte_identical(tmp_path, monkeypatch, ray_session, trained):
    from test_quality import CRAWL, REFERENCE

    spec = {"name": "quality-top",
            "inputs": {"docs": {"format": "jsonl", "paths": [str(CRAWL), str(REFERENCE)], "source": "web",
                                "split_bytes": 40_000}},
            "stages": {"quality": {"type": "quality_top", "model": str(trained), "keep_top": 0.3}}}
    dag = parse_dag(spec, "quality-top.yaml", base_dir=str(REPO))
    ref = tmp_path / "ref"
    run_dag(dag, ref, workers=2, quiet=True)
    for label in ("quality:score", "quality:gather", "quality:cut"):
        run = tmp_path / label.replace(":", "-")
        stats = _kill_and_resume(monkeypatch, dag, run, label)
        assert _digests(run) == _digests(ref), label
        assert 0 < stats["ran"] < stats["jobs"], label


from test_quality import trained  # noqa: E402,F401  (the module-scoped classifier fixture)
