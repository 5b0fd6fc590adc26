"""The model and its attention backends: sizes, document masking, SDPA vs per-document, flash vs SDPA."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from training.attention import (
    AttentionMeta,
    attend,
    doc_ids_from_lens,
    document_causal_mask,
    flash_available,
    positions_from_doc_ids,
    varlen_cu_seqlens,
)
from training.config import ModelConfig
from training.model import Transformer, flops_per_token

torch.set_num_threads(1)


def tiny(vocab=256, **kw) -> ModelConfig:
    return ModelConfig(preset="tiny", vocab_size=vocab, **kw)


@pytest.mark.parametrize(
    "preset, vocab, lo, hi",
    [("tiny", 8192, 1e6, 5e6), ("tiny", 32000, 1e6, 5e6), ("125m", 50257, 110e6, 140e6), ("1b", 128256, 1.1e9, 1.35e9)],
)
def test_preset_sizes(preset, vocab, lo, hi):
    with torch.device("meta"):  # no memory, no init cost: only shapes
        model = Transformer(ModelConfig(preset=preset, vocab_size=vocab), max_seq_len=16)
    n = model.num_params()
    assert lo <= n <= hi, f"{preset}: {n / 1e6:.1f}M params"


def test_tied_and_untied_embeddings():
    tied = Transformer(tiny(), 32)
    untied = Transformer(tiny(tie_embeddings=False), 32)
    assert tied.output.weight is tied.tok_embeddings.weight
    assert untied.output.weight is not untied.tok_embeddings.weight
    assert untied.num_params() - tied.num_params() == 256 * 128
    # Both count the LM head as a matmul.
    assert tied.num_params(matmul_only=True) == untied.num_params(matmul_only=True)


def test_scaled_init():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=512, n_layer=8, d_model=256, n_head=4)
    m = Transformer(cfg, 32)
    std_q = m.layers["0"].attention.wq.weight.std().item()
    std_o = m.layers["0"].attention.wo.weight.std().item()
    assert abs(std_q - 0.02) < 0.002
    assert abs(std_o - 0.02 / 4) < 0.0005  # 1/sqrt(2 * 8 layers)


def test_flops_formula():
    cfg = tiny()
    n = Transformer(cfg, 64).num_params(matmul_only=True)
    assert flops_per_token(cfg, 64, n) == 6 * n + 12 * 4 * 4 * 32 * 64


def test_segments_and_positions():
    ids = doc_ids_from_lens([[3, 2], [5], [2, 1]], 6)
    assert ids.tolist() == [[0, 0, 0, 1, 1, 2], [0, 0, 0, 0, 0, 1], [0, 0, 1, 2, 2, 2]]
    pos = positions_from_doc_ids(ids)
    assert pos.tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 4, 0], [0, 1, 0, 0, 1, 2]]


def test_mask_definition():
    ids = torch.tensor([[0, 0, 1, 1]])
    mask = document_causal_mask(ids)[0, 0].int().tolist()
    assert mask == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    cu, max_len = varlen_cu_seqlens(torch.tensor([[0, 0, 0, 1], [0, 1, 1, 2]]), 2, 4, "cpu")
    # Same boundaries as the mask: row starts and doc-id changes.
    # max_len is the longest (3) rounded up to a power of two: an exact bound for the kernels'
    # grids, with few distinct values for a compiled block.
    assert cu.dtype == torch.int32 and cu.tolist() == [0, 3, 4, 5, 7, 8] and max_len == 4


def _random_qkv(b, t, h, kv, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, t, h, d, generator=g), torch.randn(b, t, kv, d, generator=g), torch.randn(b, t, kv, d, generator=g))


def test_sdpa_masked_equals_per_document_attention():
    """Document-masked SDPA over packed rows == attention run on each document separately."""
    b, t, h, kv, d = 2, 40, 4, 2, 16
    q, k, v = _random_qkv(b, t, h, kv, d)
    lens = [[7, 20, 13], [1, 30, 5]]  # row 2 ends with 4 padding tokens (own segment)
    doc_ids = torch.from_numpy(doc_ids_from_lens(lens, t))
    out = attend(q, k, v, AttentionMeta.build(doc_ids, b, t, torch.device("cpu"), "sdpa"))
    for row, row_lens in enumerate(lens):
        start = 0
        for n in row_lens + ([t - sum(row_lens)] if sum(row_lens) < t else []):
            sl = slice(start, start + n)
            qs = q[row, sl].transpose(0, 1)
            ks = k[row, sl].transpose(0, 1).repeat_interleave(h // kv, 0)
            vs = v[row, sl].transpose(0, 1).repeat_interleave(h // kv, 0)
            ref = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1)
            torch.testing.assert_close(out[row, sl], ref, rtol=1e-5, atol=1e-6)
            start += n


def test_no_document_mask_is_plain_causal():
    b, t, h, kv, d = 2, 16, 4, 4, 8
    q, k, v = _random_qkv(b, t, h, kv, d, seed=1)
    out = attend(q, k, v, AttentionMeta.build(None, b, t, torch.device("cpu"), "sdpa"))
    ref = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    torch.testing.assert_close(out, ref.transpose(1, 2))


def _packed_inputs(doc_a, doc_b):
    tokens = torch.cat([doc_a, doc_b])[None]
    doc_ids = torch.from_numpy(doc_ids_from_lens([[len(doc_a), len(doc_b)]], tokens.shape[1]))
    positions = torch.from_numpy(positions_from_doc_ids(doc_ids.numpy()))
    return tokens, doc_ids, positions


def test_document_logits_do_not_depend_on_what_precedes_them():
    """A document's logits are the same packed after another document or alone (RoPE reset)."""
    torch.manual_seed(0)
    model = Transformer(tiny(), 64).eval()
    g = torch.Generator().manual_seed(3)
    doc_a, doc_b = torch.randint(2, 256, (23,), generator=g), torch.randint(2, 256, (17,), generator=g)
    tokens, doc_ids, positions = _packed_inputs(doc_a, doc_b)
    with torch.no_grad():
        packed = model(tokens, doc_ids, positions)[0, len(doc_a) :]
        alone = model(doc_b[None])[0]
        # Without document masking the earlier document leaks in: the check above is not vacuous.
        leaky = model(tokens)[0, len(doc_a) :]
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    assert (leaky - alone).abs().max() > 1e-2


