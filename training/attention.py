"""Document-masked causal attention, and the backends that compute it.

One definition of what may attend to what: every token carries a *document id* (its
segment inside a packed row; padding is one more segment) and

    allowed(q, k) = doc_id[q] == doc_id[k] and k <= q

Every backend computes exactly that; they differ in what they materialise:

========  ======  ==================================================================
backend   device  how
========  ======  ==================================================================
flash     CUDA    flash-attn ``flash_attn_varlen_func`` over ``cu_seqlens`` (optional
                  extra: ``pip install '.[gpu]'``; import guarded)
varlen    CUDA    torch's own ``torch.nn.attention.varlen.varlen_attn`` (flash kernels
                  shipped with torch), same ``cu_seqlens``
flex      CUDA    ``flex_attention`` with a document ``BlockMask`` built from the ids at
                  block granularity (never a T x T mask); compiled
segments  any     SDPA (``is_causal``) over each document's segment of the packed rows,
                  segments gathered into batches of equal *bucketed* length (16, 24, 32,
                  48, 64, ...), not T: memory linear in T. The scaling path on CPU.
sdpa      any     SDPA with a dense ``(B, 1, T, T)`` boolean mask: O(B T^2) memory, fine
                  for short rows (``auto`` uses it only on CUDA without any of the
                  above, and only up to T = 1024)
========  ======  ==================================================================

``auto`` (``choose_backend``) never builds the dense mask above ``DENSE_MASK_MAX_T``: on
CUDA it takes flash, then varlen, then flex, whichever can run (dense SDPA only for short
rows when none can, else it stops with a message saying what to install); on CPU segments.
``doc_ids=None`` means plain causal attention over the whole row (``document_mask:
false``): no mask at all, whatever the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
import torch.nn.functional as F

BACKENDS = ("auto", "flash", "flex", "varlen", "sdpa", "segments")

#: ``auto`` builds a dense (B, 1, T, T) mask only for rows of at most this many tokens.
DENSE_MASK_MAX_T = 1024

#: FlexAttention's block size (its default): the block mask has (T/128)^2 entries per row.
FLEX_BLOCK = 128


class AttentionUnavailable(RuntimeError):
    """The attention backend asked for (or any that scales, for ``auto``) cannot run here."""


# ---------------------------------------------------------------------------------------
# What is installed


@lru_cache(maxsize=1)
def _flash_varlen():
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # ImportError, or a broken CUDA build: both mean "not available"
        return None
    return flash_attn_varlen_func


@lru_cache(maxsize=1)
def _torch_varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except Exception:
        return None
    return varlen_attn


@lru_cache(maxsize=1)
def _flex():
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention
    except Exception:
        return None
    return flex_attention, BlockMask


@lru_cache(maxsize=1)
def _flex_compiled():
    # Eager flex_attention materialises the full score matrix; compiled, it is a fused
    # block-sparse kernel. Compiled once per process (shapes are guarded by dynamo).
    return torch.compile(_flex()[0], dynamic=False)


def _has_triton() -> bool:
    try:
        from torch.utils._triton import has_triton
    except Exception:
        return False
    return has_triton()


#: Keywords the trainer passes to each kernel: probed by signature, not only by import.
VARLEN_KEYWORDS = ("window_size",)  # enable_gqa only where the signature has it (torch 2.11 has not)
FLASH_KEYWORDS = ("dropout_p", "softmax_scale", "causal", "deterministic")


def _missing_keywords(fn, names: tuple[str, ...]) -> list[str]:
    import inspect

    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # no introspectable signature: trust the import
        return []
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return []
    return [n for n in names if n not in params]


def flash_available() -> bool:
    """True when the flash-attn package imports and CUDA is present."""
    return _flash_varlen() is not None and torch.cuda.is_available()


def unavailable(backend: str, device: torch.device) -> str | None:
    """Why ``backend`` cannot train on ``device``; None when it can."""
    cuda = device.type == "cuda" and torch.cuda.is_available()
    if backend in ("sdpa", "segments"):
        return None
    if backend == "flash":
        if _flash_varlen() is None:
            return "flash-attn is not installed (pip install flash-attn, or pip install '.[gpu]')"
        if (missing := _missing_keywords(_flash_varlen(), FLASH_KEYWORDS)):
            return f"this flash-attn's flash_attn_varlen_func takes no {', '.join(missing)}"
        return None if cuda else "flash-attn runs on CUDA only"
    if backend == "varlen":
        if _torch_varlen() is None:
            return f"torch {torch.__version__} has no torch.nn.attention.varlen.varlen_attn (a newer torch has)"
        if (missing := _missing_keywords(_torch_varlen(), VARLEN_KEYWORDS)):
            # a prototype API: its keywords moved between releases; fail here, not at the first forward
            return f"torch {torch.__version__}'s varlen_attn takes no {', '.join(missing)} (the trainer calls it with {', '.join(VARLEN_KEYWORDS)})"
        if not cuda:
            return "torch's varlen_attn runs on CUDA only"
        if torch.cuda.get_device_capability(device) < (8, 0) or not torch.backends.cuda.is_flash_attention_available():
            return "torch's varlen_attn needs an sm80+ GPU and a torch built with flash attention"
        return None
    if backend == "flex":
        if _flex() is None:
            return f"torch {torch.__version__} has no torch.nn.attention.flex_attention"
        if not cuda:
            return f"FlexAttention has no CPU backward in torch {torch.__version__} (use segments on CPU)"
        if not _has_triton():
            return "FlexAttention needs triton to compile its kernel (pip install triton)"
        return None
    raise ValueError(f"unknown attention backend {backend!r}; one of {', '.join(BACKENDS)}")


def choose_backend(preference: str, device: torch.device, seq_len: int, document_mask: bool = True) -> tuple[str, str]:
    """The backend to train with, and why (one line for the run's log).

    An explicit choice is checked and kept (``AttentionUnavailable`` if it cannot run).
    ``auto``: without document masking plain causal SDPA (no mask at any length); on CUDA
    flash, varlen, flex in that order, else dense SDPA up to ``DENSE_MASK_MAX_T`` and above
    it ``AttentionUnavailable`` naming what to install; off CUDA segments.
    """
    device = torch.device(device)
    if preference != "auto":
        reason = unavailable(preference, device)
        if reason is not None:
            raise AttentionUnavailable(f"attention backend {preference!r} cannot run on {device}: {reason}")
        return preference, "configured"
    if not document_mask:
        return "sdpa", "auto: document_mask off, plain causal SDPA (no mask)"
    if device.type == "cuda":
        reasons = {}
        for backend in ("flash", "varlen", "flex"):
            reasons[backend] = unavailable(backend, device)
            if reasons[backend] is None:
                return backend, f"auto: first of flash/varlen/flex that runs on {device}"
        if seq_len <= DENSE_MASK_MAX_T:
            return "sdpa", f"auto: seq_len {seq_len} <= {DENSE_MASK_MAX_T}, dense mask (flash/varlen/flex unavailable)"
        why = "; ".join(f"{b}: {r}" for b, r in reasons.items())
        raise AttentionUnavailable(
            f"attention auto: no document-masked attention that scales to seq_len {seq_len} runs on {device} ({why}). "
            f"Install flash-attn (pip install '.[gpu]') or triton (for flex), or a torch with varlen_attn; or set "
            f"model.attention explicitly: 'segments' (linear memory, slower) or 'sdpa' (a dense T x T mask)"
        )
    # Off CUDA segments at every length: as fast as the dense mask at T = 256 on CPU (bench_train
    # ratio 1.02 vs 1.01), faster from 1024 up (one forward at 4096: 0.17 s, 28 MiB vs 0.97 s,
    # 93 MiB; at 8192: 0.5 s, 56 MiB vs 3.6 s, 345 MiB; bench_attention.py).
    return "segments", f"auto: {device.type}, per-document SDPA (memory linear in T)"


@lru_cache(maxsize=64)
def select_backend(preference: str, device: torch.device, seq_len: int = 0, document_mask: bool = True) -> str:
    """``choose_backend``'s name only (cached: the model asks on every forward)."""
    return choose_backend(preference, device, seq_len, document_mask)[0]


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
# Each backend's description of the same mask


def document_causal_mask(doc_ids: torch.Tensor) -> torch.Tensor:
    """Boolean (B, 1, T, T) mask, True = may attend: same document and not in the future."""
    t = doc_ids.shape[-1]
    causal = torch.ones(t, t, dtype=torch.bool, device=doc_ids.device).tril()
    same_doc = doc_ids[:, :, None] == doc_ids[:, None, :]
    return (same_doc & causal)[:, None]


def varlen_cu_seqlens(doc_ids: torch.Tensor | None, batch: int, length: int, device) -> tuple[torch.Tensor, int]:
    """int32 cumulative sequence lengths over the flattened (B*T) tokens, and the longest one.

    Sequence boundaries are the same as ``document_causal_mask``'s: a new sequence starts
    at every row start and wherever the document id changes. A device tensor costs one
    device-to-host read for the longest length: the trainer computes both on the data thread
    instead (``varlen_boundaries``) and hands them in.
    """
    if doc_ids is None:
        cu = torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device)
        return cu, length
    cu, max_len = varlen_boundaries(doc_ids.cpu().numpy())
    return torch.from_numpy(cu).to(device), max_len


