"""CUDA graphs replay only inputs of the shapes they recorded (issue 61 part 5, trainer-audit-s5 C2):
in CUDA-graph mode the varlen backends' boundaries are padded with empty sequences to a length
fixed by ``data.max_docs_per_row`` and ``max_seqlen`` is the row length (training/static_shapes.py).

On CPU there is no varlen kernel, so ``varlen_on_cpu`` stands in for torch's: one causal SDPA per
sequence of ``cu_seqlens``, holding the kernel's contract (int32 boundaries from 0 to the token
count, non-decreasing, ``max_seqlen`` at least every length; an empty sequence does nothing, as
FA2's thread blocks return at once past a sequence's end). What is tested is what the trainer
hands the kernel: the padded run trains like the unpadded one to the bit, and every micro-batch's
block inputs have one shape key (the unpadded run has nearly one per micro-batch). CUDA graphs
themselves are forced on through ``static_docs`` (the CPU falls back to compile mode default).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import training.attention
import training.model
import training.train
from train_helpers import SMALL, records, write_config
from training.config import ConfigError, load_config
from training.data import DataError, PackedDataset, RowBatch, build_micro_batches
from training.static_shapes import boundary_slots, static_docs
from training.synthetic import write_packed
from training.train import main

VOCAB = 512


def varlen_on_cpu(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, -1), enable_gqa=False):
    """torch's ``varlen_attn`` on CPU, for these tests: (total, H, D) in and out, causal per sequence."""
    cu = cu_q.tolist()
    lengths = np.diff(cu)
    assert cu_q.dtype == torch.int32 and torch.equal(cu_q, cu_k) and max_q == max_k and window_size == (-1, 0)
    assert cu[0] == 0 and cu[-1] == q.shape[0] and (lengths >= 0).all(), "boundaries must cover every token in order"
    assert lengths.max() <= max_q, f"a sequence of {lengths.max()} tokens > max_seqlen {max_q}: the kernel's grid misses rows"
    parts = []
    for qs, ks, vs in zip(*(torch.split(x, lengths.tolist()) for x in (q, k, v))):
        if len(qs):  # an empty sequence: nothing to read or write
            qs, ks, vs = (x.transpose(0, 1) for x in (qs, ks, vs))
            parts.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, enable_gqa=enable_gqa).transpose(0, 1))
    return torch.cat(parts)


@pytest.fixture
def varlen_cpu(monkeypatch):
    """``model.attention: varlen`` runs on CPU through ``varlen_on_cpu``."""
    real = training.attention.unavailable
    monkeypatch.setattr(training.attention, "_torch_varlen", lambda: varlen_on_cpu)
    monkeypatch.setattr(training.attention, "unavailable", lambda b, d: None if b == "varlen" else real(b, d))
    training.attention.select_backend.cache_clear()
    yield
    training.attention.select_backend.cache_clear()


@pytest.fixture
def block_keys(monkeypatch):
    """Every block call's inputs as a shape key: what a compiled (CUDA-graph) block is keyed by."""
    keys: list[tuple] = []
    real = training.model.Block.forward

    def recording(self, x, cos, sin, meta):
        cu = meta.cu_seqlens
        keys.append((tuple(x.shape), tuple(cos.shape), None if cu is None else tuple(cu.shape), meta.max_seqlen))
        return real(self, x, cos, sin, meta)

    monkeypatch.setattr(training.model.Block, "forward", recording)
    return keys


def force_static(monkeypatch) -> None:
    """CUDA-graph mode's fixed shapes, on CPU (where the mode itself falls back to default)."""
    monkeypatch.setattr(training.train, "static_docs", lambda cfg, backend, cudagraphs: static_docs(cfg, backend, True))


def config(tmp_path: Path, pack: Path, name: str, seq: int, **sections) -> Path:
    return write_config(tmp_path, name, {
        "seed": 0,
        "model": {"vocab_size": VOCAB, **SMALL, "attention": "varlen"},
        "data": {"path": str(pack), "seq_len": seq},
        "train": {"global_batch": 8, "micro_batch": 4, "steps": 6, "threads": 1},
        "optim": {"lr": 3e-3},
        "schedule": {"warmup_steps": 2},
        "checkpoint": {"every": 1000, "final_save": False},
        "metrics": {"every": 1, "progress": "off", "tensorboard": False},
    }, **sections)


