"""Sequence parallelism (``parallel.sequence_parallel``) and async TP's start-up checks, on CPU over gloo.

- the trainer under torchrun with tp 2 and sequence parallelism trains like one process: the loss
  and the grad norm of every step agree to ~1e-6 (the residual stream split over the sequence
  between the blocks, the norms on each rank's positions, the loss gathering them);
- with FSDP2 over the other dimension (TP=2 + SP x FSDP=2, 4 processes), and under selective
  activation checkpointing and torch.compile;
- with pipeline stages too (TP=2 x PP=2, 4 processes: a later stage receives T / tp positions), and
  its checkpoint resumes on one process without sequence parallelism;
- the model itself, split by ``parallelize`` over two spawned processes: the same loss, gradients
  and logits as the whole model on one process, the norms' weights whole and bit-equal on both
  ranks after optimizer steps, the loss without gradients (eval) too;
- start-up errors: sequence lengths (and the warm-up's first) not divisible by tp; async TP
  without tp, without sequence parallelism, off CUDA, without compile.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from train_helpers import SMALL, compare_steps, mesh_config, records, torchrun, write_config
from training.config import ConfigError, ModelConfig, ParallelConfig
from training.synthetic import write_packed
from training.tensor_parallel import check_tp
from training.train import main

SEQ, VOCAB, STEPS = 32, 256, 12

pytestmark = pytest.mark.slow


def config(tmp_path: Path, pack: Path, name: str, **sections) -> Path:
    return mesh_config(tmp_path, name, pack, {"vocab_size": VOCAB, **SMALL, "attention": "segments"}, SEQ, STEPS, 6,
                       **sections)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sp")
    data = write_packed(tmp / "pack", {"web": 200, "math": 80}, SEQ, vocab=VOCAB)
    assert main(str(config(tmp, data, "single"))) == 0
    return tmp, data




def test_tp2_with_sequence_parallel_trains_like_one_process(single):
    tmp, data = single
    torchrun(config(tmp, data, "tp2-sp"), "parallel.tp=2", "parallel.sequence_parallel=true")
    start = records(tmp / "tp2-sp", "event")[0]
    assert "tp 2 sequence-parallel" in start["message"], start["message"]
    one, got = records(tmp / "single"), records(tmp / "tp2-sp")
    compare_steps(one, got, "TP=2 + sequence parallel")
    assert one[-1]["loss_step"] < one[0]["loss_step"] - 0.5  # it trained: matching is not trivial
    assert [r["tokens"] for r in got] == [r["tokens"] for r in one]  # counted once per data-parallel rank


def test_tp2_sequence_parallel_with_fsdp2_trains_like_one_process(single):
    """4 processes, mesh (1, 1, 2, 2): FSDP2 over the data-parallel pair reduces the norms' partial
    gradients (sequence parallelism) along with the rest."""
    tmp, data = single
    torchrun(config(tmp, data, "tp2-sp-fsdp2"), "parallel.tp=2", "parallel.sequence_parallel=true",
             "parallel.strategy=fsdp", nproc=4, timeout=600)
    assert "world 4 (fsdp, tp 2 sequence-parallel)" in records(tmp / "tp2-sp-fsdp2", "event")[0]["message"]
    compare_steps(records(tmp / "single"), records(tmp / "tp2-sp-fsdp2"), "TP=2 + sequence parallel x FSDP=2")


def test_tp2_sequence_parallel_under_selective_ac_and_compile(single):
    """The plan's hooks inside checkpointed, compiled blocks; selective AC keeps the reduce-scatters."""
    tmp, data = single
    torchrun(config(tmp, data, "tp2-sp-ac-compile"), "parallel.tp=2", "parallel.sequence_parallel=true",
             "parallel.ac=selective", "train.compile=true", "train.stop_at_step=4", timeout=600)
    start = records(tmp / "tp2-sp-ac-compile", "event")[0]
    assert start["compile"] and start["activation_checkpointing"] == "selective" and "sequence-parallel" in start["message"]
    compare_steps(records(tmp / "single")[:4], records(tmp / "tp2-sp-ac-compile"), "TP=2 + SP + selective AC + compile")


