"""Tensor parallelism for ``training.model.Transformer``, applied from outside the model.

Megatron's split by DTensor plans (``torch.distributed.tensor.parallel``), per block:

- attention: ``wq``/``wk``/``wv`` column-wise (each rank computes ``n_head / tp`` query heads and
  ``n_kv_head / tp`` key/value heads: whole heads, so attention itself runs locally, and GQA's
  grouping holds inside each rank), ``wo`` row-wise (partial sums, all-reduced);
- MLP: ``w1``/``w3`` column-wise (the SwiGLU product is elementwise, so it stays local), ``w2``
  row-wise.

Two all-reduces per block forward (after ``wo`` and ``w2``) and two in backward (the inputs'
gradients of the column-wise layers). Between blocks the activations are plain, whole tensors on
every rank of a tensor-parallel group; so are the norms, which each rank holds and updates whole.

The vocabulary is split too (``head_plan``): the embedding row-wise (each rank looks up the ids it
holds, one all-reduce of the (tokens x d_model) output) and the LM head column-wise, both over the
vocabulary, so tied embeddings stay one tensor (one DTensor, re-tied after the split). The fused
loss (``training.loss.vocab_parallel_cross_entropy``) reads the head's local rows: no rank ever
holds a (tokens x vocab) logits tensor, only (tokens x vocab / tp) per chunk.

Not yet: sequence parallelism on the norms, async TP.
"""

from __future__ import annotations

import torch.nn as nn

from training.config import ConfigError, ModelConfig


def block_plan() -> dict:
    """The DTensor plan of one ``Block``, by submodule name."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }


def head_plan() -> dict:
    """The embedding and the LM head split over the vocabulary (dim 0 of both weights). The
    head's own forward (logits, not the loss: tests, inference) gathers the logits."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "output": ColwiseParallel(output_layouts=Replicate()),
    }


def check_tp(cfg: ModelConfig, tp: int) -> None:
    """Start-up checks: every split above must give each rank whole heads and equal widths."""
    if tp == 1:
        return
    for what, n in (("model.n_head", cfg.n_head), ("model.n_kv_head", cfg.n_kv_head), ("model.ffn_hidden", cfg.ffn_hidden)):
        if n % tp:
            raise ConfigError(f"parallel.tp {tp}: {what} ({n}) must be divisible by tp (each rank holds {what} / tp)")


def apply_tp(model: nn.Module, tp_mesh) -> None:
    """Split every block of ``model`` over ``tp_mesh`` (1-D), in place. Works on a model still on
    the meta device (its shards are materialised and initialised later, like FSDP2's)."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan = block_plan()
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, plan)
    # A pipeline stage may hold neither (training/pipeline_parallel.py).
    tied = model.output is not None and model.output.weight is getattr(model.tok_embeddings, "weight", None)
    parallelize_module(model, tp_mesh, {k: v for k, v in head_plan().items() if getattr(model, k) is not None})
    if tied:  # each module got its own DTensor: one parameter again (the same Shard(0) placement)
        model.output.weight = model.tok_embeddings.weight
