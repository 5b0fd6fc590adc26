"""GPU acceptance run for the trainer, sized for one short lease (one command, <= 7 min on one H100/H200).

    python tests/benchmarks/bench_gpu.py --lease OUT_DIR [--deadline 400] [--only kernels,resume] [--strategy none]
    python tests/benchmarks/bench_gpu.py --dry-run OUT_DIR     # the same control flow on CPU, tiny shapes

Checks, in value order (cheap correctness first, so a slow compile cannot cost them):
  kernels    every runnable attention backend in bf16 against fp32 SDPA with the dense document
             mask, forward and the three input gradients, on packed rows where a kernel without
             the mask misses by far (that miss is measured and required too);
  resume     a straight run checkpointed at half; that checkpoint resumed (``--resume PATH``) in a
             new run dir with metrics every step: the first resumed step's loss bit-equal, and
             every step under train.deterministic (both modes on a lease);
  mfu_1b     ~1B at seq 4096, compiled + selective AC, TORCH_LOGS=recompiles counted in the same
             run; tokens/s from the trainer's synchronized window ends, MFU with the PaLM count
             and with causal attention FLOPs; target >= 40% (PaLM count);
  async_save 10 steps, a checkpoint every 5 with checkpoint.async_save (one GPU: the 1-rank NCCL
             group, whose async save needs the checkpointer's gloo group); step 5 read back: resumed
             for one step, its loss bit-equal to the async run's own;
  trace      a profiled window of the ~125M run: ops table, device-busy share, host ops per step;
  small      ~125M knobs: eager, compiled, CUDA graphs (compile_mode reduce-overhead) with batches
             in tokens: tokens/s and MFU each; target >= 35%. The CUDA-graph run pads its varlen
             boundaries to one length (data.max_docs_per_row auto: 144 slots on this pack) with
             max_seqlen 1024, so each graph is recorded once and replayed (trainer-audit-s5 C2);
  multi      FSDP2 and DDP under torchrun when > 1 GPU (CPU: 2 processes in the dry run), batch
             geometry from the GPU count (global = micro x GPUs x 2), final losses compared.
Each check runs in its own process group with its own timeout (never past --deadline) and writes
OUT_DIR/<check>.json (status pass/fail/timeout, figures, seconds, kernel, log tail) as it lands; its
output is appended to OUT_DIR/bench.log; OUT_DIR/summary.json (torch, CUDA, driver, GPU, every check
so far, skipped ones with the reason) is rewritten after each; every JSON is written whole or not at
all (temporary file, rename), and one that cannot be read fails its check only. Runs that only
measure end without a checkpoint (checkpoint.final_save false). --strategy none reruns the checks
without the 1-rank NCCL group (no FSDP2 on one GPU). A check whose estimate no longer fits
before --deadline is skipped (summary only: a lease returns at most 8 files). This layout is what
gets committed under tests/artifacts/gpu/<date>-<gpu>/.
Without --lease/--dry-run and without CUDA it says it needs a GPU and exits 0 (``make bench`` runs on).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import yaml  # noqa: E402

from training.files import write_text_atomic  # noqa: E402  (stdlib only: no torch import)

# torch is imported where it is used: a check process that only launches trainers (every check
# but kernels in the dry run) does not pay for it (seconds a process on a busy 2-core machine)


@dataclass(frozen=True)
class Check:
    name: str
    timeout_s: int  # on a lease (capped by what is left before --deadline)
    estimate_s: int  # on one H100/H200 from a bare machine: the lease plan (README)


#: Value order. Estimates: torch 2.11/2.13 on one H200, Inductor compiles cold (trainer-audit-s4 §5),
#: checkpoint writes included (trainer-audit-s5 K1; 1.13 GiB per ~125M save, at ~0.5 GB/s assumed for
#: the lease's disk). Only resume and async_save save: every other run sets checkpoint.final_save false
#: (mfu_1b's final save alone was 13.8 GiB). resume: 2 saves + 2 loads; async_save: 2 background saves,
#: then one step resumed from the first (a load and a start-up).
CHECKS = [
    Check("kernels", 120, 50),
    Check("resume", 200, 110),
    Check("mfu_1b", 270, 190),
    Check("async_save", 120, 60),
    Check("trace", 90, 45),
    Check("small", 300, 170),
    Check("multi", 240, 120),
]
DRY_TIMEOUT = 300  # per check on CPU: tiny shapes, but a busy 2-core machine
MFU_1B_TARGET, MFU_SMALL_TARGET = 0.40, 0.35


def environment() -> dict:
    import torch

    from training.cuda_driver import driver_version

    cuda = torch.cuda.is_available()
    return {"torch": torch.__version__, "cuda": torch.version.cuda, "driver": driver_version(), "python": platform.python_version(),
            "gpu": torch.cuda.get_device_name(0) if cuda else None, "gpus": torch.cuda.device_count() if cuda else 0,
            "host": platform.node()}


# ---------------------------------------------------------------- one check, in its own process

class Ctx:
    """Shapes and paths of one check: a lease's, or the dry run's tiny ones on CPU."""

    def __init__(self, work: Path, dry: bool, strategy: str | None = None):
        self.work, self.dry = work, dry
        self.strategy = strategy  # --strategy: parallel.strategy of every one-process run (None: each check's own)
        self.device = "cpu" if dry else "cuda"
        self.gpus = 2  # multi: 2 CPU processes in the dry run
        if not dry:
            import torch

            self.gpus = torch.cuda.device_count()

    def best(self) -> str:
        if self.dry:
            return "segments"
        import torch

        from training.attention import unavailable
        return next((b for b in ("flash", "varlen", "flex") if unavailable(b, torch.device("cuda")) is None), "sdpa")

    def pack(self, name: str, seq: int, vocab: int, rows: dict, max_doc: int) -> Path:
        from training.synthetic import write_packed
        path = self.work / name
        if not (path / "_manifest.jsonl").exists() and not path.exists():
            write_packed(path, rows, seq, vocab=vocab, max_doc={k: max_doc for k in rows})
        return path

    def small_pack(self) -> tuple[Path, int, int]:
        if self.dry:
            return self.pack("pack-tiny", 128, 512, {"web": 120, "math": 40}, 100), 128, 512
        return self.pack("pack-125m", 1024, 32768, {"web": 6000, "math": 2000}, 900), 1024, 32768

    def model(self) -> dict:
        if self.dry:
            return {"n_layer": 2, "d_model": 64, "n_head": 4, "n_kv_head": 2, "ffn_hidden": 192}
        return {"preset": "125m"}

    def pin_strategy(self, raw: dict) -> None:
        if self.strategy:
            raw["parallel"] = {**raw.get("parallel", {}), "strategy": self.strategy}

    def cfg(self, name: str, steps: int, model: dict | None = None, train: dict | None = None, data: dict | None = None,
            **extra) -> Path:
        pack, seq, vocab = self.small_pack()
        raw = {
            "run_dir": str(self.work / name), "seed": 0,
            "model": {**self.model(), "vocab_size": vocab, "attention": self.best(), **(model or {})},
            "data": {"path": str(pack), "seq_len": seq, **(data or {})},
            "train": {"global_batch": 8 if self.dry else 32, "micro_batch": 4 if self.dry else 8, "steps": steps,
                      "device": self.device, **({"threads": 1} if self.dry else {}), **(train or {})},
            "optim": {"lr": 6e-4}, "schedule": {"warmup_steps": 2 if self.dry else 10},
            "checkpoint": {"every": 10**6, "final_save": False, **extra.pop("checkpoint", {})},
            "metrics": {"every": 5, "progress": "off", "tensorboard": False,
                        **({"peak_flops": 1e12} if self.dry else {}), **extra.pop("metrics", {})},
            **extra,
        }
        self.pin_strategy(raw)
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
    t = time.time()
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env={**os.environ, **(env or {}), "PYTHONPATH": path})
    print(f"ran {cfg.stem} {' '.join(sets)}{' --resume ' + resume if resume else ''}: exit {proc.returncode}, "
          f"{time.time() - t:.0f} s", flush=True)
    if proc.returncode:
        print(proc.stdout[-2000:] + proc.stderr[-3000:], flush=True)
    return proc


def recs(run: Path, kind: str = "train") -> list[dict]:
    out = []
    for line in (run / "metrics.jsonl").read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:  # a line torn by a killed trainer: the records before it still count
            continue
        if rec["kind"] == kind:
            out.append(rec)
    return out


def write_json(path: Path, obj: dict) -> None:
    """Whole or not at all: a kill mid-write leaves the previous file (or none), never half a JSON."""
    write_text_atomic(path, json.dumps(obj, indent=1, default=str))


def steady(run: Path, skip: int) -> dict:
    """Medians over the train records after the first ``skip`` (compile, warm-up). tokens/s come
    from the trainer's window times, synchronized with the device at each window's end."""
    rs = recs(run)
    rs = rs[skip:] or rs[-1:]
    med = lambda key: statistics.median(r[key] for r in rs) if all(r.get(key) is not None for r in rs) else None  # noqa: E731
    return {"tokens_per_s": med("tokens_per_s"), "mfu": med("mfu"), "mfu_causal": med("mfu_causal"),
            "records": [{k: r.get(k) for k in ("step", "loss", "tokens_per_s", "mfu", "mfu_causal")} for r in recs(run)]}


def check_kernels(c: Ctx) -> dict:
    import torch

    from train_helpers import KERNEL_TOL, kernel_errors, maskless
    from training import attention
    from training.attention import AttentionMeta, attend, unavailable

    dev = torch.device(c.device)
    shape = dict(t=256, heads=(8, 2), d=32) if c.dry else dict(t=1024, heads=(12, 4), d=64)
    miss = kernel_errors(maskless, dev, torch.bfloat16, **shape)
    ok = min(miss.values()) > 10 * KERNEL_TOL  # the fixture would catch a kernel that lost the mask
    kernels = {}
    for backend in ("flash", "varlen", "flex", "segments", "sdpa"):
        why = unavailable(backend, dev)
        if why is not None:
            kernels[backend] = {"status": "skipped", "reason": why}
            continue
        errs = kernel_errors(lambda q, k, v, ids, b=backend: attend(q, k, v, AttentionMeta.build(ids, ids.shape[0], ids.shape[1], dev, b)),
                             dev, torch.bfloat16, **shape)
        passed = max(errs.values()) < KERNEL_TOL
        ok = ok and passed
        kernels[backend] = {"status": "pass" if passed else "fail", **errs}
    varlen = attention._torch_varlen()
    ran = [k for k, v in kernels.items() if v["status"] != "skipped"]
    return {"status": "pass" if ok and ran else "fail", "kernel": ",".join(ran), "tolerance": KERNEL_TOL,
            "maskless_errors": miss, "kernels": kernels, "shape": shape,
            "varlen_takes_enable_gqa": None if varlen is None else not attention._missing_keywords(varlen, ("enable_gqa",))}


def check_resume(c: Ctx) -> dict:
    steps = 8 if c.dry else 20
    half = steps // 2
    out, ok = {"kernel": c.best(), "resumed_at": half}, True
    for det in ((True,) if c.dry else (True, False)):
        tag = "deterministic" if det else "fast"
        kw = dict(train={"deterministic": det}, checkpoint={"every": half}, metrics={"every": 1})
        if train(c.cfg(f"straight-{tag}", steps, **kw)).returncode:
            return {**out, "status": "fail", "reason": f"straight {tag} run failed"}
        ckpt = c.work / f"straight-{tag}" / "checkpoints" / f"step_{half:08d}"
        if train(c.cfg(f"resumed-{tag}", steps, **kw), resume=str(ckpt)).returncode:
            return {**out, "status": "fail", "reason": f"resume {tag} from the straight run's {ckpt.name} failed"}
        a = {r["step"]: r["loss_step"] for r in recs(c.work / f"straight-{tag}")}
        b = {r["step"]: r["loss_step"] for r in recs(c.work / f"resumed-{tag}")}
        equal = [s for s in sorted(b) if a.get(s) == b[s]]
        first_equal = min(b) == half and a.get(half) == b[half]
        good = first_equal and (not det or len(equal) == len(b))
        ok = ok and good
        out[tag] = {"first_resumed_step": min(b), "first_equal": first_equal, "bit_equal_steps": f"{len(equal)}/{len(b)}",
                    "straight_loss_first_last": [a[min(a)], a[max(a)]], "loss_falls": a[max(a)] < a[min(a)]}
    return {**out, "status": "pass" if ok else "fail"}


def check_mfu_1b(c: Ctx) -> dict:
    if c.dry:
        seq, vocab, steps, model = 128, 512, 8, {**c.model(), "vocab_size": 512}
        pack, gb, micro = c.small_pack()[0], 8, 4
    else:
        seq, vocab, steps, model = 4096, 128256, 24, {"preset": "1b", "vocab_size": 128256}
        pack, gb, micro = c.pack("pack-1b", seq, vocab, {"web": 1500, "math": 500}, 3000), 8, 2
    raw = {"run_dir": str(c.work / "1b"), "seed": 0,
           "model": {**model, "attention": c.best()},
           "data": {"path": str(pack), "seq_len": seq},
           "train": {"global_batch": gb, "micro_batch": micro, "steps": steps, "device": c.device, "compile": True,
                     **({"threads": 1} if c.dry else {})},
           "parallel": {"ac": "selective"}, "guard": {"enabled": False},
           "optim": {"lr": 3e-4}, "schedule": {"warmup_steps": 2},
           "checkpoint": {"every": 10**6, "final_save": False},  # the figures, not 13.8 GiB of 1B state
           "metrics": {"every": 2, "progress": "off", "tensorboard": False, **({"peak_flops": 1e12} if c.dry else {})}}
    c.pin_strategy(raw)
    cfg = c.work / "1b.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    proc = train(cfg, env={"TORCH_LOGS": "recompiles"})
    log = proc.stdout + proc.stderr
    recompiles = len(re.findall(r"Recompiling function", log))
    limit = bool(re.search(r"recompile_limit|cache_size_limit", log))
    out = {"kernel": c.best(), "recompiles": recompiles, "recompile_limit_hit": limit, "seq_len": seq, "global_batch": gb}
    if proc.returncode:
        return {**out, "status": "fail", "reason": "run failed"}
    st = steady(c.work / "1b", skip=2)
    start = recs(c.work / "1b", "event")[0]
    met = None if c.dry else (st["mfu"] or 0) >= MFU_1B_TARGET
    return {**out, **st, "peak_flops": start["peak_flops"], "flops_per_token": start["flops_per_token"],
            "mfu_target": MFU_1B_TARGET, "target_met": met,
            "status": "pass" if not limit and st["tokens_per_s"] and met is not False else "fail"}


def check_async_save(c: Ctx) -> dict:
    """Two background saves, then the first read back: resumed in a new run dir for one step, whose
    loss must be bit-equal to the async run's own step 5 (the weights, Adam moments, data position
    and RNG all came back as they were)."""
    # strategy fsdp: what auto is on one GPU (a 1-rank NCCL group there; gloo in the dry run)
    kw = dict(checkpoint={"every": 5, "async_save": True, "final_save": True}, parallel={"strategy": "fsdp"},
              metrics={"every": 1})
    proc = train(c.cfg("async", 10, **kw))
    ckdir = c.work / "async" / "checkpoints"
    ckpts = sorted(p.name for p in ckdir.glob("step_*") if (p / "meta.json").exists()) if ckdir.exists() else []
    start = recs(c.work / "async", "event")[0]["message"] if (c.work / "async" / "metrics.jsonl").exists() else ""
    out = {"kernel": c.best(), "checkpoints": ckpts, "exit": proc.returncode, "start": start}
    if proc.returncode or len(ckpts) < 2:
        return {**out, "status": "fail", "reason": "async run failed or its checkpoints did not land"}
    back = train(c.cfg("async-read", 10, **{**kw, "checkpoint": {"every": 10**6}}, train={"stop_at_step": 6}),
                 resume=str(ckdir / "step_00000005"))
    if back.returncode:
        return {**out, "status": "fail", "reason": "resuming the async step_00000005 failed"}
    wrote = {r["step"]: r["loss_step"] for r in recs(c.work / "async")}
    read = {r["step"]: r["loss_step"] for r in recs(c.work / "async-read")}
    equal = sorted(read) == [5] and read[5] == wrote.get(5)
    return {**out, "read_back": {"step": 5, "loss_written_run": wrote.get(5), "loss_resumed": read.get(5), "bit_equal": equal},
            "status": "pass" if equal else "fail", **({} if equal else {"reason": "the resumed step's loss differs"})}


def check_trace(c: Ctx) -> dict:
    proc = train(c.cfg("trace", 10, profile={"start": 6, "steps": 3}))
    events = [e for e in recs(c.work / "trace", "event") if e["event"] == "profile"] if proc.returncode == 0 else []
    if not events:
        return {"status": "fail", "kernel": c.best(), "reason": "no profile event"}
    ev = events[0]
    ops = Path(ev["ops"]).read_text().splitlines()
    print("\n".join(ops[:28]))
    return {"status": "pass", "kernel": c.best(), "device_busy": ev.get("device_busy"), "host_ops_per_step": ev.get("host_ops_per_step"),
            "window_ms": ev.get("window_ms"), "ops_table_head": ops[:16]}


def check_small(c: Ctx) -> dict:
    seq = c.small_pack()[1]
    rows = 8 if c.dry else 32
    variants = {"eager": {}, "compiled": {"compile": True},
                "cudagraphs": {"compile": True, "compile_mode": "reduce-overhead", "global_batch": None,
                               "micro_batch": None, "batch_tokens": rows * seq, "micro_batch_tokens": rows * seq // 2}}
    # CUDA graphs replay only one shape: varlen boundaries padded to micro rows x (the pack's most
    # documents in a row + 1), measured at start (trainer-audit-s5 C2)
    graphs_data = {"max_docs_per_row": "auto"}
    # Like for like (trainer-audit-s5 C3): no wrapper (CUDA graphs cannot capture FSDP2's hooks) and no
    # per-step host read of the guard, in all three.
    same = dict(parallel={"strategy": "none"}, guard={"enabled": False})
    if c.dry:  # CPU: the eager path is every other check's, the compile path mfu_1b's; here the CUDA-graph fallback
        del variants["eager"], variants["compiled"]
    out, ok = {}, True
    for name, tr in variants.items():
        proc = train(c.cfg(f"small-{name}", 6 if c.dry else 20, train=tr, data=graphs_data if name == "cudagraphs" else None,
                           **same))
        if proc.returncode:
            out[name], ok = {"status": "fail"}, False
            continue
        st = steady(c.work / f"small-{name}", skip=1 if c.dry else 2)
        notes = [e["message"] for e in recs(c.work / f"small-{name}", "event") if e["event"] == "note"]
        out[name] = {"tokens_per_s": st["tokens_per_s"], "mfu": st["mfu"], "mfu_causal": st["mfu_causal"], "notes": notes}
    best = max((v.get("mfu") or 0 for v in out.values()), default=0)
    met = None if c.dry else best >= MFU_SMALL_TARGET
    return {"status": "pass" if ok else "fail", "kernel": c.best(), "variants": out, "best_mfu": best,
            "mfu_target": MFU_SMALL_TARGET, "target_met": met}


def check_multi(c: Ctx) -> dict:
    n = c.gpus
    micro = 2 if c.dry else 4
    gb = micro * n * 2  # two accumulation steps at any GPU count: 8 GPUs -> 64 rows, never a geometry error
    out, ok, finals = {"gpus": n, "global_batch": gb, "micro_batch": micro}, True, {}
    for strategy in ("fsdp", "ddp"):
        proc = train(c.cfg(f"multi-{strategy}", 4 if c.dry else 10, train={"global_batch": gb, "micro_batch": micro}),
                     f"parallel.strategy={strategy}", nproc=n, env={"OMP_NUM_THREADS": "1"} if c.dry else None)
        ok = ok and proc.returncode == 0
        finals[strategy] = recs(c.work / f"multi-{strategy}")[-1]["loss"] if proc.returncode == 0 else None
    agree = ok and abs(finals["fsdp"] - finals["ddp"]) <= 3e-2 * abs(finals["ddp"])
    return {**out, "final_loss": finals, "agree_bf16": agree, "status": "pass" if ok and agree else "fail", "kernel": c.best()}


RUN = {"kernels": check_kernels, "resume": check_resume, "mfu_1b": check_mfu_1b, "async_save": check_async_save,
       "trace": check_trace, "small": check_small, "multi": check_multi}


# ---------------------------------------------------------------- the orchestrator

def run_check(name: str, work: Path, out: Path, dry: bool, timeout: float, strategy: str | None = None) -> tuple[int | None, str]:
    """The check in its own process group (its trainers with it): killed whole at the timeout."""
    cmd = [sys.executable, __file__, "--check", name, "--work", str(work), "--out", str(out)] + (["--dry"] if dry else [])
    cmd += ["--strategy", strategy] if strategy else []
    log_path = work / f"{name}.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = None
    return code, log_path.read_text(errors="replace")


def load_result(path: Path, code: int | None) -> dict:
    """A check's landed JSON; one that cannot be read is a failure of that check, not of the run."""
    if not path.exists():
        return {"status": "fail", "reason": f"check process exited {code} without a result"}
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        return {"status": "fail", "reason": f"unreadable result ({err})"}