def test_gqa_matches_repeated_heads():
    """GQA == full multi-head attention whose k/v heads are copies."""
    torch.manual_seed(0)
    gqa = Transformer(tiny(), 32).eval()  # n_head 4, n_kv_head 2
    mha = Transformer(tiny(n_kv_head=4), 32).eval()
    state = gqa.state_dict()
    for i in range(4):
        for name in ("wk", "wv"):
            w = state[f"layers.{i}.attention.{name}.weight"].view(2, 32, 128)
            state[f"layers.{i}.attention.{name}.weight"] = w.repeat_interleave(2, 0).reshape(128, 128)
    mha.load_state_dict(state)
    tokens = torch.randint(0, 256, (2, 24))
    with torch.no_grad():
        torch.testing.assert_close(gqa(tokens), mha(tokens), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not flash_available(), reason="flash-attn is not installed or there is no CUDA device: the flash "
                    "path only runs on CUDA; it runs on a CUDA machine after pip install '.[gpu]'")
def test_flash_varlen_matches_sdpa():
    b, t, h, kv, d = 2, 128, 8, 2, 64
    q, k, v = (x.cuda().to(torch.bfloat16) for x in _random_qkv(b, t, h, kv, d))
    doc_ids = torch.from_numpy(doc_ids_from_lens([[50, 70, 8], [128]], t)).cuda()
    dev = torch.device("cuda")
    flash = attend(q, k, v, AttentionMeta.build(doc_ids, b, t, dev, "flash"))
    sdpa = attend(q, k, v, AttentionMeta.build(doc_ids, b, t, dev, "sdpa"))
    torch.testing.assert_close(flash.float(), sdpa.float(), rtol=2e-2, atol=2e-2)


def test_rope_positions_restart_per_document():
    """positions_from_doc_ids restarts at each document; with one document it is 0..T-1."""
    ids = doc_ids_from_lens([[10]], 10)
    assert positions_from_doc_ids(ids).tolist() == [list(range(10))]
    assert np.array_equal(positions_from_doc_ids(doc_ids_from_lens([[4, 6]], 10))[0], [0, 1, 2, 3, 0, 1, 2, 3, 4, 5])


