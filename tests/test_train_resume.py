"""Exact resume: a run interrupted at step N/2 (stopped, or SIGKILLed) and resumed is bit-for-bit
the uninterrupted run; a changed shard set or plan is refused."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from train_helpers import REPO, SMALL, write_config
from training.synthetic import write_packed
from training.train import main

SEQ, VOCAB, STEPS = 64, 256, 24


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_packed(tmp_path_factory.mktemp("resume") / "pack", {"web": 200, "math": 60, "code": 60}, SEQ, vocab=VOCAB)


def config(tmp_path: Path, data_dir: Path, name: str, **sections) -> Path:
    return write_config(tmp_path, name, {
        "model": {"vocab_size": VOCAB, **SMALL},
        "data": {"path": str(data_dir), "seq_len": SEQ},
        # Two micro-batches per step, so resume is also exact across gradient accumulation.
        "train": {"global_batch": 8, "micro_batch": 4, "steps": STEPS, "threads": 1},
        "optim": {"lr": 3e-3},
        "schedule": {"kind": "wsd", "warmup_steps": 4, "decay_fraction": 0.5},
        "checkpoint": {"every": 4, "keep": 2},
        "metrics": {"every": 1, "progress": "plain", "log_row_ids": True},
    }, **sections)


def per_step(run_dir: Path) -> dict[int, tuple]:
    """step -> (loss, grad norm, lr) from metrics.jsonl; a step logged twice is an error."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r["kind"] == "train":
            assert r["step"] not in out, f"step {r['step']} logged twice"
            out[r["step"]] = (r["loss"], r["grad_norm"], r["lr"])
    return out


