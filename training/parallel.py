"""Data parallelism, applied from outside the model (torchtitan style).

- ``init_distributed``: one process, or a torchrun process group (gloo on CPU, nccl on CUDA).
- ``parallelize``: ``torch.compile`` per block, activation checkpointing per block, then
  FSDP2 (``fully_shard`` on every block, then on the root, over a 1-D device mesh); a model
  built on the meta device is then materialised and initialised (under FSDP2 each rank only
  its own shards: no rank ever holds the whole model); DDP last.
- ``grad_sync``: skip the gradient all-reduce / reduce-scatter on all but the last
  micro-batch of an accumulation.
- ``clip_grad_norm``: global-norm clipping that returns a plain float for any wrapping.
"""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

from training.config import ConfigError, ParallelConfig


@dataclass
class DistEnv:
    """Who this process is."""

    rank: int
    world: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def init_distributed(device: str = "auto") -> DistEnv:
    """Read torchrun's environment; start a process group when there is more than one rank."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world > 1 and not dist.is_initialized():
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=30))
    return DistEnv(rank, world, local_rank, dev)


def shutdown(env: DistEnv) -> None:
    """Leave the process group cleanly (barrier first, so no rank exits mid-collective)."""
    if env.distributed and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def strategy_for(cfg: ParallelConfig, env: DistEnv) -> str:
    """The data-parallel strategy actually used: 'none' for a single process."""
    if not env.distributed:
        return "none"
    if cfg.strategy == "auto":
        return "fsdp" if env.device.type == "cuda" else "ddp"
    if cfg.strategy == "none":
        # Ranks would each train their own copy on a slice of the batch and drift apart.
        raise ConfigError(f"parallel.strategy: 'none' cannot run on {env.world} processes; use ddp, fsdp or auto")
    return cfg.strategy


def parallelize(model: nn.Module, cfg: ParallelConfig, env: DistEnv, compile: bool = False) -> nn.Module:
    """Wrap ``model`` (a ``training.model.Transformer``): compile, activation checkpointing,
    FSDP2, materialise, DDP.

    ``model`` may live on the meta device (built under ``torch.device("meta")``): it is then
    moved to ``env.device`` with ``to_empty`` *after* sharding and initialised with its own
    ``init_weights()``, so under FSDP2 each rank allocates and draws only its shards (the
    init is per row chunk, so the weights are the same on any world size). A model with real
    tensors is moved to ``env.device`` (FSDP2: ``fully_shard`` moves each module's shards)."""
    if compile:
        # Each block's forward (the blocks share the compiled code): the module call around it
        # (checkpointing, FSDP2's gather/free hooks) stays eager, and the state-dict keys stay
        # the plain model's. Attention paths whose shapes change per batch (segments) run
        # eagerly inside, between two compiled graphs.
        for block in model.layers:
            block.forward = torch.compile(block.forward)
    if cfg.activation_checkpointing:
        # Recompute each block's activations in backward; the wrapper keeps state-dict keys.
        for i, block in enumerate(model.layers):
            model.layers[i] = checkpoint_wrapper(block)
    strategy = strategy_for(cfg, env)
    if strategy == "fsdp":
        mesh = init_device_mesh(env.device.type, (env.world,))
        if env.device.type == "cuda":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        else:
            mp = MixedPrecisionPolicy()
        # Blocks don't cast their inputs: the activations already have the compute dtype and
        # the fp32 RoPE tables must stay fp32.
        block_mp = MixedPrecisionPolicy(mp.param_dtype, mp.reduce_dtype, cast_forward_inputs=False)
        for block in model.layers:
            fully_shard(block, mesh=mesh, mp_policy=block_mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        tied = _tied_parameters(model)
        model.to_empty(device=env.device)  # gives each module its own tensor: unties shared weights
        for (owner, attr), *others in tied:  # re-tie (FSDP2 manages the first holder's parameter)
            for module, name in others:
                setattr(module, name, getattr(owner, attr))
        model.init_weights()
    elif strategy != "fsdp":
        model.to(env.device)
    if strategy == "ddp":
        return DDP(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None)
    return model


def _tied_parameters(model: nn.Module) -> list[list[tuple[nn.Module, str]]]:
    """Parameters held by more than one module (tied embeddings), as (module, attribute)
    lists in module order."""
    holders: dict[int, list[tuple[nn.Module, str]]] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is not None:
                holders.setdefault(id(p), []).append((module, name))
    return [h for h in holders.values() if len(h) > 1]


def uses_fsdp(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def grad_sync(model: nn.Module, sync: bool):
    """Context for one micro-batch backward: communicate gradients only when ``sync``."""
    if isinstance(model, DDP) and not sync:
        with model.no_sync():
            yield
        return
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)
    yield


def clip_grad_norm(model: nn.Module, max_norm: float) -> float:
    """Clip to a global L2 norm; returns the norm before clipping (as a float, all ranks)."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor
        norm = norm.full_tensor()
    return float(norm)


def all_reduce_sum(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    """Sum a small tensor over ranks (no-op for one process)."""
    if env.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def broadcast_object(obj, env: DistEnv):
    """Rank 0's Python object on every rank."""
    if not env.distributed:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