def test_tp2_sequence_parallel_with_pipeline_and_resume_on_one_process(single):
    """TP=2 + SP x PP=2 (GPipe; 4 processes): the second stage gets (B, T/2, d) hidden states and
    rebuilds the RoPE table of the whole T (plain causal attention: no positions travel with the
    rows, the stage derives them from the length). Its step-6 checkpoint (norms held as
    replicated DTensors) resumes on one process without sequence parallelism."""
    tmp, data = single
    sections = {"model": {"tie_embeddings": False}, "data": {"document_mask": False}}
    torchrun(config(tmp, data, "tp2-sp-pp2", **sections), "parallel.tp=2", "parallel.sequence_parallel=true",
             "parallel.pp=2", "parallel.pp_schedule=gpipe", "parallel.strategy=fsdp", "train.stop_at_step=8", nproc=4,
             timeout=600)
    assert "tp 2 sequence-parallel, pp 2 gpipe" in records(tmp / "tp2-sp-pp2", "event")[0]["message"]
    assert main(str(config(tmp, data, "single-causal", **sections))) == 0
    one = records(tmp / "single-causal")
    compare_steps(one[:8], records(tmp / "tp2-sp-pp2"), "TP=2 + sequence parallel x PP=2 (gpipe)")
    ckpt = tmp / "tp2-sp-pp2" / "checkpoints" / "step_00000006"
    assert main(str(config(tmp, data, "sp-on-one", **sections)), resume=str(ckpt)) == 0
    after = records(tmp / "sp-on-one")
    assert after[0]["step"] == 6
    compare_steps(one[6:], after, "saved on TP=2 + SP x PP=2, resumed on 1 process")


# ---------------------------------------------------------------- the model split by hand

MODEL = dict(vocab_size=VOCAB, **SMALL, attention="segments")


