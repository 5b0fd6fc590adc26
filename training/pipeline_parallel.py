"""Pipeline parallelism for ``training.model.Transformer``, applied from outside the model.

The blocks are cut into ``n_stages`` equal runs (``stage_layers``). A rank keeps only its stages'
blocks (``split_model``): the model's ``layers`` dict is keyed by the block's index in the whole
model, so the parameters keep their names (``layers.5.attention.wq.weight``) on any pipeline
degree, and a checkpoint saved on one loads on another. The first stage also holds the
embedding, the last the final norm, the LM head and the loss (the fused chunked head: no
logits leave it). Each stage is a view of the rank's model (``StageModule``: the same
submodules, its own ``forward`` over its blocks), run by ``torch.distributed.pipelining``'s
``PipelineStage`` under GPipe, 1F1B or interleaved 1F1B (``Pipeline``).

Between stages only the (micro_batch, T, d_model) hidden states travel; every rank of a pipeline
reads the same rows, so the document ids, RoPE positions and targets reach each stage as keyword
arguments, cut per micro-batch by the schedule along the rows: exactly the data pipeline's
micro-batches, so every document-masking backend (segments, sdpa, flex) sees each micro-batch's
own boundaries. Varlen boundaries (``cu_seqlens``, flat over a micro-batch's tokens) cannot be
cut by rows: the stage looks up the data pipeline's own for the micro-batch it runs (``mb``, a
host-side index the schedule cuts like the rest), so no boundary is ever read back from the device.

The loss of a micro-batch is ``CE_sum * scale`` (``scale = dp_world / global tokens``, the
trainer's), summed, not averaged, over micro-batches (``scale_grads=False``): the gradient is
then the same as without a pipeline. Tied embeddings are refused: the embedding and the head sit
on different ranks.
"""

from __future__ import annotations

import inspect

import torch
import torch.nn as nn

from training.config import ConfigError, ModelConfig, ParallelConfig
from training.model import Transformer

SCHEDULES = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved_1f1b": "ScheduleInterleaved1F1B"}


def stages_per_rank(cfg: ParallelConfig) -> int:
    return cfg.pp_stages_per_rank if cfg.pp_schedule == "interleaved_1f1b" else 1


def stage_layers(n_layer: int, n_stages: int) -> list[list[str]]:
    """The block keys of each stage, in order: equal runs."""
    per = n_layer // n_stages
    return [[str(i) for i in range(s * per, (s + 1) * per)] for s in range(n_stages)]


def rank_stages(cfg: ParallelConfig, pp_rank: int) -> list[int]:
    """The stages rank ``pp_rank`` runs: one, or (interleaved) every pp-th from ``pp_rank``, the
    order ``ScheduleInterleaved1F1B`` expects."""
    return [pp_rank + k * cfg.pp for k in range(stages_per_rank(cfg))]


def check_pp(model: ModelConfig, cfg: ParallelConfig, accum: int, compile_mode: str | None = None) -> None:
    """Start-up checks, each naming the fields to change."""
    if cfg.pp == 1:
        return
    n_stages = cfg.pp * stages_per_rank(cfg)
    what = f"parallel.pp {cfg.pp}" + (f" x pp_stages_per_rank {cfg.pp_stages_per_rank}" if n_stages > cfg.pp else "")
    if model.n_layer % n_stages:
        raise ConfigError(f"{what}: model.n_layer ({model.n_layer}) must be divisible by the {n_stages} pipeline stages "
                          "(each stage holds an equal run of blocks)")
    if model.tie_embeddings:
        raise ConfigError("parallel.pp > 1 with model.tie_embeddings: the embedding (first stage) and the LM head (last "
                          "stage) sit on different ranks; set model.tie_embeddings: false")
    if cfg.pp_microbatches is not None and cfg.pp_microbatches != accum:
        raise ConfigError(f"parallel.pp_microbatches ({cfg.pp_microbatches}) must equal the micro-batches per step: "
                          f"train.global_batch / (train.micro_batch x data-parallel ranks) = {accum}; change "
                          "train.micro_batch to cut the batch into that many")
    if cfg.pp_schedule == "1f1b" and accum < cfg.pp:
        raise ConfigError(f"parallel.pp_schedule 1f1b needs at least pp ({cfg.pp}) micro-batches per step, got {accum} "
                          "(train.global_batch / (train.micro_batch x data-parallel ranks)); lower train.micro_batch")
    if cfg.pp_schedule == "interleaved_1f1b" and accum % cfg.pp:
        raise ConfigError(f"parallel.pp_schedule interleaved_1f1b needs the micro-batches per step ({accum}) to be a "
                          f"multiple of pp ({cfg.pp}); change train.micro_batch")
    if compile_mode in ("reduce-overhead", "max-autotune"):
        raise ConfigError(f"train.compile_mode {compile_mode} (CUDA graphs) with parallel.pp > 1 is not supported: the "
                          "schedule's sends and receives run between the graphs; use compile_mode default")


