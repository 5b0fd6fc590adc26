"""What the trainer tests share: a small model, writing a config, reading metrics.jsonl, and
launching the trainer under torchrun on CPU.

Every config written here pins ``train.device: cpu`` unless a test says otherwise: the CPU
suite means the same on a GPU machine (CUDA variants live in tests/test_train_gpu.py, marked
``gpu``, with bf16 tolerances)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
#: Smaller than the "tiny" preset so each test stays a few seconds on a busy CPU.
SMALL = {"n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2, "ffn_hidden": 192}


def write_config(tmp_path: Path, name: str, raw: dict, **sections) -> Path:
    """``raw`` with ``run_dir`` = tmp_path/name and each of ``sections`` merged in (a dict
    updates that section, anything else replaces it), written to tmp_path/name.yaml."""
    raw = {"run_dir": str(tmp_path / name), **raw}
    for key, value in sections.items():
        raw[key] = {**raw.get(key, {}), **value} if isinstance(value, dict) else value
    raw["train"] = {"device": "cpu", **raw.get("train", {})}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def mesh_config(tmp_path: Path, name: str, train: Path, model: dict, seq: int, steps: int, checkpoint_every: int,
                held: Path | None = None, /, **sections) -> Path:
    """The run the mesh tests (TP, SP, PP, HSDP x PP) train on every mesh and on one process:
    8 rows a step in micro-batches of 2, every step's loss and row ids logged, no final save;
    with ``held``, an eval every ``checkpoint_every`` steps. ``sections`` override as in
    ``write_config`` (``model=``, ``train=``... too: the arguments before them are positional)."""
    raw = {
        "seed": 0,
        "model": model,
        "data": {"path": str(train), "seq_len": seq},
        "train": {"global_batch": 8, "micro_batch": 2, "steps": steps, "threads": 1},
        "optim": {"lr": 3e-3},
        "schedule": {"warmup_steps": 3},
        "checkpoint": {"every": checkpoint_every, "final_save": False},
        "metrics": {"every": 1, "progress": "off", "tensorboard": False, "log_row_ids": True},
    }
    if held is not None:
        raw["eval"] = {"path": str(held), "every": checkpoint_every, "batches": 1}
    return write_config(tmp_path, name, raw, **sections)


def records(run_dir: Path, kind: str = "train") -> list[dict]:
    """The records of one kind in the run's metrics.jsonl, in order."""
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run_dir)}


def row_ids(run: Path) -> dict[tuple[int, int], list[int]]:
    """The packed rows each rank read at each step (``metrics.log_row_ids``): {(step, rank): rows}."""
    out = {}
    for f in (run / "row_ids").glob("rank*.jsonl"):
        for r in map(json.loads, f.read_text().splitlines()):
            out[r["step"], r["rank"]] = r["rows"]
    return out


def compare_steps(one: list[dict], other: list[dict], label: str, tol: float = 1e-5) -> tuple[float, float]:
    """Print the per-step |loss diff| and |grad-norm diff| of ``other`` against ``one`` (the same
    steps); each within ``tol`` (relative, at least 1). Returns the maxima."""
    assert [r["step"] for r in one] == [r["step"] for r in other]
    print(f"\n{label} vs 1 process, per step: |loss diff|, |grad-norm diff|")
    worst = [0.0, 0.0]
    for x, y in zip(one, other):
        dl, dg = abs(x["loss_step"] - y["loss_step"]), abs(x["grad_norm"] - y["grad_norm"])
        print(f"  step {x['step']:2d}  loss {x['loss_step']:.6f}  {dl:.2e}  grad norm {x['grad_norm']:.4f}  {dg:.2e}")
        assert dl <= tol * max(1.0, abs(x["loss_step"])), f"step {x['step']}: loss differs by {dl}"
        assert dg <= tol * max(1.0, abs(x["grad_norm"])), f"step {x['step']}: grad norm differs by {dg}"
        worst = [max(worst[0], dl), max(worst[1], dg)]
    print(f"  max: loss {worst[0]:.2e}, grad norm {worst[1]:.2e}")
    return worst[0], worst[1]


