"""Attention backends: each one that runs here equals attention computed one document at a
time (forward, and gradients where the backend has a backward here), on packed rows of many
short documents with GQA; ``auto`` never builds a dense T x T mask for long rows; peak
memory of one call at T = 4096, dense vs the scaling path."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from training import attention
from training.attention import (
    DENSE_MASK_MAX_T,
    AttentionMeta,
    AttentionUnavailable,
    Segments,
    attend,
    bucket_len,
    choose_backend,
    doc_ids_from_lens,
    document_block_mask,
    positions_from_doc_ids,
    run_ids,
    unavailable,
)
from training.config import ModelConfig
from training.model import Transformer

sys.path.insert(0, str(Path(__file__).parent / "benchmarks"))

torch.set_num_threads(1)
# Eager FlexAttention (CPU, forward only) warns that it is unfused: that is what is tested here.
pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
CPU = torch.device("cpu")
H, KV, D = 6, 2, 16  # GQA: 3 query heads per kv head


def packed_rows(length: int, rows: int, seed: int = 0) -> list[list[int]]:
    """Rows of many short documents (1..40 tokens), some with padding at the end."""
    rng = np.random.default_rng(seed)
    out = []
    for r in range(rows):
        lens, used = [], 0
        while used < length - 12:
            n = int(min(rng.integers(1, 41), length - used))
            lens.append(n)
            used += n
        out.append(lens if r % 2 else lens[:-1])  # odd rows fill the row, even rows end in padding
    return out


# The second row has a 380-token document: blocks 1 and 2 (of 128) lie inside it, so the flex
# block mask has a *full* block (mask_mod skipped) next to partial ones; T is not a multiple of 128.
T = 400
LENS = [packed_rows(T, 1, seed=1)[0], [5, 380, 15], packed_rows(T, 2, seed=2)[1]]


def qkv(b: int, t: int, seed: int = 0, dtype=torch.float32, device=CPU):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, t, n, D, generator=g).to(device, dtype).requires_grad_() for n in (H, KV, KV)]


def segments_of(lens: list[int], length: int) -> list[tuple[int, int]]:
    """(start, length) of each document, and of the padding after them."""
    out, start = [], 0
    for n in lens + ([length - sum(lens)] if sum(lens) < length else []):
        out.append((start, n))
        start += n
    return out


def per_document(q, k, v, lens_by_row):
    """The reference: causal attention run on each document on its own (kv heads repeated)."""
    rep = q.shape[2] // k.shape[2]
    rows = []
    for row, lens in enumerate(lens_by_row):
        pieces = []
        for start, n in segments_of(lens, q.shape[1]):
            sl = slice(start, start + n)
            qs = q[row, sl].transpose(0, 1)
            ks = k[row, sl].transpose(0, 1).repeat_interleave(rep, 0)
            vs = v[row, sl].transpose(0, 1).repeat_interleave(rep, 0)
            pieces.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1))
        rows.append(torch.cat(pieces))
    return torch.stack(rows)


def runnable_here(backend: str) -> str | None:
    """None if ``backend``'s forward runs on this machine, else why not."""
    if backend == "flex":
        return None if attention._flex() is not None else "no FlexAttention in this torch"
    return unavailable(backend, torch.device("cuda" if torch.cuda.is_available() else "cpu"))


def has_backward_here(backend: str, device: torch.device) -> bool:
    # FlexAttention has no CPU backward in torch 2.13 (NotImplementedError).
    return not (backend == "flex" and device.type == "cpu")


