"""Failing fast on many processes: one rank's error ends the whole job (no barrier on the
error path), an eval split that does not divide across ranks still evaluates under FSDP2,
and the CPU suite means the same on a machine with GPUs."""

from __future__ import annotations

import ast
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from train_helpers import REPO, SMALL, records, torchrun, write_config
from training.config import load_config
from training.data.eval import EvalData, padded_rank_rows
from training.data.batches import IGNORE
from training.synthetic import write_packed
from training.train import main

SEQ, VOCAB = 32, 256


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    train = write_packed(root / "train", {"web": 60, "math": 20}, SEQ, vocab=VOCAB, seed=0)
    held = write_packed(root / "held", {"web": 5, "math": 2}, SEQ, vocab=VOCAB, seed=1)  # 7 rows
    return train, held


def config(tmp_path: Path, data: Path, name: str, **sections) -> Path:
    return write_config(tmp_path, name, {
        "seed": 0,
        "model": {"vocab_size": VOCAB, **SMALL},
        "data": {"path": str(data), "seq_len": SEQ},
        "train": {"global_batch": 4, "micro_batch": 2, "steps": 6, "threads": 1},
        "optim": {"lr": 3e-3},
        "checkpoint": {"every": 1000},
        "metrics": {"every": 1, "progress": "off", "tensorboard": False},
    }, **sections)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_one_rank_raising_ends_the_job_fast(tmp_path, packs, strategy):
    """Rank 1 raises at step 3 while rank 0 is about to enter the step's collectives: both
    processes exit non-zero within 60 s (before, rank 1 sat in a barrier and rank 0 in an
    all-gather until the 30-minute timeout)."""
    train, _ = packs
    path = config(tmp_path, train, strategy, guard={"inject_error": {"step": 3, "rank": 1}})
    t0 = time.monotonic()
    proc = torchrun(path, f"parallel.strategy={strategy}", check=False, timeout=120)
    took = time.monotonic() - t0
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert took < 60, f"the job took {took:.0f} s to end"
    assert "injected error on rank 1 at step 3" in proc.stdout + proc.stderr
    # Steps 0-2 trained before the fault (rank 0 logged them), step 3 never completed.
    assert [r["step"] for r in records(tmp_path / strategy)] == [0, 1, 2]


def test_eval_rows_are_padded_to_whole_micro_batches_on_every_rank():
    rows = np.arange(7)
    per_rank = [padded_rank_rows(rows, r, 2, 2) for r in range(2)]
    assert [len(p) for p in per_rank] == [4, 4]  # 7 rows -> 8 slots, 2 micro-batches of 2 per rank
    assert sorted(np.concatenate(per_rank)[np.concatenate(per_rank) >= 0].tolist()) == list(range(7))
    assert (np.concatenate(per_rank) < 0).sum() == 1


def test_eval_padding_rows_carry_no_loss(packs):
    _, held = packs
    one = EvalData(str(held), 1, 4, 2, 0, 1, SEQ, True, 0, VOCAB)  # 4 of 7 rows
    r1 = EvalData(str(held), 4, 4, 3, 1, 2, SEQ, True, 0, VOCAB)  # rank 1 of 2, micro 3: 7 rows -> 12 slots
    assert len(r1.micro) == 2 and all(mb.inputs.shape == (3, SEQ) for mb in r1.micro)
    # rank 1 holds rows 1, 3, 5 and three padding rows: the last micro-batch is padding only
    assert (r1.micro[1].targets == IGNORE).all() and not (r1.micro[0].targets == IGNORE).all()
    assert sum(len(mb.inputs) for mb in one.micro) == 4


@pytest.mark.slow
def test_uneven_eval_split_under_fsdp_on_two_ranks(tmp_path, packs):
    """A held-out split of 7 rows on 2 ranks (micro-batch 2) evaluates under FSDP2, and gives
    the one-process eval loss."""
    train, held = packs
    ev = {"path": str(held), "every": 3, "batches": 4}
    assert main(str(config(tmp_path, train, "single", eval=ev))) == 0
    torchrun(config(tmp_path, train, "fsdp", eval=ev), "parallel.strategy=fsdp", timeout=240)
    one, two = records(tmp_path / "single", "eval"), records(tmp_path / "fsdp", "eval")
    assert [e["step"] for e in one] == [e["step"] for e in two] == [2, 5]
    for a, b in zip(one, two):
        assert b["eval_loss"] == pytest.approx(a["eval_loss"], rel=1e-4)


def test_local_rank_beyond_the_visible_gpus_stops_with_one_line(monkeypatch):
    from training.config import ConfigError
    from training.parallel import init_distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    with pytest.raises(ConfigError, match=r"LOCAL_RANK 1 but only 1 CUDA device\(s\).*--nproc-per-node=1"):
        init_distributed("cuda")


def test_cpu_suite_pins_device_cpu(tmp_path, packs):
    """Every config the trainer tests write says ``train.device: cpu`` (so ``auto`` never
    turns a CPU assertion into a CUDA run), and no CPU test module asks for CUDA."""
    cfg = load_config(config(tmp_path, packs[0], "pinned"))
    assert cfg.train.device == "cpu"
    raw = yaml.safe_load((tmp_path / "pinned.yaml").read_text())
    assert raw["train"]["device"] == "cpu"
    offenders = []
    for path in sorted((REPO / "tests").glob("test_train_*.py")):
        if path.name in ("test_train_gpu.py", Path(__file__).name):  # the CUDA suite, and this check's own strings
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in ("train.device=cuda", "train.device=auto"):
                offenders.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.Dict):  # {"device": "cuda"} / {"device": "auto"} in a config
                for k, v in zip(node.keys, node.values):
                    if isinstance(k, ast.Constant) and k.value == "device" and isinstance(v, ast.Constant) and v.value in ("cuda", "auto"):
                        offenders.append(f"{path.name}:{node.lineno}")
    assert not offenders, f"CPU trainer tests that name CUDA / auto devices: {offenders}"
