"""Pipeline parallelism (``parallel.pp``) on CPU over gloo, against one process.

- the trainer under torchrun with pp 2 (GPipe, 1F1B, interleaved 1F1B: 2 stages per rank; 1F1B also
  under selective activation checkpointing and torch.compile) trains
  like one process: the loss and the grad norm of every step, and the held-out loss, agree to
  ~1e-6 (float32); both stages read the single process's rows and tokens are counted once;
- PP=2 x FSDP=2 (4 processes) and TP=2 x PP=2 x FSDP=2 (8 processes): the same, each
  data-parallel rank's stages (and tensor-parallel peers) reading its own half of the rows;
- a checkpoint saved under PP=2 (x FSDP=2, x TP=2) resumes on one process, and one process's under
  PP=2, with the straight run's losses (parameter names do not depend on the pipeline degree); a
  checkpoint in the layout before pipelines (optimizer state nested by group) still loads;
- varlen boundaries: each stage runs a micro-batch with that micro-batch's own ``cu_seqlens``;
- start-up errors: layers vs stages, tied embeddings, micro-batches vs schedule, CUDA graphs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from train_helpers import SMALL, compare_steps, mesh_config, records, row_ids, torchrun
from training.config import ConfigError, ModelConfig, ParallelConfig
from training.parallel import DistEnv, mesh_shape, strategy_for
from training.pipeline_parallel import check_pp, rank_stages, stage_layers
from training.synthetic import write_packed
from training.train import main

SEQ, VOCAB, STEPS = 32, 256, 8
MODEL = {"vocab_size": VOCAB, **SMALL, "n_layer": 4, "tie_embeddings": False, "attention": "segments"}

pytestmark = pytest.mark.slow


def config(tmp: Path, packs, name: str, **sections) -> Path:
    train, held = packs
    return mesh_config(tmp, name, train, MODEL, SEQ, STEPS, 4, held, **sections)


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pp")
    packs = (write_packed(tmp / "pack", {"web": 200, "math": 80}, SEQ, vocab=VOCAB),
             write_packed(tmp / "held", {"web": 30, "math": 10}, SEQ, vocab=VOCAB, seed=1))
    assert main(str(config(tmp, packs, "single"))) == 0
    return tmp, packs




def compare(tmp: Path, run: str, label: str, first: int = 0, tol: float = 1e-5) -> float:
    """Print the per-step differences of ``run`` against the single process from step ``first``;
    each within ``tol`` (relative, at least 1). Returns the largest loss difference."""
    one, other = records(tmp / "single")[first:], records(tmp / run)
    worst = compare_steps(one, other, label, tol)
    held = {r["step"]: r["eval_loss"] for r in records(tmp / "single", "eval")}
    evals = [(held[r["step"]], r["eval_loss"]) for r in records(tmp / run, "eval")]
    eval_diff = max((abs(a - b) for a, b in evals), default=0.0)
    assert eval_diff <= tol * 10
    print(f"  held-out loss {eval_diff:.2e} ({len(evals)} evals)")
    return worst[0]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved_1f1b"])
def test_pp2_trains_like_one_process(single, schedule):
    tmp, packs = single
    name = f"pp2-{schedule}"
    torchrun(config(tmp, packs, name), "parallel.pp=2", f"parallel.pp_schedule={schedule}")
    start = records(tmp / name, "event")[0]
    assert f"world 2 (none, pp 2 {schedule})" in start["message"], start["message"]
    compare(tmp, name, f"PP=2 {schedule}")
    assert records(tmp / "single")[0]["loss_step"] - records(tmp / name)[-1]["loss_step"] > 0.3  # it trained
    # Tokens counted once per data-parallel rank, not once per stage; both stages read the same rows.
    assert [r["tokens"] for r in records(tmp / name)] == [r["tokens"] for r in records(tmp / "single")]
    split, whole = row_ids(tmp / name), row_ids(tmp / "single")
    for step in range(STEPS):
        assert split[step, 0] == split[step, 1] == whole[step, 0]


def test_pp2_with_fsdp2_trains_like_one_process(single):
    """4 processes: 2 pipeline stages (outermost) x 2 data-parallel ranks sharding each stage (FSDP2)."""
    tmp, packs = single
    torchrun(config(tmp, packs, "pp2-fsdp2"), "parallel.pp=2", "parallel.strategy=fsdp", nproc=4, timeout=600)
    start = records(tmp / "pp2-fsdp2", "event")[0]
    assert "world 4 (fsdp, pp 2 1f1b)" in start["message"], start["message"]
    compare(tmp, "pp2-fsdp2", "PP=2 x FSDP=2 (1f1b)")
    split, whole = row_ids(tmp / "pp2-fsdp2"), row_ids(tmp / "single")
    for step in range(STEPS):
        # ranks 0, 1: stage 0 of data-parallel ranks 0, 1; ranks 2, 3: stage 1 of the same
        assert split[step, 0] == split[step, 2] and split[step, 1] == split[step, 3]
        assert not set(split[step, 0]) & set(split[step, 1])
        assert sorted(split[step, 0] + split[step, 1]) == sorted(whole[step, 0])


def test_pp2_under_selective_ac_and_compile_trains_like_one_process(single):
    """The stages' blocks are checkpoint-wrapped and compiled (keys and names unchanged)."""
    tmp, packs = single
    torchrun(config(tmp, packs, "pp2-ac-compile"), "parallel.pp=2", "parallel.ac=selective", "train.compile=true",
             "train.stop_at_step=3", timeout=600)
    start = records(tmp / "pp2-ac-compile", "event")[0]
    assert start["compile"] and start["activation_checkpointing"] == "selective"
    one, got = records(tmp / "single")[:3], records(tmp / "pp2-ac-compile")
    diffs = [(abs(a["loss_step"] - b["loss_step"]), abs(a["grad_norm"] - b["grad_norm"])) for a, b in zip(one, got)]
    print(f"\nPP=2 + selective AC + compile vs 1 process: max |loss diff| {max(d[0] for d in diffs):.2e}, "
          f"max |grad-norm diff| {max(d[1] for d in diffs):.2e}")
    assert len(got) == 3 and all(dl <= 1e-5 * 6 and dg <= 1e-5 * 2 for dl, dg in diffs), diffs


