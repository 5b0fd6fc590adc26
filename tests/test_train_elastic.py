"""Elastic resume: a checkpoint written by 2 processes (FSDP2, sharded) resumes on 1, and one
written by 1 resumes on 2 (DDP); either way the rows consumed are exactly the
uninterrupted run's, none twice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train_helpers import SMALL, losses, torchrun, write_config
from training.synthetic import write_packed
from training.train import main

pytestmark = pytest.mark.slow

SEQ, VOCAB, STEPS = 32, 256, 20


def config(tmp_path: Path, data_dir: Path, name: str) -> Path:
    return write_config(tmp_path, name, {
        "model": {"vocab_size": VOCAB, **SMALL},
        "data": {"path": str(data_dir), "seq_len": SEQ},
        "train": {"global_batch": 8, "micro_batch": 2, "steps": STEPS, "threads": 1},
        "optim": {"lr": 3e-3},
        "schedule": {"warmup_steps": 3},
        "checkpoint": {"every": 100},
        "metrics": {"every": 1, "progress": "plain", "log_row_ids": True},
    })


def rows_by_step(run_dir: Path) -> dict[int, list[int]]:
    """step -> the step's rows over all ranks; fails if a (step, rank) was logged twice."""
    out: dict[int, list[int]] = {}
    seen = set()
    for f in (run_dir / "row_ids").glob("rank*.jsonl"):
        for r in map(json.loads, f.read_text().splitlines()):
            assert (r["step"], r["rank"]) not in seen
            seen.add((r["step"], r["rank"]))
            out.setdefault(r["step"], []).extend(r["rows"])
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("elastic")
    # 8 rows x 20 steps = 160 rows < 360: no row may legitimately appear twice.
    data = write_packed(tmp / "pack", {"web": 200, "math": 80, "code": 80}, SEQ, vocab=VOCAB)
    assert main(str(config(tmp, data, "straight"))) == 0
    return tmp, data


def check_same_rows_and_losses(tmp: Path, name: str) -> None:
    want, got = rows_by_step(tmp / "straight"), rows_by_step(tmp / name)
    assert sorted(got) == list(range(STEPS))
    for step in range(STEPS):
        assert sorted(got[step]) == sorted(want[step]), f"step {step}"
    every = [r for rows in got.values() for r in rows]
    assert len(every) == len(set(every)) == 8 * STEPS  # none twice
    a, b = losses(tmp / "straight"), losses(tmp / name)
    assert all(b[s] == pytest.approx(a[s], rel=1e-4) for s in range(STEPS))


def test_two_fsdp_processes_then_one(setup):
    tmp, data = setup
    path = config(tmp, data, "two_then_one")
    torchrun(path, "parallel.strategy=fsdp", f"train.stop_at_step={STEPS // 2}")
    ckpt = tmp / "two_then_one" / "checkpoints" / f"step_{STEPS // 2:08d}"
    assert json.loads((ckpt / "meta.json").read_text())["world_size"] == 2
    assert len(list((ckpt / "state").glob("*.distcp"))) == 2  # one shard file per rank
    assert main(str(path)) == 0  # resume on a single process
    check_same_rows_and_losses(tmp, "two_then_one")


def test_one_process_then_two_ddp(setup):
    tmp, data = setup
    path = config(tmp, data, "one_then_two")
    assert main(str(path), overrides=[f"train.stop_at_step={STEPS // 2}"]) == 0
    torchrun(path, "parallel.strategy=ddp")
    check_same_rows_and_losses(tmp, "one_then_two")
