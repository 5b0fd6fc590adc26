"""Tensor parallelism for ``training.model.Transformer``, applied from outside the model.

Megatron's split by DTensor plans (``torch.distributed.tensor.parallel``), per block:

- attention: ``wq``/``wk``/``wv`` column-wise (each rank computes ``n_head / tp`` query heads and
  ``n_kv_head / tp`` key/value heads: whole heads, so attention itself runs locally, and GQA's
  grouping holds inside each rank), ``wo`` row-wise (partial sums, all-reduced);
- MLP: ``w1``/``w3`` column-wise (the SwiGLU product is elementwise, so it stays local), ``w2``
  row-wise.

Two all-reduces per block forward (after ``wo`` and ``w2``) and two in backward (the inputs'
gradients of the column-wise layers). Between blocks the activations are plain, whole tensors on
every rank of a tensor-parallel group; so are the embeddings, the norms and the LM head, which
each rank holds and updates whole: their gradients are computed from those whole activations and
agree across the group without communication, and tied embeddings stay one tensor.

Not yet: sequence parallelism on the norms, a vocabulary-parallel embedding and fused loss (the
head's memory and compute are not split), async TP.
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
