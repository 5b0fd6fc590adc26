"""Micro-batches of one fixed shape for CUDA graphs (issue 61; trainer-audit-s5 C2).

CUDA-graph trees (``train.compile_mode: reduce-overhead``) keep one recorded graph per set of
input shapes and int arguments. The varlen and flash backends take ``cu_seqlens`` (one entry per
document boundary of the micro-batch) and ``max_seqlen``: both change with the documents, so nearly
every micro-batch would warm up and record a new graph instead of replaying one.

In CUDA-graph mode those two are made static: ``cu_seqlens`` is padded to a length fixed by the
config (``boundary_slots``) by repeating its last entry, the total token count, which appends
*empty* sequences; ``max_seqlen`` is the row length. The other backends need nothing: flex's
block mask is ``(B, 1, T/128, T/128)`` whatever the documents, segments runs outside the
compiled graphs, and sdpa's dense mask is ``(B, 1, T, T)``.

Empty sequences in the kernels (torch's FA2 copy, aten/src/ATen/native/transformers/cuda/
flash_attn/, which flash-attn shares): each thread block reads its sequence's length as
``cu_seqlens[b + 1] - cu_seqlens[b]`` and returns at once when its row block starts past it
(forward ``if (m_block * kBlockM >= binfo.actual_seqlen_q) return``; backward ``if (n_block *
kBlockN >= binfo.actual_seqlen_k) return``), so a zero-length sequence writes nothing and reads
nothing. ``max_seqlen`` only sizes the grid: a larger one adds blocks that return at once. The
log-sum-exp is ``(heads, total_q)`` (torch's varlen fake op), not per padded sequence; the
backward's dQ accumulator takes 128 rows per sequence (``total_q + 128 * batch``), which is what
padding costs in memory. Not yet run on a GPU: the lease's ``small`` check is the first run.
"""

from __future__ import annotations

import numpy as np

from training.config import ConfigError, TrainConfig

#: Backends whose compiled blocks take per-micro-batch ``cu_seqlens`` / ``max_seqlen``.
VARLEN_BACKENDS = ("flash", "varlen")


def static_docs(cfg: TrainConfig, backend: str, cudagraphs: bool) -> int | str | None:
    """``data.max_docs_per_row`` (a number or ``"auto"``) when this run needs fixed varlen shapes
    (CUDA graphs, document masking, the varlen or flash backend), else None. Refused when it needs
    them and the field is not set: the run would record a graph for nearly every micro-batch."""
    if not (cudagraphs and cfg.data.document_mask and backend in VARLEN_BACKENDS):
        return None
    if cfg.data.max_docs_per_row is None:
        chosen = cfg.model.attention + (f" -> {backend}" if cfg.model.attention != backend else "")
        raise ConfigError(
            f"train.compile_mode {cfg.train.compile_mode} (CUDA graphs) with model.attention {chosen} needs "
            "data.max_docs_per_row (the most documents one packed row holds, or auto: measured at start): "
            "the varlen boundaries are padded "
            "to a length fixed by it, so every micro-batch has the same shapes and a recorded graph replays "
            "instead of re-recording. Or use model.attention flex (block masks of one shape).")
    return cfg.data.max_docs_per_row


def boundary_slots(micro_rows: int, seq_len: int, cur_len: int, max_docs: int) -> int:
    """Sequences a micro-batch's ``cu_seqlens`` is padded to. A row of ``seq_len`` input tokens
    holds at most ``max_docs`` documents and one padding segment; each cut of the sequence-length
    warm-up (``seq_len / cur_len`` pieces per row) starts at most one more."""
    return micro_rows * (max_docs + seq_len // cur_len)


def pad_boundaries(cu: np.ndarray, slots: int) -> np.ndarray:
    """``cu`` (``n + 1`` int32 boundaries, ``n <= slots``) followed by its total repeated up to
    ``slots + 1`` entries: ``slots - n`` empty sequences, which the varlen kernels skip."""
    n = len(cu) - 1
    if n > slots:
        raise ValueError(f"{n} sequences do not fit {slots} varlen slots")
    return np.concatenate([cu, np.full(slots - n, cu[-1], dtype=cu.dtype)])
