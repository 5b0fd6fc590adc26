"""The vocabulary-parallel fused cross entropy (``training.loss.vocab_parallel_cross_entropy``)
over two spawned CPU processes (gloo), against ``F.cross_entropy`` over the full logits:

- the loss and both gradients (hidden, the head's rows) agree (fp64 to ~1e-12, fp32 to ~1e-6), with
  ignored targets, several chunks, a vocabulary that splits evenly and one that does not;
- memory: no rank ever produces a tensor as wide as the vocabulary; the largest tensor any op
  produces on a rank (forward and backward, recorded by a dispatch mode) is a (tokens x vocab/2)
  one, against (tokens x vocab) for the fused loss on one process and for F.cross_entropy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

N, D, CHUNK = 512, 64, 128


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produces (bytes), and the widest last dimension."""

    def __init__(self):
        super().__init__()
        self.bytes = self.widest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dim() >= 2:
                self.bytes = max(self.bytes, t.numel() * t.element_size())
                self.widest = max(self.widest, t.shape[-1])
        return out


def _inputs(vocab: int, dtype):
    g = torch.Generator().manual_seed(vocab)
    hidden = torch.randn(N, D, generator=g, dtype=dtype)
    weight = torch.randn(vocab, D, generator=g, dtype=dtype) * 0.5
    targets = torch.randint(0, vocab, (N,), generator=g)
    targets[::7] = -100  # padding / cross-document targets
    return hidden, weight, targets


def _reference(vocab: int, dtype):
    hidden, weight, targets = _inputs(vocab, dtype)
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    with LargestTensor() as probe:
        loss = F.cross_entropy(h @ w.t(), targets, reduction="sum", ignore_index=-100)
        loss.backward()
    return loss.detach(), h.grad, w.grad, probe


def _worker(rank: int, world: int, init_file: str, out: str, cases: list) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from training.loss import linear_cross_entropy

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (world,))
    res = {}
    for vocab, dtype_name in cases:
        dtype = getattr(torch, dtype_name)
        hidden, weight, targets = _inputs(vocab, dtype)
        h = hidden.requires_grad_()
        w = distribute_tensor(weight, mesh, [Shard(0)]).requires_grad_()  # this rank's rows of the head
        with LargestTensor() as probe:
            loss = linear_cross_entropy(h, w, targets, chunk_tokens=CHUNK)
            loss.backward()
        ref_loss, ref_h, ref_w, _ = _reference(vocab, dtype)
        with torch.no_grad():
            no_grad = linear_cross_entropy(hidden, w.detach(), targets, chunk_tokens=CHUNK)  # eval path
        res[f"{vocab}/{dtype_name}"] = {
            "loss": abs(loss.item() - ref_loss.item()) / abs(ref_loss.item()),
            "eval": abs(no_grad.item() - ref_loss.item()) / abs(ref_loss.item()),
            "grad_h": (h.grad - ref_h).abs().max().item() / ref_h.abs().max().item(),
            "grad_w": (w.grad.full_tensor() - ref_w).abs().max().item() / ref_w.abs().max().item(),
            "grad_w_placements": str(w.grad.placements), "local_rows": w.to_local().shape[0],
            "largest_bytes": probe.bytes, "widest": probe.widest,
        }
    Path(out, f"rank{rank}.json").write_text(json.dumps(res))
    dist.destroy_process_group()


CASES = [(8192, "float32"), (8192, "float64"), (8191, "float64")]  # 8191: rows 4096 / 4095
#: ``_worker`` over two spawned processes, in the session's one spawned pair (conftest.two_ranks)
TWO_RANK_JOB = ("_worker", (CASES,))


@pytest.fixture(scope="module")
def results(two_ranks):
    out = two_ranks(__name__)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_values_and_gradients_match_cross_entropy_over_the_full_logits(results):
    for rank, res in enumerate(results):
        for key, r in res.items():
            print(f"\nrank {rank} V/dtype {key}: rows {r['local_rows']}, relative |diff| loss {r['loss']:.1e} "
                  f"(no-grad {r['eval']:.1e}), grad hidden {r['grad_h']:.1e}, grad head {r['grad_w']:.1e}")
            tol = 1e-12 if key.endswith("float64") else 5e-6
            assert max(r["loss"], r["eval"], r["grad_h"], r["grad_w"]) < tol, (key, r)
            assert r["grad_w_placements"] == "(Shard(dim=0),)"
    assert [res["8191/float64"]["local_rows"] for res in results] == [4096, 4095]


def test_no_rank_holds_logits_as_wide_as_the_vocabulary(results):
    from training.loss import linear_cross_entropy

    vocab = 8192
    hidden, weight, targets = _inputs(vocab, torch.float32)
    h, w = hidden.requires_grad_(), weight.requires_grad_()
    with LargestTensor() as fused:  # the fused loss on one process
        linear_cross_entropy(h, w, targets, chunk_tokens=CHUNK).backward()
    full = _reference(vocab, torch.float32)[3]
    mib = 2.0 ** 20
    print(f"\n{N} tokens x vocab {vocab} fp32, chunks of {CHUNK} tokens, the largest tensor any op produces: "
          f"F.cross_entropy over full logits {full.bytes / mib:.1f} MiB, fused on 1 process {fused.bytes / mib:.1f} MiB, "
          "vocabulary-parallel over 2 ranks " + ", ".join(
              f"rank {i} {res[f'{vocab}/float32']['largest_bytes'] / mib:.1f} MiB (widest {res[f'{vocab}/float32']['widest']})"
              for i, res in enumerate(results)))
    for res in results:
        r = res[f"{vocab}/float32"]
        assert r["widest"] <= vocab // 2  # never a tensor spanning the whole vocabulary
        assert r["largest_bytes"] == N * (vocab // 2) * 4  # the stored softmax gradient of this rank's columns
    assert full.bytes == fused.bytes == N * vocab * 4