def orchestrate(out: Path, dry: bool, deadline: float, only: set[str], strategy: str | None = None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    for stale in [out / f"{c.name}.json" for c in CHECKS] + [out / "summary.json", out / "bench.log"]:
        stale.unlink(missing_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-gpu-"))  # packs and run dirs: big, not results
    summary = {"mode": "dry-run" if dry else "lease", **environment(), "deadline_s": deadline,
               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "strategy": strategy or "per check",
               "plan": [{"check": c.name, "estimate_s": c.estimate_s, "timeout_s": c.timeout_s} for c in CHECKS], "checks": {}}
    t_start = time.time()
    print(f"bench_gpu {summary['mode']}: torch {summary['torch']}, CUDA {summary['cuda']}, driver {summary['driver']}, "
          f"{summary['gpus']} x {summary['gpu']}", flush=True)
    try:
        for check in CHECKS:
            t0, left = time.time(), deadline - (time.time() - t_start)
            if check.name not in only:
                res = {"status": "skipped", "reason": "not in --only"}
            elif check.name == "multi" and not dry and summary["gpus"] < 2:
                res = {"status": "skipped", "reason": f"{summary['gpus']} GPU(s): multi-GPU needs 2 or more"}
            elif not dry and left < check.estimate_s:
                res = {"status": "skipped", "reason": f"deadline: estimate {check.estimate_s} s, {left:.0f} s left (run it with --only)"}
            else:
                limit = DRY_TIMEOUT if dry else min(check.timeout_s, left)
                code, log = run_check(check.name, work, out, dry, limit, strategy)
                with open(out / "bench.log", "a") as f:
                    f.write(f"===== {check.name} (exit {code}, {time.time() - t0:.0f} s)\n{log}\n")
                landed = out / f"{check.name}.json"
                if code is None:
                    res = {"status": "timeout", "reason": f"over {limit:.0f} s"}
                else:
                    res = load_result(landed, code)
                res["log_tail"] = log[-1500:]
            res["seconds"] = round(time.time() - t0, 1)
            if res["status"] != "skipped":  # skipped: summary only (a lease returns at most 8 files)
                write_json(out / f"{check.name}.json", res)
            summary["checks"][check.name] = {k: v for k, v in res.items() if k not in ("log_tail", "records", "ops_table_head")}
            summary["elapsed_s"] = round(time.time() - t_start, 1)
            write_json(out / "summary.json", summary)
            print(f"[{res['status'].upper()}] {check.name} ({res['seconds']} s) {res.get('reason', '')}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    bad = [n for n, r in summary["checks"].items() if r["status"] in ("fail", "timeout")]
    print(f"{len(bad)} failed or timed out ({', '.join(bad) or 'none'}); {summary['elapsed_s']} s; results in {out}")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lease", metavar="OUT_DIR", help="the acceptance run on this machine's GPU(s), results to OUT_DIR")
    ap.add_argument("--dry-run", metavar="OUT_DIR", help="the same control flow on CPU with tiny shapes")
    ap.add_argument("--deadline", type=float, default=400, help="seconds: no check starts that its estimate says cannot end by then, "
                                                                "and none runs past it")
    ap.add_argument("--only", default=",".join(c.name for c in CHECKS), help="comma-separated checks")
    ap.add_argument("--strategy", choices=["none", "fsdp"], help="parallel.strategy of every one-process trainer run "
                    "(none: no 1-rank NCCL group, bf16 autocast; to rerun the checks if that group misbehaves); "
                    "default: each check's own (auto = FSDP2 on one GPU)")
    ap.add_argument("--check", help=argparse.SUPPRESS)  # internal: one check in this process
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--dry", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.check:
        t0 = time.time()
        res = RUN[a.check](Ctx(Path(a.work), a.dry, a.strategy))
        res["seconds"] = round(time.time() - t0, 1)
        write_json(Path(a.out, f"{a.check}.json"), res)
        return 0
    only = set(a.only.split(","))
    if only - set(RUN):
        ap.error(f"--only: unknown {sorted(only - set(RUN))}; checks: {', '.join(RUN)}")
    if a.dry_run:
        return orchestrate(Path(a.dry_run), True, a.deadline, only, a.strategy)
    import torch

    if not torch.cuda.is_available():
        from training.cuda_driver import driver_version, unavailable_reason

        why = unavailable_reason(driver_version(), torch.version.cuda, torch.__version__)
        if a.lease:
            print(f"bench_gpu --lease: torch sees no CUDA device{': ' + why if why else ''}", file=sys.stderr)
            return 2
        # exit 0: `make bench` runs every CPU benchmark after this one
        print("bench_gpu: needs a CUDA GPU; skipped" + (f" ({why})" if why else "")
              + " (on CPU: --dry-run OUT_DIR runs the same checks with tiny shapes)")
        return 0
    if not a.lease:
        ap.error("give --lease OUT_DIR (results land there check by check)")
    return orchestrate(Path(a.lease), False, a.deadline, only, a.strategy)


if __name__ == "__main__":
    sys.exit(main())
