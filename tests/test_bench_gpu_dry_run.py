"""The GPU acceptance run's logic on every commit: ``bench_gpu.py --dry-run`` runs every check with
tiny shapes on CPU through the same orchestrator (own process group and timeout per check, JSON
landing as each ends, bench.log, summary.json); without CUDA and without --dry-run it says it is
skipped and exits 0, and --lease refuses with the reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from train_helpers import REPO
from training.attention import AttentionMeta, _attend_torch_varlen

BENCH = REPO / "tests" / "benchmarks" / "bench_gpu.py"
sys.path.insert(0, str(BENCH.parent))


@pytest.mark.slow
def test_dry_run_lands_every_check(tmp_path):
    from bench_gpu import CHECKS

    out = tmp_path / "out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(BENCH), "--dry-run", str(out)], capture_output=True, text=True, timeout=1500,
                          cwd=REPO, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["mode"] == "dry-run" and summary["torch"] and "driver" in summary and "gpu" in summary
    assert [p["check"] for p in summary["plan"]] == [c.name for c in CHECKS]
    log = (out / "bench.log").read_text()
    for check in CHECKS:
        res = json.loads((out / f"{check.name}.json").read_text())
        assert res["status"] == "pass", (check.name, res)
        assert res["seconds"] > 0 and res["kernel"] and summary["checks"][check.name]["status"] == "pass"
        assert f"===== {check.name} (exit 0" in log
    kernels = json.loads((out / "kernels.json").read_text())
    assert min(kernels["maskless_errors"].values()) > 10 * kernels["tolerance"]
    resume = json.loads((out / "resume.json").read_text())["deterministic"]
    assert resume["first_resumed_step"] == 4 and resume["bit_equal_steps"] == "4/4"
    mfu = json.loads((out / "mfu_1b.json").read_text())
    assert mfu["recompiles"] == 0 and 0 < mfu["mfu_causal"] < mfu["mfu"]
    assert json.loads((out / "async_save.json").read_text())["checkpoints"] == ["step_00000005", "step_00000010"]
    small = json.loads((out / "small.json").read_text())["variants"]
    assert any("CUDA graphs need a CUDA device" in n for n in small["cudagraphs"]["notes"])
    multi = json.loads((out / "multi.json").read_text())
    assert multi["global_batch"] == multi["micro_batch"] * multi["gpus"] * 2 and multi["agree_bf16"]


def test_without_cuda_it_is_skipped_and_a_lease_is_refused(tmp_path):
    # CUDA hidden from the script, so this runs on a GPU machine too
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, str(BENCH)], capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 0 and "needs a CUDA GPU; skipped" in proc.stdout
    proc = subprocess.run([sys.executable, str(BENCH), "--lease", str(tmp_path / "o")], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=env)
    assert proc.returncode == 2 and "torch sees no CUDA device" in proc.stderr


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
