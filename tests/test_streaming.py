"""Streaming map tasks: a task's memory follows its batch, not its shard, and the batch size
never changes a byte of the output."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import ClassVar, Literal

import pyarrow.parquet as pq
import pytest

from conftest import REPO
from curation.io.read import iter_read
from curation.pipeline.dag import load_dag, parse_dag
from curation.pipeline.executor import RootJob, _root_entries, make_plan, run_dag
from curation.pipeline.rundir import RunDir
from curation.stages.base import MapStage, StageResult

MiB = 1 << 20


def _texts() -> list[str]:
    out = []
    for f in sorted((REPO / "tests/data/jsonl").glob("dolma_cc_en_head-*.jsonl.gz")):
        out += [json.loads(line)["text"] for line in gzip.open(f, "rt")]
    return out


def _jsonl(path: Path, size: int) -> Path:
    """Real CC pages repeated (each line its own offset, so its own id) up to ``size`` bytes."""
    texts = _texts()
    with open(path, "w") as f:
        while f.tell() < size:
            for t in texts:
                f.write(json.dumps({"text": t}) + "\n")
    return path


def _task_growth(tmp: Path, size: int, batch_bytes: int) -> dict:
    src = _jsonl(tmp / f"in-{size}.jsonl", size)
    work = tmp / f"w-{size}"
    work.mkdir()
    out = subprocess.run([sys.executable, str(REPO / "tests/stream_task_memory.py"), str(src), str(work),
                          str(batch_bytes)], capture_output=True, text=True, cwd=REPO, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_task_memory_is_flat_in_the_shard_size(tmp_path):
    # One task over a 12 MB and a 36 MB shard, 1 MiB read batches, three filters fused: if the
    # task held its shard (as it did before streaming), growth would triple with the shard.
    small = _task_growth(tmp_path, 12 * MiB, 1 * MiB)
    large = _task_growth(tmp_path, 36 * MiB, 1 * MiB)
    assert large["rows"]["gopher"] > 2.5 * small["rows"]["gopher"]  # the larger shard did 3x the work
    assert large["growth_mb"] < 1.5 * small["growth_mb"] + 16, (small, large)


def _hashes(run: Path) -> dict[str, str]:
    return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(run.rglob("*.parquet")) if "_work" not in p.parts}


def test_batch_size_never_changes_a_byte(tmp_path, ray_session):
    # The demo's map stages (extract, the union, four filters) with tiny and default batches:
    # every shard and rejected file is identical, row groups included.
    spec = load_dag(REPO / "pipelines/demo.yaml").to_dict()
    runs = {}
    for name, rows, nbytes in [("tiny", 7, 64 << 10), ("default", spec["batch_size"], spec["batch_bytes"])]:
        dag = parse_dag({**spec, "batch_size": rows, "batch_bytes": nbytes}, str(REPO / "pipelines/demo.yaml"),
                        str(REPO))
        runs[name] = tmp_path / name
        run_dag(dag, runs[name], workers=2, quiet=True)
    tiny, default = _hashes(runs["tiny"]), _hashes(runs["default"])
    assert len(default) > 10 and any(k.startswith("rejected/") for k in default)
    assert tiny == default


class SeeBatches(MapStage):
    """A pass-through map stage that records the size of every batch it is given."""

    type: Literal["test_streaming:SeeBatches"] = "test_streaming:SeeBatches"
    seen: ClassVar[list[int]] = []

    def process(self, batch, text=None):
        SeeBatches.seen.append(batch.num_rows)
        return StageResult(batch, None, text)


def test_small_batches_after_extraction_are_joined_before_the_next_stage(tmp_path):
    # A read batch is cut by HTML bytes; what extraction keeps of it is a twentieth. The stage
    # after it gets the kept rows joined back up to the batch budget, in order, none lost.
    SeeBatches.seen.clear()
    spec = {"name": "coalesce", "batch_size": 2000, "batch_bytes": 64 << 10,
            "inputs": {"crawl": {"format": "warc", "paths": [str(REPO / "tests/data/warc/dolma_sample-0000.warc.gz")],
                                 "source": "web"}},
            "stages": {"extract": {"type": "extract", "input": "crawl"},
                       "see": {"type": "test_streaming:SeeBatches", "input": "extract"}},
            "output": "see"}
    dag = parse_dag(spec, str(tmp_path / "dag.yaml"), str(REPO))
    plan = make_plan(dag)
    rd = RunDir(str(tmp_path / "run"))
    rd.prepare(dag, False)
    shard = plan.input_shards["crawl"][0]
    entries = {e["stage"]: e for e in _root_entries(
        RootJob(dag.to_dict(), dag.path, dag.base_dir, rd, "crawl", shard.key, shard, None, False))}
    extracted = pq.read_table(rd.shard_path("extract", shard.key))
    # the read made many batches (64 KiB of HTML each); the stage after extraction saw few
    n_read = sum(1 for _ in iter_read(shard, dag.inputs["crawl"], dag.batch_size, dag.batch_bytes))
    assert n_read >= 4
    assert len(SeeBatches.seen) < n_read / 2, (n_read, SeeBatches.seen)
    assert sum(SeeBatches.seen) == extracted.num_rows == entries["see"]["rows"] > 0
    assert pq.read_table(rd.shard_path("see", shard.key)).column("id").to_pylist() == \
        extracted.column("id").to_pylist()


class SeeThreads(MapStage):
    """A pass-through map stage that records its ``label``, the thread it runs on and the
    stage-module restriction in force there; ``fail`` raises on its first batch."""

    type: Literal["test_streaming:SeeThreads"] = "test_streaming:SeeThreads"
    label: str = ""
    fail: bool = False
    seen: ClassVar[list[tuple[str, str, object]]] = []

    def process(self, batch, text=None):
        from curation.pipeline.dag import stage_modules_in_force

        SeeThreads.seen.append((self.label, threading.current_thread().name, stage_modules_in_force()))
        if self.fail:
            raise RuntimeError("a stage failed on the chain thread")
        return StageResult(batch, None, text)


def _threads_of(label: str) -> set[str]:
    return {t for lab, t, _ in SeeThreads.seen if lab == label}


def _three_stage_task(tmp: Path, fail: bool = False, src_dir: Path | None = None) -> tuple[list[dict], RunDir, str]:
    """jsonl -> first -> second -> third (SeeThreads), one task run in this process; the input
    file in ``src_dir`` (default ``tmp``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    src = _jsonl((src_dir or tmp) / "in.jsonl", 256 << 10)
    stage = {"type": "test_streaming:SeeThreads"}
    spec = {"name": "threads", "batch_size": 2000, "batch_bytes": 64 << 10,
            "inputs": {"docs": {"format": "jsonl", "paths": [str(src)], "source": "web"}},
            "stages": {"first": {**stage, "input": "docs", "label": "first"},
                       "second": {**stage, "input": "first", "label": "second"},
                       "third": {**stage, "input": "second", "label": "third", "fail": fail}},
            "output": "third"}
    dag = parse_dag(spec, str(tmp / "dag.yaml"), str(REPO))
    shard = make_plan(dag).input_shards["docs"][0]
    rd = RunDir(str(tmp / "run"))
    rd.prepare(dag, False)
    job = RootJob(dag.to_dict(), dag.path, dag.base_dir, rd, "docs", shard.key, shard, None, False)
    return _root_entries(job), rd, shard.key


def test_the_stages_after_the_first_run_on_the_chain_thread(tmp_path, monkeypatch):
    # The stage the read feeds runs on the task's thread; the stages it feeds on the chain
    # thread (their own heap: curation.pipeline.allocator), in turn, with the caller's context;
    # the output is the same byte for byte as with the chain on the task's thread.
    from curation.pipeline import allocator
    from curation.pipeline.dag import stage_modules_allowed

    SeeThreads.seen.clear()
    with stage_modules_allowed(["test_streaming"]):
        # one input file for both runs: rows record the path of their file (origin_file)
        entries, _, _ = _three_stage_task(tmp_path / "threaded", src_dir=tmp_path)
    here = threading.current_thread().name
    assert _threads_of("first") == {here}
    chain = _threads_of("second") | _threads_of("third")
    assert len(chain) == 1 and here not in chain and next(iter(chain)).startswith("refinery-chain")
    assert {m for _, _, m in SeeThreads.seen} == {("test_streaming",)}
    threaded = _hashes(tmp_path / "threaded" / "run")

    monkeypatch.setenv("REFINERY_CHAIN_THREAD", "0")
    allocator.chain_thread.cache_clear()
    try:
        SeeThreads.seen.clear()
        entries_off, _, _ = _three_stage_task(tmp_path / "one", src_dir=tmp_path)
        assert {t for _, t, _ in SeeThreads.seen} == {here}
    finally:
        monkeypatch.delenv("REFINERY_CHAIN_THREAD")
        allocator.chain_thread.cache_clear()
    assert [e["rows"] for e in entries] == [e["rows"] for e in entries_off] and entries[-1]["rows"] > 0
    assert threaded == _hashes(tmp_path / "one" / "run") and len(threaded) >= 3


def test_an_error_on_the_chain_thread_fails_the_task_and_commits_nothing(tmp_path):
    # The chain thread's exception reaches the task as it was raised; every stage's writer is
    # aborted, as when a stage fails on the task's thread.
    SeeThreads.seen.clear()
    with pytest.raises(RuntimeError, match="a stage failed on the chain thread"):
        _three_stage_task(tmp_path, fail=True)
    assert [lab for lab, _, _ in SeeThreads.seen] == ["first", "second", "third"]
    assert _threads_of("third") != {threading.current_thread().name}
    assert not _hashes(tmp_path / "run")
