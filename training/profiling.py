"""A window of training steps under ``torch.profiler``, written where a run's files go.

``profile: {start: S, steps: N}`` in the config records steps S .. S+N-1 (after one warm-up
step, S-1, which the profiler needs to settle) on the ranks in ``profile.ranks``: each writes

- ``RUN_DIR/profile/rank{R}_steps{S}-{E}.json``: a Chrome trace (chrome://tracing, Perfetto),
  every training step a ``train_step N`` range, CUDA kernels beside the host ops on a GPU;
- ``RUN_DIR/profile/rank{R}_steps{S}-{E}_ops.txt``: the ops by their own time (device time on a
  GPU, host time on CPU), the first question about a slow step: is it the kernels, or the host
  between them?

and the metrics log gets a ``profile`` event naming both files, the top three ops and the window's
shape (``window_summary``): how much of it the device was busy and how many host ops a step
dispatched. A GPU busy a quarter of the step is waiting on the host (reported for the ~125M model
on an H100, 24%, no output committed: bench_gpu.py's trace check measures it), not on its kernels. As in
torchtitan, a window of a few steps after compilation and warm-up is the useful one; the run
goes on as before around it (the profiler's cost stays inside the window).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import torch

from training.files import atomic_path, write_text_atomic

#: ops listed in the ``_ops.txt`` table
TOP_OPS = 40


class StepProfiler:
    """``step_range(step)`` around each step's work; ``after_step(step)`` after it. Inactive
    (two cheap calls a step) unless the config has a window (``cfg`` not None), this rank
    profiles and the window is ahead."""

    def __init__(self, cfg, run_dir: Path, rank: int, device: torch.device, start_step: int, log):
        self.cfg, self.rank, self.device, self.log = cfg, rank, device, log
        self.prof: torch.profiler.profile | None = None
        self.enabled = False
        if cfg is None:
            return
        self.out = Path(cfg.dir) if cfg.dir else Path(run_dir) / "profile"
        self.first, self.last = cfg.start, cfg.start + cfg.steps - 1
        # the window is in training steps: a run resumed after its warm-up step does not profile
        self.enabled = rank in cfg.ranks and start_step <= self.first - 1

    def _make(self) -> torch.profiler.profile:
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        return torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=0, warmup=1, active=self.cfg.steps, repeat=1),
            on_trace_ready=self._write,
            record_shapes=self.cfg.record_shapes,
            profile_memory=self.cfg.memory,
            with_stack=False,
        )

    def step_range(self, step: int):
        if not self.enabled:
            return contextlib.nullcontext()
        if step == self.first - 1 and self.prof is None:  # the warm-up step opens the window
            self.out.mkdir(parents=True, exist_ok=True)
            self.prof = self._make()
            self.prof.start()
        if self.prof is None:
            return contextlib.nullcontext()
        return torch.profiler.record_function(f"train_step {step}")

    def after_step(self, step: int) -> None:
        if self.prof is None:
            return
        self.prof.step()  # the schedule calls _write after the last active step
        if step >= self.last:
            self.close()

    def close(self) -> None:
        """End the window early (the run stopped inside it): what was recorded is written."""
        if self.prof is not None:
            prof, self.prof = self.prof, None
            prof.stop()
            self.enabled = False

    def _write(self, prof: torch.profiler.profile) -> None:
        stem = self.out / f"rank{self.rank}_steps{self.first}-{self.last}"
        trace = stem.with_suffix(".json")
        with atomic_path(trace) as part:  # renamed when whole: a kill never leaves half a trace
            prof.export_chrome_trace(str(part))
        key = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        averages = prof.key_averages()
        table = averages.table(sort_by=key, row_limit=TOP_OPS)
        shape = window_summary(json.loads(trace.read_text()))
        ops = Path(f"{stem}_ops.txt")
        write_text_atomic(ops, f"steps {self.first}-{self.last} on rank {self.rank} ({self.device}), ops by {key}\n{table}\n"
                                f"{shape_line(shape)}\n")
        top = sorted((e for e in averages if not e.key.startswith(("train_step", "ProfilerStep"))),
                     key=lambda e: getattr(e, key), reverse=True)[:3]
        per_step = ", ".join(f"{e.key} {getattr(e, key) / 1e3 / self.cfg.steps:.1f} ms" for e in top)
        self.log({"kind": "event", "step": self.last, "event": "profile",
                  "message": f"steps {self.first}-{self.last} profiled: {trace.name}, {ops.name}; "
                             f"top ops per step by {key.replace('_total', '')}: {per_step}; {shape_line(shape)}",
                  "trace": str(trace), "ops": str(ops), **shape})


#: trace event categories that occupy the device
DEVICE_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _union_us(spans: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(spans):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def window_summary(trace: dict) -> dict:
    """From a Chrome trace of the window: ``window_ms`` (first step's start to last step's end),
    ``steps``, ``device_busy`` (share of the window with a kernel or copy running: the union of
    their intervals; None without device events, as on CPU) and ``host_ops_per_step``."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    # the host's step ranges (on a GPU the trace repeats each on the device's timeline)
    steps = [e for e in events if str(e.get("name", "")).startswith("train_step ") and e.get("cat") != "gpu_user_annotation"]
    if not steps:
        return {"window_ms": 0.0, "steps": 0, "device_busy": None, "host_ops_per_step": 0}
    lo = min(e["ts"] for e in steps)
    hi = max(e["ts"] + e["dur"] for e in steps)
    device = [(max(e["ts"], lo), min(e["ts"] + e["dur"], hi)) for e in events
              if e.get("cat") in DEVICE_CATS and e["ts"] < hi and e["ts"] + e["dur"] > lo]
    host_ops = sum(1 for e in events if e.get("cat") == "cpu_op" and lo <= e["ts"] < hi)
    return {"window_ms": (hi - lo) / 1e3, "steps": len(steps),
            "device_busy": _union_us(device) / (hi - lo) if device and hi > lo else None,
            "host_ops_per_step": host_ops // len(steps)}


def shape_line(shape: dict) -> str:
    busy = "no device events" if shape["device_busy"] is None else f"device busy {shape['device_busy']:.0%} of it"
    return (f"window {shape['window_ms']:,.0f} ms over {shape['steps']} steps, {busy}, "
            f"{shape['host_ops_per_step']:,} host ops per step")
