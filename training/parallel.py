"""Data, tensor and pipeline parallelism, applied from outside the model (torchtitan style).

One device mesh ``(pp, dp_replicate, dp_shard, tp)`` over the world (``mesh_shape``), outermost
first: ranks ``r * tp .. r * tp + tp - 1`` form the tensor-parallel group of data-parallel rank
``r`` (TP's collectives stay between neighbours: one node); pipeline stages are ``world / pp``
ranks apart (the only traffic between them, one activation per micro-batch, may cross nodes).
With ``tp`` and ``pp`` 1 the mesh is only made where FSDP2/HSDP need one, as before.

- ``init_distributed``: one process, or a torchrun process group (gloo on CPU, nccl on CUDA);
  a 1-rank group where FSDP2 runs on one process (CUDA ``auto``), so one GPU and many train
  with the same precision recipe.
- ``parallelize``: the pipeline split (``training.pipeline_parallel``: this rank keeps only its
  stages' blocks), tensor parallelism (``training.tensor_parallel``), activation checkpointing
  per block (full or selective), ``torch.compile`` per block (over the checkpointed block), then FSDP2 (``fully_shard`` on every block, then
  on the root) over a 1-D mesh, or HSDP over a 2-D (replicate x shard) mesh; a model built on
  the meta device is then materialised and initialised (each rank only its own shards: no
  rank ever holds the whole model); DDP last.
- ``grad_sync``: DDP skips the all-reduce on all but the last micro-batch; FSDP2
  reduce-scatters every micro-batch (``reshard_grads_every_microbatch``, so a rank keeps only
  its gradient shard) or only the last.
- ``clip_grad_norm``: global-norm clipping; the norm stays a device tensor (with tensor
  parallelism each gradient element counted once over the mesh).
- ``shutdown``: a barrier only after success; after an error the group is aborted at once,
  so one rank's exception ends the job instead of hanging the others in a collective.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import sys
from dataclasses import dataclass, field

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
    notes: list[str] = field(default_factory=list)  # said at start, logged in the run's metrics
    tp: int = 1  # tensor-parallel degree: neighbouring ranks that share every row of data
    pp: int = 1  # pipeline-parallel degree: the outermost dimension (stages also share rows)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def dp_rank(self) -> int:
        """Which rows this rank reads: the same as its tensor-parallel peers' and pipeline stages'."""
        return (self.rank % (self.world // self.pp)) // self.tp

    @property
    def dp_world(self) -> int:
        return self.world // (self.tp * self.pp)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp

    @property
    def pp_rank(self) -> int:
        return self.rank // (self.world // self.pp)

    @property
    def counts_rows(self) -> bool:
        """One rank of each data-parallel rank's (pp x tp) group counts its rows and tokens."""
        return self.tp_rank == 0 and self.pp_rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1


