"""HSDP x pipeline parallelism on CPU over gloo (4 processes), against one process.

The mesh (pp 2, dp_replicate 2, dp_shard 1, tp 1): each pipeline stage an HSDP root replicated
over the two data-parallel ranks (its gradients all-reduced across the replicas, not
reduce-scattered), 1F1B over 2 micro-batches per rank. It trains like one process (loss and grad
norm of every step, held-out loss), each replica's stages read their own half of the rows, and its
checkpoint resumes on one process with the straight run's losses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from train_helpers import SMALL, compare_steps, mesh_config, records, row_ids, torchrun
from training.synthetic import write_packed
from training.train import main

SEQ, VOCAB, STEPS = 32, 256, 8
MODEL = {"vocab_size": VOCAB, **SMALL, "n_layer": 4, "tie_embeddings": False, "attention": "segments"}

pytestmark = pytest.mark.slow


def config(tmp: Path, packs, name: str) -> Path:
    train, held = packs
    return mesh_config(tmp, name, train, MODEL, SEQ, STEPS, 4, held)






def test_hsdp_x_pp2_trains_like_one_process_and_resumes_on_one(tmp_path):
    packs = (write_packed(tmp_path / "pack", {"web": 200, "math": 80}, SEQ, vocab=VOCAB),
             write_packed(tmp_path / "held", {"web": 30, "math": 10}, SEQ, vocab=VOCAB, seed=1))
    assert main(str(config(tmp_path, packs, "single"))) == 0
    torchrun(config(tmp_path, packs, "hsdp-pp2"), "parallel.pp=2", "parallel.strategy=hsdp", "parallel.dp_replicate=2",
             nproc=4, timeout=600)
    start = records(tmp_path / "hsdp-pp2", "event")[0]
    assert "world 4 (hsdp 2x1, pp 2 1f1b)" in start["message"], start["message"]
    one = records(tmp_path / "single")
    compare_steps(one, records(tmp_path / "hsdp-pp2"), "HSDP (2 replicas x 1) x PP=2 (1f1b)")
    assert one[0]["loss_step"] - one[-1]["loss_step"] > 0.3  # it trained: matching is not trivial
    held = {r["step"]: r["eval_loss"] for r in records(tmp_path / "single", "eval")}
    evals = [abs(held[r["step"]] - r["eval_loss"]) for r in records(tmp_path / "hsdp-pp2", "eval")]
    print(f"  held-out loss: max |diff| {max(evals):.2e} over {len(evals)} evals")
    assert evals and max(evals) < 1e-4
    assert [r["tokens"] for r in records(tmp_path / "hsdp-pp2")] == [r["tokens"] for r in one]
    split, whole = row_ids(tmp_path / "hsdp-pp2"), row_ids(tmp_path / "single")
    for step in range(STEPS):
        # ranks 0, 1: stage 0 of replicas 0, 1; ranks 2, 3: stage 1 of the same
        assert split[step, 0] == split[step, 2] and split[step, 1] == split[step, 3]
        assert sorted(split[step, 0] + split[step, 1]) == sorted(whole[step, 0])
    ckpt = tmp_path / "hsdp-pp2" / "checkpoints" / "step_00000004"
    assert main(str(config(tmp_path, packs, "hsdp-pp2-on-one")), resume=str(ckpt)) == 0
    after = records(tmp_path / "hsdp-pp2-on-one")
    assert after[0]["step"] == 4
    compare_steps(one[4:], after, "saved on HSDP x PP=2, resumed on 1 process")