def split_model(model: nn.Module, cfg: ParallelConfig, pp_rank: int) -> list[tuple[int, list[str]]]:
    """Keep in ``model`` (in place, on the meta device or not) only rank ``pp_rank``'s stages:
    their blocks, the embedding if it runs the first stage, the norm and head if it runs the
    last. Returns (stage index, block keys) of each of its stages."""
    n_stages = cfg.pp * stages_per_rank(cfg)
    keys = stage_layers(len(model.layers), n_stages)
    mine = rank_stages(cfg, pp_rank)
    keep = {k for s in mine for k in keys[s]}
    for k in list(model.layers.keys()):
        if k not in keep:
            del model.layers[k]
    if 0 not in mine:
        model.tok_embeddings = None
    if n_stages - 1 not in mine:
        model.norm = model.output = None
    return [(s, keys[s]) for s in mine]


class StageModule(Transformer):
    """One pipeline stage: the model's own ``forward`` over a view that holds the same
    submodules, only this stage's (so the optimizer, the checkpoint and the clipping see them
    through the rank's model, by their names). Built once the model is materialised."""

    def __init__(self, model: Transformer, keys: list[str], first: bool, last: bool):
        nn.Module.__init__(self)  # not Transformer.__init__: nothing new is built
        self.cfg, self.max_seq_len, self.init_seed = model.cfg, model.max_seq_len, model.init_seed
        self.sequence_shards = model.sequence_shards
        self.tok_embeddings = model.tok_embeddings if first else None
        self.layers = nn.ModuleDict({k: model.layers[k] for k in keys})
        self.norm = model.norm if last else None
        self.output = model.output if last else None
        self.register_buffer("rope_cos", model.rope_cos, persistent=False)
        self.register_buffer("rope_sin", model.rope_sin, persistent=False)
        self.loss_chunk_tokens = 1024  # the trainer's, set with each step's inputs
        self.boundaries: list[tuple[torch.Tensor | None, int]] = []  # the step's varlen boundaries, per micro-batch

    def forward(self, x: torch.Tensor, mb: torch.Tensor, doc_ids=None, positions=None, targets=None) -> torch.Tensor:
        """``x``: token ids (first stage) or the previous stage's hidden states; ``mb``: which
        micro-batch of the step this is (a host tensor: reading it is no device sync)."""
        cu, max_len = self.boundaries[int(mb[0])] if self.boundaries else (None, 0)
        out = super().forward(x, doc_ids, positions, targets=targets, cu_seqlens=cu, max_seqlen=max_len,
                              loss_chunk_tokens=self.loss_chunk_tokens)
        # The loss as (1,), not a scalar: the schedule concatenates the last stage's outputs (eval).
        # A copy, not a view: FSDP2 warns about views a root returns.
        return out.reshape(1).clone() if self.norm is not None and targets is not None else out