def init_distributed(device: str = "auto", cfg: ParallelConfig | None = None, deterministic: bool = False) -> DistEnv:
    """Read torchrun's environment; start a process group when there is more than one rank,
    or one rank that FSDP2 will shard over (a 1-rank mesh)."""
    cfg = cfg or ParallelConfig()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    notes = []
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
        why = _no_cuda_reason() if device == "cpu" else None
        if why is not None:  # a GPU node training on its CPU: say so loudly, not quietly
            notes.append(f"train.device auto: training on CPU because {why}")
            print(f"WARNING: {notes[-1]}", file=sys.stderr, flush=True)
    if deterministic:
        # cuBLAS needs its workspace fixed before its first call; the rest is torch's switch.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    # Set either way: the switch is process-global, and a run after a deterministic one in the same
    # process (tests, a service training in-process) must get what its own config says.
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = deterministic, False
    if device == "cuda":
        if not torch.cuda.is_available():
            why = _no_cuda_reason()
            raise ConfigError("train.device: cuda, but torch sees no CUDA device"
                              + (f": {why}" if why else " (set train.device: cpu or auto)"))
        count = torch.cuda.device_count()
        if local_rank >= count:
            raise ConfigError(
                f"LOCAL_RANK {local_rank} but only {count} CUDA device(s) are visible on this node: "
                f"launch at most {count} process(es) per node (torchrun --nproc-per-node={count}), "
                "or set train.device: cpu"
            )
        torch.cuda.set_device(local_rank)
        dev = torch.device("cuda", local_rank)
    else:
        dev = torch.device("cpu")
    if world % cfg.tp:
        raise ConfigError(f"parallel.tp ({cfg.tp}) must divide the world size ({world})")
    if world % (cfg.tp * cfg.pp):
        raise ConfigError(f"parallel.pp ({cfg.pp}) x tp ({cfg.tp}) must divide the world size ({world})")
    env = DistEnv(rank, world, local_rank, dev, notes, tp=cfg.tp, pp=cfg.pp)
    if not dist.is_initialized() and (world > 1 or strategy_for(cfg, env) in ("fsdp", "hsdp")):
        backend = "nccl" if dev.type == "cuda" else "gloo"
        timeout = datetime.timedelta(seconds=cfg.timeout_s)
        if world > 1:
            dist.init_process_group(backend, timeout=timeout, device_id=dev if dev.type == "cuda" else None)
        else:  # one rank, no torchrun rendezvous: an in-process store
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    return env


def _no_cuda_reason() -> str | None:
    from training.cuda_driver import driver_version, unavailable_reason

    return unavailable_reason(driver_version(), torch.version.cuda, torch.__version__)


#: Process groups made besides the default one (HSDP's shard and replicate groups): their
#: timeout follows the default group's (they are not created with it).
_GROUPS: list = []


def set_collective_timeout(env: DistEnv, seconds: float) -> None:
    """Set the collectives' timeout of the default group and of every group the mesh made
    (HSDP's would keep torch's 10-minute NCCL default): the first step (compile, checkpoint
    loading) gets ``timeout_s``, later steps ``step_timeout_s``, checkpoint I/O its own."""
    if not dist.is_initialized():
        return
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
    if setter is None:
        return
    for group in [None, *_GROUPS]:
        with contextlib.suppress(Exception):  # not every backend/version can change it live
            setter(datetime.timedelta(seconds=seconds), group)


def shutdown(env: DistEnv, clean: bool = True) -> None:
    """Leave the process group. After success: barrier first, so no rank exits
    mid-collective. After an error: abort without a barrier (the other ranks may sit in a
    collective this rank will never join); their collectives then fail, or torchrun stops
    them, and the job ends with this error instead of hanging until the timeout."""
    _GROUPS.clear()
    if not dist.is_initialized():
        return
    if clean:
        if dist.get_world_size() > 1:
            dist.barrier()
        dist.destroy_process_group()
        return
    abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
    with contextlib.suppress(Exception):
        if abort is not None:
            abort()
        else:
            dist.destroy_process_group()


def strategy_for(cfg: ParallelConfig, env: DistEnv) -> str:
    """The data-parallel strategy actually used, over the world / tp data-parallel ranks.

    auto: FSDP2 on CUDA at any world size (one GPU included: one precision recipe), on CPU
    'none' for one data-parallel rank and DDP above (FSDP2 with tp > 1). DDP on one
    data-parallel rank is 'none'; HSDP on one is FSDP2 over one rank."""
    s, dp = cfg.strategy, env.dp_world
    if s == "auto":
        if env.device.type == "cuda":
            return "fsdp"
        s = ("fsdp" if env.tp > 1 or env.pp > 1 else "ddp") if dp > 1 else "none"
    if dp == 1:
        return {"ddp": "none", "hsdp": "fsdp"}.get(s, s)
    if s == "none":
        # Ranks would each train their own copy on a slice of the batch and drift apart.
        where = (f"{env.world} processes" if env.tp == env.pp == 1
                 else f"{dp} data-parallel ranks (world {env.world} / (tp {env.tp} x pp {env.pp}))")
        raise ConfigError(f"parallel.strategy: 'none' cannot run on {where}; use ddp, fsdp, hsdp or auto")
    if s == "ddp" and env.tp > 1:
        raise ConfigError("parallel.strategy ddp cannot run with parallel.tp > 1 (DDP does not take the tensor-parallel "
                          "DTensor parameters): use fsdp or hsdp, which shard over the data-parallel ranks")
    if s == "ddp" and env.pp > 1:
        raise ConfigError("parallel.strategy ddp cannot run with parallel.pp > 1 (the pipeline schedule drives each "
                          "stage's backward, not DDP's hooks): use fsdp or hsdp over the data-parallel ranks")
    return s