def same_steps(a: list[dict], b: list[dict]) -> None:
    assert [r["step"] for r in a] == [r["step"] for r in b]
    # the same per-sequence attention on the same tokens: bit-equal, not close
    assert [(r["loss_step"], r["grad_norm"]) for r in a] == [(r["loss_step"], r["grad_norm"]) for r in b]
    assert a[-1]["loss_step"] < a[0]["loss_step"]  # it trained: matching is not trivial


@pytest.fixture(scope="module")
def small_pack(tmp_path_factory):
    root = tmp_path_factory.mktemp("static")
    return write_packed(root / "train", {"web": 90, "math": 30}, 64, vocab=VOCAB, max_doc={"web": 40, "math": 12}), \
        write_packed(root / "eval", {"web": 12, "math": 4}, 64, vocab=VOCAB, seed=1)


def test_padded_boundaries_train_like_unpadded(tmp_path, small_pack, varlen_cpu, block_keys, monkeypatch):
    """6 steps of 2 micro-batches, a held-out eval every 3 steps and a sequence-length warm-up
    (64 -> 32 -> 64): losses, grad norms and eval losses bit-equal with and without padding."""
    train, held = small_pack
    kw = dict(eval={"path": str(held), "every": 3, "batches": 1},
              data={"seq_len_warmup": {"start": 32, "steps": 3}})
    assert main(str(config(tmp_path, train, "plain", 64, **kw))) == 0
    plain_keys = list(block_keys)
    block_keys.clear()
    force_static(monkeypatch)
    kw["data"]["max_docs_per_row"] = "auto"  # measured over both packs
    assert main(str(config(tmp_path, train, "padded", 64, **kw))) == 0
    same_steps(records(tmp_path / "plain"), records(tmp_path / "padded"))
    notes = [e["message"] for e in records(tmp_path / "padded", "event") if e["event"] == "note"]
    assert any("varlen boundaries padded to" in n for n in notes), notes
    assert [e["eval_loss"] for e in records(tmp_path / "plain", "eval")] == \
        [e["eval_loss"] for e in records(tmp_path / "padded", "eval")]
    # one key per row length (the warm-up's 32, then 64; eval at 64); unpadded, many more
    print(f"\ndistinct block-input keys: unpadded {len(set(plain_keys))}, padded {len(set(block_keys))}")
    assert all(k[2] is not None for k in plain_keys + block_keys)  # the varlen path ran, both times
    assert len({k[0][1] for k in block_keys}) == 2 and len(set(block_keys)) == 2
    assert len(set(plain_keys)) > 4


def test_lease_shaped_micro_batches_all_have_one_shape(tmp_path_factory, varlen_cpu, monkeypatch):
    """The ~125M lease check's pack shape (rows of 1024 tokens, documents of 8 to 900, 16 rows a
    micro-batch, accumulation 2) over 40 micro-batches as the loop hands them to ``train_step``:
    unpadded, their varlen shapes change with nearly every one; padded, one key. (The model is not
    run: at 1024 tokens a row it costs minutes on CPU; the test above runs it, at 64.)"""
    root = tmp_path_factory.mktemp("lease-shape")
    pack = write_packed(root / "pack", {"web": 300, "math": 100}, 1024, vocab=VOCAB, max_doc={"web": 900, "math": 900})
    keys: list[tuple] = []

    def recording(self, step, batch):  # the step's micro-batches as train_step gets them; no compute
        keys.extend((tuple(mb.inputs.shape), tuple(mb.positions.shape), tuple(mb.cu_seqlens.shape), mb.max_seqlen)
                    for mb in batch.micro)
        self.n_step = batch.n_tokens
        return 1.0, 1.0, None

    monkeypatch.setattr(training.train.Trainer, "train_step", recording)
    kw = dict(train={"global_batch": 32, "micro_batch": 16, "steps": 20})
    assert main(str(config(root, pack, "plain", 1024, **kw))) == 0
    plain = Counter(keys)
    keys.clear()
    max_docs = PackedDataset(pack).max_docs_per_row()
    force_static(monkeypatch)
    assert main(str(config(root, pack, "padded", 1024, data={"max_docs_per_row": max_docs}, **kw))) == 0
    padded = Counter(keys)
    slots = boundary_slots(16, 1024, 1024, max_docs)
    print(f"\n40 micro-batches of 16 x 1024 tokens, at most {max_docs} documents a row: distinct shape keys "
          f"unpadded {len(plain)} (cu_seqlens lengths {min(k[2][0] for k in plain)}-{max(k[2][0] for k in plain)}, "
          f"max_seqlen {sorted({k[3] for k in plain})}), padded {len(padded)} (cu_seqlens {slots + 1}, max_seqlen 1024)")
    assert sum(plain.values()) == sum(padded.values()) == 40
    assert len(plain) >= 10  # what C2 found: a CUDA graph recorded for each new key
    assert list(padded) == [((16, 1024), (16, 1024), (slots + 1,), 1024)]


