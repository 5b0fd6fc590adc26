"""A GPU lease cannot lose its figures (issue 61, part 5):

- result files are written whole or not at all: a write that fails midway, or a process killed
  between writing and renaming, leaves the previous file as it was;
- ``checkpoint.final_save: false`` ends a run without its last save (periodic saves still land);
- with CUDA graphs (``keeps_grad_buffers``) gradients are allocated once and zeroed in place: the
  same buffers every step and micro-batch, and the same losses and grad norms to the bit as
  ``.grad = None`` between steps (forced on here, on CPU; the CUDA-graph run itself is in
  ``tests/test_train_gpu.py``);
- the GPU bench reads an unreadable result as that check's failure.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import training.files
import training.train
from train_helpers import REPO, SMALL, records, write_config
from training.files import write_text_atomic
from training.synthetic import write_packed
from training.train import main

SEQ, VOCAB = 32, 256


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_packed(tmp_path_factory.mktemp("lease") / "pack", {"web": 120, "math": 40}, SEQ, vocab=VOCAB)


def config(tmp_path: Path, data: Path, name: str, **sections) -> Path:
    return write_config(tmp_path, name, {
        "seed": 0,
        "model": {"vocab_size": VOCAB, **SMALL},
        "data": {"path": str(data), "seq_len": SEQ},
        # 4 micro-batches of 2 rows per step: gradient accumulation is what CUDA graphs broke
        "train": {"global_batch": 8, "micro_batch": 2, "steps": 6, "threads": 1},
        "optim": {"lr": 3e-3},
        "schedule": {"warmup_steps": 2},
        "checkpoint": {"every": 3},
        "metrics": {"every": 1, "progress": "off", "tensorboard": False},
    }, **sections)


# ---------------------------------------------------------------- atomic result files

def test_a_write_failing_midway_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "summary.json"
    path.write_text('{"old": true}\n')

    class HalfThenFull:  # writes half of the text, then the disk is full
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, text):
            self.f.write(text[: len(text) // 2])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")

    real_fdopen = os.fdopen
    monkeypatch.setattr(training.files.os, "fdopen", lambda fd, mode: HalfThenFull(real_fdopen(fd, mode)))
    with pytest.raises(OSError, match="No space"):
        write_text_atomic(path, json.dumps({"new": "x" * 10_000}))
    assert path.read_text() == '{"old": true}\n'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]  # the half-written temporary is gone
    monkeypatch.undo()
    write_text_atomic(path, '{"new": true}\n')
    assert path.read_text() == '{"new": true}\n' and sorted(p.name for p in tmp_path.iterdir()) == ["summary.json"]


def test_a_writer_killed_before_the_rename_leaves_the_old_file(tmp_path):
    path = tmp_path / "mfu_1b.json"
    path.write_text('{"status": "pass"}')
    # The new text is written and flushed, then the process dies (SIGKILL) where it would fsync.
    script = (
        "import os, signal, sys\n"
        "import training.files as f\n"
        "f.os.fsync = lambda fd: os.kill(os.getpid(), signal.SIGKILL)\n"
        "f.write_text_atomic(sys.argv[1], '{\"status\": \"fa')\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(path)], cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == -signal.SIGKILL
    assert json.loads(path.read_text()) == {"status": "pass"}
    left = [p.name for p in tmp_path.iterdir() if p.name != path.name]
    assert len(left) == 1 and left[0].startswith(".mfu_1b.json.") and left[0].endswith(".tmp")  # hidden, ignored


def test_the_bench_reads_an_unreadable_result_as_that_checks_failure(tmp_path):
    sys.path.insert(0, str(REPO / "tests" / "benchmarks"))
    from bench_gpu import load_result

    torn = tmp_path / "resume.json"
    torn.write_text('{"status": "pass", "deterministic": {"first_')
    assert load_result(torn, 0)["status"] == "fail" and "unreadable result" in load_result(torn, 0)["reason"]
    assert "without a result" in load_result(tmp_path / "none.json", 1)["reason"]
    torn.write_text('{"status": "pass"}')
    assert load_result(torn, 0) == {"status": "pass"}


# ---------------------------------------------------------------- no final save

def checkpoints(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").glob("step_*"))


def test_final_save_false_ends_without_a_checkpoint(tmp_path, data):
    assert main(str(config(tmp_path, data, "nofinal", checkpoint={"final_save": False}))) == 0
    # step 6 is a multiple of every=3 too: the last step is not saved either way
    assert checkpoints(tmp_path / "nofinal") == ["step_00000003"]
    summary = json.loads((tmp_path / "nofinal" / "summary.json").read_text())
    assert summary["exit"] == 0 and summary["step"] == 6
    assert [r["step"] for r in records(tmp_path / "nofinal")] == list(range(6))
    assert main(str(config(tmp_path, data, "final"))) == 0
    assert checkpoints(tmp_path / "final") == ["step_00000003", "step_00000006"]


# ---------------------------------------------------------------- gradients allocated once

def test_grad_buffers_kept_and_zeroed_in_place_train_the_same(tmp_path, data, monkeypatch):
    assert main(str(config(tmp_path, data, "fresh"))) == 0  # .grad = None after every step (the default)

    seen: list[dict] = []
    real_step = training.train.Trainer.train_step

    def observed(self, step, batch):
        out = real_step(self, step, batch)
        grads = [p.grad for p in self.model.parameters()]
        seen.append({"ptrs": [g.data_ptr() if g is not None else None for g in grads],
                     "zero": all(g is not None and not g.any() for g in grads)})
        return out

    before_backward: list[bool] = []  # every .grad allocated before a micro-batch's forward/backward?
    real_loss = training.train.Trainer._loss_sum

    def loss_sum(self, mb):
        before_backward.append(all(p.grad is not None for p in self.model.parameters()))
        return real_loss(self, mb)

    monkeypatch.setattr(training.train, "keeps_grad_buffers", lambda cudagraphs: True)
    monkeypatch.setattr(training.train.Trainer, "train_step", observed)
    monkeypatch.setattr(training.train.Trainer, "_loss_sum", loss_sum)
    assert main(str(config(tmp_path, data, "kept"))) == 0
    # Allocated before the very first backward: autograd adds into them and never adopts its own
    # output as .grad (under CUDA graphs, a graph-pool tensor the next replay overwrites).
    assert len(before_backward) == 6 * 4 and all(before_backward)
    assert len(seen) == 6 and all(s["zero"] for s in seen)  # zeroed in place after each step, never None
    assert all(s["ptrs"] == seen[0]["ptrs"] for s in seen)  # the same storage every step: allocated once
    fresh, kept = records(tmp_path / "fresh"), records(tmp_path / "kept")
    # 0 + g1 + ... + g4 == g1 + ... + g4 exactly in fp32: bit-equal, not close
    assert [(r["loss_step"], r["grad_norm"]) for r in kept] == [(r["loss_step"], r["grad_norm"]) for r in fresh]
    assert fresh[-1]["loss_step"] < fresh[0]["loss_step"]  # it trained: matching is not trivial

    # Resumed mid-run (DCP's optimizer-state init needs .grad None at load): still the same steps.
    seen.clear()
    ckpt = tmp_path / "kept" / "checkpoints" / "step_00000003"
    assert main(str(config(tmp_path, data, "kept-resumed")), resume=str(ckpt)) == 0
    resumed = records(tmp_path / "kept-resumed")
    assert [r["step"] for r in resumed] == [3, 4, 5] and all(s["zero"] for s in seen)
    assert resumed[0]["loss_step"] == fresh[3]["loss_step"]


def test_kept_grad_buffers_and_a_guard_stop_before_any_step_still_save_adam_state(tmp_path, data, monkeypatch):
    """A checkpoint before any optimizer step: DCP initialises Adam's state only while no .grad exists."""
    monkeypatch.setattr(training.train, "keeps_grad_buffers", lambda cudagraphs: True)
    path = config(tmp_path, data, "stopped", guard={"inject_nonfinite_steps": [0, 1], "max_consecutive_skips": 2})
    assert main(str(path)) == training.train.EXIT_GUARD_STOP
    assert checkpoints(tmp_path / "stopped") == ["step_00000002"]
    # It resumes (the optimizer's state is in the checkpoint) and trains on.
    path = config(tmp_path, data, "stopped-resumed")
    assert main(str(path), resume=str(tmp_path / "stopped" / "checkpoints" / "step_00000002")) == 0
    assert [r["step"] for r in records(tmp_path / "stopped-resumed")] == [2, 3, 4, 5]