def hsdp_shape(cfg: ParallelConfig, env: DistEnv) -> tuple[int, int]:
    """(replicas, shard group size) of the HSDP mesh over the data-parallel ranks: shard inside
    a node by default."""
    dp = env.dp_world
    if cfg.dp_shard:
        shard = cfg.dp_shard
    elif cfg.dp_replicate:
        shard = dp // cfg.dp_replicate if dp % cfg.dp_replicate == 0 else 0
    else:
        shard = min(dp, max(1, int(os.environ.get("LOCAL_WORLD_SIZE", env.world)) // env.tp))
    if not shard or shard > dp or dp % shard or (cfg.dp_replicate and cfg.dp_replicate * shard != dp):
        raise ConfigError(f"parallel: dp_replicate ({cfg.dp_replicate}) x dp_shard ({cfg.dp_shard or shard}) must be "
                          f"the {dp} data-parallel ranks (world {env.world} / (tp {env.tp} x pp {env.pp}))")
    return dp // shard, shard


#: Names of the mesh's dimensions, outermost first.
MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")


def mesh_shape(cfg: ParallelConfig, env: DistEnv) -> tuple[int, int, int, int]:
    """(pp, dp_replicate, dp_shard, tp): how the world is laid out (checked at start, errors name
    the fields). ddp and none: every data-parallel rank a replica (dp_shard 1)."""
    strategy, dp = strategy_for(cfg, env), env.dp_world
    if strategy == "hsdp":
        shape = (env.pp, *hsdp_shape(cfg, env), env.tp)
    elif strategy == "fsdp":
        shape = (env.pp, 1, dp, env.tp)
    else:
        shape = (env.pp, dp, 1, env.tp)
    for name, given, got in (("dp_shard", cfg.dp_shard, shape[2]), ("dp_replicate", cfg.dp_replicate, shape[1])):
        if given is not None and given != got:
            raise ConfigError(f"parallel.{name} ({given}): strategy {strategy} over {dp} data-parallel ranks "
                              f"(world {env.world} / (tp {env.tp} x pp {env.pp})) has {name} {got}")
    return shape


def parallelize(model: nn.Module, cfg: ParallelConfig, env: DistEnv, compile: bool = False, compile_mode: str = "default") -> nn.Module:
    """Wrap ``model`` (a ``training.model.Transformer``): activation checkpointing, compile,
    FSDP2 / HSDP, materialise, DDP.

    ``model`` may live on the meta device (built under ``torch.device("meta")``): it is then
    moved to ``env.device`` with ``to_empty`` *after* sharding and initialised with its own
    ``init_weights()``, so under FSDP2 each rank allocates and draws only its shards (the
    init is per row chunk, so the weights are the same on any world size). A model with real
    tensors is moved to ``env.device`` (FSDP2: ``fully_shard`` moves each module's shards)."""
    strategy = strategy_for(cfg, env)
    shape = mesh_shape(cfg, env)
    mesh = stages = None
    if env.tp > 1 or env.pp > 1:
        # One mesh for every dimension (FSDP2 over TP needs both from the same parent).
        mesh = init_device_mesh(env.device.type, shape, mesh_dim_names=MESH_DIMS)
        _GROUPS[:] = [mesh.get_group(i) for i in range(mesh.ndim)]
        set_collective_timeout(env, cfg.timeout_s)
    if env.pp > 1:
        # First: this rank keeps only its stages' blocks (and the embedding / the head), so
        # everything below touches only what this rank holds.
        from training.pipeline_parallel import split_model

        stages = split_model(model, cfg, env.pp_rank)
    if env.tp > 1:
        # TP before any wrapper: its plans address the blocks' own submodules.
        from training.tensor_parallel import apply_tp

        apply_tp(model, mesh["tp"], sequence_parallel=cfg.sequence_parallel)
        model.tensor_parallel = env.tp
        if cfg.async_tp:  # checked at start (check_tp): CUDA, compiled, sequence parallel
            from training.tensor_parallel import enable_async_tp

            enable_async_tp(mesh["tp"])
    if cfg.ac != "none":
        # Recompute each block's activations in backward; the wrapper keeps state-dict keys.
        context = {"context_fn": selective_ac_context} if cfg.ac == "selective" else {}
        for key, block in model.layers.items():
            model.layers[key] = checkpoint_wrapper(block, **context)
    if compile:
        # Each block, over its checkpoint wrapper (torchtitan's order: the compiler sees the
        # recompute policy); Module.compile keeps the state-dict keys. Attention paths whose
        # shapes change per batch (segments, flash-attn's Python entry) run eagerly inside.
        for block in model.layers.values():
            block.compile(mode=None if compile_mode == "default" else compile_mode)
    fsdp = _apply_fsdp(model, cfg, env, mesh, shape, strategy) if strategy in ("fsdp", "hsdp") else None
    _materialise(model, env, strategy)
    if strategy == "ddp":
        # RoPE tables are derived buffers, equal on every rank: nothing to broadcast per forward.
        return DDP(model, device_ids=[env.local_rank] if env.device.type == "cuda" else None, broadcast_buffers=False)
    model.reshard_grads_every_microbatch = cfg.reshard_grads_every_microbatch
    if stages is not None:
        from training.pipeline_parallel import Pipeline

        model.pipeline = Pipeline(model, stages, cfg, env, mesh.get_group("pp"), fsdp)
    return model


def _apply_fsdp(model: nn.Module, cfg: ParallelConfig, env: DistEnv, mesh, shape: tuple[int, ...], strategy: str):
    """FSDP2 (or HSDP) over the data-parallel dimensions: each block sharded, then the root; under
    a pipeline the stages' roots are sharded later (``Pipeline``), so their mesh and policy are
    returned instead (None otherwise)."""
    if env.device.type == "cpu":
        # The floor (2.6) is CUDA's: FSDP2 over gloo came later (checked on 2.6, 2.7, 2.8, 2.13).
        need = (2, 8) if strategy == "hsdp" else (2, 7)
        have = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
        if have < need:
            raise ConfigError(f"parallel.strategy {strategy} on CPU needs torch >= {need[0]}.{need[1]} "
                              f"(this is {torch.__version__}); use ddp on CPU, or a GPU")
    if mesh is not None:  # the whole mesh's data-parallel dimensions
        dp_mesh = mesh["dp_replicate", "dp_shard"] if strategy == "hsdp" else mesh["dp_shard"]
    elif strategy == "hsdp":
        dp_mesh = init_device_mesh(env.device.type, shape[1:3], mesh_dim_names=MESH_DIMS[1:3])
        _GROUPS[:] = [dp_mesh.get_group(i) for i in range(dp_mesh.ndim)]
        set_collective_timeout(env, cfg.timeout_s)
    else:
        dp_mesh = init_device_mesh(env.device.type, (env.world,), mesh_dim_names=MESH_DIMS[2:3])
    if env.device.type == "cuda":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    # Blocks don't cast their inputs: the activations already have the compute dtype and
    # the fp32 RoPE tables must stay fp32.
    block_mp = MixedPrecisionPolicy(mp.param_dtype, mp.reduce_dtype, cast_forward_inputs=False)
    # Under a pipeline schedule every micro-batch's forward runs before its backward (GPipe) or
    # interleaves with others': resharding after forward would gather each block again per
    # micro-batch in backward (torchtitan keeps them too).
    reshard = cfg.reshard_after_forward and env.pp == 1
    for block in model.layers.values():
        fully_shard(block, mesh=dp_mesh, mp_policy=block_mp, reshard_after_forward=reshard)
    if env.pp == 1:
        # The root (embeddings, final norm, LM head) is used again right at the start of
        # backward: keep it gathered after forward (torchtitan does the same for the head).
        fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=False)
    else:
        # Each pipeline stage becomes the root over its blocks, its embedding or head (below:
        # a rank may run two stages). Those three are materialised whole on their stage's
        # ranks first, then sharded: a transient copy, never the whole model.
        return dp_mesh, mp
    return None


def _materialise(model: nn.Module, env: DistEnv, strategy: str) -> None:
    """A model built on the meta device gets its tensors on ``env.device`` (after sharding: each
    rank only its shards) and its own initialisation; a real one is moved there (FSDP2 moved its
    shards already)."""
    if any(t.is_meta for t in [*model.parameters(), *model.buffers()]):
        tied = _tied_parameters(model)
        model.to_empty(device=env.device)  # gives each module its own tensor: unties shared weights
        for (owner, attr), *others in tied:  # re-tie (FSDP2 manages the first holder's parameter)
            for module, name in others:
                setattr(module, name, getattr(owner, attr))
        model.init_weights()
    elif strategy not in ("fsdp", "hsdp"):
        model.to(env.device)


#: Ops whose outputs selective activation checkpointing keeps (attention is the costly one
#: to recompute); every other matmul is kept too, the rest is recomputed (torchtitan's rule).
def _sac_saved_ops() -> set:
    aten = torch.ops.aten
    names = ["_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward"]
    ops = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    varlen = getattr(getattr(torch.ops, "torch_attn", None), "_varlen_attn", None)
    if varlen is not None:
        ops.add(varlen.default)
    # Sequence parallelism's reduce-scatters (torchtitan keeps them: recomputing one is a collective)
    funcol = getattr(torch.ops, "_c10d_functional", None)
    if funcol is not None and hasattr(funcol, "reduce_scatter_tensor"):
        ops.add(funcol.reduce_scatter_tensor.default)
    return ops


def selective_ac_context():
    """A fresh (forward, recompute) context pair for one checkpointed block call."""
    from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

    saved, mm = _sac_saved_ops(), torch.ops.aten.mm.default
    counts = {False: 0, True: 0}  # matmuls seen, in forward and in recompute (same order)

    def policy(ctx, op, *args, **kwargs):
        if op == mm:
            counts[ctx.is_recompute] += 1
            keep = counts[ctx.is_recompute] % 2 == 1
        else:
            keep = op in saved
        return CheckpointPolicy.MUST_SAVE if keep else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


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
    """FSDP2 on the model (or, under pipeline parallelism, on its stages' blocks)."""
    return isinstance(model, FSDPModule) or (hasattr(model, "pipeline") and any(isinstance(m, FSDPModule) for m in model.modules()))


@contextlib.contextmanager
def grad_sync(model: nn.Module, last: bool):
    """Context for one micro-batch backward: DDP communicates only on the ``last``; FSDP2
    reduce-scatters on every micro-batch unless ``reshard_grads_every_microbatch`` is off."""
    if isinstance(model, DDP) and not last:
        with model.no_sync():
            yield
        return
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(last or getattr(model, "reshard_grads_every_microbatch", True))
    yield


def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Clip to a global L2 norm; returns the norm before clipping as a device tensor (no
    host read: the caller reads it when it needs the number)."""
    params = [p for p in model.parameters() if p.grad is not None]
    pipeline = getattr(model, "pipeline", None)
    if getattr(model, "tensor_parallel", 1) > 1 or pipeline is not None:
        return _clip_over_mesh(params, max_norm, pipeline.group if pipeline is not None else None)
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    if hasattr(norm, "full_tensor"):  # FSDP2: a DTensor
        norm = norm.full_tensor()
    return norm


@torch.no_grad()
def _clip_over_mesh(params: list[nn.Parameter], max_norm: float, pp_group=None) -> torch.Tensor:
    """Global-norm clipping for a model whose gradients mix whole tensors (held alike by every
    rank of a tensor-parallel group) and DTensors on different meshes (TP's, FSDP2's), which
    torch's clip_grad_norm_ cannot combine. Each local block's squared norm is summed over the
    mesh dimensions it is sharded on, and only those: every gradient element counts once.
    One all-reduce per (mesh, sharded dims) group: at most three. With pipeline stages
    (``pp_group``) the stages' squared norms are summed too: every rank clips by the whole
    model's norm."""
    _reduce_partial_grads(params)
    groups: dict[tuple, tuple] = {}
    for p in params:
        g = p.grad
        if hasattr(g, "to_local"):
            if any(pl.is_partial() for pl in g.placements):
                raise RuntimeError(f"a partial gradient ({g.placements}) cannot be clipped before its reduction")
            dims = tuple(i for i, pl in enumerate(g.placements) if not pl.is_replicate())
            key, mesh, local = (id(g.device_mesh), dims), g.device_mesh, g.to_local()
        else:
            key, mesh, dims, local = (None, ()), None, (), g
        groups.setdefault(key, (mesh, dims, []))[2].append(local)
    total = None
    for mesh, dims, locals_ in groups.values():
        sq = torch.stack([t.float().pow(2).sum() for t in locals_]).sum()
        for d in dims:
            dist.all_reduce(sq, group=mesh.get_group(d))
        total = sq if total is None else total + sq
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)
    norm = total.sqrt()
    coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    for _, _, locals_ in groups.values():
        for t in locals_:
            t.mul_(coef.to(t.dtype))
    return norm


