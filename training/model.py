"""A decoder-only transformer in the nanoGPT spirit: one file, read top to bottom.

Llama-style blocks: RMSNorm pre-norm, rotary position embeddings (positions restart at
each packed document), grouped-query attention, SwiGLU MLP. Embeddings are tied or not.
Nothing here knows about parallelism: DDP/FSDP2, tensor and pipeline parallelism, activation
checkpointing and compilation are applied from the outside by ``training.parallel`` (torchtitan
style). The concessions: weight init can fill just this rank's block of a sharded weight
(``seeded_normal_``), so a model built on the meta device is initialised shard by shard;
attention takes its head count from its projections' output (a tensor-parallel rank holds only
some heads); the blocks sit in a dict keyed by their index, and a pipeline stage is this same
module with the other stages' blocks (and the embedding, or the norm and head) removed.
"""

from __future__ import annotations

import hashlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from training.attention import AttentionMeta, attend, select_backend
from training.config import ModelConfig
from training.loss import linear_cross_entropy


class RMSNorm(nn.Module):
    """Root-mean-square layer norm with a learned scale (no bias, no mean subtraction)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_tables(head_dim: int, max_len: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables of shape (max_len, head_dim/2), fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv_freq)
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (i, i + D/2) of x (B,T,H,D) by per-token angles; cos/sin are (B,T,1,D/2).

    Done in fp32 so large positions keep their precision under bf16 compute.
    """
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.type_as(x)


