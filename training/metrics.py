"""Where training numbers go: a JSONL file (always), TensorBoard (if importable), the console.

Rank 0 writes ``RUN_DIR/metrics.jsonl``: one record per logging interval (``kind: train``),
per eval (``kind: eval``) and per event (``kind: event``: skipped steps, checkpoints,
stops). With ``log_row_ids`` every rank appends ``RUN_DIR/row_ids/rank{r}.jsonl``:
``{"step", "rank", "world", "rows": [global row ids]}`` per step.

On resume, records at or after the resume step are dropped from these files first, so
they always describe one lineage (a killed run may have logged steps it never saved).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from training.files import truncate_jsonl

#: Dense (no sparsity) bf16 tensor-core peak FLOP/s of one device, by a substring of its CUDA
#: name; the first match wins, so more specific names come first ("L40S" before "L4").
PEAK_FLOPS: list[tuple[str, float]] = [
    ("GB200", 2.5e15),
    ("B200", 2.25e15),
    ("GH200", 989e12),  # before "H200": Grace Hopper's GPU is an H200/H100 SXM part
    ("H200 NVL", 835e12),  # the PCIe card (NVL), like the H100 NVL: not the SXM peak
    ("H200", 989e12),  # SXM
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),  # SXM ("NVIDIA H100 80GB HBM3")
    ("H800", 989e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
]


def peak_flops(device: torch.device, override: float | None = None) -> float | None:
    """Peak FLOP/s of one device for MFU: ``override`` (``metrics.peak_flops`` /
    ``--peak-flops``) when given; else the table by CUDA device name; else None (CPU, or a GPU
    not in the table), and MFU is not logged."""
    if override is not None:
        return float(override)
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, value in PEAK_FLOPS:
        if key in name:
            return value
    return None


def mfu(flops_per_token: float, tokens_per_s: float, peak: float | None, devices: int = 1) -> float | None:
    """Model FLOPs utilisation: achieved model FLOP/s over the devices' peak (None without a peak)."""
    if not peak:
        return None
    return flops_per_token * tokens_per_s / (peak * devices)


class _Console:
    """A rich progress bar on a TTY, plain lines otherwise (CI logs, files)."""

    def __init__(self, mode: str, total: int, start: int):
        if mode == "auto":
            mode = "rich" if sys.stdout.isatty() else "plain"
        self.mode, self.progress = mode, None
        if mode == "rich":
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self.progress = Progress(
                TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.description}")
            )
            self.task = self.progress.add_task("", total=total, completed=start)
            self.progress.start()

    def update(self, step: int, rec: dict | None) -> None:
        if self.mode == "off":
            return
        line = None
        if rec is not None:
            line = _summary(rec)
        if self.progress is not None:
            self.progress.update(self.task, completed=step, description=line or self.progress.tasks[0].description)
        elif line is not None:
            print(line, flush=True)

    def message(self, text: str) -> None:
        if self.progress is not None:
            self.progress.console.print(text)
        elif self.mode != "off":
            print(text, flush=True)

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


def _summary(rec: dict) -> str:
    if rec.get("kind") == "eval":
        return f"step {rec['step']:>6} | eval loss {rec['eval_loss']:.4f}"
    parts = [f"step {rec['step']:>6}", f"loss {rec['loss']:.4f}", f"lr {rec['lr']:.2e}", f"gnorm {rec['grad_norm']:.2f}"]
    parts.append(f"{rec['tokens_per_s']:,.0f} tok/s")
    if rec.get("mfu") is not None:
        parts.append(f"mfu {rec['mfu']:.1%}")
    parts.append(f"wait {rec['data_wait_frac']:.1%}")
    return " | ".join(parts)


class MetricsLogger:
    """Rank 0 logs records; every rank may log its row ids. ``start_step`` trims old records."""

    def __init__(self, run_dir: str | Path, rank: int, world: int, total_steps: int, start_step: int, progress: str, tensorboard: bool, log_row_ids: bool):
        self.run_dir, self.rank, self.world = Path(run_dir), rank, world
        self.main = rank == 0
        self.path = self.run_dir / "metrics.jsonl"
        self.rows_path = self.run_dir / "row_ids" / f"rank{rank}.jsonl" if log_row_ids else None
        self._file = self._rows = self._tb = None
        if self.main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            truncate_jsonl(self.path, start_step)
            self._file = open(self.path, "a")
            if tensorboard:
                try:
                    from torch.utils.tensorboard import SummaryWriter

                    self._tb = SummaryWriter(str(self.run_dir / "tb"))
                except Exception:  # tensorboard not installed: JSONL only
                    self._tb = None
        if self.rows_path is not None:
            self.rows_path.parent.mkdir(parents=True, exist_ok=True)
            # Ranks beyond this run's world may have files from an earlier, wider run; each
            # rank trims its own, rank 0 also trims the ones no rank of this run owns.
            for p in self.rows_path.parent.glob("rank*.jsonl"):
                r = int(p.stem.removeprefix("rank"))
                if r == rank or (self.main and r >= world):
                    truncate_jsonl(p, start_step)
            self._rows = open(self.rows_path, "a")
        self.console = _Console(progress if self.main else "off", total_steps, start_step)

    def log(self, rec: dict) -> None:
        """Write one record (rank 0 only) and show it."""
        if not self.main:
            return
        rec = {"time": round(time.time(), 3), **rec}
        self._file.write(json.dumps(rec) + "\n")
        self._file.flush()
        if self._tb is not None:
            for k, v in rec.items():
                if isinstance(v, (int, float)) and k not in ("step", "time"):
                    self._tb.add_scalar(f"{rec.get('kind', 'train')}/{k}", v, rec["step"])
        if rec.get("kind") == "event":
            self.console.message(f"[step {rec['step']}] {rec['message']}")
        else:
            self.console.update(rec["step"] + 1, rec)

    def progress(self, step: int) -> None:
        if self.main:
            self.console.update(step, None)

    def rows(self, step: int, row_ids) -> None:
        if self._rows is not None:
            self._rows.write(json.dumps({"step": step, "rank": self.rank, "world": self.world, "rows": [int(r) for r in row_ids]}) + "\n")
            self._rows.flush()

    def close(self) -> None:
        self.console.close()
        for f in (self._file, self._rows):
            if f is not None:
                f.close()
        if self._tb is not None:
            self._tb.close()


def mix_table(run_dir: str | Path, plans: list) -> str:
    """Per phase and source: the weight and the realised share of content tokens, from the
    run's ``metrics.jsonl`` (one lineage, so it spans resumes). Printed at the end of a run."""
    by_phase: dict[str, dict[str, float]] = {}
    path = Path(run_dir) / "metrics.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        rec = json.loads(line)
        if rec.get("kind") == "train":
            acc = by_phase.setdefault(rec["phase"], {})
            for s, n in rec.get("content_tokens_by_source", {}).items():
                acc[s] = acc.get(s, 0.0) + n
    lines = [f"{'phase':<12} {'source':<12} {'weight':>7} {'tokens':>7}  (share of content tokens)"]
    for p in plans:
        got = by_phase.get(p.name, {})
        total = sum(got.values()) or 1.0
        for s in sorted(set(p.weights) | set(got)):
            lines.append(f"{p.name:<12} {s:<12} {p.weights.get(s, 0.0):>7.4f} {got.get(s, 0.0) / total:>7.4f}")
    return "\n".join(lines)