@pytest.mark.parametrize("backend", ["sdpa", "segments", "flex", "varlen", "flash"])
def test_backend_equals_per_document_attention(backend):
    why = runnable_here(backend)
    if why is not None:
        pytest.skip(f"{backend}: {why} (the CUDA paths run on a GPU machine)")
    device = torch.device("cuda") if backend in ("varlen", "flash") else CPU
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)
    b = len(LENS)
    q, k, v = qkv(b, T, dtype=dtype, device=device)
    doc_ids = torch.from_numpy(doc_ids_from_lens(LENS, T)).to(device)
    backward = has_backward_here(backend, device)
    if not backward:  # forward only: inputs that want no gradient
        q, k, v = (x.detach() for x in (q, k, v))
    out = attend(q, k, v, AttentionMeta.build(doc_ids, b, T, device, backend))
    ref = per_document(q, k, v, LENS)
    torch.testing.assert_close(out.float(), ref.float(), **tol)
    if not backward:
        return
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(5)).to(device, dtype)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    ref_grads = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for name, g, r in zip("qkv", grads, ref_grads):
        torch.testing.assert_close(g.float(), r.float(), **tol, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("backend", ["sdpa", "segments", "flex"])
def test_backends_without_document_mask_are_plain_causal(backend):
    q, k, v = (x.detach() for x in qkv(2, 100, seed=3))
    out = attend(q, k, v, AttentionMeta.build(None, 2, 100, CPU, backend))
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("length", [64, 300, 400, 512])
def test_flex_block_mask_equals_torch_create_block_mask(length):
    """Our block-level document mask has the same partial and full blocks as torch's
    create_block_mask, which evaluates the mask at every one of the T x T positions."""
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    lens = [[5, 380, 15], [length], [3, 140, 120, 200]] + packed_rows(length, 2, seed=4)
    doc_ids = torch.from_numpy(doc_ids_from_lens(lens, length))
    runs = run_ids(doc_ids)
    ours = document_block_mask(doc_ids, len(lens), length, CPU)
    ref = flex.create_block_mask(lambda b, h, q, kv: (runs[b, q] == runs[b, kv]) & (kv <= q), len(lens), None, length, length, device="cpu")
    n = ref.kv_indices.shape[-1]

    def dense(num, idx):
        return flex._ordered_to_dense(num, idx, n)

    assert torch.equal(dense(ours.kv_num_blocks, ours.kv_indices), dense(ref.kv_num_blocks, ref.kv_indices))
    assert torch.equal(dense(ours.full_kv_num_blocks, ours.full_kv_indices), dense(ref.full_kv_num_blocks, ref.full_kv_indices))
    assert ours.seq_lengths == ref.seq_lengths


def test_segments_are_batched_at_bucketed_lengths_not_t():
    assert [bucket_len(n) for n in (1, 16, 17, 24, 25, 33, 48, 49, 65, 97, 129, 4096)] == [16, 16, 24, 24, 32, 48, 48, 64, 96, 128, 192, 4096]
    assert all(n <= bucket_len(n) <= max(16, 1.5 * n) for n in range(1, 5000))
    length = 4096
    lens = packed_rows(length, 2)
    seg = Segments.build(torch.from_numpy(doc_ids_from_lens(lens, length)), CPU)
    sizes = [index.shape[1] for index, _, _ in seg.groups]
    assert max(sizes) <= 64  # documents of <= 40 tokens (and short padding): nothing near T
    gathered = sum(index.numel() for index, _, _ in seg.groups)
    assert sum(int(valid.sum()) for _, valid, _ in seg.groups) == 2 * length  # every token once
    assert gathered < 2 * 2 * length  # linear in T: at most ~1.5x the tokens (plus tiny docs at 16)


def tiny_model(attention: str = "auto", seed: int = 0) -> Transformer:
    cfg = ModelConfig(vocab_size=256, n_layer=2, d_model=96, n_head=H, n_kv_head=KV, attention=attention)
    return Transformer(cfg, 4096, init_seed=seed)


@pytest.mark.parametrize("length", [2048, 4096])
def test_auto_never_builds_a_dense_mask_for_long_rows(monkeypatch, length):
    """On the auto path at T = 2048 / 4096 the dense (B,1,T,T) mask builder is never called
    (it is patched to raise), in forward or backward, and the result still equals the dense
    path's."""
    model = tiny_model()
    lens = [[300] + packed_rows(length, 1, seed=length)[0]]  # one longer document, many short (cut at T)
    doc_ids = torch.from_numpy(doc_ids_from_lens(lens, length))
    positions = torch.from_numpy(positions_from_doc_ids(doc_ids.numpy()))
    tokens = torch.randint(0, 256, (1, length), generator=torch.Generator().manual_seed(0))
    assert choose_backend("auto", CPU, length)[0] == "segments"

    def no_dense_mask(*a, **k):
        raise AssertionError("dense (B,1,T,T) mask built on the auto path")

    monkeypatch.setattr(attention, "document_causal_mask", no_dense_mask)
    logits = model(tokens, doc_ids, positions)
    logits.float().square().mean().backward()
    grad = model.layers["0"].attention.wq.weight.grad.clone()
    monkeypatch.undo()
    # The same model on the dense path (explicit sdpa) gives the same numbers.
    model.zero_grad()
    model.cfg = model.cfg.model_copy(update={"attention": "sdpa"})
    dense = model(tokens, doc_ids, positions)
    dense.float().square().mean().backward()
    torch.testing.assert_close(logits, dense, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(grad, model.layers["0"].attention.wq.weight.grad, rtol=1e-4, atol=1e-6)


def test_auto_choices_and_the_message_when_nothing_scales(monkeypatch):
    assert choose_backend("auto", CPU, 256)[0] == "segments"
    assert choose_backend("auto", CPU, 8192)[0] == "segments"
    assert choose_backend("auto", CPU, 8192, document_mask=False)[0] == "sdpa"  # no mask at all
    assert choose_backend("sdpa", CPU, 8192) == ("sdpa", "configured")  # explicit: the user's call
    cuda = torch.device("cuda")
    if not torch.cuda.is_available():
        # A CUDA device with none of flash-attn / varlen / flex usable (as here): short rows
        # may take the dense mask; long rows stop, naming what to install.
        assert choose_backend("auto", cuda, DENSE_MASK_MAX_T)[0] == "sdpa"
        with pytest.raises(AttentionUnavailable) as err:
            choose_backend("auto", cuda, 4096)
        msg = str(err.value)
        assert "seq_len 4096" in msg and "pip install" in msg and "flash-attn" in msg and "triton" in msg
        assert "segments" in msg  # and the explicit way out
        with pytest.raises(AttentionUnavailable, match="flash-attn"):
            choose_backend("flash", cuda, 256)
        with pytest.raises(AttentionUnavailable, match="CPU backward"):
            choose_backend("flex", CPU, 256)
    # Order on CUDA: flash, then varlen, then flex.
    monkeypatch.setattr(attention, "unavailable", lambda b, d: None if b == "flex" else "missing")
    assert choose_backend("auto", cuda, 4096)[0] == "flex"
    monkeypatch.setattr(attention, "unavailable", lambda b, d: None if b in ("flex", "varlen") else "missing")
    assert choose_backend("auto", cuda, 4096)[0] == "varlen"
    monkeypatch.setattr(attention, "unavailable", lambda b, d: None)
    assert choose_backend("auto", cuda, 4096)[0] == "flash"


def test_peak_memory_of_one_call_at_4096_dense_vs_scaling(capsys):
    """Printed: the peak memory of one attention call (mask inputs + forward) at T = 4096 on
    CPU for the dense path and for the path auto takes, each in a fresh process."""
    from bench_attention import BATCH, HEADS, HEAD_DIM, KV_HEADS, measure

    dense, scaling = measure("sdpa", 4096), measure(choose_backend("auto", CPU, 4096)[0], 4096)
    with capsys.disabled():
        print(f"\n  one attention call at T=4096 (B {BATCH}, {HEADS}/{KV_HEADS} heads, dim {HEAD_DIM}, fp32, "
              f"{dense['docs']} documents), peak above baseline:"
              f"\n    dense sdpa (B,1,T,T) mask: {dense['peak_bytes'] / 2**20:7.1f} MiB  {dense['seconds'] * 1e3:7.1f} ms"
              f"\n    auto -> {scaling['backend']:<17} {scaling['peak_bytes'] / 2**20:7.1f} MiB  {scaling['seconds'] * 1e3:7.1f} ms")
    assert dense["peak_bytes"] > 4096 * 4096 * 5  # at least the bool mask + its float form (1 + 4 bytes/entry)
    assert scaling["peak_bytes"] < 0.5 * dense["peak_bytes"]


def test_the_kernel_check_catches_a_kernel_without_the_document_mask():
    """Mutation test of the CUDA kernel check (tests/test_train_gpu.py, bench_gpu.py's kernels):
    on its fixture, the same comparison run with the document mask removed (plain causal
    attention over the packed row) misses the tolerance by far, while a masked backend passes."""
    from train_helpers import KERNEL_TOL, kernel_errors, maskless

    bad = kernel_errors(maskless, CPU, torch.float32)
    assert min(bad.values()) > 10 * KERNEL_TOL, bad  # forward and every gradient far outside
    for backend in ("segments", "sdpa"):
        good = kernel_errors(lambda q, k, v, ids, b=backend: attend(q, k, v, AttentionMeta.build(ids, ids.shape[0], ids.shape[1], CPU, b)),
                             CPU, torch.float32)
        assert max(good.values()) < 1e-4, (backend, good)


def test_varlen_without_enable_gqa_repeats_the_kv_heads(monkeypatch):
    """torch 2.11's varlen_attn has no ``enable_gqa``: the trainer must not refuse it for that,
    and passes K/V with the query's head count instead (the keyword only where the signature has it)."""
    calls = []

    def varlen_211(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1)):
        calls.append((k.shape[1], window_size))
        out, start = [], 0
        for end in cu_q[1:].tolist():  # per sequence causal attention: what the CUDA kernel computes
            sl = slice(start, end)
            out.append(F.scaled_dot_product_attention(q[sl].transpose(0, 1), k[sl].transpose(0, 1), v[sl].transpose(0, 1),
                                                      is_causal=True).transpose(0, 1))
            start = end
        return torch.cat(out)

    monkeypatch.setattr(attention, "_torch_varlen", lambda: varlen_211)
    assert "enable_gqa" not in attention.VARLEN_KEYWORDS
    assert attention._missing_keywords(varlen_211, attention.VARLEN_KEYWORDS) == []
    from train_helpers import kernel_errors

    errs = kernel_errors(lambda q, k, v, ids: attend(q, k, v, AttentionMeta.build(ids, ids.shape[0], ids.shape[1], CPU, "varlen")),
                         CPU, torch.float32)
    assert max(errs.values()) < 1e-4, errs
    assert calls and all(heads == 8 for heads, _ in calls)  # K/V repeated to the 8 query heads
