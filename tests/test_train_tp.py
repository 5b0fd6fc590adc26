"""Tensor parallelism (``parallel.tp``) on CPU over gloo, against one process.

- the trainer under torchrun with tp 2 (one data-parallel rank) trains like one process: the loss
  and the grad norm of every step agree to ~1e-6 (float32; TP only changes the order of the sums
  in the row-wise layers); the two ranks read the same rows, the single process's;
- with FSDP2 over the other dimension (TP=2 x FSDP=2, 4 processes) too, and under selective
  activation checkpointing and torch.compile;
- a checkpoint saved on one layout resumes on another (TP=2 -> 1, TP=2 x FSDP=2 -> 1, 1 -> TP=2)
  with the straight run's losses;
- the model itself, split by ``parallelize`` over two spawned processes: the seeded init gives
  the one-process weights (row-wise shards draw columns of the same rows), tied embeddings stay
  tied (one parameter split over the vocabulary), and after optimizer steps the whole-held
  parameters (norms) are bit-equal on both ranks;
- start-up errors: heads, KV heads and the MLP width divisible by tp, tp dividing the world,
  no DDP with tp, layout fields that contradict the strategy.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from train_helpers import SMALL, compare_steps, mesh_config, records, row_ids, torchrun
from training.config import ConfigError, ModelConfig, ParallelConfig
from training.parallel import DistEnv, init_distributed, mesh_shape, strategy_for
from training.synthetic import write_packed
from training.tensor_parallel import check_tp
from training.train import main

SEQ, VOCAB, STEPS = 32, 256, 12

pytestmark = pytest.mark.slow


def config(tmp_path: Path, data: Path, name: str, **sections) -> Path:
    return mesh_config(tmp_path, name, data, {"vocab_size": VOCAB, **SMALL, "attention": "segments"}, SEQ, STEPS, 6,
                       **sections)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tp")
    data = write_packed(tmp / "pack", {"web": 200, "math": 80}, SEQ, vocab=VOCAB)
    assert main(str(config(tmp, data, "single"))) == 0
    return tmp, data






def compare(tmp: Path, run: str, label: str, tol: float = 1e-5) -> None:
    """``run`` against the single process, step by step (``compare_steps``)."""
    one = records(tmp / "single")
    compare_steps(one, records(tmp / run), label, tol)
    assert one[-1]["loss_step"] < one[0]["loss_step"] - 0.5  # it trained: matching is not trivial


def test_tp2_trains_like_one_process(single):
    tmp, data = single
    torchrun(config(tmp, data, "tp2"), "parallel.tp=2")
    start = records(tmp / "tp2", "event")[0]
    assert "world 2 (none, tp 2)" in start["message"], start["message"]
    compare(tmp, "tp2", "TP=2")
    one, two = records(tmp / "single"), records(tmp / "tp2")
    # Tokens are counted once per data-parallel rank, not once per tensor-parallel rank.
    assert [r["tokens"] for r in two] == [r["tokens"] for r in one]
    # Both tensor-parallel ranks read the single process's rows.
    split, whole = row_ids(tmp / "tp2"), row_ids(tmp / "single")
    for step in range(STEPS):
        assert split[step, 0] == split[step, 1] == whole[step, 0]


def test_tp2_with_fsdp2_trains_like_one_process(single):
    """4 processes: 2 data-parallel ranks (FSDP2 over dp_shard) x 2 tensor-parallel ranks."""
    tmp, data = single
    torchrun(config(tmp, data, "tp2-fsdp2"), "parallel.tp=2", "parallel.strategy=fsdp", nproc=4, timeout=600)
    start = records(tmp / "tp2-fsdp2", "event")[0]
    assert "world 4 (fsdp, tp 2)" in start["message"], start["message"]
    compare(tmp, "tp2-fsdp2", "TP=2 x FSDP=2")
    split, whole = row_ids(tmp / "tp2-fsdp2"), row_ids(tmp / "single")
    for step in range(STEPS):
        assert split[step, 0] == split[step, 1] and split[step, 2] == split[step, 3]  # TP peers: the same rows
        assert not set(split[step, 0]) & set(split[step, 2])  # data-parallel ranks: different rows
        assert sorted(split[step, 0] + split[step, 2]) == sorted(whole[step, 0])


def test_tp2_under_selective_ac_and_compile_trains_like_one_process(single):
    """TP is applied before activation checkpointing and torch.compile wrap the blocks."""
    tmp, data = single
    torchrun(config(tmp, data, "tp2-ac-compile"), "parallel.tp=2", "parallel.ac=selective", "train.compile=true",
             "train.stop_at_step=4", timeout=600)
    start = records(tmp / "tp2-ac-compile", "event")[0]
    assert start["compile"] and start["activation_checkpointing"] == "selective"
    compare_steps(records(tmp / "single")[:4], records(tmp / "tp2-ac-compile"), "TP=2 + selective AC + compile")


#: (saved by, resumed on): run name, its torchrun overrides and process count
MESHES = {"1 process": ("single", (), 1), "TP=2": ("tp2", ("parallel.tp=2",), 2),
          "TP=2 x FSDP=2": ("tp2-fsdp2", ("parallel.tp=2", "parallel.strategy=fsdp"), 4)}


@pytest.mark.parametrize("saved, resumed", [("TP=2", "1 process"), ("TP=2 x FSDP=2", "1 process"), ("1 process", "TP=2")])
def test_a_checkpoint_resumes_on_another_mesh(single, saved, resumed):
    """The step-6 checkpoint of one layout, resumed on another: the steps after it as the straight run's."""
    tmp, data = single
    src, src_sets, src_n = MESHES[saved]
    ckpt = tmp / src / "checkpoints" / "step_00000006"
    if not ckpt.exists():  # its own test did not run (-k): make the checkpoint
        torchrun(config(tmp, data, src), *src_sets, "train.stop_at_step=6", nproc=src_n, timeout=600)
    _, sets, n = MESHES[resumed]
    name = f"{src}-on-{MESHES[resumed][0]}"
    if n == 1:
        assert main(str(config(tmp, data, name)), resume=str(ckpt)) == 0
    else:
        torchrun(config(tmp, data, name), *sets, nproc=n, resume=str(ckpt), timeout=600)
    one, after = records(tmp / "single"), records(tmp / name)
    assert after[0]["step"] == 6
    compare_steps(one[6:], after, f"saved on {saved}, resumed on {resumed} (steps 6-{STEPS - 1})")


