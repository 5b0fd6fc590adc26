"""GPU acceptance run for the trainer, sized for one short lease.

    python tests/benchmarks/bench_gpu.py --lease OUT_DIR [--deadline 420] [--only kernels,resume]
    python tests/benchmarks/bench_gpu.py --dry-run OUT_DIR     # same control flow on CPU, tiny shapes

Checks, in value order (cheap correctness first, so a slow compile cannot cost them):
  kernels   every runnable attention backend against fp32 dense document-masked SDPA, forward and
            the three input gradients, on packed rows whose documents make a maskless kernel
            diverge far beyond the tolerance (that divergence is measured and required too);
  resume    a straight run checkpointed at half; that checkpoint resumed (``--resume PATH``) into a
            new run dir with metrics.every 1: the first resumed step's loss bit-equal, every step
            under train.deterministic;
  mfu_1b    ~1B at seq 4096, compiled + selective AC, TORCH_LOGS=recompiles counted in the same
            run; MFU from synchronized window ends (each metrics record's wall time follows a
            device->host copy), with causal attention FLOPs beside the PaLM convention;
  async_save 10 steps, checkpoint every 5 with async_save: both checkpoints complete;
  trace     a profiled window of the ~125M run, its ops table;
  small     ~125M knobs (eager / compiled, micro-batch) tokens/s and MFU;
  multi     FSDP2 and DDP under torchrun, only with > 1 GPU, batch geometry from the GPU count.
Each check runs as a subprocess of this script with its own timeout and writes OUT_DIR/<check>.json
(status pass/fail/timeout/skipped, figures, seconds, kernel, log tail) as it lands;
OUT_DIR/summary.json (torch, CUDA, driver, GPU, every check so far) is rewritten after each one.
A check that would start after --deadline seconds is written as skipped (deadline).
Without --lease/--dry-run and without CUDA it says it needs a GPU and exits 0 (``make bench`` runs on).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402
import yaml  # noqa: E402

#: (name, GPU only, timeout on a lease in s, lease estimate in s)
CHECKS = [
    ("kernels", False, 90, 50),
    ("resume", False, 150, 90),
    ("mfu_1b", True, 270, 180),
    ("async_save", False, 60, 25),
    ("trace", True, 80, 50),
    ("small", True, 200, 120),
    ("multi", True, 200, 0),
]
DRY_TIMEOUT = 150  # per check on CPU (tiny shapes; a busy 2-core CI host)


def _env() -> dict:
    driver = None
    if shutil.which("nvidia-smi"):
        try:
            driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                    capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except (subprocess.SubprocessError, IndexError, OSError):
            driver = None
    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "driver": driver,
            "gpu": torch.cuda.get_device_name(0) if cuda else None, "gpus": torch.cuda.device_count() if cuda else 0}


# ---------------------------------------------------------------- one check, in its own process

class Ctx:
    def __init__(self, work: Path, dry: bool):
        self.work, self.dry = work, dry
        self.device = "cpu" if dry else "cuda"

    def best(self) -> str:
        if self.dry:
            return "segments"
        from training.attention import unavailable
        return next((b for b in ("flash", "varlen", "flex") if unavailable(b, torch.device("cuda")) is None), "sdpa")

    def pack(self, name: str, seq: int, vocab: int, rows: dict, max_doc: int) -> Path:
        from training.synthetic import write_packed
        path = self.work / name
        if not path.exists():
            write_packed(path, rows, seq, vocab=vocab, max_doc={k: max_doc for k in rows})
        return path

    def small_pack(self) -> tuple[Path, int, int]:
        if self.dry:
            return self.pack("pack-tiny", 128, 512, {"web": 120, "math": 40}, 100), 128, 512
        return self.pack("pack-125m", 1024, 32768, {"web": 6000, "math": 2000}, 900), 1024, 32768

    def cfg(self, name: str, steps: int, model: dict | None = None, train: dict | None = None, **extra) -> Path:
        pack, seq, vocab = self.small_pack()
        gb, micro = (8, 4) if self.dry else (32, 8)
        raw = {
            "run_dir": str(self.work / name), "seed": 0,
            "model": {"preset": "tiny" if self.dry else "125m", "vocab_size": vocab, "attention": self.best(), **(model or {})},
            "data": {"path": str(pack), "seq_len": seq},
            "train": {"global_batch": gb, "micro_batch": micro, "steps": steps, "device": self.device, **(train or {})},
            "optim": {"lr": 6e-4}, "schedule": {"warmup_steps": 2 if self.dry else 10},
            "checkpoint": {"every": 10**6, **extra.pop("checkpoint", {})},
            "metrics": {"every": 5, "progress": "off", "tensorboard": False, **extra.pop("metrics", {})},
            **extra,
        }
        path = self.work / f"{name}.yaml"
        path.write_text(yaml.safe_dump(raw))
        return path


def train(cfg: Path, *sets: str, resume: str | None = None, nproc: int = 1, env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "training", str(cfg)] if nproc == 1 else \
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", "-m", "training", str(cfg)]
    for s in sets:
        cmd += ["--set", s]
    if resume:
        cmd += ["--resume", resume]
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, **(env or {}), "PYTHONPATH": path})
    print(f"ran {cfg.stem} {' '.join(sets)} exit {proc.returncode}", flush=True)
    if proc.returncode:
        print(proc.stdout[-2000:] + proc.stderr[-3000:], flush=True)
    return proc


def recs(run: Path, kind: str = "train") -> list[dict]:
    return [r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def check_kernels(c: Ctx) -> dict:
    import torch.nn.functional as F
    from training.attention import AttentionMeta, attend, doc_ids_from_lens, document_causal_mask, unavailable

    dev = torch.device(c.device)
    g = torch.Generator(device="cpu").manual_seed(0)
    # many short documents packed per row: attention across a boundary changes most outputs
    lens = [[1, 40, 20, 23, 40], [30, 30, 60], [8] * 15, [10]] if c.dry else [[1, 400, 200, 23, 400], [300, 300, 424], [17] * 60, [100]]
    T, H, KV, D = (128, 4, 2, 16) if c.dry else (1024, 12, 4, 64)
    b = len(lens)
    doc_ids = torch.from_numpy(doc_ids_from_lens(lens, T)).to(dev)
    q32, k32, v32 = (torch.randn(b, T, n, D, generator=g).to(dev) for n in (H, KV, KV))
    w = torch.randn(b, T, H, D, generator=g).to(dev)
    mask = document_causal_mask(doc_ids)
    qr, kr, vr = (x.clone().requires_grad_() for x in (q32, k32, v32))
    ref = F.scaled_dot_product_attention(qr.transpose(1, 2), kr.transpose(1, 2), vr.transpose(1, 2), attn_mask=mask, enable_gqa=True).transpose(1, 2)
    ref_g = torch.autograd.grad((ref * w).sum(), (qr, kr, vr))
    tol = 3e-2
    # the fixture must catch a kernel that ignores the document mask (plain causal)
    nomask = F.scaled_dot_product_attention(q32.transpose(1, 2), k32.transpose(1, 2), v32.transpose(1, 2), is_causal=True, enable_gqa=True).transpose(1, 2)
    maskless_err = (nomask - ref).abs().max().item()
    kernels, ok = {}, maskless_err > 10 * tol
    dtype = torch.float32 if c.dry else torch.bfloat16
    for backend in ("flash", "varlen", "flex", "segments", "sdpa"):
        why = unavailable(backend, dev)
        if why is not None:
            kernels[backend] = {"status": "skipped", "reason": why}
            continue
        q, k, v = (x.to(dtype).requires_grad_() for x in (q32, k32, v32))
        out = attend(q, k, v, AttentionMeta.build(doc_ids, b, T, dev, backend))
        grads = torch.autograd.grad((out.float() * w).sum(), (q, k, v))
        errs = [(out.float() - ref).abs().max().item()] + [(a.float() - r).abs().max().item() / max(r.abs().max().item(), 1e-6)
                                                            for a, r in zip(grads, ref_g)]
        passed = max(errs) < tol
        ok = ok and passed
        kernels[backend] = {"status": "pass" if passed else "fail", "out_err": errs[0], "grad_rel_err_qkv": errs[1:]}
    ran = [k for k, v in kernels.items() if v["status"] != "skipped"]
    return {"status": "pass" if ok and ran else "fail", "kernel": ",".join(ran), "tolerance": tol,
            "maskless_out_err": maskless_err, "kernels": kernels}


def check_resume(c: Ctx) -> dict:
    steps = 8 if c.dry else 20
    half = steps // 2
    out = {"kernel": c.best()}
    ok = True
    for det in ((True,) if c.dry else (True, False)):
        tag = "det" if det else "fast"
        kw = dict(train={"deterministic": det}, checkpoint={"every": half}, metrics={"every": 1})
        straight = c.cfg(f"straight-{tag}", steps, **kw)
        if train(straight).returncode:
            return {**out, "status": "fail", "reason": f"straight {tag} run failed"}
        ckpt = c.work / f"straight-{tag}" / "checkpoints" / f"step_{half:08d}"
        resumed = c.cfg(f"resumed-{tag}", steps, **kw)
        if train(resumed, resume=str(ckpt)).returncode:
            return {**out, "status": "fail", "reason": f"resume {tag} from {ckpt.name} failed"}
        a = {r["step"]: r["loss_step"] for r in recs(c.work / f"straight-{tag}")}
        b = {r["step"]: r["loss_step"] for r in recs(c.work / f"resumed-{tag}")}
        after = sorted(s for s in b if s >= half)
        equal = [s for s in after if a.get(s) == b[s]]
        first_equal = bool(after) and a.get(after[0]) == b[after[0]]
        good = first_equal and (not det or len(equal) == len(after)) and min(b) >= half
        ok = ok and good
        falls = a[max(a)] < a[min(a)]
        out[tag] = {"first_resumed_step": after[0] if after else None, "first_equal": first_equal,
                    "bit_equal_steps": f"{len(equal)}/{len(after)}", "loss_first_last": [a[min(a)], a[max(a)]], "loss_falls": falls}
    return {**out, "status": "pass" if ok else "fail"}


def check_mfu_1b(c: Ctx) -> dict:
    from training.config import ModelConfig
    from training.model import flops_per_token
    seq, vocab, steps = 4096, 128256, 28
    pack = c.pack("pack-1b", seq, vocab, {"web": 1500, "math": 500}, 3000)
    raw = {"run_dir": str(c.work / "1b"), "seed": 0,
           "model": {"preset": "1b", "vocab_size": vocab, "attention": c.best()},
           "data": {"path": str(pack), "seq_len": seq},
           "train": {"global_batch": 8, "micro_batch": 2, "steps": steps, "device": "cuda", "compile": True},
           "parallel": {"ac": "selective"}, "guard": {"enabled": False},
           "optim": {"lr": 3e-4}, "schedule": {"warmup_steps": 5}, "checkpoint": {"every": 10**6},
           "metrics": {"every": 2, "progress": "off", "tensorboard": False}}
    cfg = c.work / "1b.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    proc = train(cfg, env={"TORCH_LOGS": "recompiles"})
    log = proc.stdout + proc.stderr
    recompiles = len(re.findall(r"Recompiling function", log))
    limit = bool(re.search(r"recompile_limit|cache_size_limit", log))
    if proc.returncode:
        return {"status": "fail", "kernel": c.best(), "reason": "run failed", "recompiles": recompiles}
    rs = recs(c.work / "1b")[2:]  # after compile and warm-up
    # record times follow the window's device->host copy of its counters: synchronized ends
    tokens = sum(r["tokens"] for r in rs[1:])
    wall = rs[-1]["time"] - rs[0]["time"]
    tps = tokens / wall
    mc = ModelConfig(preset="1b", vocab_size=vocab)
    from training.model import Transformer
    with torch.device("meta"):
        n_matmul = Transformer(mc, seq).num_params(matmul_only=True)
    conv = flops_per_token(mc, seq, n_matmul)
    attn = 12 * mc.n_layer * mc.n_head * mc.head_dim * seq
    from training.metrics import peak_flops
    peak = peak_flops(torch.device("cuda"))
    logged = statistics.median(r["mfu"] for r in rs if r["mfu"] is not None) if any(r["mfu"] is not None for r in rs) else None
    mfu_conv = conv * tps / peak if conv and peak else None
    mfu_causal = (conv - attn / 2) * tps / peak if conv and peak else None
    return {"status": "pass" if (mfu_conv or logged or 0) >= 0.35 and not limit else "fail", "kernel": c.best(),
            "tokens_per_s_synced": tps, "mfu_synced": mfu_conv, "mfu_causal_attention": mfu_causal, "mfu_logged_median": logged,
            "recompiles": recompiles, "recompile_limit_hit": limit, "peak_flops": peak}


def check_async_save(c: Ctx) -> dict:
    proc = train(c.cfg("async", 10, checkpoint={"every": 5, "async_save": True}))
    ckpts = sorted(p.name for p in (c.work / "async" / "checkpoints").glob("step_*") if (p / "meta.json").exists()) \
        if proc.returncode == 0 else []
    return {"status": "pass" if proc.returncode == 0 and len(ckpts) >= 2 else "fail", "kernel": c.best(),
            "checkpoints": ckpts, "exit": proc.returncode}


def check_trace(c: Ctx) -> dict:
    proc = train(c.cfg("trace", 10, profile={"start": 6, "steps": 3}))
    tables = sorted((c.work / "trace" / "profile").glob("*_ops.txt")) if proc.returncode == 0 else []
    if tables:
        print("\n".join(tables[0].read_text().splitlines()[:28]))
    return {"status": "pass" if tables else "fail", "kernel": c.best(), "tables": [t.name for t in tables]}


def check_small(c: Ctx) -> dict:
    rows, ok = {}, True
    for name, tr in [("eager-mb8", {}), ("eager-mb32", {"micro_batch": 32}), ("compiled-mb8", {"compile": True})]:
        cfg = c.cfg(f"small-{name}", 15, train=tr)
        if train(cfg).returncode:
            rows[name], ok = None, False
            continue
        rs = recs(c.work / f"small-{name}")[1:]
        mfus = [r["mfu"] for r in rs if r["mfu"] is not None]
        rows[name] = {"tokens_per_s": statistics.median(r["tokens_per_s"] for r in rs), "mfu": statistics.median(mfus) if mfus else None}
    return {"status": "pass" if ok else "fail", "kernel": c.best(), "variants": rows}


def check_multi(c: Ctx) -> dict:
    n = torch.cuda.device_count()
    micro = 4
    gb = micro * n * 2  # two accumulation steps at any GPU count
    out, ok = {"gpus": n, "global_batch": gb, "micro_batch": micro}, True
    for strategy in ("fsdp", "ddp"):
        cfg = c.cfg(f"multi-{strategy}", 20, train={"global_batch": gb, "micro_batch": micro})
        proc = train(cfg, f"parallel.strategy={strategy}", nproc=n)
        ok = ok and proc.returncode == 0
        out[strategy] = recs(c.work / f"multi-{strategy}")[-1]["loss"] if proc.returncode == 0 else None
    return {**out, "status": "pass" if ok else "fail", "kernel": c.best()}


RUN = {"kernels": check_kernels, "resume": check_resume, "mfu_1b": check_mfu_1b, "async_save": check_async_save,
       "trace": check_trace, "small": check_small, "multi": check_multi}


# ---------------------------------------------------------------- the orchestrator

def orchestrate(out: Path, dry: bool, deadline: float, only: set[str]) -> int:
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))  # packs and run dirs: big, not results
    summary = {"mode": "dry-run" if dry else "lease", **_env(), "deadline_s": deadline, "work_dir": str(work), "checks": {}}
    t_start = time.time()
    gpus = summary["gpus"]
    for name, gpu_only, timeout, _ in CHECKS:
        t0 = time.time()
        if name not in only:
            res = {"status": "skipped", "reason": "not in --only"}
        elif dry and gpu_only:
            res = {"status": "skipped", "reason": "GPU only (dry run on CPU)"}
        elif name == "multi" and gpus < 2:
            res = {"status": "skipped", "reason": f"{gpus} GPU(s): multi-GPU needs > 1"}
        elif time.time() - t_start > deadline:
            res = {"status": "skipped", "reason": f"deadline {deadline:.0f} s passed"}
        else:
            limit = DRY_TIMEOUT if dry else timeout
            cmd = [sys.executable, __file__, "--check", name, "--work", str(work), "--out", str(out)] + (["--dry"] if dry else [])
            try:
                proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=limit)
                log, code = proc.stdout + proc.stderr, proc.returncode
            except subprocess.TimeoutExpired as e:
                log, code = ((e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")), None
            landed = out / f"{name}.json"
            if code is None:
                res = {"status": "timeout", "reason": f"over {limit} s"}
            elif landed.exists():
                res = json.loads(landed.read_text())
            else:
                res = {"status": "fail", "reason": f"check process exited {code} without a result"}
            res["log_tail"] = log[-3000:]
        res["seconds"] = round(time.time() - t0, 1)
        (out / f"{name}.json").write_text(json.dumps(res, indent=1, default=str))
        summary["checks"][name] = {k: v for k, v in res.items() if k != "log_tail"}
        summary["elapsed_s"] = round(time.time() - t_start, 1)
        (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
        print(f"[{res['status'].upper()}] {name} ({res['seconds']} s) {res.get('reason', '')}", flush=True)
    shutil.rmtree(work, ignore_errors=True)
    bad = [n for n, r in summary["checks"].items() if r["status"] in ("fail", "timeout")]
    print(f"{len(bad)} failed of {len(CHECKS)}; results in {out}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lease", metavar="OUT_DIR", help="run the acceptance on this machine's GPU, results to OUT_DIR")
    ap.add_argument("--dry-run", metavar="OUT_DIR", help="the same control flow on CPU with tiny shapes")
    ap.add_argument("--deadline", type=float, default=420, help="seconds after which later checks are skipped")
    ap.add_argument("--only", default=",".join(n for n, *_ in CHECKS))
    ap.add_argument("--check", help=argparse.SUPPRESS)  # internal: one check in this process
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--dry", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.check:
        t0 = time.time()
        res = RUN[a.check](Ctx(Path(a.work), a.dry))
        res["seconds"] = round(time.time() - t0, 1)
        Path(a.out, f"{a.check}.json").write_text(json.dumps(res, indent=1, default=str))
        return 0
    only = set(a.only.split(","))
    if only - set(RUN):
        ap.error(f"--only: unknown {sorted(only - set(RUN))}")
    if a.dry_run:
        return orchestrate(Path(a.dry_run), True, a.deadline, only)
    if not torch.cuda.is_available():
        # exit 0: `make bench` runs every CPU benchmark after this one
        print("bench_gpu: needs a CUDA GPU; skipped (on CPU try --dry-run OUT_DIR; the CPU suite is `make test`)")
        return 0
    if not a.lease:
        ap.error("give --lease OUT_DIR (results land there check by check)")
    return orchestrate(Path(a.lease), False, a.deadline, only)


if __name__ == "__main__":
    sys.exit(main())