def test_tp2_pp2_fsdp2_trains_like_one_process(single):
    """8 processes: mesh (pp 2, dp_shard 2, tp 2); tensor parallelism inside each stage, the
    vocabulary-parallel loss on the last stage's tensor-parallel pair."""
    tmp, packs = single
    torchrun(config(tmp, packs, "tp2-pp2-fsdp2"), "parallel.pp=2", "parallel.tp=2", "parallel.strategy=fsdp", nproc=8,
             timeout=600)
    start = records(tmp / "tp2-pp2-fsdp2", "event")[0]
    assert "world 8 (fsdp, tp 2, pp 2 1f1b)" in start["message"], start["message"]
    compare(tmp, "tp2-pp2-fsdp2", "TP=2 x PP=2 x FSDP=2 (1f1b)")
    assert [r["tokens"] for r in records(tmp / "tp2-pp2-fsdp2")] == [r["tokens"] for r in records(tmp / "single")]
    split, whole = row_ids(tmp / "tp2-pp2-fsdp2"), row_ids(tmp / "single")
    for step in range(STEPS):
        # rank = pp * 4 + dp * 2 + tp: every (pp, tp) of a data-parallel rank reads its rows
        for dp in (0, 1):
            assert len({tuple(split[step, p * 4 + dp * 2 + t]) for p in (0, 1) for t in (0, 1)}) == 1
        assert sorted(split[step, 0] + split[step, 2]) == sorted(whole[step, 0])


