"""Run under ``torchrun --nproc-per-node 2`` (CPU, gloo) by tests/test_train_startup.py.

Each rank builds a model big enough to show it (~136M parameters, 0.54 GB in fp32) the way
the trainer does (meta device -> ``parallelize`` with FSDP2, which shards, then materialises
and initialises only this rank's shards) and records the peak of its resident memory above
what it held before (VmHWM reset through /proc/self/clear_refs). It then checks its shards
hold exactly the rows a single process would have drawn, and, for comparison, measures the
old way: the full model initialised on the host, then sharded.

Writes ``OUT/rank{r}.json``.
"""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch

from training.config import ModelConfig, ParallelConfig
from training.model import Transformer, seeded_normal_
from training.parallel import init_distributed, parallelize, shutdown

MODEL = dict(vocab_size=32000, n_layer=8, d_model=1024, n_head=8, n_kv_head=8, ffn_hidden=2816)
SEQ, SEED = 256, 7


def status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def peak_of(build) -> tuple[int, object]:
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # VmHWM := VmRSS
    before = status()["VmRSS"]
    result = build()
    return status()["VmHWM"] - before, result


def main(out_dir: str) -> None:
    torch.set_num_threads(1)
    env = init_distributed("cpu")
    cfg = ModelConfig(**MODEL)
    fsdp = ParallelConfig(strategy="fsdp")

    def meta_build():
        with torch.device("meta"):
            model = Transformer(cfg, SEQ, init_seed=SEED)
        return parallelize(model, fsdp, env)

    meta_peak, model = peak_of(meta_build)
    full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())  # DTensors: global sizes
    local_bytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())

    # The shards hold the rows one process would have drawn for the whole tensor.
    checked = []
    for name, p in model.named_parameters():
        if name in ("tok_embeddings.weight", "layers.0.attention.wq.weight", "layers.7.feed_forward.w2.weight", "norm.weight"):
            full = torch.empty(p.shape)
            std = model.init_std_of(name)
            full.fill_(1.0) if std is None else seeded_normal_(full, std, SEED, name)
            local = p.to_local()
            rows = -(-p.shape[0] // env.world)  # FSDP2 shards dim 0 like torch.chunk
            expected = full[env.rank * rows : env.rank * rows + local.shape[0]]
            assert torch.equal(local, expected), name
            checked.append(name)
    assert torch.equal(model.rope_cos[:4], Transformer(ModelConfig(**{**MODEL, "n_layer": 1, "vocab_size": 8}), 4).rope_cos)
    del model, full, expected, local

    def host_build():  # the former start-up: every rank initialises the full model, then shards it
        return parallelize(Transformer(cfg, SEQ, init_seed=SEED), fsdp, env)

    host_peak, model = peak_of(host_build)
    del model
    Path(out_dir, f"rank{env.rank}.json").write_text(json.dumps({
        "rank": env.rank, "world": env.world, "full_model_bytes": full_bytes, "local_shard_bytes": local_bytes,
        "meta_init_peak_bytes": meta_peak, "host_init_peak_bytes": host_peak, "checked": checked,
    }))
    shutdown(env)


if __name__ == "__main__":
    main(sys.argv[1])