class Pipeline:
    """This rank's stages and the schedules that run them: one (stages, schedule) per batch
    shape (sequence-length warm-up changes it; each is built, and its shapes inferred, once)."""

    def __init__(self, model: Transformer, stages: list[tuple[int, list[str]]], cfg: ParallelConfig, env, group,
                 fsdp: tuple | None = None):
        from torch.distributed.fsdp import fully_shard

        self.cfg, self.device, self.group = cfg, env.device, group
        self.n_stages = cfg.pp * stages_per_rank(cfg)
        self.stages: list[tuple[int, StageModule]] = []
        for index, keys in stages:
            module = StageModule(model, keys, index == 0, index == self.n_stages - 1)
            if fsdp is not None:
                # Each stage an FSDP2 root: over its blocks (already sharded), and sharding its
                # embedding or norm and head (kept gathered from forward to backward, as without
                # a pipeline). The schedule drives its gradient sync.
                mesh, mp = fsdp
                fully_shard(module, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
            self.stages.append((index, module))
        self.has_first = any(i == 0 for i, _ in self.stages)
        self.has_last = any(i == self.n_stages - 1 for i, _ in self.stages)
        self._built: dict[tuple, object] = {}
        self._losses: list[torch.Tensor] = []
        self.scale: torch.Tensor | float = 1.0
        self.poison = False

    def _loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """The schedule's loss_fn on the last stage: the stage already computed the summed CE."""
        if self.poison:  # fault injection (guard.inject_nonfinite_steps)
            output = output * float("nan")
        self._losses.append(output.detach())
        return (output * self.scale).sum()

    def _schedule(self, train: bool, n_micro: int, shape: tuple):
        key = (train, n_micro, shape)
        if key not in self._built:
            from torch.distributed.pipelining import PipelineStage, schedules

            stages = [PipelineStage(m, i, self.n_stages, self.device, group=self.group) for i, m in self.stages]
            if train:
                cls = getattr(schedules, SCHEDULES[self.cfg.pp_schedule])
            else:  # forward only: the schedule's order does not matter
                cls = schedules.ScheduleGPipe if len(stages) == 1 else schedules.ScheduleLoopedBFS
            self._built[key] = cls(stages[0] if len(stages) == 1 else stages, n_microbatches=n_micro, loss_fn=self._loss,
                                   scale_grads=False)
        return self._built[key]

    def _inputs(self, micro: list, loss_chunk_tokens: int) -> tuple[tuple, dict, torch.Tensor | None]:
        """The step's micro-batches as one batch (the schedule cuts it back along the rows)."""
        cat = lambda name: torch.cat([getattr(mb, name) for mb in micro])  # noqa: E731
        kwargs = {"mb": torch.arange(len(micro)), "targets": cat("targets")}
        if micro[0].doc_ids is not None:
            kwargs["doc_ids"], kwargs["positions"] = cat("doc_ids"), cat("positions")
        varlen = [(mb.cu_seqlens, mb.max_seqlen) for mb in micro] if micro[0].cu_seqlens is not None else []
        for _, module in self.stages:
            module.boundaries, module.loss_chunk_tokens = varlen, loss_chunk_tokens
        args = (cat("inputs"),) if self.has_first else ()
        return args, kwargs, kwargs["targets"] if self.has_last else None

    def step(self, micro: list, scale: torch.Tensor, loss_chunk_tokens: int) -> torch.Tensor:
        """Forward and backward of the step's micro-batches; the summed CE of this rank's last
        stage (0 on the other ranks)."""
        schedule = self._schedule(True, len(micro), tuple(micro[0].inputs.shape))
        args, kwargs, target = self._inputs(micro, loss_chunk_tokens)
        self.scale, self._losses = scale, []
        # Older torch has no return_outputs (it then concatenates the (1,) losses: harmless).
        quiet = {"return_outputs": False} if "return_outputs" in inspect.signature(schedule.step).parameters else {}
        schedule.step(*args, target=target, **quiet, **kwargs)
        return self._summed(len(micro))

    @torch.no_grad()
    def eval(self, mb, loss_chunk_tokens: int) -> torch.Tensor:
        """Forward of one micro-batch: its summed CE on the last stage's rank, 0 elsewhere."""
        schedule = self._schedule(False, 1, tuple(mb.inputs.shape))
        args, kwargs, target = self._inputs([mb], loss_chunk_tokens)
        self.scale, self._losses = 1.0, []
        schedule.eval(*args, target=target, **kwargs)
        return self._summed(1)

    def _summed(self, n: int) -> torch.Tensor:
        if not self.has_last:
            return torch.zeros((), dtype=torch.float32, device=self.device)
        # The last n: a schedule's first call also computes a loss while inferring shapes.
        return torch.cat(self._losses[-n:]).sum()
