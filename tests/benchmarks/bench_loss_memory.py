"""Peak memory of the LM loss (forward + backward) at a large vocabulary, on CPU: the trainer's
fused chunked head (training/loss.py) against the unfused loss it replaced
(``F.cross_entropy(logits.float(), ...)`` over the whole (B, T, V) logits).

Each variant runs in its own process; the figure is its peak RSS above the RSS after the
inputs were built, so the two are measured the same way. Defaults: vocab 128k, seq 2048,
micro-batch 4 (8,192 tokens), d_model 256 (the head's input size does not change the logits'
size), bf16 compute like the GPU recipe.

    .venv/bin/python tests/benchmarks/bench_loss_memory.py [--vocab 131072 --seq 2048 --micro 4 --dtype bf16]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def child(variant: str, vocab: int, tokens: int, d_model: int, dtype: str, chunk: int) -> dict:
    import torch

    sys.path.insert(0, str(REPO))
    from training.loss import linear_cross_entropy, reference_cross_entropy

    torch.set_num_threads(2)
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
    g = torch.Generator().manual_seed(0)
    h = (torch.randn(tokens, d_model, generator=g) * 0.1).to(dt).requires_grad_()
    w = (torch.randn(vocab, d_model, generator=g) * 0.02).to(dt).requires_grad_()
    t = torch.randint(0, vocab, (tokens,), generator=g)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    if variant == "unfused":
        loss = reference_cross_entropy((h @ w.t())[None], t[None])
    else:
        loss = linear_cross_entropy(h, w, t, chunk)
    loss.backward()
    took = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"variant": variant, "loss": float(loss), "peak_mib": peak - base, "seconds": took}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--vocab", type=int, default=131072)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro", type=int, default=4)
    p.add_argument("--d-model", type=int, default=256)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    p.add_argument("--chunk", type=int, default=1024, help="train.loss_chunk_tokens (its default)")
    p.add_argument("--child", default=None)
    a = p.parse_args()
    tokens = a.seq * a.micro
    if a.child:
        print(json.dumps(child(a.child, a.vocab, tokens, a.d_model, a.dtype, a.chunk)))
        return
    logits_gib = tokens * a.vocab * 4 / 2**30
    print(f"loss over {a.micro} x {a.seq} tokens, vocab {a.vocab}, d_model {a.d_model}, {a.dtype} compute "
          f"(one fp32 copy of the logits: {logits_gib:.2f} GiB)")
    out = {}
    for variant in ("unfused", "fused"):
        cmd = [sys.executable, __file__, "--child", variant, "--vocab", str(a.vocab), "--seq", str(a.seq), "--micro",
               str(a.micro), "--d-model", str(a.d_model), "--dtype", a.dtype, "--chunk", str(a.chunk)]
        r = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1])
        out[variant] = r
        print(f"  {variant:8s} peak +{r['peak_mib']:8.0f} MiB   {r['seconds']:6.1f} s   loss {r['loss']:.6g}")
    print(f"peak memory: fused / unfused = {out['fused']['peak_mib'] / out['unfused']['peak_mib']:.2f}x "
          f"({out['unfused']['peak_mib'] / 1024:.2f} GiB -> {out['fused']['peak_mib'] / 1024:.2f} GiB); "
          f"same loss: {abs(out['fused']['loss'] - out['unfused']['loss']) / out['unfused']['loss']:.1e} relative")


if __name__ == "__main__":
    main()
