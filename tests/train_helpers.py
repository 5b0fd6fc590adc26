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


def records(run_dir: Path, kind: str = "train") -> list[dict]:
    """The records of one kind in the run's metrics.jsonl, in order."""
    return [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if r["kind"] == kind]


def losses(run_dir: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in records(run_dir)}


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
