"""The GPU acceptance script's control flow, on CPU every commit: ``bench_gpu.py --dry-run``
runs each check as its own subprocess and leaves one JSON per check plus summary.json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch

from training.attention import _attend_torch_varlen, AttentionMeta

REPO = Path(__file__).resolve().parents[1]
CPU_CHECKS = ("kernels", "resume", "async_save")
GPU_CHECKS = ("mfu_1b", "trace", "small", "multi")


def test_dry_run_lands_every_check(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, str(REPO / "tests/benchmarks/bench_gpu.py"), "--dry-run", str(out)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "dry-run" and summary["torch"] == torch.__version__
    for name in CPU_CHECKS + GPU_CHECKS:
        res = json.loads((out / f"{name}.json").read_text())
        assert summary["checks"][name]["status"] == res["status"]
        assert isinstance(res["seconds"], float | int)
        if name in CPU_CHECKS:
            assert res["status"] == "pass", (name, res)
            assert res["kernel"]
        else:
            assert res["status"] == "skipped" and res["reason"], (name, res)
    kernels = json.loads((out / "kernels.json").read_text())
    # the fixture catches a maskless kernel: its error is far above the tolerance
    assert kernels["maskless_out_err"] > 10 * kernels["tolerance"]
    assert kernels["kernels"]["segments"]["status"] == "pass"
    resume = json.loads((out / "resume.json").read_text())["det"]
    assert resume["first_equal"] and resume["bit_equal_steps"].split("/")[0] == resume["bit_equal_steps"].split("/")[1]
    assert json.loads((out / "async_save.json").read_text())["checkpoints"] == ["step_00000005", "step_00000010"]


def test_varlen_without_enable_gqa_repeats_kv_heads():
    """torch 2.11's varlen_attn has no enable_gqa: the trainer repeats KV heads instead of refusing."""
    import torch.nn.functional as F

    def varlen_211(q, k, v, cu_q, cu_k, max_q, max_k, window_size=(-1, -1)):  # no enable_gqa: as 2.11
        assert k.shape[1] == q.shape[1], "GQA reached a kernel without enable_gqa"
        out = torch.empty_like(q)
        for s, e in zip(cu_q[:-1].tolist(), cu_q[1:].tolist()):
            out[s:e] = F.scaled_dot_product_attention(q[s:e].transpose(0, 1), k[s:e].transpose(0, 1), v[s:e].transpose(0, 1),
                                                      is_causal=True).transpose(0, 1)
        return out

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 16, n, 8, generator=g) for n in (4, 2, 2))
    cu = torch.tensor([0, 5, 16], dtype=torch.int32)
    got = _attend_torch_varlen(q, k, v, AttentionMeta("varlen", cu_seqlens=cu, max_seqlen=16, kernel=varlen_211))
    ref = torch.cat([F.scaled_dot_product_attention(q[:, s:e].transpose(1, 2), k[:, s:e].transpose(1, 2), v[:, s:e].transpose(1, 2),
                                                    is_causal=True, enable_gqa=True).transpose(1, 2) for s, e in ((0, 5), (5, 16))], dim=1)
    torch.testing.assert_close(got, ref)
