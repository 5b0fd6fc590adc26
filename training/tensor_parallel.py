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

Sequence parallelism (``parallel.sequence_parallel``, Megatron-SP, torchtitan's plan): between
the blocks the residual stream is split over the sequence instead of held whole, each rank
holding ``T / tp`` positions (B, T/tp, d). The norms run on those positions only
(``SequenceParallel``: their weights stay whole on every rank, their gradients are summed over
the group); attention and the MLP all-gather their input over the sequence
(``PrepareModuleInput``) and their row-wise output projections reduce-scatter over it instead of
all-reducing (``RowwiseParallel(output_layouts=Shard(1))``). The same traffic as without (an
all-reduce is a reduce-scatter plus an all-gather), the norms' and residual's activations ÷ tp.
The embedding reduce-scatters its output; the loss gathers the final norm's positions and
reduce-scatters their gradient (``training.loss``: the vocabulary-parallel loss with a
sequence-split input). Needs every sequence length divisible by tp (checked at start).

Async TP (``parallel.async_tp``, ``enable_async_tp``): torch's micro-pipelined TP, which cuts each
all-gather -> matmul and matmul -> reduce-scatter that sequence parallelism leaves in a block
into pieces that overlap communication with compute. It is an Inductor pass (compiled blocks)
over symmetric memory (CUDA): refused at start elsewhere (``check_tp``).
"""

from __future__ import annotations

import torch.nn as nn

from training.config import ConfigError, ModelConfig, ParallelConfig


def block_plan(sequence_parallel: bool = False) -> dict:
    """The DTensor plan of one ``Block``, by submodule name. ``sequence_parallel``: the block's
    input and output are split over the sequence (dim 1), its norms run on those positions."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, PrepareModuleInput, RowwiseParallel, SequenceParallel

    if not sequence_parallel:
        return {
            "attention.wq": ColwiseParallel(),
            "attention.wk": ColwiseParallel(),
            "attention.wv": ColwiseParallel(),
            "attention.wo": RowwiseParallel(),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w3": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(),
        }
    # Attention takes (x, cos, sin, meta): only x is gathered; the RoPE tables and the document
    # masks cover the whole sequence already (every rank of the group reads the same rows).
    return {
        "attention_norm": SequenceParallel(),
        "attention": PrepareModuleInput(input_layouts=(Shard(1), None, None, None),
                                        desired_input_layouts=(Replicate(), None, None, None), use_local_output=True),
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),),
                                           use_local_output=True),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w3": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
    }


def head_plan(sequence_parallel: bool = False) -> dict:
    """The embedding and the LM head split over the vocabulary (dim 0 of both weights). The
    head's own forward (logits, not the loss: tests, inference) gathers the logits.
    ``sequence_parallel``: the embedding's output is reduce-scattered over the sequence, and the
    final norm runs on each rank's positions; its output stays a DTensor split on dim 1, which is
    how the loss (and the head's forward) know to gather the positions."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    if not sequence_parallel:
        return {
            "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
            "output": ColwiseParallel(output_layouts=Replicate()),
        }
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    }


def check_tp(cfg: ModelConfig, tp: int, parallel: ParallelConfig | None = None, seq_lens: tuple[int, ...] = (),
             device: str = "cpu", compile: bool = False) -> None:
    """Start-up checks: every split above must give each rank whole heads and equal widths;
    with sequence parallelism, equal runs of positions at every sequence length the run uses
    (``seq_lens``: data.seq_len, and the warm-up's first length); async TP where it can run."""
    parallel = parallel or ParallelConfig(tp=tp)
    if parallel.async_tp:
        why = ("parallel.tp is 1 (nothing to overlap)" if tp == 1
               else "parallel.sequence_parallel is off (it overlaps the all-gather and reduce-scatter that sequence "
                    "parallelism puts around each block's matmuls; set parallel.sequence_parallel: true)"
               if not parallel.sequence_parallel
               else f"the device is {device} (micro-pipelined TP runs on CUDA symmetric memory)" if device != "cuda"
               else "train.compile is off (it is an Inductor pass over the compiled blocks; set train.compile: true)"
               if not compile else None)
        if why:
            raise ConfigError(f"parallel.async_tp needs tensor parallelism with sequence parallelism, compiled, on CUDA: {why}")
    if tp == 1:
        return
    for what, n in (("model.n_head", cfg.n_head), ("model.n_kv_head", cfg.n_kv_head), ("model.ffn_hidden", cfg.ffn_hidden)):
        if n % tp:
            raise ConfigError(f"parallel.tp {tp}: {what} ({n}) must be divisible by tp (each rank holds {what} / tp)")
    if parallel.sequence_parallel:
        for what, n in zip(("data.seq_len", "data.seq_len_warmup.start"), seq_lens):
            if n % tp:
                raise ConfigError(f"parallel.sequence_parallel with tp {tp}: {what} ({n}) must be divisible by tp (each "
                                  f"rank holds {what} / tp positions between the blocks); change it, or set "
                                  "parallel.sequence_parallel: false")


def enable_async_tp(tp_mesh) -> None:
    """Micro-pipelined TP (torchtitan's switch): Inductor rewrites each all-gather -> matmul and
    matmul -> reduce-scatter of the compiled blocks into overlapped pieces over symmetric memory
    of the tensor-parallel group. Process-wide; before the blocks are compiled (their first call)."""
    import torch._inductor.config as inductor_config
    from torch.distributed._symmetric_memory import enable_symm_mem_for_group

    inductor_config._micro_pipeline_tp = True
    enable_symm_mem_for_group(tp_mesh.get_group().group_name)


def apply_tp(model: nn.Module, tp_mesh, sequence_parallel: bool = False) -> None:
    """Split every block of ``model`` over ``tp_mesh`` (1-D), in place. Works on a model still on
    the meta device (its shards are materialised and initialised later, like FSDP2's).
    ``sequence_parallel``: the residual stream between blocks split over the sequence too."""
    from torch.distributed.tensor.parallel import parallelize_module

    plan = block_plan(sequence_parallel)
    for block in model.layers.values():
        parallelize_module(block, tp_mesh, plan)
    # A pipeline stage may hold neither (training/pipeline_parallel.py).
    tied = model.output is not None and model.output.weight is getattr(model.tok_embeddings, "weight", None)
    parallelize_module(model, tp_mesh, {k: v for k, v in head_plan(sequence_parallel).items() if getattr(model, k) is not None})
    if tied:  # each module got its own DTensor: one parameter again (the same Shard(0) placement)
        model.output.weight = model.tok_embeddings.weight
    if sequence_parallel:  # a later stage's input (hidden states) holds T / tp positions
        model.sequence_shards = tp_mesh.size()