def test_boundaries_have_one_length_for_any_rows_within_the_bound():
    """Random rows with at most ``max_docs`` documents, some padded, at every warm-up cut: the
    padded boundaries have one length per row length, end at the token count, start with the
    unpadded ones, and the rest are empty sequences."""
    rng = np.random.default_rng(0)
    seq, micro, max_docs = 64, 4, 5
    for cur in (64, 32, 16):
        lengths = set()
        for _ in range(30):
            lens = [np.diff(np.sort(np.r_[0, rng.choice(np.arange(1, 65), rng.integers(0, max_docs), replace=False), 65]))
                    for _ in range(micro)]  # up to max_docs documents filling the row
            lens = [x[: rng.integers(1, len(x) + 1)] for x in lens]  # ... or some of them, then padding
            rows = RowBatch(rng.integers(2, VOCAB, (micro, seq + 1)), lens, [None] * micro)
            (plain,), _, _ = build_micro_batches(rows, seq, cur, micro, True, VOCAB)
            (mb,), _, _ = build_micro_batches(rows, seq, cur, micro, True, VOCAB, max_docs=max_docs)
            cu, ref = mb.cu_seqlens.numpy(), plain.cu_seqlens.numpy()
            assert mb.max_seqlen == cur and cu[-1] == micro * seq
            assert (cu[: len(ref)] == ref).all() and (cu[len(ref):] == micro * seq).all()
            lengths.add(len(cu))
        assert lengths == {boundary_slots(micro, seq, cur, max_docs) + 1}


def test_cuda_graphs_without_a_bound_are_refused_at_start(tmp_path, small_pack, varlen_cpu, monkeypatch, capsys):
    cfg = load_config(config(tmp_path, small_pack[0], "f", 64, train={"compile": True, "compile_mode": "reduce-overhead"}))
    for backend in ("varlen", "flash"):
        with pytest.raises(ConfigError, match=r"data\.max_docs_per_row .*model\.attention flex"):
            static_docs(cfg, backend, cudagraphs=True)
    for backend in ("flex", "segments", "sdpa"):  # shapes fixed already: nothing to pad
        assert static_docs(cfg, backend, cudagraphs=True) is None
    assert static_docs(cfg, "varlen", cudagraphs=False) is None  # no graphs, no padding
    nomask = cfg.model_copy(update={"data": cfg.data.model_copy(update={"document_mask": False})})
    assert static_docs(nomask, "varlen", cudagraphs=True) is None  # whole rows: one shape already
    for bound in (7, "auto"):
        bounded = cfg.model_copy(update={"data": cfg.data.model_copy(update={"max_docs_per_row": bound})})
        assert static_docs(bounded, "varlen", cudagraphs=True) == bound
    for bad in (0, "many"):
        with pytest.raises(ConfigError, match="max_docs_per_row"):
            load_config(config(tmp_path, small_pack[0], "bad", 64, data={"max_docs_per_row": bad}))

    # The trainer refuses before building the model (CUDA graphs pretended: the CPU has none).
    monkeypatch.setattr(training.train, "compile_mode_for", lambda cfg, env, notes: "reduce-overhead")
    assert main(str(config(tmp_path, small_pack[0], "refused", 64, train={"compile": True}))) == 2
    err = capsys.readouterr().err
    assert "model.attention varlen needs data.max_docs_per_row" in err, err
    assert not (tmp_path / "refused" / "metrics.jsonl").exists()


def test_a_row_over_the_bound_stops_the_run_naming_the_field(tmp_path, small_pack, varlen_cpu, monkeypatch, capsys):
    rows = RowBatch(np.full((2, 65), 5), [np.array([10, 20, 35]), np.array([65])], [None] * 2)
    with pytest.raises(DataError, match=r"holds 3 documents > data\.max_docs_per_row 2"):
        build_micro_batches(rows, 64, 64, 2, True, VOCAB, max_docs=2)
    force_static(monkeypatch)
    assert main(str(config(tmp_path, small_pack[0], "over", 64, data={"max_docs_per_row": 1}))) == 2
    assert "data.max_docs_per_row 1" in capsys.readouterr().err