def _worker(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from training.model import Transformer
    from training.parallel import clip_grad_norm, init_distributed, parallelize, shutdown

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    cfg, par = ModelConfig(**MODEL), ParallelConfig(tp=world, sequence_parallel=True)
    env = init_distributed("cpu", par)
    with torch.device("meta"):
        model = Transformer(cfg, SEQ, init_seed=5)
    model = parallelize(model, par, env)
    ref = Transformer(cfg, SEQ, init_seed=5)  # the whole model, on this process alone
    full = lambda t: t.full_tensor() if hasattr(t, "full_tensor") else t  # noqa: E731
    res = {"tied": model.output.weight is model.tok_embeddings.weight,
           "norms": sorted({str(p.placements) for n, p in model.named_parameters() if n.endswith("norm.weight")}),
           "init_equal": all(torch.equal(full(p), q) for p, q in zip(model.parameters(), ref.parameters()))}
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (model, ref)]
    g = torch.Generator().manual_seed(1)
    res["loss_diff"], res["grad_diff"], res["norm_diff"] = [], [], []
    for _ in range(3):
        tokens, targets = (torch.randint(0, VOCAB, (2, SEQ), generator=g) for _ in range(2))
        targets[0, :5] = -100  # ignored positions, on rank 0's run only
        doc_ids = torch.zeros(2, SEQ, dtype=torch.long)
        doc_ids[:, SEQ // 3:] = 1
        losses = [m(tokens, doc_ids, targets=targets) for m in (model, ref)]
        res["loss_diff"].append(abs(losses[0].item() - losses[1].item()) / losses[1].item())
        for loss in losses:
            (loss / tokens.numel()).backward()
        res["grad_diff"].append(max(full(p.grad).sub(q.grad).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
                                / max(q.grad.abs().max().item() for q in ref.parameters()))
        norms = clip_grad_norm(model, 1.0), torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        res["norm_diff"].append(abs(norms[0].item() - norms[1].item()))
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    with torch.no_grad():  # eval: the loss without gradients, and the logits through the head's own forward
        res["eval_diff"] = abs(model(tokens, doc_ids, targets=targets).item() - ref(tokens, doc_ids, targets=targets).item())
        res["logits_diff"] = (model(tokens, doc_ids) - ref(tokens, doc_ids)).abs().max().item()
    # The norms each rank holds whole, after three steps: the same bits on both ranks.
    whole = torch.cat([p.to_local().flatten() for n, p in model.named_parameters() if n.endswith("norm.weight")])
    gathered = [torch.empty_like(whole) for _ in range(world)]
    dist.all_gather(gathered, whole)
    res["norms_bit_equal"] = all(torch.equal(gathered[0], t) for t in gathered)
    res["param_diff"] = max(full(p).sub(q).abs().max().item() for p, q in zip(model.parameters(), ref.parameters()))
    Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    shutdown(env)


#: ``_worker`` over two spawned processes, in the session's one spawned pair (conftest.two_ranks)
TWO_RANK_JOB = ("_worker", ())


def test_the_model_with_sequence_parallel_over_two_processes(two_ranks):
    out = two_ranks(__name__)
    for rank in range(2):
        res = json.loads((out / f"rank{rank}.json").read_text())
        assert res["tied"] and res["init_equal"] and res["norms_bit_equal"], res
        assert res["norms"] == ["(Replicate(),)"], res["norms"]  # whole on each rank, a DTensor over the TP group
        print(f"\nrank {rank}: |loss diff| rel {['%.1e' % d for d in res['loss_diff']]}, max |grad diff| / max |grad| "
              f"{['%.1e' % d for d in res['grad_diff']]}, |grad-norm diff| {['%.1e' % d for d in res['norm_diff']]}, "
              f"eval loss {res['eval_diff']:.1e}, logits {res['logits_diff']:.1e}, max |param diff| {res['param_diff']:.1e}")
        # The first step's gradients from the same weights; later ones after Adam steps, which move a weight
        # by up to lr wherever its gradient is near 0 (float noise): TP=2 without sequence parallelism
        # measures the same 3.5e-5 on this input.
        assert res["grad_diff"][0] < 1e-6 and max(res["grad_diff"]) < 1e-4, res["grad_diff"]
        assert max(res["loss_diff"]) < 1e-6 and max(res["norm_diff"]) < 1e-5
        assert res["eval_diff"] < 1e-3 and res["logits_diff"] < 1e-4 and res["param_diff"] < 1e-4


# ---------------------------------------------------------------- start-up errors

def test_sequence_lengths_must_split_evenly():
    cfg, sp = ModelConfig(**MODEL), ParallelConfig(tp=2, sequence_parallel=True)
    check_tp(cfg, 2, sp, (32, 8))
    check_tp(cfg, 2, ParallelConfig(tp=2), (33,))  # without sequence parallelism: any length
    with pytest.raises(ConfigError, match=r"sequence_parallel with tp 2: data.seq_len \(31\) must be divisible by tp"):
        check_tp(cfg, 2, sp, (31,))
    with pytest.raises(ConfigError, match=r"data.seq_len_warmup.start \(3\) must be divisible by tp"):
        check_tp(cfg, 2, sp, (48, 3))


def test_async_tp_refused_where_it_cannot_run():
    cfg = ModelConfig(**MODEL)
    on = dict(async_tp=True, sequence_parallel=True)
    check_tp(cfg, 2, ParallelConfig(tp=2, **on), (32,), "cuda", compile=True)  # where it runs: no error
    cases = [(1, {}, "cuda", True, "parallel.tp is 1"),
             (2, {"sequence_parallel": False}, "cuda", True, "parallel.sequence_parallel is off"),
             (2, {}, "cpu", True, "the device is cpu"),
             (2, {}, "cuda", False, "train.compile is off")]
    for tp, change, device, compile, why in cases:
        with pytest.raises(ConfigError, match=rf"parallel.async_tp needs .*: {why}"):
            check_tp(cfg, tp, ParallelConfig(tp=tp, **{**on, **change}), (32,), device, compile)


def test_the_trainer_refuses_async_tp_at_start(tmp_path, capsys):
    """End to end: the error before any data is read or any model built (one CPU process, no tp)."""
    path = write_config(tmp_path, "async", {
        "model": {"vocab_size": VOCAB, **SMALL}, "data": {"path": str(tmp_path / "absent"), "seq_len": SEQ},
        "train": {"global_batch": 2, "micro_batch": 2, "steps": 1},
        "parallel": {"async_tp": True, "sequence_parallel": True}})
    assert main(str(path)) == 2
    assert "parallel.async_tp needs tensor parallelism" in capsys.readouterr().err