# ---------------------------------------------------------------- the model split by hand

MODEL = dict(vocab_size=VOCAB, **SMALL, attention="segments")


def _worker(rank: int, world: int, init_file: str, out: str) -> None:
    import torch.distributed as dist

    from training.model import Transformer
    from training.parallel import clip_grad_norm, parallelize, shutdown

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    cfg, par = ModelConfig(**MODEL), ParallelConfig(tp=world)
    env = init_distributed("cpu", par)
    with torch.device("meta"):
        model = Transformer(cfg, SEQ, init_seed=5)
    model = parallelize(model, par, env)
    ref = Transformer(cfg, SEQ, init_seed=5)  # the whole model, on this process alone
    res = {"tied": model.output.weight is model.tok_embeddings.weight,
           "sharded": sorted(n for n, p in model.named_parameters() if hasattr(p, "to_local")),
           "init_equal": all(torch.equal(p.full_tensor() if hasattr(p, "full_tensor") else p, q)
                             for p, q in zip(model.parameters(), ref.parameters()))}
    opts = [torch.optim.AdamW(m.parameters(), lr=3e-3) for m in (model, ref)]
    g = torch.Generator().manual_seed(1)
    res["grad_diff"], res["norm_diff"] = [], []
    for _ in range(3):
        tokens, targets = (torch.randint(0, VOCAB, (2, SEQ), generator=g) for _ in range(2))
        doc_ids = torch.zeros(2, SEQ, dtype=torch.long)
        doc_ids[:, SEQ // 3:] = 1
        for m in (model, ref):
            (m(tokens, doc_ids, targets=targets) / tokens.numel()).backward()  # mean CE, as the trainer's scale
        # largest gradient difference, relative to the largest gradient entry
        res["grad_diff"].append(max((p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).sub(q.grad).abs().max().item()
                                    for p, q in zip(model.parameters(), ref.parameters()))
                                / max(q.grad.abs().max().item() for q in ref.parameters()))
        norms = clip_grad_norm(model, 1.0), torch.nn.utils.clip_grad_norm_(ref.parameters(), 1.0)
        res["norm_diff"].append(abs(norms[0].item() - norms[1].item()))
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)
    # The parameters each rank holds whole, after three steps: the same bits on both ranks.
    whole = torch.cat([p.detach().flatten() for p in model.parameters() if not hasattr(p, "to_local")])
    gathered = [torch.empty_like(whole) for _ in range(world)]
    dist.all_gather(gathered, whole)
    res["whole_bit_equal"] = all(torch.equal(gathered[0], t) for t in gathered)
    res["param_diff"] = max((p.full_tensor() if hasattr(p, "full_tensor") else p).sub(q).abs().max().item()
                            for p, q in zip(model.parameters(), ref.parameters()))
    Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    shutdown(env)