def varlen_boundaries(doc_ids: np.ndarray) -> tuple[np.ndarray, int]:
    """Host version of ``varlen_cu_seqlens`` for (B, T) document ids: int32 ``cu_seqlens`` and
    ``max_seqlen`` rounded up to a power of two (at most T). The kernels use it only to size
    their grid, so rounding up is exact; few distinct values keep a compiled block from
    recompiling for every batch."""
    b, t = doc_ids.shape
    starts = np.ones((b, t), dtype=bool)
    starts[:, 1:] = doc_ids[:, 1:] != doc_ids[:, :-1]
    cu = np.append(np.flatnonzero(starts), b * t).astype(np.int32)
    longest = int(np.diff(cu).max()) if len(cu) > 1 else t
    return cu, min(t, 1 << max(0, longest - 1).bit_length())


def run_ids(doc_ids: torch.Tensor) -> torch.Tensor:
    """Per row, 0, 1, 2, ... for each run of equal document ids: non-decreasing, and the same
    segments as ``doc_ids`` (packed documents are contiguous)."""
    change = torch.zeros_like(doc_ids, dtype=torch.int32)
    change[:, 1:] = (doc_ids[:, 1:] != doc_ids[:, :-1]).int()
    return change.cumsum(1, dtype=torch.int32)