#: run name, its torchrun overrides and process count
MESHES = {"1 process": ("single", (), 1), "PP=2": ("pp2-1f1b", ("parallel.pp=2",), 2),
          "PP=2 x FSDP=2": ("pp2-fsdp2", ("parallel.pp=2", "parallel.strategy=fsdp"), 4),
          "TP=2 x PP=2 x FSDP=2": ("tp2-pp2-fsdp2", ("parallel.pp=2", "parallel.tp=2", "parallel.strategy=fsdp"), 8)}


@pytest.mark.parametrize("saved, resumed", [("PP=2", "1 process"), ("PP=2 x FSDP=2", "1 process"), ("1 process", "PP=2"),
                                            ("TP=2 x PP=2 x FSDP=2", "1 process")])
def test_a_checkpoint_resumes_on_another_mesh(single, saved, resumed):
    """The step-4 checkpoint of one layout, resumed on another: the steps after it as the straight run's."""
    tmp, packs = single
    src, src_sets, src_n = MESHES[saved]
    ckpt = tmp / src / "checkpoints" / "step_00000004"
    if not ckpt.exists():  # its own test did not run (-k): make the checkpoint
        torchrun(config(tmp, packs, src), *src_sets, "train.stop_at_step=4", nproc=src_n, timeout=600)
    _, sets, n = MESHES[resumed]
    name = f"{src}-on-{MESHES[resumed][0]}"
    if n == 1:
        assert main(str(config(tmp, packs, name)), resume=str(ckpt)) == 0
    else:
        torchrun(config(tmp, packs, name), *sets, nproc=n, resume=str(ckpt), timeout=600)
    assert records(tmp / name)[0]["step"] == 4
    compare(tmp, name, f"saved on {saved}, resumed on {resumed} (steps 4-{STEPS - 1})", first=4)


def test_a_checkpoint_in_the_layout_before_pipelines_still_loads(single, monkeypatch):
    """Checkpoints written before the optimizer state was stored by parameter name (meta.json says
    nothing of its layout) load as they were written."""
    import training.checkpoint as ckpt

    tmp, packs = single
    monkeypatch.setattr(ckpt, "OPTIM_LAYOUT", None)  # save as before: nested by parameter group
    assert main(str(config(tmp, packs, "old-layout")), overrides=["train.stop_at_step=4", "checkpoint.final_save=true"]) == 0
    old = tmp / "old-layout" / "checkpoints" / "step_00000004"
    assert ckpt.read_meta(old)["optimizer_layout"] is None
    from torch.distributed.checkpoint import FileSystemReader

    assert "optim.param_groups.0.lr" in FileSystemReader(str(old / "state")).read_metadata().state_dict_metadata
    monkeypatch.undo()
    assert main(str(config(tmp, packs, "old-layout-resumed")), resume=str(old)) == 0
    compare(tmp, "old-layout-resumed", "saved in the nested layout, resumed (steps 4-7)", first=4)


# ---------------------------------------------------------------- varlen boundaries per micro-batch

def test_each_stage_runs_a_micro_batch_with_its_own_varlen_boundaries(monkeypatch):
    """The schedule cuts doc ids along rows; cu_seqlens (flat over a micro-batch's tokens) cannot be
    cut so: the stage takes the data pipeline's own for the micro-batch index it is handed."""
    import training.model as model_mod
    from training.attention import varlen_boundaries
    from training.pipeline_parallel import StageModule

    seen = []
    build = model_mod.AttentionMeta.build
    monkeypatch.setattr(model_mod.AttentionMeta, "build",
                        classmethod(lambda cls, doc_ids, *a, **kw: seen.append((doc_ids, kw, a)) or build(doc_ids, *a[:4])))
    model = model_mod.Transformer(ModelConfig(**MODEL), SEQ)
    stage = StageModule(model, list(model.layers.keys()), first=True, last=True)
    rng = np.random.default_rng(0)
    doc_ids = [np.sort(rng.integers(0, k, (2, SEQ)), axis=1) for k in (2, 5, 9)]  # 3 micro-batches, different docs
    stage.boundaries = [(torch.from_numpy(cu), m) for cu, m in map(varlen_boundaries, doc_ids)]
    tokens = torch.randint(0, VOCAB, (2, SEQ))
    for i in (2, 0, 1):
        stage(tokens, mb=torch.tensor([i]), doc_ids=torch.from_numpy(doc_ids[i]))
    for (got_ids, _, args), i in zip(seen, (2, 0, 1)):
        cu, max_len = args[4], args[5]
        assert torch.equal(got_ids, torch.from_numpy(doc_ids[i]))
        assert torch.equal(cu, stage.boundaries[i][0]) and max_len == stage.boundaries[i][1]


