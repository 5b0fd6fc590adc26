"""Atomic, world-size independent checkpoints.

A checkpoint is a directory ``step_00001000/``:

- ``state/``    model + optimizer through torch.distributed.checkpoint (DCP). Tensors are
                stored by fully-qualified name with their global shape, each rank writing
                its own shards, so a checkpoint written by 2 FSDP2 ranks loads on 1 process
                (or 8) and vice versa. ``get_state_dict`` / ``set_state_dict`` hide whether
                the model is plain, DDP or FSDP2.
- ``meta.json`` step, world size, and the ``state_dict()`` of every training-state component
                it is handed, under the component's name (data position, LR schedule,
                phase plan, guard, token counters), plus descriptive fields (config
                snapshot, reason, lineage).
- ``rng.pt``    rank 0's torch / numpy / python RNG states.

Everything is written into ``.tmp-step_...`` and renamed into place by rank 0 once every
rank has finished, then the ``latest`` pointer file is replaced (also atomically). A kill
at any moment leaves either the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import warnings
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from training.parallel import DistEnv, barrier, broadcast_object

LATEST = "latest"


class Stateful(Protocol):
    """Training state besides model and optimizer; its state is JSON (it goes to meta.json)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def step_of(path: Path) -> int:
    return int(Path(path).name.split("_")[-1])


class Checkpointer:
    """Saves to ``directory/step_XXXXXXXX``, keeps the last ``keep``, maintains ``latest``."""

    def __init__(self, directory: str | Path, keep: int, env: DistEnv):
        self.dir, self.keep, self.env = Path(directory), keep, env
        if env.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, components: dict[str, Stateful], info: dict | None = None) -> Path:
        """Collective: every rank must call it. Returns the final checkpoint path.

        meta.json holds each component's state under its name, and ``info`` (descriptive
        fields nothing restores from).
        """
        name = f"step_{step:08d}"
        final, tmp = self.dir / name, self.dir / f".tmp-{name}"
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        barrier(self.env)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        with warnings.catch_warnings():  # single process: DCP warns that it is not distributed
            warnings.simplefilter("ignore", UserWarning)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "state"), no_dist=not self.env.distributed)
        if self.env.is_main:
            rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
            if torch.cuda.is_available():
                rng["cuda"] = torch.cuda.get_rng_state_all()
            torch.save(rng, tmp / "rng.pt")
            meta = {**(info or {}), **{key: c.state_dict() for key, c in components.items()}}
            meta.update(step=step, world_size=self.env.world)
            _write_atomic(tmp / "meta.json", json.dumps(meta, indent=1, sort_keys=True))
        barrier(self.env)  # every rank's shards are on disk before the rename makes them visible
        if self.env.is_main:
            if final.exists():  # the same step saved again (e.g. after a resume): replace it
                trash = self.dir / f".old-{name}"
                shutil.rmtree(trash, ignore_errors=True)
                os.replace(final, trash)
                os.replace(tmp, final)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.replace(tmp, final)
            _write_atomic(self.dir / LATEST, name + "\n")
            self._prune(keep=final)
        barrier(self.env)
        return final

    def _prune(self, keep: Path) -> None:
        done = sorted((p for p in self.dir.glob("step_*") if p.is_dir()), key=step_of)
        for old in done[: -self.keep]:
            if old != keep:
                shutil.rmtree(old, ignore_errors=True)

    def latest(self) -> Path | None:
        """The newest complete checkpoint (the ``latest`` pointer, else the highest step dir)."""
        pointer = self.dir / LATEST
        if pointer.exists():
            path = self.dir / pointer.read_text().strip()
            if (path / "meta.json").exists():
                return path
        done = sorted((p for p in self.dir.glob("step_*") if (p / "meta.json").exists()), key=step_of)
        return done[-1] if done else None


def read_meta(path: str | Path) -> dict:
    """A checkpoint's meta.json (accepts the checkpoint dir or a run's checkpoints dir)."""
    path = resolve(path)
    return json.loads((path / "meta.json").read_text())


def resolve(path: str | Path) -> Path:
    """Accept a checkpoint dir, or a directory holding a ``latest`` pointer."""
    path = Path(path)
    if (path / "meta.json").exists():
        return path
    if (path / LATEST).exists():
        return path / (path / LATEST).read_text().strip()
    if (path / "checkpoints" / LATEST).exists():
        return resolve(path / "checkpoints")
    raise FileNotFoundError(f"{path}: not a checkpoint (no meta.json) and no 'latest' pointer")


def load(path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer | None, env: DistEnv, components: dict[str, Stateful] | None = None) -> dict:
    """Load model (+ optimizer) state into an already wrapped model, and each component's
    state from meta.json (a component the checkpoint has no state for keeps its own: it was
    written before that component existed). Returns meta.json.

    Collective. Works whatever the world size was when the checkpoint was written.
    """
    path = resolve(path)
    optimizers = [optimizer] if optimizer is not None else []
    model_sd, optim_sd = get_state_dict(model, optimizers)
    state = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = optim_sd
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(path / "state"), no_dist=not env.distributed)
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state.get("optim", {}))
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])
    meta = broadcast_object(json.loads((path / "meta.json").read_text()), env)
    for name, component in (components or {}).items():
        if name in meta:
            component.load_state_dict(meta[name])
    return meta