def torchrun(config_path: Path, *overrides: str, nproc: int = 2, check: bool = True, timeout: float = 300,
             resume: str | None = None) -> subprocess.CompletedProcess:
    """Run the trainer under torchrun on CPU; with ``check``, fail with its output if it fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "training", str(config_path)]
    for o in overrides:
        cmd += ["--set", o]
    if resume is not None:
        cmd += ["--resume", resume]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


#: A kernel in bf16 against the fp32 dense document mask: max |out| error, and max |grad| error
#: relative to the reference gradient's largest entry. A kernel that ignores the document mask
#: misses it by two orders of magnitude on the fixture below (its errors are measured too).
KERNEL_TOL = 3e-2


def mask_sensitive_rows(t: int) -> list[list[int]]:
    """Packed rows where most positions sit behind a document boundary: a kernel attending
    across documents changes most outputs (a one-token document, runs of short ones, padding)."""
    return [[1, t // 3, t // 6, 23, t // 3], [17] * (t // 17), [3, 5, 7, 11, 13] * (t // 39), [t // 10]]


def kernel_errors(attend_fn, device, dtype, t: int = 256, heads: tuple[int, int] = (8, 2), d: int = 32, seed: int = 0) -> dict:
    """Errors of ``attend_fn(q, k, v, doc_ids) -> out`` ((B,T,H,D) layout, GQA) against fp32 SDPA
    with the dense document-causal mask, forward and the three input gradients."""
    import torch
    import torch.nn.functional as F

    from training.attention import doc_ids_from_lens, document_causal_mask

    h, kv = heads
    lens = mask_sensitive_rows(t)
    g = torch.Generator(device="cpu").manual_seed(seed)
    doc_ids = torch.from_numpy(doc_ids_from_lens(lens, t)).to(device)
    q32, k32, v32 = (torch.randn(len(lens), t, n, d, generator=g).to(device) for n in (h, kv, kv))
    w = torch.randn(len(lens), t, h, d, generator=g).to(device)
    qr, kr, vr = (x.clone().requires_grad_() for x in (q32, k32, v32))
    ref = F.scaled_dot_product_attention(qr.transpose(1, 2), kr.transpose(1, 2), vr.transpose(1, 2),
                                         attn_mask=document_causal_mask(doc_ids), enable_gqa=True).transpose(1, 2)
    ref_grads = torch.autograd.grad((ref * w).sum(), (qr, kr, vr))
    q, k, v = (x.to(dtype).requires_grad_() for x in (q32, k32, v32))
    out = attend_fn(q, k, v, doc_ids)
    grads = torch.autograd.grad((out.float() * w).sum(), (q, k, v))
    errs = {"out": (out.float() - ref).abs().max().item()}
    for name, a, r in zip(("dq", "dk", "dv"), grads, ref_grads):
        errs[name] = (a.float() - r).abs().max().item() / max(r.abs().max().item(), 1e-6)
    return errs


def maskless(q, k, v, doc_ids):
    """Causal attention over the whole packed row: what a kernel that lost the document mask computes."""
    import torch.nn.functional as F

    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                          enable_gqa=True).transpose(1, 2)


# ---------------------------------------------------------------- one spawned pair, several jobs

def _two_rank_jobs(rank: int, world: int, jobs: list[tuple[str, str, str, str, tuple]]) -> None:
    """One spawned process of the pair: each job ``(module, function, rendezvous file, out dir,
    args)`` in turn, ``module.function(rank, world, rendezvous file, out dir, *args)``; each job
    starts its own gloo group on its own file and ends it."""
    import importlib

    for module, fn, init_file, out, args in jobs:
        getattr(importlib.import_module(module), fn)(rank, world, init_file, out, *args)


def spawn_two_rank_jobs(jobs: dict[str, tuple[str, tuple]], tmp: Path) -> tuple[dict[str, Path], BaseException | None]:
    """Run ``{module: (function, args)}`` in one pair of spawned CPU processes, one job after the
    other (two processes start, each imports torch once, for every job). Returns each module's
    output folder (its ``rank{r}.json``) and the error that stopped the pair, if any: the jobs
    before the failing one have their outputs."""
    import tempfile

    import torch.multiprocessing as mp

    outs, specs = {}, []
    for module, (fn, args) in jobs.items():
        outs[module] = tmp / module
        outs[module].mkdir()
        specs.append((module, fn, tempfile.mktemp(dir=outs[module]), str(outs[module]), tuple(args)))
    try:
        mp.spawn(_two_rank_jobs, args=(2, specs), nprocs=2, join=True)
    except Exception as e:  # noqa: BLE001  (each test reports it where its own output is missing)
        return outs, e
    return outs, None