# ---------------------------------------------------------------- start-up errors

def test_stage_layout():
    assert stage_layers(8, 4) == [["0", "1"], ["2", "3"], ["4", "5"], ["6", "7"]]
    assert rank_stages(ParallelConfig(pp=2, pp_schedule="interleaved_1f1b"), 1) == [1, 3]
    assert rank_stages(ParallelConfig(pp=4, pp_schedule="1f1b"), 3) == [3]
    env = DistEnv(5, 8, 5, torch.device("cpu"), tp=2, pp=2)  # mesh (pp 2, dp 2, tp 2), pp outermost
    assert (env.pp_rank, env.dp_rank, env.tp_rank, env.dp_world, env.counts_rows) == (1, 0, 1, 2, False)
    assert DistEnv(2, 8, 2, torch.device("cpu"), tp=2, pp=2).counts_rows
    assert strategy_for(ParallelConfig(pp=2), env) == "fsdp"  # auto with pp on CPU: FSDP2, not DDP
    assert mesh_shape(ParallelConfig(pp=2, tp=2), env) == (2, 1, 2, 2)
    with pytest.raises(ConfigError, match="ddp cannot run with parallel.pp"):
        strategy_for(ParallelConfig(pp=2, strategy="ddp"), DistEnv(0, 4, 0, torch.device("cpu"), pp=2))


def test_pp_startup_errors():
    untied = ModelConfig(**MODEL)  # 4 layers
    check_pp(untied, ParallelConfig(pp=2), accum=4)
    check_pp(untied, ParallelConfig(pp=2, pp_schedule="interleaved_1f1b"), accum=4)  # 4 stages of 1 layer
    with pytest.raises(ConfigError, match=r"model.n_layer \(4\) must be divisible by the 3 pipeline stages"):
        check_pp(untied, ParallelConfig(pp=3), accum=6)
    with pytest.raises(ConfigError, match=r"pp_stages_per_rank 3: model.n_layer \(4\) must be divisible by the 6"):
        check_pp(untied, ParallelConfig(pp=2, pp_schedule="interleaved_1f1b", pp_stages_per_rank=3), accum=4)
    with pytest.raises(ConfigError, match="tie_embeddings: false"):
        check_pp(ModelConfig(**{**MODEL, "tie_embeddings": True}), ParallelConfig(pp=2), accum=4)
    with pytest.raises(ConfigError, match=r"pp_microbatches \(8\) must equal the micro-batches per step.* = 4"):
        check_pp(untied, ParallelConfig(pp=2, pp_microbatches=8), accum=4)
    with pytest.raises(ConfigError, match=r"1f1b needs at least pp \(4\) micro-batches per step, got 2"):
        check_pp(untied, ParallelConfig(pp=4), accum=2)
    check_pp(untied, ParallelConfig(pp=4, pp_schedule="gpipe"), accum=2)  # GPipe runs any count
    with pytest.raises(ConfigError, match=r"interleaved_1f1b needs the micro-batches per step \(3\) to be a multiple"):
        check_pp(ModelConfig(**{**MODEL, "n_layer": 8}), ParallelConfig(pp=2, pp_schedule="interleaved_1f1b"), accum=3)
    with pytest.raises(ConfigError, match="CUDA graphs"):
        check_pp(untied, ParallelConfig(pp=2), accum=4, compile_mode="reduce-overhead")
