"""Start-up and throughput features: the model built on the meta device and initialised shard
by shard under FSDP2 (two CPU processes, peak host memory per rank), ``train.compile``,
activation checkpointing per block, MFU with the peak table or ``--peak-flops``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from train_helpers import REPO, SMALL, records, torchrun, write_config
from training import metrics
from training.attention import doc_ids_from_lens, positions_from_doc_ids
from training.config import ModelConfig, ParallelConfig
from training.model import Transformer, flops_per_token
from training.parallel import DistEnv, parallelize
from training.synthetic import write_packed
from training.train import main

torch.set_num_threads(1)
SEQ, VOCAB = 64, 256
ONE = DistEnv(0, 1, 0, torch.device("cpu"))


def batch(length: int = SEQ, rows: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, VOCAB, (rows, length + 1), generator=g)
    lens = [[5, 20, 9, 30], [40, 1, 23]]
    doc_ids = torch.from_numpy(doc_ids_from_lens(lens[:rows], length))
    positions = torch.from_numpy(positions_from_doc_ids(doc_ids.numpy()))
    return tokens[:, :-1], tokens[:, 1:], doc_ids, positions


def loss_and_grads(model, tokens, targets, doc_ids, positions):
    loss = F.cross_entropy(model(tokens, doc_ids, positions).flatten(0, 1), targets.flatten())
    loss.backward()
    # Names without the wrappers' prefixes (activation checkpointing adds one).
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad.clone() for n, p in model.named_parameters()}
    return loss.item(), grads


def built(parallel: ParallelConfig, compile: bool = False, attention: str = "auto") -> torch.nn.Module:
    """A model the way the trainer builds it: on meta, then parallelize (materialise + init)."""
    with torch.device("meta"):
        model = Transformer(ModelConfig(vocab_size=VOCAB, attention=attention, **SMALL), SEQ, init_seed=3)
    return parallelize(model, parallel, ONE, compile=compile)


def test_meta_init_equals_host_init():
    """Built on the meta device and initialised after ``to_empty`` == built directly: the
    weights depend on (seed, parameter name) only."""
    host = Transformer(ModelConfig(vocab_size=VOCAB, **SMALL), SEQ, init_seed=3)
    meta = built(ParallelConfig())
    a, b = host.state_dict(), meta.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert torch.equal(host.rope_cos, meta.rope_cos) and torch.equal(host.rope_sin, meta.rope_sin)
    other = Transformer(ModelConfig(vocab_size=VOCAB, **SMALL), SEQ, init_seed=4)
    assert not torch.equal(other.layers["0"].attention.wq.weight, host.layers["0"].attention.wq.weight)


@pytest.mark.slow
def test_fsdp2_meta_init_keeps_each_rank_under_the_full_model(tmp_path):
    """torchrun, 2 CPU processes (gloo): a ~136M-parameter model (0.54 GB fp32) built on the
    meta device and initialised shard by shard; each rank's peak host memory during start-up
    stays near its half, well under the full model (the former host-side init is measured too)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "MALLOC_MMAP_THRESHOLD_": "65536"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
           str(REPO / "tests" / "dist_meta_init.py"), str(tmp_path)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    mib = 2**20
    print(f"\n  FSDP2 start-up, 2 ranks, model {ranks[0]['full_model_bytes'] / mib:.0f} MiB fp32:")
    for r in ranks:
        print(f"    rank {r['rank']}: shard {r['local_shard_bytes'] / mib:.0f} MiB, peak during start-up: meta init "
              f"{r['meta_init_peak_bytes'] / mib:.0f} MiB, former host init {r['host_init_peak_bytes'] / mib:.0f} MiB")
    for r in ranks:
        assert len(r["checked"]) == 4  # its shards hold exactly the single-process rows
        assert r["meta_init_peak_bytes"] < 0.65 * r["full_model_bytes"]
        assert r["host_init_peak_bytes"] > r["full_model_bytes"]  # the measure sees a full model when there is one


