"""Attention backends on CPU: peak memory and time of one document-masked attention call.

For each T, the dense path (``sdpa``: a (B, 1, T, T) mask) against the scaling path that
``auto`` picks on CPU (``segments``: SDPA per document, batched by bucketed length), on
packed rows of many documents (lengths ~ geometric, mean ~300 tokens, plus one long one).

Peak memory is the process's peak resident set (VmHWM, reset through /proc/self/clear_refs)
above what it held before the call, measured in a fresh process per figure with glibc's
mmap threshold pinned, so every large buffer is mapped and unmapped on its own (freed
memory is not reused silently and the peak is what the call itself needed). One call =
building the backend's mask inputs + the forward; ``--backward`` adds the backward.

Run: ``.venv/bin/python tests/benchmarks/bench_attention.py [--lengths 1024,2048,4096] [--backward]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

#: 125m-preset attention shape: 12 query heads, 4 kv heads, head dim 64.
BATCH, HEADS, KV_HEADS, HEAD_DIM = 1, 12, 4, 64


def doc_lens(length: int, rows: int, seed: int = 0) -> list[list[int]]:
    """Rows of documents: one long document (length / 3), the rest ~ geometric (mean ~300)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(rows):
        lens, used = [length // 3], length // 3
        while used < length - 8:
            n = int(min(rng.geometric(1 / 300), length - used))
            lens.append(n)
            used += n
        out.append(lens)
    return out


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":")
                out[key] = int(value.split()[0]) * 1024
    return out


def _child(backend: str, length: int, backward: bool) -> dict:
    """In this (fresh) process: peak bytes above the baseline of one attention call."""
    import torch

    from training.attention import AttentionMeta, attend, doc_ids_from_lens

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(BATCH, length, HEADS, HEAD_DIM, generator=g, requires_grad=backward)
    k = torch.randn(BATCH, length, KV_HEADS, HEAD_DIM, generator=g, requires_grad=backward)
    v = torch.randn(BATCH, length, KV_HEADS, HEAD_DIM, generator=g, requires_grad=backward)
    doc_ids = torch.from_numpy(doc_ids_from_lens(doc_lens(length, BATCH), length))
    dev = torch.device("cpu")
    # Warm up on a short row (kernels, thread pools), then measure from a clean peak.
    short = torch.from_numpy(doc_ids_from_lens(doc_lens(64, BATCH), 64))
    attend(q[:, :64].detach(), k[:, :64].detach(), v[:, :64].detach(), AttentionMeta.build(short, BATCH, 64, dev, backend))
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS
    before = _status()["VmRSS"]
    t0 = time.perf_counter()
    out = attend(q, k, v, AttentionMeta.build(doc_ids, BATCH, length, dev, backend))
    if backward:
        out.square().sum().backward()
    seconds = time.perf_counter() - t0
    peak = _status()["VmHWM"] - before
    return {"backend": backend, "T": length, "backward": backward, "peak_bytes": peak, "seconds": seconds,
            "docs": len(doc_lens(length, BATCH)[0])}


def measure(backend: str, length: int, backward: bool = False) -> dict:
    """``_child`` in a fresh interpreter (so earlier allocations cannot hide or inflate the peak)."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, __file__, "--child", backend, "--lengths", str(length)] + (["--backward"] if backward else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1024,2048,4096")
    ap.add_argument("--backends", default="sdpa,segments")
    ap.add_argument("--backward", action="store_true", help="forward + backward (default: forward only)")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    lengths = [int(x) for x in a.lengths.split(",")]
    if a.child:
        print(json.dumps(_child(a.child, lengths[0], a.backward)))
        return
    what = "forward + backward" if a.backward else "forward"
    print(f"bench_attention: one attention call ({what}, incl. building its mask inputs), B {BATCH}, "
          f"{HEADS} heads / {KV_HEADS} kv heads, head dim {HEAD_DIM}, fp32, 1 thread")
    for length in lengths:
        for backend in a.backends.split(","):
            r = measure(backend, length, a.backward)
            print(f"  T {length:>5}  {backend:<9} peak {r['peak_bytes'] / 2**20:8.1f} MiB   {r['seconds'] * 1e3:8.1f} ms"
                  f"   ({r['docs']} documents)")


if __name__ == "__main__":
    main()