class Attention(nn.Module):
    """Grouped-query self-attention: n_head query heads share n_kv_head key/value heads."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head, self.n_kv_head, self.head_dim = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.wq = nn.Linear(cfg.d_model, cfg.n_head * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.d_model, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_head * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
        b, t, _ = x.shape
        # Heads from the projections' width, not the config: under tensor parallelism each rank's
        # wq/wk/wv produce only its n_head / tp and n_kv_head / tp heads (training/tensor_parallel.py).
        q = self.wq(x).view(b, t, -1, self.head_dim)
        k = self.wk(x).view(b, t, -1, self.head_dim)
        v = self.wv(x).view(b, t, -1, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = attend(q, k, v, meta)
        return self.wo(y.reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU MLP: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.w3 = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.w2 = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.attention_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), cos, sin, meta)
        return x + self.feed_forward(self.ffn_norm(x))


#: Rows per independently seeded chunk of a weight (any shard boundary costs at most two
#: partly used chunks).
INIT_CHUNK_ROWS = 256


def _local_block(p: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    """The block of ``p`` this process holds, and its offset in every dim: a plain tensor is
    all of itself; a DTensor is this rank's shard (FSDP2 shards dim 0, tensor parallelism dim
    0 or 1, or both on a 2-D mesh)."""
    if not hasattr(p, "to_local"):
        return p, (0,) * p.ndim
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    # FSDP2 over a tensor-parallel Shard(0) gives (_StridedShard(0), Shard(0)): still one block of
    # rows (FSDP splits this rank's TP rows), found at its first offset.
    _, offset = compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)
    return p.to_local(), tuple(offset)


def seeded_normal_(p: torch.Tensor, std: float, seed: int, name: str) -> None:
    """Fill ``p`` (or this rank's block of it) with N(0, std^2). Rows come in chunks of
    ``INIT_CHUNK_ROWS``, each from a generator seeded by (seed, name, chunk): any rank can
    draw any rows without drawing the rest, and the full tensor is the same on every layout
    (a block that is narrower than the full rows draws them whole and keeps its columns)."""
    local, offset = _local_block(p)
    if local.numel() == 0:
        return
    row0, n = offset[0], local.shape[0]
    cols = tuple(slice(o, o + k) for o, k in zip(offset[1:], local.shape[1:]))
    key = int.from_bytes(hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=5).digest(), "little")
    gen = torch.Generator(device=local.device)
    for chunk in range(row0 // INIT_CHUNK_ROWS, (row0 + n - 1) // INIT_CHUNK_ROWS + 1):
        first = chunk * INIT_CHUNK_ROWS
        rows = min(INIT_CHUNK_ROWS, p.shape[0] - first)
        gen.manual_seed((key << 22) + chunk)
        values = torch.randn((rows, *p.shape[1:]), generator=gen, device=local.device, dtype=local.dtype)
        lo, hi = max(first, row0), min(first + rows, row0 + n)
        local[lo - row0 : hi - row0] = values[(slice(lo - first, hi - first), *cols)] * std


class Transformer(nn.Module):
    """Token ids (B, T) -> logits (B, T, vocab).

    ``doc_ids`` (B, T) int: document id per token; with it attention stays inside each
    document. ``positions`` (B, T) int: RoPE positions (``attention.positions_from_doc_ids``
    restarts them per document); default 0..T-1. ``cfg.attention`` names the attention
    backend (``auto`` is resolved per call by ``attention.select_backend``).

    Built under ``torch.device("meta")`` it allocates nothing; ``to_empty`` then
    ``init_weights()`` materialise it (``training.parallel`` does so after sharding).
    """

    #: Ranks a hidden-state input (a later pipeline stage's) is split over along the sequence:
    #: set by tensor parallelism's sequence-parallel plan (training/tensor_parallel.py).
    sequence_shards = 1

    def __init__(self, cfg: ModelConfig, max_seq_len: int, init_seed: int = 0):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        # Keyed by the block's index in the whole model, not by position: a pipeline stage keeps
        # only some blocks, and their parameter names (checkpoints, the seeded init) stay the same.
        self.layers = nn.ModuleDict({str(i): Block(cfg) for i in range(cfg.n_layer)})
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.output = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.max_seq_len, self.init_seed = max_seq_len, init_seed
        # Not persistent: derived from the config, so not part of checkpoints.
        self.register_buffer("rope_cos", torch.empty(max_seq_len, cfg.head_dim // 2), persistent=False)
        self.register_buffer("rope_sin", torch.empty(max_seq_len, cfg.head_dim // 2), persistent=False)
        if self.rope_cos.device.type != "meta":  # built under torch.device("meta"): init later
            self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """RoPE tables; N(0, init_std) weights, residual output projections scaled by
        1/sqrt(2*n_layer) (GPT-2) so the residual stream's variance does not grow with depth.

        Every weight is drawn by ``seeded_normal_`` from ``(init_seed, its name)`` only, so the
        weights are the same whatever the world size, and a rank holding only a shard of a
        weight (FSDP2, after ``to_empty``) initialises just that shard.
        """
        cos, sin = rope_tables(self.cfg.head_dim, self.max_seq_len, self.cfg.rope_theta)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)
        for name, p in self.named_parameters():
            name = ".".join(part for part in name.split(".") if not part.startswith("_"))  # wrappers' prefixes
            std = self.init_std_of(name)
            if std is None:
                p.fill_(1.0)
            else:
                seeded_normal_(p, std, self.init_seed, name)

    def init_std_of(self, name: str) -> float | None:
        """The init std of parameter ``name`` (None: a norm scale, initialised to 1)."""
        if name.endswith("norm.weight"):
            return None
        if name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
            return self.cfg.init_std / math.sqrt(2 * self.cfg.n_layer)
        return self.cfg.init_std

    def forward(
        self,
        tokens: torch.Tensor,
        doc_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        max_seqlen: int = 0,
        loss_chunk_tokens: int = 1024,
    ) -> torch.Tensor:
        """Logits (B, T, V); with ``targets`` instead the summed cross-entropy (fp32 scalar)
        over targets that are not -100, through the fused chunked head (training/loss.py).
        ``cu_seqlens``/``max_seqlen``: the varlen boundaries, computed on the data thread
        (no device-to-host read here); derived from ``doc_ids`` when not given.

        A pipeline stage without the embedding takes the previous stage's hidden states
        (B, T, d) as ``tokens``; one without the final norm and head returns its hidden states."""
        b, t = tokens.shape[:2]
        if self.tok_embeddings is None:  # hidden states: split over the sequence under sequence parallelism
            t *= self.sequence_shards
        if positions is None:
            cos, sin = self.rope_cos[:t][None, :, None], self.rope_sin[:t][None, :, None]
        else:
            cos, sin = self.rope_cos[positions][:, :, None], self.rope_sin[positions][:, :, None]
        backend = select_backend(self.cfg.attention, tokens.device, t, doc_ids is not None)
        meta = AttentionMeta.build(doc_ids, b, t, tokens.device, backend, cu_seqlens, max_seqlen)
        h = tokens if self.tok_embeddings is None else self.tok_embeddings(tokens)
        for layer in self.layers.values():
            h = layer(h, cos, sin, meta)
        if self.norm is None:
            return h
        h = self.norm(h)
        if targets is None:
            return self.output(h)
        return linear_cross_entropy(h, self.output.weight, targets, loss_chunk_tokens)

    def num_params(self, matmul_only: bool = False) -> int:
        """Parameter count (tied weights once). ``matmul_only``: weights used in matmuls —
        every Linear, including the LM head, but not the embedding lookup or norms."""
        if not matmul_only:
            return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
        n = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return n


def flops_per_token(cfg: ModelConfig, seq_len: int, n_matmul: int, causal: bool = False) -> float:
    """Training FLOPs per token (PaLM appendix B): 6 N_matmul + 12 L H Q T. ``causal``: the
    attention term of the causal half that a causal kernel computes (6 L H Q T), the count
    that does not flatter MFU (document masking skips more still)."""
    attention = 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len
    return 6 * n_matmul + (attention / 2 if causal else attention)
