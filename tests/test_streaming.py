"""Streaming map tasks: a task's memory follows its batch, not its shard, and the batch size
never changes a byte of the output."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import subprocess
import sys
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