@pytest.mark.parametrize("chunk", [0, 7, 64])
def test_fused_chunked_loss_matches_cross_entropy_over_full_logits(chunk):
    """training/loss.py: the summed CE and both gradients equal F.cross_entropy over the
    full fp32 logits, for any chunking, with ignored targets anywhere."""
    from training.loss import linear_cross_entropy, reference_cross_entropy

    g = torch.Generator().manual_seed(0)
    h = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(300, 16, generator=g, dtype=torch.float64, requires_grad=True)
    t = torch.randint(0, 300, (50,), generator=g)
    t[[0, 9, 10, 49]] = -100
    ref = F.cross_entropy(h @ w.t(), t, ignore_index=-100, reduction="sum")  # fp64 throughout
    assert reference_cross_entropy((h @ w.t())[None], t[None]).item() == pytest.approx(ref.item(), rel=1e-6)
    gh, gw = torch.autograd.grad(ref * 0.37, (h, w))
    got = linear_cross_entropy(h, w, t, chunk)
    assert got.dtype == torch.float64  # fp32 for bf16/fp32 inputs; fp64 kept
    assert got.item() == pytest.approx(ref.item(), rel=1e-6)
    fh, fw = torch.autograd.grad(got * 0.37, (h, w))
    torch.testing.assert_close(fh, gh, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(fw, gw, rtol=1e-6, atol=1e-9)
    with torch.no_grad():  # eval: the loss only
        assert linear_cross_entropy(h, w, t, chunk).item() == pytest.approx(ref.item(), rel=1e-6)


def test_fused_loss_backward_under_autocast_runs_in_the_compute_dtype():
    """Under autocast (strategy none/ddp on a GPU) hidden and weight are fp32 and only the
    forward is autocast: the backward's two matmuls must still run in bf16 (they ran in fp32,
    a non-TF32 SIMT sgemm on an H100, 2026-11-28), and the gradients keep the inputs' dtypes."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from training.loss import linear_cross_entropy, reference_cross_entropy

    class MatmulDtypes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.seen = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.mm.default:
                self.seen.append((args[0].dtype, args[1].dtype))
            return func(*args, **(kwargs or {}))

    g = torch.Generator().manual_seed(0)
    h = torch.randn(64, 32, generator=g, requires_grad=True)
    w = torch.randn(200, 32, generator=g, requires_grad=True)
    t = torch.randint(0, 200, (64,), generator=g)
    gh, gw = torch.autograd.grad(reference_cross_entropy((h @ w.t())[None], t[None]), (h, w))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_cross_entropy(h, w, t, 16)
    modes = MatmulDtypes()
    with modes:
        fh, fw = torch.autograd.grad(loss, (h, w))
    assert modes.seen and all(d == (torch.bfloat16, torch.bfloat16) for d in modes.seen), modes.seen
    assert fh.dtype == fw.dtype == torch.float32
    for got, want in ((fh, gh), (fw, gw)):  # bf16 logits: within 2% of the largest gradient
        assert (got - want).abs().max() < 0.02 * want.abs().max()


def test_model_loss_path_equals_logits_path():
    """``model(..., targets=...)`` (fused head + loss) == cross-entropy of ``model(...)``'s logits."""
    from training.loss import reference_cross_entropy

    cfg = ModelConfig(vocab_size=97, n_layer=2, d_model=32, n_head=4, n_kv_head=2)
    model = Transformer(cfg, 24, init_seed=1)
    tokens = torch.randint(0, 97, (2, 25), generator=torch.Generator().manual_seed(2))
    doc_ids = torch.from_numpy(doc_ids_from_lens([[10, 14], [24]], 24))
    logits = model(tokens[:, :-1], doc_ids)
    want = reference_cross_entropy(logits, tokens[:, 1:])
    got = model(tokens[:, :-1], doc_ids, targets=tokens[:, 1:], loss_chunk_tokens=5)
    assert got.item() == pytest.approx(want.item(), rel=1e-5)


def test_varlen_boundaries_come_from_the_data_thread(monkeypatch):
    """The micro-batches carry host-computed cu_seqlens / max_seqlen, and the varlen path
    uses them without reading anything back from the device (no .item() per forward)."""
    from training.attention import AttentionMeta, varlen_boundaries, varlen_cu_seqlens
    from training.data.batches import build_micro_batches
    from training.data.shards import RowBatch

    lens = [np.array([5, 20, 9, 30]), np.array([40, 1, 23]), np.array([65])]
    ids = np.random.default_rng(0).integers(0, 50, size=(3, 65))
    micro, _, _ = build_micro_batches(RowBatch(ids, lens, [None] * 3), 64, 64, 2, True, 50)
    for mb in micro:
        cu, longest = varlen_cu_seqlens(mb.doc_ids, len(mb.doc_ids), 64, "cpu")
        assert mb.cu_seqlens.dtype == torch.int32 and mb.cu_seqlens.tolist() == cu.tolist()
        true_max = int(np.diff(mb.cu_seqlens.numpy()).max())
        assert mb.max_seqlen >= true_max and mb.max_seqlen & (mb.max_seqlen - 1) == 0 and mb.max_seqlen <= 64
    assert varlen_boundaries(np.zeros((1, 64), np.int32))[1] == 64

    def no_reads(*a, **k):
        raise AssertionError("a device value was read back on the attention path")

    monkeypatch.setattr(torch.Tensor, "item", no_reads)
    monkeypatch.setattr(torch.Tensor, "tolist", no_reads)
    monkeypatch.setattr(torch.Tensor, "cpu", no_reads)
    mb = micro[0]
    meta = AttentionMeta.build(mb.doc_ids, 2, 64, torch.device("cpu"), "varlen", mb.cu_seqlens, mb.max_seqlen)
    assert meta.cu_seqlens is mb.cu_seqlens and meta.max_seqlen == mb.max_seqlen