def _reduce_partial_grads(params: list[nn.Parameter]) -> None:
    """Sum the gradients still pending a reduction into their parameters' placements. Under
    sequence parallelism each rank's norms see only its positions, so their (whole, replicated)
    weights get partial gradients; FSDP2 reduces them with the rest, without it they are summed
    here, once per step after the last micro-batch: one all-reduce per mesh for all of them."""
    from torch.distributed.tensor import DTensor

    pending: dict[tuple, list[nn.Parameter]] = {}
    for p in params:
        g = p.grad
        if hasattr(g, "to_local") and any(pl.is_partial() for pl in g.placements):
            pending.setdefault((id(g.device_mesh), tuple(g.placements), tuple(p.placements)), []).append(p)
    for ps in pending.values():
        mesh, placements = ps[0].grad.device_mesh, ps[0].grad.placements
        if any(not (pl.is_replicate() or pl.is_partial()) for pl in (*placements, *ps[0].placements)):
            raise RuntimeError(f"a partial gradient ({placements}) of a sharded parameter ({ps[0].placements})")
        flat = torch.cat([p.grad.to_local().flatten() for p in ps])
        for d, pl in enumerate(placements):
            if pl.is_partial():
                dist.all_reduce(flat, group=mesh.get_group(d))
        for p, part in zip(ps, flat.split([p.grad.to_local().numel() for p in ps])):
            p.grad = DTensor.from_local(part.view_as(p.grad.to_local()), mesh, p.placements, run_check=False)


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
