"""A window of training steps under ``torch.profiler``, written where a run's files go.

``profile: {start: S, steps: N}`` in the config records steps S .. S+N-1 (after one warm-up
step, S-1, which the profiler needs to settle) on the ranks in ``profile.ranks``: each writes

- ``RUN_DIR/profile/rank{R}_steps{S}-{E}.json``: a Chrome trace (chrome://tracing, Perfetto),
  every training step a ``train_step N`` range, CUDA kernels beside the host ops on a GPU;
- ``RUN_DIR/profile/rank{R}_steps{S}-{E}_ops.txt``: the ops by their own time (device time on a
  GPU, host time on CPU), the first question about a slow step: is it the kernels, or the host
  between them?

and the metrics log gets a ``profile`` event naming both files and the top three ops. As in
torchtitan, a window of a few steps after compilation and warm-up is the useful one; the run
goes on as before around it (the profiler's cost stays inside the window).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

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
        prof.export_chrome_trace(str(trace))
        key = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        averages = prof.key_averages()
        table = averages.table(sort_by=key, row_limit=TOP_OPS)
        ops = Path(f"{stem}_ops.txt")
        ops.write_text(f"steps {self.first}-{self.last} on rank {self.rank} ({self.device}), ops by {key}\n{table}\n")
        top = sorted((e for e in averages if not e.key.startswith(("train_step", "ProfilerStep"))),
                     key=lambda e: getattr(e, key), reverse=True)[:3]
        per_step = ", ".join(f"{e.key} {getattr(e, key) / 1e3 / self.cfg.steps:.1f} ms" for e in top)
        self.log({"kind": "event", "step": self.last, "event": "profile",
                  "message": f"steps {self.first}-{self.last} profiled: {trace.name}, {ops.name}; "
                             f"top ops per step by {key.replace('_total', '')}: {per_step}",
                  "trace": str(trace), "ops": str(ops)})
