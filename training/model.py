"""A decoder-only transformer in the nanoGPT spirit: one file, read top to bottom.

Llama-style blocks: RMSNorm pre-norm, rotary position embeddings (positions restart at
each packed document), grouped-query attention, SwiGLU MLP. Embeddings are tied or not.
Nothing here knows about parallelism: DDP/FSDP2 and activation checkpointing are applied
from the outside by ``training.parallel`` (torchtitan style).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from training.attention import AttentionMeta, attend, select_backend
from training.config import ModelConfig


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
        q = self.wq(x).view(b, t, self.n_head, self.head_dim)
        k = self.wk(x).view(b, t, self.n_kv_head, self.head_dim)
        v = self.wv(x).view(b, t, self.n_kv_head, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = attend(q, k, v, meta)
        return self.wo(y.reshape(b, t, self.n_head * self.head_dim))


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


class Transformer(nn.Module):
    """Token ids (B, T) -> logits (B, T, vocab).

    ``doc_ids`` (B, T) int: document id per token; with it attention stays inside each
    document. ``positions`` (B, T) int: RoPE positions (``attention.positions_from_doc_ids``
    restarts them per document); default 0..T-1.
    """

    def __init__(self, cfg: ModelConfig, max_seq_len: int):
        super().__init__()
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.output = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight
        cos, sin = rope_tables(cfg.head_dim, max_seq_len, cfg.rope_theta)
        # Not persistent: derived from the config, so not part of checkpoints.
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    @torch.no_grad()
    def init_weights(self) -> None:
        """N(0, init_std) everywhere; residual output projections scaled by 1/sqrt(2*n_layer)
        (GPT-2) so the residual stream's variance does not grow with depth."""
        std = self.cfg.init_std
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(("attention.wo.weight", "feed_forward.w2.weight")):
                nn.init.normal_(p, 0.0, std / math.sqrt(2 * self.cfg.n_layer))
            else:
                nn.init.normal_(p, 0.0, std)

    def forward(
        self,
        tokens: torch.Tensor,
        doc_ids: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
    ) -> torch.Tensor:
        b, t = tokens.shape
        if positions is None:
            cos, sin = self.rope_cos[:t][None, :, None], self.rope_sin[:t][None, :, None]
        else:
            cos, sin = self.rope_cos[positions][:, :, None], self.rope_sin[positions][:, :, None]
        backend = select_backend(self.cfg.attention, tokens.device)
        meta = AttentionMeta.build(doc_ids, b, t, tokens.device, backend)
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, cos, sin, meta)
        return self.output(self.norm(h))

    def num_params(self, matmul_only: bool = False) -> int:
        """Parameter count (tied weights once). ``matmul_only``: weights used in matmuls —
        every Linear, including the LM head, but not the embedding lookup or norms."""
        if not matmul_only:
            return sum(p.numel() for p in {id(p): p for p in self.parameters()}.values())
        n = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return n


def flops_per_token(cfg: ModelConfig, seq_len: int, n_matmul: int) -> float:
    """Training FLOPs per token (PaLM appendix B): 6 N_matmul + 12 L H Q T."""
    return 6 * n_matmul + 12 * cfg.n_layer * cfg.n_head * cfg.head_dim * seq_len
