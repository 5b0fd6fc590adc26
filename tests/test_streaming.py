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

import pytest

from conftest import REPO
from curation.pipeline.dag import load_dag, parse_dag
from curation.pipeline.executor import run_dag

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