#: ``_worker`` over two spawned processes, in the session's one spawned pair (conftest.two_ranks)
TWO_RANK_JOB = ("_worker", ())


def test_the_model_split_over_two_processes(two_ranks):
    out = two_ranks(__name__)
    for rank in range(2):
        res = json.loads((out / f"rank{rank}.json").read_text())
        assert res["tied"] and res["init_equal"] and res["whole_bit_equal"], res
        # the blocks' projections, and the tied embedding / head split over the vocabulary (one parameter)
        assert res["sharded"] == sorted(["tok_embeddings.weight"] + [
            f"layers.{i}.{m}.weight" for i in range(SMALL["n_layer"]) for m in
            ("attention.wq", "attention.wk", "attention.wv", "attention.wo", "feed_forward.w1", "feed_forward.w2",
             "feed_forward.w3")])
        print(f"\nrank {rank}: max |grad diff| / max |grad| per step {['%.1e' % d for d in res['grad_diff']]}, "
              f"|grad-norm diff| {['%.1e' % d for d in res['norm_diff']]}, max |param diff| after 3 steps {res['param_diff']:.1e}")
        # Adam divides by sqrt(v): where a gradient entry is near 0, float32 noise moves a weight by up to
        # lr (3e-3); a wrong split moves every weight by about that much
        assert max(res["grad_diff"]) < 1e-5 and max(res["norm_diff"]) < 1e-5 and res["param_diff"] < 1e-4


# ---------------------------------------------------------------- start-up errors

def test_heads_kv_heads_and_mlp_width_must_split_evenly():
    cfg = ModelConfig(**MODEL)  # 4 heads, 2 KV heads, ffn 192
    check_tp(cfg, 2)
    with pytest.raises(ConfigError, match=r"model.n_kv_head \(2\) must be divisible by tp"):
        check_tp(cfg, 4)
    with pytest.raises(ConfigError, match=r"model.n_head \(4\) must be divisible by tp"):
        check_tp(cfg, 3)
    with pytest.raises(ConfigError, match=r"model.ffn_hidden \(201\) must be divisible by tp"):
        check_tp(ModelConfig(**{**MODEL, "ffn_hidden": 201}), 2)


def test_layout_errors(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ConfigError, match=r"parallel.tp \(2\) must divide the world size \(3\)"):
        init_distributed("cpu", ParallelConfig(tp=2))
    cpu = torch.device("cpu")
    env = DistEnv(0, 4, 0, cpu, tp=2)
    assert (env.dp_rank, env.dp_world, env.tp_rank) == (0, 2, 0)
    assert strategy_for(ParallelConfig(tp=2), env) == "fsdp"  # auto with tp on CPU: FSDP2, not DDP
    assert mesh_shape(ParallelConfig(tp=2), env) == (1, 1, 2, 2)  # (pp, dp_replicate, dp_shard, tp)
    assert mesh_shape(ParallelConfig(tp=2, strategy="hsdp", dp_shard=1), env) == (1, 2, 1, 2)
    assert mesh_shape(ParallelConfig(tp=2), DistEnv(1, 2, 1, cpu, tp=2)) == (1, 1, 1, 2)  # TP only
    with pytest.raises(ConfigError, match="ddp cannot run with parallel.tp"):
        strategy_for(ParallelConfig(tp=2, strategy="ddp"), env)
    with pytest.raises(ConfigError, match=r"parallel.dp_shard \(4\)"):
        mesh_shape(ParallelConfig(tp=2, strategy="fsdp", dp_shard=4), env)
    with pytest.raises(ConfigError, match=r"'none' cannot run on 2 data-parallel ranks"):
        strategy_for(ParallelConfig(tp=2, strategy="none"), env)
