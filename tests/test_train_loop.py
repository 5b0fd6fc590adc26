"""The training loop end to end on CPU: learning, eval, guard rails, config errors, seq-len warm-up."""

from __future__ import annotations

import gc
import json
import math
import re
from pathlib import Path

import pytest
import torch
import yaml

from train_helpers import SMALL, records, write_config
from training.checkpoint import Checkpointer
from training.config import ConfigError, load_config
from training.parallel import DistEnv
from training.synthetic import write_packed
from training.train import EXIT_GUARD_STOP, main, run

SEQ, VOCAB = 64, 256


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("loop")
    train = write_packed(root / "train", {"web": 300, "math": 100, "code": 100}, SEQ, vocab=VOCAB, seed=0)
    held = write_packed(root / "eval", {"web": 30, "math": 10, "code": 10}, SEQ, vocab=VOCAB, seed=1)
    return train, held


def config(tmp_path: Path, data_dir: Path, name: str = "run", **sections) -> Path:
    return write_config(tmp_path, name, {
        "seed": 0,
        "model": {"vocab_size": VOCAB, **SMALL},
        "data": {"path": str(data_dir), "seq_len": SEQ},
        "train": {"global_batch": 8, "micro_batch": 4, "steps": 20, "threads": 1},
        "optim": {"lr": 3e-3},
        "schedule": {"kind": "cosine", "warmup_steps": 5},
        "checkpoint": {"every": 1000},
        "metrics": {"every": 1, "progress": "plain"},
    }, **sections)


def test_loss_falls_and_eval_runs(tmp_path, packs):
    train, held = packs
    cfg = load_config(config(tmp_path, train, train={"steps": 100}, metrics={"every": 10}, eval={"path": str(held), "every": 50, "batches": 2}))
    assert run(cfg) == 0
    losses = [r["loss"] for r in records(tmp_path / "run")]
    assert len(losses) == 10
    assert losses[0] > math.log(VOCAB) - 0.6  # starts near uniform
    assert losses[-1] < losses[0] - 1.0 and losses[-1] < math.log(VOCAB) - 1.5, losses  # learns the motifs
    assert all(b < a + 0.1 for a, b in zip(losses, losses[1:])), losses  # and keeps falling
    evals = records(tmp_path / "run", "eval")
    assert [e["step"] for e in evals] == [49, 99]
    assert evals[1]["eval_loss"] < evals[0]["eval_loss"] < math.log(VOCAB)
    rec = records(tmp_path / "run")[-1]
    assert rec["mfu"] is None  # CPU: no meaningful peak
    assert rec["tokens_per_s"] > 0 and 0 <= rec["data_wait_frac"] < 1
    assert set(rec["tokens_seen_by_source"]) == {"web", "math", "code"}
    # The end-of-run checkpoint exists and `latest` points at it.
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step_00000100"