def document_block_mask(doc_ids: torch.Tensor | None, batch: int, length: int, device, block: int = FLEX_BLOCK):
    """FlexAttention ``BlockMask`` for document-causal attention, built at block granularity.

    Runs are non-decreasing along a row, so for key block kb before query block qb some
    pair may attend iff kb's last run is qb's first run, and every pair may iff both blocks
    lie inside one run (and inside the row). Diagonal blocks are partial (causal inside).
    Memory: (T / block)^2 per row; ``create_block_mask`` would evaluate the T x T mask.
    """
    _, BlockMask = _flex()
    runs = torch.zeros(batch, length, dtype=torch.int32, device=device) if doc_ids is None else run_ids(doc_ids.to(device))
    nb = -(-length // block)
    # The last run repeated: F.pad(mode="replicate") has no int32 kernel on CUDA (CPU has one).
    pad = nb * block - length
    padded = torch.cat([runs, runs[:, -1:].expand(-1, pad)], dim=1) if pad else runs
    blocks = padded.view(batch, nb, block)
    first, last = blocks[..., 0], blocks[..., -1]  # runs are sorted: min and max of each block
    qb = torch.arange(nb, device=device)
    before = qb[None, :] < qb[:, None]  # [q, k]: key block strictly before query block
    touch = last[:, None, :] == first[:, :, None]  # [b, q, k]
    complete = qb < length // block
    one_run = (first == last) & complete[None]
    full = before & one_run[:, :, None] & one_run[:, None, :] & (first[:, :, None] == first[:, None, :])
    partial = ((before & touch) | torch.eye(nb, dtype=torch.bool, device=device)) & ~full

    def ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        dense = dense[:, None].to(torch.int32)  # (B, 1, NQ, NK): one mask for every head
        order = torch.argsort(dense, dim=-1, descending=True, stable=True)
        return dense.sum(-1).to(torch.int32), order.to(torch.int32)

    def mask_mod(b, h, q_idx, kv_idx):
        return (runs[b, q_idx] == runs[b, kv_idx]) & (kv_idx <= q_idx)

    num, idx = ordered(partial)
    full_num, full_idx = ordered(full)
    return BlockMask.from_kv_blocks(num, idx, full_num, full_idx, BLOCK_SIZE=block, mask_mod=mask_mod, seq_lengths=(length, length))


def bucket_len(n: int) -> int:
    """The padded length a segment of ``n`` tokens is batched at: 16, 24, 32, 48, 64, 96, ...
    (at most 1.5x the segment, so the padding costs at most ~2x its attention)."""
    if n <= 16:
        return 16
    p = 1 << (n - 1).bit_length()
    return 3 * p // 4 if n <= 3 * p // 4 else p


@dataclass
class Segments:
    """The packed rows' segments grouped by bucketed length, for ``attend``.

    Per bucket of length L: ``index`` (n, L) into the flattened (B*T) tokens, row i holding
    segment i's tokens and then its last token repeated up to L (causal attention never
    looks at those copies: they come after every real token of the segment); ``valid`` (n, L)
    marks the real slots and ``tokens`` lists their token positions, in ``valid``'s order.
    """

    groups: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # (index, valid, tokens)

    @classmethod
    def build(cls, doc_ids: torch.Tensor, device) -> Segments:
        ids = doc_ids.cpu().numpy()
        b, t = ids.shape
        start = np.ones((b, t), dtype=bool)
        start[:, 1:] = ids[:, 1:] != ids[:, :-1]
        starts = np.flatnonzero(start)
        lens = np.diff(np.append(starts, b * t))
        buckets = np.array([bucket_len(int(n)) for n in lens])
        groups = []
        for size in np.unique(buckets):
            sel = np.flatnonzero(buckets == size)
            col = np.arange(size)[None, :]
            valid = col < lens[sel, None]
            index = starts[sel, None] + np.minimum(col, lens[sel, None] - 1)
            groups.append(tuple(torch.from_numpy(x).to(device) for x in (index, valid, index[valid])))
        return cls(groups)


@dataclass
class AttentionMeta:
    """Built once per batch, shared by every layer: which backend and its mask inputs."""

    backend: str
    mask: torch.Tensor | None = None  # sdpa: (B,1,T,T) bool; None = is_causal
    cu_seqlens: torch.Tensor | None = None  # flash / varlen: int32 (n_seqs + 1,)
    max_seqlen: int = 0
    block_mask: object = None  # flex: torch.nn.attention.flex_attention.BlockMask
    segments: Segments | None = None  # segments; None = whole rows (is_causal)
    kernel: object = None  # flash / varlen / flex: the function (looked up here, not in a compiled block)

    @classmethod
    def build(cls, doc_ids: torch.Tensor | None, batch: int, length: int, device: torch.device, backend: str,
              cu_seqlens: torch.Tensor | None = None, max_seqlen: int = 0) -> AttentionMeta:
        if backend in ("flash", "varlen"):
            if cu_seqlens is None or doc_ids is None:
                cu_seqlens, max_seqlen = varlen_cu_seqlens(doc_ids, batch, length, device)
            kernel = _flash_varlen() if backend == "flash" else _torch_varlen()
            return cls(backend, cu_seqlens=cu_seqlens, max_seqlen=max_seqlen, kernel=kernel)
        if backend == "flex":
            # Compiled on CUDA (a fused block-sparse kernel); eager elsewhere: forward only,
            # and it materialises the scores (tests).
            kernel = _flex_compiled() if torch.device(device).type == "cuda" else _flex()[0]
            return cls("flex", block_mask=document_block_mask(doc_ids, batch, length, device), kernel=kernel)
        if doc_ids is None:
            return cls(backend)
        if backend == "segments":
            return cls("segments", segments=Segments.build(doc_ids, device))
        if backend == "sdpa":
            return cls("sdpa", mask=document_causal_mask(doc_ids))
        raise ValueError(f"unknown attention backend {backend!r}")


@torch.compiler.disable  # its shapes change with every batch's documents: run it eagerly
def _attend_segments(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seg: Segments) -> torch.Tensor:
    b, t, h, d = q.shape
    qf, kf, vf = q.reshape(b * t, h, d), k.reshape(b * t, -1, d), v.reshape(b * t, -1, d)
    gqa = k.shape[2] != h
    out = q.new_empty(b * t, h, d)
    for index, valid, tokens in seg.groups:  # (n, L) -> (n, heads, L, d)
        qs, ks, vs = qf[index].transpose(1, 2), kf[index].transpose(1, 2), vf[index].transpose(1, 2)
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=gqa)
        out.index_copy_(0, tokens, o.transpose(1, 2)[valid])
    return out.view(b, t, h, d)


