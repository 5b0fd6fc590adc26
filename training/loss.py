"""The LM head and cross-entropy, fused and chunked over tokens.

``F.cross_entropy(logits.float(), ...)`` over a (B, T, V) batch keeps the logits, an fp32
copy of them and the log-softmax for backward: at micro-batch 4 x 2048 tokens x 128k vocab
that is ~13 GB for one loss. ``linear_cross_entropy`` instead walks the tokens in chunks:
per chunk it computes the logits (compute dtype), their log-sum-exp and the loss in fp32, and
right away the gradient of the loss with respect to those logits (``softmax - one_hot``), kept
in the compute dtype. Backward is then two matmuls with that stored gradient: no recompute, and
the only (tokens x vocab) tensor alive at the end of forward is one in the compute dtype
(the size of the bf16 logits themselves); the fp32 work is one chunk at a time.

The loss is a *sum* over tokens whose target is not ``ignore_index`` (the trainer divides by
the global token count), so backward only scales the stored gradient by the incoming scalar.
``tests/test_train_model.py`` checks the value and both gradients against
``F.cross_entropy`` over the full logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk: int, ignore_index: int):
        n = hidden.shape[0]
        total = torch.zeros((), dtype=torch.float32 if hidden.element_size() < 4 else hidden.dtype, device=hidden.device)
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grads = None
        for a in range(0, n, chunk):
            h, t = hidden[a : a + chunk], targets[a : a + chunk]
            logits = h @ weight.t()
            if need_grad and grads is None:
                # d(loss)/d(logits) for all tokens in the compute dtype (the logits': bf16 under
                # autocast even where hidden is fp32), filled chunk by chunk
                grads = logits.new_empty((n, weight.shape[0]))
            if logits.element_size() < 4:  # bf16/fp16 compute: the softmax in fp32, one chunk at a time
                logits = logits.float()
            lse = torch.logsumexp(logits, dim=-1)
            valid = t != ignore_index
            safe = torch.where(valid, t, 0)
            picked = logits.gather(1, safe[:, None]).squeeze(1)
            total += torch.where(valid, lse - picked, 0.0).sum()
            if need_grad:
                # d(sum CE)/d logits = softmax - one_hot, zero on ignored rows (in place: no copy)
                g = logits.sub_(lse[:, None]).exp_()
                g[torch.arange(len(t), device=t.device), safe] -= 1.0
                g.mul_(valid[:, None])
                grads[a : a + chunk] = g
        if need_grad:
            ctx.save_for_backward(hidden, weight, grads)
        return total

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        hidden, weight, g = ctx.saved_tensors
        g.mul_(grad_out.to(g.dtype))  # in place: the stored gradient is used once (no retain_graph)
        # In the forward's compute dtype: backward runs outside autocast, and fp32 operands here
        # would make both matmuls fp32 (on a GPU without TF32, a SIMT sgemm ~10x slower).
        grad_h = (g @ weight.to(g.dtype)).to(hidden.dtype) if ctx.needs_input_grad[0] else None
        grad_w = (g.t() @ hidden.to(g.dtype)).to(weight.dtype) if ctx.needs_input_grad[1] else None
        return grad_h, grad_w, None, None, None


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int = 1024,
                         ignore_index: int = -100) -> torch.Tensor:
    """``sum(cross_entropy(hidden @ weight.T, targets))`` over tokens whose target is not
    ``ignore_index``, in fp32 (fp64 for fp64 inputs). hidden: (N, d); weight: (V, d); targets: (N,).
    ``chunk_tokens`` <= 0: one chunk. A ``weight`` split over the vocabulary (a DTensor sharded
    on dim 0: tensor parallelism) takes the vocabulary-parallel path below."""
    if hasattr(weight, "device_mesh"):
        chunk = chunk_tokens if chunk_tokens > 0 else max(1, targets.numel())
        return vocab_parallel_cross_entropy(hidden, weight, targets, chunk, ignore_index)
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    chunk = chunk_tokens if chunk_tokens > 0 else max(1, hidden.shape[0])
    if not torch.is_grad_enabled():  # eval: no gradient to keep
        return _LinearCrossEntropy.forward(_NoGrad, hidden, weight, targets, chunk, ignore_index)
    return _LinearCrossEntropy.apply(hidden, weight, targets, chunk, ignore_index)


class _NoGrad:
    needs_input_grad = (False,) * 8


# ---------------------------------------------------------------------------------------
# The head split over the vocabulary (tensor parallelism)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """The fused loss with this rank's rows of the head only (vocabulary ids ``start ..
    start + V_local - 1``); ``hidden`` is whole on every rank. Per chunk: local logits (c, V_local),
    never the full (c, V); the log-sum-exp over the whole vocabulary from two all-reduces (the max,
    then the sum of exps together with the target logit, which only its owner contributes). The
    gradient ``softmax - one_hot`` of the local columns stays local; backward all-reduces
    ``grad_hidden`` (each rank's columns contribute a partial sum), ``grad_weight`` is local."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk: int, ignore_index: int, start: int, group, seq_group=None):
        import torch.distributed as dist

        if seq_group is not None:  # sequence parallel: this rank's positions; gather the group's, rank-major
            local = hidden
            hidden = hidden.new_empty((hidden.shape[0] * dist.get_world_size(seq_group), hidden.shape[1]))
            (getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor)(hidden, local.contiguous(), group=seq_group)
        n, v_local = hidden.shape[0], weight.shape[0]
        total = torch.zeros((), dtype=torch.float32 if hidden.element_size() < 4 else hidden.dtype, device=hidden.device)
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        grads = None
        for a in range(0, n, chunk):
            h, t = hidden[a : a + chunk], targets[a : a + chunk]
            logits = h @ weight.t()
            if need_grad and grads is None:
                grads = logits.new_empty((n, v_local))
            if logits.element_size() < 4:
                logits = logits.float()
            top = logits.max(dim=-1).values
            dist.all_reduce(top, op=dist.ReduceOp.MAX, group=group)
            valid = t != ignore_index
            local = t - start
            mine = valid & (local >= 0) & (local < v_local)  # this rank holds the target's logit
            safe = torch.where(mine, local, 0)
            picked = torch.where(mine, logits.gather(1, safe[:, None]).squeeze(1), 0.0)
            sums = torch.stack([(logits - top[:, None]).exp().sum(dim=-1), picked])
            dist.all_reduce(sums, group=group)
            lse = top + sums[0].log()
            total += torch.where(valid, lse - sums[1], 0.0).sum()
            if need_grad:
                g = logits.sub_(lse[:, None]).exp_()  # this rank's columns of the softmax
                g[torch.arange(len(t), device=t.device), safe] -= mine.to(g.dtype)
                g.mul_(valid[:, None])
                grads[a : a + chunk] = g
        if need_grad:
            ctx.group, ctx.seq_group = group, seq_group
            ctx.save_for_backward(hidden, weight, grads)
        return total

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        import torch.distributed as dist

        hidden, weight, g = ctx.saved_tensors
        g.mul_(grad_out.to(g.dtype))
        grad_h = grad_w = None
        if ctx.needs_input_grad[0]:
            grad_h = g @ weight.to(g.dtype)
            # every rank's columns of d(loss)/d(logits) contribute
            if ctx.seq_group is None:
                dist.all_reduce(grad_h, group=ctx.group)
            else:  # summed and scattered back to the positions each rank holds, in one collective
                grad_h = _reduce_scatter(grad_h, ctx.seq_group)
            grad_h = grad_h.to(hidden.dtype)
        if ctx.needs_input_grad[1]:
            grad_w = (g.t() @ hidden.to(g.dtype)).to(weight.dtype)
        return grad_h, grad_w, None, None, None, None, None, None


def _reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    """Sum ``x`` over ``group`` and keep this rank's block of rows (dim 0)."""
    import torch.distributed as dist

    size = dist.get_world_size(group)
    out = x.new_empty((x.shape[0] // size, *x.shape[1:]))
    # (named reduce_scatter_single from torch 2.13 on, reduce_scatter_tensor before)
    (getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor)(out, x.contiguous(), group=group)
    return out


def vocab_parallel_cross_entropy(hidden: torch.Tensor, weight, targets: torch.Tensor, chunk: int,
                                 ignore_index: int = -100) -> torch.Tensor:
    """``linear_cross_entropy`` for a head ``weight`` that is a DTensor sharded over the vocabulary
    (dim 0) on one mesh dimension and whole on any other: every rank returns the whole sum.

    ``hidden`` (B, T, d) whole on every rank, or (sequence parallelism) a DTensor split over the
    sequence (dim 1) on the same ranks as the vocabulary: each rank holds T / tp positions of every
    row, ``targets`` (B, T) whole. Those positions are all-gathered (the loss is a sum: their order
    does not matter, the targets are laid out the same way), and backward reduce-scatters their
    gradient: one collective where the whole-input path all-reduces it."""
    import torch.distributed as dist
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    dims = [i for i, pl in enumerate(weight.placements) if pl.is_shard(0)]
    if len(dims) != 1 or any(not (pl.is_replicate() or i in dims) for i, pl in enumerate(weight.placements)):
        raise ValueError(f"a vocabulary-parallel head is sharded on dim 0 over one mesh dimension, not {weight.placements}")
    group = weight.device_mesh.get_group(dims[0])
    seq_group = None
    if hasattr(hidden, "device_mesh"):
        if hidden.device_mesh.ndim != 1 or not hidden.placements[0].is_shard(1) or hidden.ndim != 3:
            raise ValueError(f"a sequence-parallel input is (B, T, d) split on dim 1 over one mesh dimension, not "
                             f"{hidden.placements} of shape {tuple(hidden.shape)}")
        seq_group = hidden.device_mesh.get_group()
        if dist.get_process_group_ranks(seq_group) != dist.get_process_group_ranks(group):
            raise ValueError("the sequence-parallel input and the vocabulary-parallel head must be split over the same ranks")
        b, t, _ = hidden.shape
        shards = dist.get_world_size(seq_group)
        if t % shards or hidden.to_local().shape[1] != t // shards:
            raise ValueError(f"sequence parallelism needs equal runs of positions: {t} positions over {shards} ranks")
        # the targets in the gathered order: rank by rank, each its run of positions of every row
        targets = targets.reshape(b, shards, t // shards).transpose(0, 1)
        hidden = hidden.to_local()  # differentiable: its gradient comes back split on dim 1
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    _, offset = compute_local_shape_and_global_offset(weight.shape, weight.device_mesh, weight.placements)
    local = weight.to_local()  # differentiable: its gradient comes back as a DTensor shard
    if not torch.is_grad_enabled():
        return _VocabParallelCrossEntropy.forward(_NoGrad, hidden, local, targets, chunk, ignore_index, offset[0], group,
                                                  seq_group)
    return _VocabParallelCrossEntropy.apply(hidden, local, targets, chunk, ignore_index, offset[0], group, seq_group)


def reference_cross_entropy(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100) -> torch.Tensor:
    """The unfused reference (what the trainer did before): fp32 copy of all logits."""
    return F.cross_entropy(logits.float().flatten(0, -2), targets.flatten(), ignore_index=ignore_index, reduction="sum")