def test_garbage_is_collected_at_step_boundaries_only(tmp_path, packs):
    """``train.gc_every``: Python's collector is off inside steps, runs (generation 1) once at the
    start and every ``gc_every`` steps, and is back on when the run ends; ``null`` leaves it on."""
    train, _ = packs
    explicit = []  # collections while automatic collection is off: only the trainer's own

    def seen(phase: str, info: dict) -> None:
        if phase == "start" and not gc.isenabled():
            explicit.append(info["generation"])

    gc.callbacks.append(seen)
    try:
        assert run(load_config(config(tmp_path, train, "gc", train={"steps": 20, "gc_every": 5}))) == 0
        assert gc.isenabled()
        assert explicit == [1] * (1 + 20 // 5), explicit  # at the start, then after steps 5, 10, 15, 20
        explicit.clear()
        assert run(load_config(config(tmp_path, train, "auto_gc", train={"steps": 5, "gc_every": None}))) == 0
        assert explicit == [] and gc.isenabled()
    finally:
        gc.callbacks.remove(seen)


def _weights(run_dir: Path, step: int) -> dict[str, torch.Tensor]:
    """Model tensors of a checkpoint, read back through the same loader the trainer uses."""
    from training.checkpoint import load
    from training.config import ModelConfig
    from training.model import Transformer

    model = Transformer(ModelConfig(vocab_size=VOCAB, **SMALL), SEQ)
    load(run_dir / "checkpoints" / f"step_{step:08d}", model, None, DistEnv(0, 1, 0, torch.device("cpu")))
    return {k: v.clone() for k, v in model.state_dict().items()}


def test_nonfinite_loss_skips_the_step(tmp_path, packs):
    train, _ = packs
    clean = load_config(config(tmp_path, train, "clean", train={"stop_at_step": 3}))
    poisoned = load_config(config(tmp_path, train, "poisoned", train={"stop_at_step": 4}, guard={"inject_nonfinite_steps": [3]}))
    assert run(clean) == 0 and run(poisoned) == 0
    skips = records(tmp_path / "poisoned", "event")
    skips = [e for e in skips if e["event"] == "skip"]
    assert len(skips) == 1 and skips[0]["step"] == 3 and "non-finite loss" in skips[0]["message"]
    # Step 3 was skipped: the weights after 4 steps are bit-for-bit those after 3.
    a, b = _weights(tmp_path / "clean", 3), _weights(tmp_path / "poisoned", 4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["skipped"] for r in records(tmp_path / "poisoned")] == [0, 0, 0, 1]


def test_consecutive_skips_stop_with_a_checkpoint(tmp_path, packs, capsys):
    train, _ = packs
    path = config(tmp_path, train, guard={"inject_nonfinite_steps": [2, 3, 4, 5], "max_consecutive_skips": 3})
    assert main(str(path)) == EXIT_GUARD_STOP
    events = records(tmp_path / "run", "event")
    stop = [e for e in events if e["event"] == "stop"]
    assert len(stop) == 1 and stop[0]["step"] == 4
    assert "3 consecutive skipped steps" in stop[0]["message"]
    assert "stopping" in capsys.readouterr().out
    ckpt = Checkpointer(tmp_path / "run" / "checkpoints", 3, DistEnv(0, 1, 0, torch.device("cpu"))).latest()
    assert ckpt is not None and ckpt.name == "step_00000005"
    assert json.loads((ckpt / "meta.json").read_text())["reason"] == "guard stop"


def test_grad_norm_spike_is_skipped(tmp_path, packs):
    train, _ = packs
    # A hair-trigger guard: anything above 1.05 x the median of the last 3 accepted steps.
    cfg = load_config(config(tmp_path, train, guard={"spike_factor": 1.05, "window": 3, "min_history": 3, "max_consecutive_skips": 100,
                                                          "max_spike_skips": 100}))
    assert run(cfg) == 0
    skips = [e for e in records(tmp_path / "run", "event") if e["event"] == "skip"]
    assert skips and all("grad-norm spike" in e["message"] for e in skips)
    for e in skips:
        median = float(re.search(r"median ([0-9.e+-]+)\)", e["message"]).group(1))
        assert e["grad_norm"] > 1.05 * median * 0.999  # the median is printed to 3 digits
    assert all(e["step"] >= 3 for e in skips)  # never before min_history accepted steps


def test_a_spike_repeated_on_the_next_batch_is_taken():
    """Skipping leaves the model as it is: when the next batch spikes too, the guard takes the
    step (clipped) instead of skipping until it stops the run. Non-finite losses still skip."""
    from training.config import GuardConfig
    from training.guard import Guard

    guard = Guard(GuardConfig(spike_factor=10, min_history=3, max_consecutive_skips=3))
    for g in (1.0, 0.9, 1.1):
        assert guard.verdict(5.0, g) is None
        guard.accept(g)
    assert "grad-norm spike" in guard.verdict(5.0, 30.0)  # one batch: skipped
    assert not guard.reject()
    assert guard.verdict(5.0, 33.0) is None and "the model moved" in guard.note  # again: taken
    guard.accept(33.0)
    assert guard.verdict(5.0, 1.0) is None and guard.note is None
    guard.accept(1.0)
    assert "grad-norm spike" in guard.verdict(5.0, 40.0)  # a new isolated spike is skipped again
    assert not guard.reject()
    assert guard.verdict(float("nan"), 1.0).startswith("non-finite")  # never taken
    assert not guard.reject() and guard.consecutive == 2
    restored = Guard(guard.cfg, guard.state())  # the count survives a resume
    assert restored.spikes == 1 and restored.verdict(5.0, 50.0) is None
    strict = Guard(GuardConfig(spike_factor=10, min_history=3, max_spike_skips=2), {"history": [1.0] * 3})
    assert strict.verdict(5.0, 30.0) and strict.verdict(5.0, 30.0) and strict.verdict(5.0, 30.0) is None


def test_seq_len_warmup(tmp_path, packs):
    train, _ = packs
    cfg = load_config(config(tmp_path, train, train={"steps": 12}, data={"seq_len_warmup": {"start": 16, "steps": 8}}))
    assert run(cfg) == 0
    recs = records(tmp_path / "run")
    assert [r["seq_len"] for r in recs] == [16] * 4 + [32] * 4 + [64] * 4
    assert all(math.isfinite(r["loss"]) for r in recs)
    # Same tokens per step whatever the chunking: rows are split, not dropped.
    assert len({round(r["tokens"], -2) for r in recs}) <= 3


def test_config_typo_names_the_file_and_field(tmp_path, packs, capsys):
    train, _ = packs
    path = config(tmp_path, train, optim={"lrr": 0.1})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg and "optim.lrr: unknown field; did you mean 'lr'?" in msg
    assert main(str(path)) == 2
    assert "optim.lrr" in capsys.readouterr().err
    raw = yaml.safe_load(path.read_text())
    del raw["optim"]["lrr"], raw["model"]["vocab_size"]
    raw["train"]["global_batch"] = "lots"
    path.write_text(yaml.safe_dump(raw))
    msg = str(pytest.raises(ConfigError, load_config, path).value)
    assert "model.vocab_size: required field is missing" in msg
    assert "train.global_batch" in msg
    with pytest.raises(ConfigError, match="train.micro_batch"):
        load_config(config(tmp_path, train, train={"global_batch": 6}))
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        load_config(config(tmp_path, train), ["optim.lr"])


def test_activation_checkpointing_gives_the_same_steps(tmp_path, packs):
    """Recomputing activations in backward changes memory, not the numbers."""
    train, _ = packs
    plain = load_config(config(tmp_path, train, "plain", train={"steps": 4}))
    ac = load_config(config(tmp_path, train, "ac", train={"steps": 4}, parallel={"activation_checkpointing": True}))
    assert run(plain) == 0 and run(ac) == 0
    a, b = records(tmp_path / "plain"), records(tmp_path / "ac")
    assert [(r["loss"], r["grad_norm"]) for r in a] == [(r["loss"], r["grad_norm"]) for r in b]
    # The checkpoint keys are the plain model's (the wrapper does not leak into them).
    w = _weights(tmp_path / "ac", 4)
    assert "layers.0.attention.wq.weight" in w
