"""Run by tests/test_train_resume.py in a fresh process (a process group is process-global):
``Checkpointer(async_save=True)`` on a 1-rank process group whose backend serves CUDA only,
as ``init_process_group("nccl", store=HashStore(), rank=0, world_size=1)`` makes on one GPU.
On CPU the CUDA-only backend is gloo registered under another name for ``devices=["cuda"]``."""

from __future__ import annotations

import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from training.checkpoint import Checkpointer
from training.parallel import DistEnv


def main(out: str) -> None:
    dist.Backend.register_backend("cudaonly", lambda store, rank, size, timeout: dist.ProcessGroupGloo(store, rank, size, timeout),
                                  devices=["cuda"])
    dist.init_process_group("cudaonly", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=60))
    assert torch.device("cpu") not in dist.distributed_c10d._get_default_group()._device_types
    model = nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    ck = Checkpointer(out, keep=2, env=DistEnv(0, 1, 0, torch.device("cpu")), async_save=True)
    final = ck.save(1, model, opt, {})
    ck.wait()
    assert (final / "meta.json").exists(), final
    dist.destroy_process_group()
    print("async save on a 1-rank group: ok")


if __name__ == "__main__":
    main(sys.argv[1])