@torch.compiler.disable  # flash-attn's Python entry point: kept out of the compiled block
def _attend_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
    b, t, h, d = q.shape
    out = meta.kernel(q.reshape(b * t, h, d), k.reshape(b * t, k.shape[2], d), v.reshape(b * t, v.shape[2], d),
                      meta.cu_seqlens, meta.cu_seqlens, meta.max_seqlen, meta.max_seqlen, dropout_p=0.0,
                      softmax_scale=None, causal=True, deterministic=torch.are_deterministic_algorithms_enabled())
    return out.view(b, t, h, d)


def _attend_torch_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
    # torch's varlen_attn is a registered custom op (torch_attn::_varlen_attn): it compiles
    # inside the block's graph. max_seqlen is a power of two (varlen_boundaries), so a block
    # sees at most log2(T) values of it.
    b, t, h, d = q.shape
    gqa = {}
    if k.shape[2] != h:
        if _varlen_takes_gqa(meta.kernel):
            gqa = {"enable_gqa": True}
        else:  # torch 2.11's varlen_attn has no enable_gqa: repeat the KV heads instead
            k, v = (x.repeat_interleave(h // x.shape[2], dim=2) for x in (k, v))
    out = meta.kernel(q.reshape(b * t, h, d), k.reshape(b * t, k.shape[2], d), v.reshape(b * t, v.shape[2], d),
                      meta.cu_seqlens, meta.cu_seqlens, meta.max_seqlen, meta.max_seqlen,
                      window_size=(-1, 0), **gqa)  # (-1, 0): causal
    return out.view(b, t, h, d)


def _varlen_takes_gqa(kernel) -> bool:
    return not _missing_keywords(kernel, ("enable_gqa",))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: AttentionMeta) -> torch.Tensor:
    """Causal (document-masked) attention. q: (B,T,H,D); k, v: (B,T,KV,D) -> (B,T,H,D)."""
    b, t, h, d = q.shape
    gqa = k.shape[2] != h
    if meta.backend == "flash":
        return _attend_flash(q, k, v, meta)
    if meta.backend == "varlen":
        return _attend_torch_varlen(q, k, v, meta)
    if meta.segments is not None:
        return _attend_segments(q, k, v, meta.segments)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if meta.backend == "flex":
        out = meta.kernel(q, k, v, block_mask=meta.block_mask, enable_gqa=gqa)
    elif meta.mask is None:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    else:
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=meta.mask, enable_gqa=gqa)
    return out.transpose(1, 2)