def row_ids(run_dir: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for f in sorted((run_dir / "row_ids").glob("rank*.jsonl")):
        for r in map(json.loads, f.read_text().splitlines()):
            assert r["step"] not in out
            out[r["step"]] = r["rows"]
    return out


@pytest.fixture(scope="module")
def straight(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("straight")
    assert main(str(config(tmp, data, "straight"))) == 0
    return tmp / "straight"


def test_stop_and_resume_is_bitwise_identical(tmp_path, data, straight):
    path = config(tmp_path, data, "halves")
    assert main(str(path), overrides=[f"train.stop_at_step={STEPS // 2}"]) == 0
    assert sorted(per_step(tmp_path / "halves")) == list(range(STEPS // 2))
    assert main(str(path)) == 0  # resume: auto, from the run dir's latest checkpoint
    a, b = per_step(straight), per_step(tmp_path / "halves")
    assert sorted(a) == sorted(b) == list(range(STEPS))
    for step in range(STEPS):
        assert a[step] == b[step], f"step {step}: {a[step]} != {b[step]}"  # exact float equality
    assert row_ids(straight) == row_ids(tmp_path / "halves")
    # keep-last-k: only the two newest checkpoints remain.
    assert sorted(p.name for p in (tmp_path / "halves" / "checkpoints").glob("step_*")) == ["step_00000020", "step_00000024"]


def test_async_checkpoints_resume_bitwise_identical(tmp_path, data, straight):
    """``checkpoint.async_save``: dcp.async_save writes while training goes on; each checkpoint
    becomes visible at the next save or the end, and resuming from one is still exact."""
    path = config(tmp_path, data, "async", checkpoint={"async_save": True})
    assert main(str(path), overrides=[f"train.stop_at_step={STEPS // 2}"]) == 0
    ckpts = tmp_path / "async" / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == f"step_{STEPS // 2:08d}"
    assert not list(ckpts.glob(".tmp-*"))  # the last one was finished before the run exited
    assert main(str(path)) == 0
    a, b = per_step(straight), per_step(tmp_path / "async")
    assert all(a[s] == b[s] for s in range(STEPS))


def test_async_save_on_a_one_rank_group_without_a_cpu_backend(tmp_path):
    """One GPU: the 1-rank FSDP2 group is NCCL only, and ``dcp.async_save`` asserts without a CPU
    backend; the checkpointer makes its gloo group whenever a process group exists. The group is
    process-global, so this runs in a fresh process (tests/async_save_one_rank.py)."""
    res = subprocess.run([sys.executable, str(Path(__file__).with_name("async_save_one_rank.py")), str(tmp_path / "ck")],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    assert "async save on a 1-rank group: ok" in res.stdout


def test_guard_off_reads_nothing_per_step_and_trains_the_same(tmp_path, data, straight, monkeypatch):
    """``guard.enabled: false``: no host read of loss or grad norm inside a step (they are
    read once per logging interval); the steps are the same as with the guard on."""
    import torch

    import training.train as train_mod

    reads = {"n": 0}
    real_step = train_mod.Trainer.train_step

    def counting_step(self, step, batch):
        before = reads["n"]
        opt_step = self.optimizer.step

        def uncounted(*a, **k):  # CPU AdamW reads its own step counter; fused CUDA AdamW does not
            reads["paused"] = True
            try:
                return opt_step(*a, **k)
            finally:
                reads["paused"] = False

        self.optimizer.step = uncounted
        try:
            out = real_step(self, step, batch)
        finally:
            del self.optimizer.step
        assert reads["n"] == before, f"step {step} read a device value back to the host"
        return out

    for name in ("item", "tolist", "__float__"):
        real = getattr(torch.Tensor, name)

        def wrapped(self, *a, _real=real, **k):
            reads["n"] += not reads.get("paused")
            return _real(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, wrapped)
    monkeypatch.setattr(train_mod.Trainer, "train_step", counting_step)
    path = config(tmp_path, data, "noguard", guard={"enabled": False}, metrics={"every": 4, "progress": "off"})
    assert main(str(path), overrides=["train.stop_at_step=8"]) == 0
    a = per_step(straight)
    got = {r["step"]: r for r in map(json.loads, (tmp_path / "noguard" / "metrics.jsonl").read_text().splitlines()) if r["kind"] == "train"}
    assert sorted(got) == [3, 7]
    assert got[7]["loss_step"] == pytest.approx(a[7][0], rel=1e-6) and got[7]["grad_norm"] == pytest.approx(a[7][1], rel=1e-6)


def test_sigkill_and_resume_is_bitwise_identical(tmp_path, data, straight):
    path = config(tmp_path, data, "killed")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "training", str(path)], cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    latest = tmp_path / "killed" / "checkpoints" / "latest"
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if latest.exists() and latest.read_text().strip() >= "step_00000008":
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, f"run was not killed mid-way (rc {proc.returncode}): {proc.stderr.read()!r}"
    ckpts = tmp_path / "killed" / "checkpoints"
    killed_at = int(latest.read_text().strip().split("_")[1])
    assert killed_at < STEPS
    # Every visible checkpoint is complete; a torn one can only be a .tmp- dir.
    assert all((p / "meta.json").exists() for p in ckpts.glob("step_*"))
    assert main(str(path)) == 0
    a, b = per_step(straight), per_step(tmp_path / "killed")
    assert sorted(b) == list(range(STEPS))  # steps logged after the checkpoint were trimmed, not duplicated
    assert all(a[s] == b[s] for s in range(STEPS))
    assert row_ids(straight) == row_ids(tmp_path / "killed")


def test_changed_shards_are_refused(tmp_path, data, capsys):
    local = tmp_path / "pack"
    shutil.copytree(data, local)
    path = config(tmp_path, local, "changed")
    assert main(str(path), overrides=["train.stop_at_step=4"]) == 0
    extra = write_packed(tmp_path / "extra", {"web": 8}, SEQ, vocab=VOCAB, seed=9)
    shutil.copy(extra / "part-00000.parquet", local / "part-00100.parquet")
    with open(local / "_manifest.jsonl", "a") as f:
        f.write(json.dumps({"shard": "part-00100", "file": "part-00100.parquet", "rows": 8}) + "\n")
    assert main(str(path), overrides=["train.stop_at_step=8"]) == 2
    err = capsys.readouterr().err
    assert "not the ones this checkpoint was trained on" in err and "allow_data_change" in err
    assert main(str(path), overrides=["train.stop_at_step=8", "data.allow_data_change=true"]) == 0
    assert max(per_step(tmp_path / "changed")) == 7


def test_changed_plan_is_refused(tmp_path, data, capsys):
    path = config(tmp_path, data, "plan")
    assert main(str(path), overrides=["train.stop_at_step=4"]) == 0
    assert main(str(path), overrides=["train.steps=30"]) == 2
    assert "differ from the checkpoint's plan" in capsys.readouterr().err
    # And an explicit fresh start on a run dir with checkpoints is refused too.
    assert main(str(path), resume="never") == 2
    assert "already has checkpoints" in capsys.readouterr().err
