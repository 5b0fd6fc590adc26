"""Document-masked causal attention.

One definition of what may attend to what: every token carries a *document id* (its
segment inside a packed row; padding is one more segment) and

    allowed(q, k) = doc_id[q] == doc_id[k] and k <= q

``document_causal_mask`` materialises exactly that for torch SDPA; ``varlen_cu_seqlens``
turns the same document ids into the cumulative sequence lengths flash-attn's varlen kernel
takes (each run of equal ids in a row is one sequence). ``doc_ids=None`` means plain causal
attention over the whole row (``document_mask: false``).

The flash path is used only when flash_attn imports *and* the tensors are on CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F


@lru_cache(maxsize=1)
def _flash_varlen():
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # ImportError, or a broken CUDA build: both mean "not available"
        return None
    return flash_attn_varlen_func


def flash_available() -> bool:
    """True when the flash-attn package imports and CUDA is present."""
    return _flash_varlen() is not None and torch.cuda.is_available()


def select_backend(preference: str, device: torch.device) -> str:
    """``auto`` picks flash on CUDA when flash-attn is installed, SDPA otherwise."""
    if preference == "sdpa":
        return "sdpa"
    usable = device.type == "cuda" and _flash_varlen() is not None
    if preference == "flash" and not usable:
        raise RuntimeError("attention backend 'flash' needs the flash-attn package and CUDA tensors")
    return "flash" if usable else "sdpa"


# ---------------------------------------------------------------------------------------
# Segmenting packed rows (numpy; runs on the data thread)


def doc_ids_from_lens(doc_lens: list, length: int) -> np.ndarray:
    """Document id per token for rows of ``length`` tokens (padding after the docs = last id).

    ``doc_lens[i]`` lists the lengths of the consecutive documents of row ``i``; their sum
    may be less than ``length`` (the rest is padding, which becomes its own segment so it
    attends only to itself and never produces NaN rows).
    """
    out = np.empty((len(doc_lens), length), dtype=np.int32)
    for i, lens in enumerate(doc_lens):
        lens = np.asarray(lens, dtype=np.int64)
        lens = lens[lens > 0]
        ids = np.repeat(np.arange(len(lens), dtype=np.int32), lens)[:length]
        out[i, : len(ids)] = ids
        out[i, len(ids) :] = len(lens)
    return out


def positions_from_doc_ids(doc_ids: np.ndarray) -> np.ndarray:
    """RoPE positions that restart at 0 at each document start (and at each row start)."""
    n, length = doc_ids.shape
    idx = np.broadcast_to(np.arange(length, dtype=np.int64), (n, length))
    start = np.zeros((n, length), dtype=bool)
    start[:, 0] = True
    start[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    start_idx = np.where(start, idx, 0)
    return idx - np.maximum.accumulate(start_idx, axis=1)


# ---------------------------------------------------------------------------------------
# The mask, and its varlen equivalent


def document_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Boolean (B, 1, T, T) mask, True = may attend: same document and not in the future."""
    t = doc_ids.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=doc_ids.device).tril()
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (same_doc & causal)[:, None]


def varlen_cu_seqlens(doc_ids: torch.Tensor | None, batch: int, length: int, device) -> tuple[torch.Tensor, int]:
    """int32 cumulative sequence lengths over the flattened (B*T) tokens, and the longest one.

    Sequence boundaries are the same as ``document_causal_mask``'s: a new sequence starts
    at every row start and wherever the document id changes.
    """
    if doc_ids is None:
        cu = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device)
        return cu, length
    starts = torch.ones_like(doc_ids, dtype=torch.bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    idx = torch.nonzero(starts.flatten(), as_tuple=False).flatten()
    total = torch.tensor([batch * length], device=device, dtype=idx.dtype)
    cu = torch.cat([idx, total]).to(torch.int32)
    max_len = int((cu[1:] - cu[:-1]).max().item())
    return cu, max_len


@dataclass
class AttentionMeta:
    """Built once per batch, shared by every layer: which backend and its mask inputs."""

    backend: str
    mask: torch.Tensor | None = None  # SDPA: (B,1,T,T) bool; None = is_causal
    cu_seqlens: torch.Tensor | None = None  # flash: int32 (n_seqs + 1,)
    max_seqlen: int = 0

    @classmethod
    def build(cls, doc_ids: torch.Tensor | None, batch: int, length: int, device: torch.device, backend: str) -> AttentionMeta:
        if backend == "flash":
            cu, max_len = varlen_cu_seqlens(doc_ids, batch, length, device)
            return cls("flash", cu_seqlens=cu, max_seqlen=max_len)
        if doc_ids is None:
            return cls("sdpa")
        return cls("sdpa", mask=document_causal_mask(doc_ids))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
    """Causal (document-masked) attention. q: (B,T,H,D); k, v: (B,T,KV,D) -> (B,T,H,D)."""
    b, t, h, d = q.shape
    if meta.backend == "flash":
        flash = _flash_varlen()
        out = flash(
            q.reshape(b * t, h, d),
            k.reshape(b * t, k.shape[2], d),
            v.reshape(b * t, v.shape[2], d),
            meta.cu_seqlens,
            meta.cu_seqlens,
            meta.max_seqlen,
            meta.max_seqlen,
            dropout_p=0.0,
            softmax_scale=None,
            causal=True,
        )
        return out.view(b, t, h, d)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = k.shape[1] != h  # SDPA repeats the kv heads itself with enable_gqa
    if meta.mask is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=meta.mask, enable_gqa=gqa)
    return out.transpose(1, 2)