def test_activation_checkpointing_gives_equal_gradients():
    tokens, targets, doc_ids, positions = batch()
    plain = loss_and_grads(built(ParallelConfig()), tokens, targets, doc_ids, positions)
    ac_model = built(ParallelConfig(activation_checkpointing=True))
    assert "CheckpointWrapper" in type(ac_model.layers["0"]).__name__
    ac = loss_and_grads(ac_model, tokens, targets, doc_ids, positions)
    assert plain[0] == ac[0]
    assert plain[1].keys() == ac[1].keys()
    for name in plain[1]:
        torch.testing.assert_close(ac[1][name], plain[1][name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("ac", ["full", "selective"])
def test_activation_checkpointing_modes_give_the_plain_gradients(ac):
    """``parallel.ac: full|selective``: the same loss and gradients as no checkpointing
    (selective keeps attention outputs and every other matmul, recomputes the rest)."""
    tokens, targets, doc_ids, positions = batch()
    plain = loss_and_grads(built(ParallelConfig()), tokens, targets, doc_ids, positions)
    got = loss_and_grads(built(ParallelConfig(ac=ac)), tokens, targets, doc_ids, positions)
    assert got[0] == pytest.approx(plain[0], rel=1e-6)
    for name in plain[1]:
        torch.testing.assert_close(got[1][name], plain[1][name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
def test_compile_over_selective_checkpointing(tmp_path, data):
    """Compile wraps the checkpointed block (torchtitan's order): with selective AC the run
    trains like eager."""
    assert main(str(config(tmp_path, data, "eager"))) == 0
    assert main(str(config(tmp_path, data, "sac", train={"compile": True}, parallel={"ac": "selective"}))) == 0
    for a, b in zip(records(tmp_path / "eager"), records(tmp_path / "sac")):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
    assert "activation checkpointing (selective)" in records(tmp_path / "sac", "event")[0]["message"]


def config(tmp_path: Path, data: Path, name: str, **sections) -> Path:
    return write_config(tmp_path, name, {
        "seed": 0,
        "model": {"vocab_size": VOCAB, **SMALL},
        "data": {"path": str(data), "seq_len": SEQ},
        "train": {"global_batch": 4, "micro_batch": 4, "steps": 3, "threads": 1},
        "optim": {"lr": 3e-3},
        "checkpoint": {"every": 1000},
        "metrics": {"every": 1, "progress": "off", "tensorboard": False},
    }, **sections)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_packed(tmp_path_factory.mktemp("startup") / "pack", {"web": 40, "math": 20}, SEQ, vocab=VOCAB)


@pytest.mark.slow
def test_compile_trains_like_eager(tmp_path, data):
    """``train.compile: true`` (each block through torch.compile, inductor on CPU): the same
    losses as eager, and the start record says so."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    assert main(str(config(tmp_path, data, "eager"))) == 0
    # an earlier test in this process may have compiled the same blocks: start from an empty
    # cache so the counter sees this run's graphs
    torch._dynamo.reset()
    counters.clear()
    assert main(str(config(tmp_path, data, "compiled", train={"compile": True}))) == 0
    assert counters["stats"]["unique_graphs"] >= 1  # dynamo did compile the blocks
    eager, compiled = records(tmp_path / "eager"), records(tmp_path / "compiled")
    assert len(eager) == len(compiled) == 3
    for a, b in zip(eager, compiled):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
    start = records(tmp_path / "compiled", "event")[0]
    assert start["compile"] is True and "compiled" in start["message"]


@pytest.mark.slow
def test_fsdp2_compiled_checkpointed_two_processes_match_one_eager(tmp_path, data):
    """torchrun, 2 CPU processes: FSDP2 over the meta-built model, compiled blocks, activation
    checkpointing, against one eager process with the same global batch."""
    assert main(str(config(tmp_path, data, "single", train={"micro_batch": 2}))) == 0
    torchrun(config(tmp_path, data, "fsdp", train={"micro_batch": 2, "compile": True}),
             "parallel.strategy=fsdp", "parallel.activation_checkpointing=true")
    one, two = records(tmp_path / "single"), records(tmp_path / "fsdp")
    assert [r["step"] for r in one] == [r["step"] for r in two] == [0, 1, 2]
    for a, b in zip(one, two):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
    start = records(tmp_path / "fsdp", "event")[0]["message"]
    assert "world 2 (fsdp)" in start and "compiled" in start and "activation checkpointing" in start


def test_mfu_with_peak_flops_and_the_attention_choice_in_the_metrics(tmp_path, data):
    """On CPU MFU is logged only with a peak (``--peak-flops``); it is model FLOPs per token x
    tokens/s / peak. The start record names the attention backend and why."""
    from training.__main__ import cli

    assert cli([str(config(tmp_path, data, "run")), "--peak-flops", "2e11"]) == 0
    start = records(tmp_path / "run", "event")[0]
    assert start["attention"] == "segments" and "attention segments" in start["message"]
    assert start["peak_flops"] == 2e11
    n_matmul = Transformer(ModelConfig(vocab_size=VOCAB, **SMALL), SEQ).num_params(matmul_only=True)
    assert start["flops_per_token"] == flops_per_token(ModelConfig(vocab_size=VOCAB, **SMALL), SEQ, n_matmul)
    for rec in records(tmp_path / "run"):
        assert rec["mfu"] == pytest.approx(start["flops_per_token"] * rec["tokens_per_s"] / 2e11)
        assert 0 < rec["mfu"] < 1


def test_peak_table(monkeypatch):
    cuda = torch.device("cuda")
    expect = {
        "NVIDIA H100 80GB HBM3": 989e12, "NVIDIA H100 PCIe": 756e12, "NVIDIA H200": 989e12,
        "NVIDIA H200 NVL": 835e12, "NVIDIA GH200 480GB": 989e12,
        "NVIDIA A100-SXM4-80GB": 312e12, "NVIDIA L40S": 362e12, "NVIDIA L4": 121e12, "NVIDIA GeForce GTX 1080": None,
    }
    for name, peak in expect.items():
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, name=name: name)
        assert metrics.peak_flops(cuda) == peak, name
    assert metrics.peak_flops(cuda, override=1e15) == 1e15
    assert metrics.peak_flops(torch.device("cpu")) is None
    assert metrics.peak_flops(torch.device("cpu"), override=5e11) == 5e11
    assert metrics.mfu(1e9, 1e3, None) is None
    assert metrics.mfu(1e9, 1e3, 1e13, devices=2) == pytest.approx(0.05)


def test_deterministic_mode_is_scoped_to_its_run():
    """``torch.use_deterministic_algorithms`` is process-global: a run with ``deterministic: false``
    after a deterministic one in the same process must not stay deterministic."""
    from training.parallel import init_distributed

    try:
        init_distributed("cpu", deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        init_distributed("cpu", deterministic=False)
        assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


def test_deterministic_mode_is_restored_after_a_run(tmp_path, data):
    """``run()`` restores the process's deterministic switch when it ends."""
    assert not torch.are_deterministic_algorithms_enabled()
    assert main(str(config(tmp_path, data, "det", train={"deterministic": True}))) == 0
    assert not torch.are_deterministic_algorithms_enabled()


def test_no_cuda_reason_names_the_driver_and_the_wheel():
    """An old driver under a CUDA 13 wheel: torch sees no GPU; the reason says which driver,
    which floor, and which wheel to install. No driver: nothing to explain (a CPU machine)."""
    from training.cuda_driver import unavailable_reason

    why = unavailable_reason("550.54.15", "13.0", "2.13.0+cu130")
    assert "driver 550.54.15 < required 580 for this torch build" in why and "CUDA 12 wheel" in why and "cu126" in why
    assert unavailable_reason("535.104.05", "12.6", "2.6.0+cu126") is not None
    assert "new enough" in unavailable_reason("580.159", "13.0", "2.11.0+cu130")
    assert "CPU-only build" in unavailable_reason("580.159", None, "2.13.0+cpu")
    assert unavailable_reason(None, "13.0", "2.13.0+cu130") is None


def test_device_cuda_and_auto_without_a_usable_driver(monkeypatch, capsys):
    """``device: cuda`` stops with the driver reason; ``device: auto`` trains on CPU but says
    why, loudly (stderr) and in the run's notes, instead of quietly."""
    from training import cuda_driver
    from training.config import ConfigError
    from training.parallel import init_distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(cuda_driver, "driver_version", lambda: "550.54.15")
    with pytest.raises(ConfigError, match="driver 550.54.15 < required 580"):
        init_distributed("cuda")
    env = init_distributed("auto")
    assert env.device.type == "cpu" and "driver 550.54.15 < required 580" in env.notes[0]
    assert "WARNING: train.device auto: training on CPU because NVIDIA driver 550.54.15" in capsys.readouterr().err
    monkeypatch.setattr(cuda_driver, "driver_version", lambda: None)  # a CPU machine: silent
    assert init_distributed("auto").notes == []


def test_collective_timeouts_reach_every_group_and_checkpoints_get_their_own(tmp_path, data, monkeypatch):
    """The step timeout is set on the default group and on the groups an HSDP mesh made (they
    would keep torch's 10-minute default); a checkpoint's save runs under checkpoint.timeout_s."""
    import datetime

    import torch.distributed as dist

    from training import parallel
    from training import train as train_mod

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=datetime.timedelta(seconds=99))
    try:
        other = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=600))
        parallel._GROUPS[:] = [other]
        parallel.set_collective_timeout(ONE, 42)
        for group in (dist.group.WORLD, other):
            assert group._get_backend(torch.device("cpu")).options._timeout == datetime.timedelta(seconds=42)
    finally:
        parallel.shutdown(ONE)
    assert parallel._GROUPS == []

    seen = []
    real = train_mod.set_collective_timeout
    monkeypatch.setattr(train_mod, "set_collective_timeout", lambda env, s: (seen.append(s), real(env, s)))
    assert main(str(config(tmp_path, data, "ck")), overrides=["checkpoint.every=2", "checkpoint.timeout_s=777",
                                                                "parallel.step_timeout_s=55"]) == 0
    assert seen[:4] == [55, 777, 55, 777], seen  # after step 1; around the save after step 2; ...


def test_causal_flops_and_mfu_causal(tmp_path, data):
    cfg = ModelConfig(vocab_size=VOCAB, **SMALL)
    full, causal = flops_per_token(cfg, SEQ, 1000), flops_per_token(cfg, SEQ, 1000, causal=True)
    assert full - causal == 6 * cfg.n_layer * cfg.n_head * cfg.head_dim * SEQ
    from training.__main__ import cli

    assert cli([str(config(tmp_path, data, "m")), "--peak-flops", "2e11"]) == 0
    for rec in records(tmp_path / "m"):
        assert rec["mfu_causal"] < rec["mfu"]
