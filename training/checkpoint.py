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

With ``async_save`` the tensors are staged to host memory and written by ``dcp.async_save``
on a background thread (over its own gloo group, so its collectives never interleave with
training's) while training goes on; the rename happens at the next ``save`` or ``wait`` --
until then the checkpoint is invisible, as a synchronous one is until its rename.
"""

from __future__ import annotations

import datetime
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
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from training.files import write_text_atomic
from training.parallel import DistEnv, barrier, broadcast_object

LATEST = "latest"

#: The optimizer's state stored by parameter name, its hyperparameters too ("flat"): a pipeline
#: stage holds only some parameters, so per-group lists of names would not match on another
#: pipeline degree. Checkpoints written before this say nothing in meta.json and load as they were.
OPTIM_LAYOUT = "flat"  # what saves write


def _options(layout: str | None) -> StateDictOptions:
    return StateDictOptions(flatten_optimizer_state_dict=layout == "flat")


class Stateful(Protocol):
    """Training state besides model and optimizer; its state is JSON (it goes to meta.json)."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


def step_of(path: Path) -> int:
    return int(Path(path).name.split("_")[-1])


class Checkpointer:
    """Saves to ``directory/step_XXXXXXXX``, keeps the last ``keep``, maintains ``latest``."""

    def __init__(self, directory: str | Path, keep: int, env: DistEnv, async_save: bool = False, timeout_s: float = 1800):
        self.dir, self.keep, self.env, self.async_save = Path(directory), keep, env, async_save
        self._pending: tuple | None = None  # an async save still writing: (future, finish args)
        self._group = None
        import torch.distributed as dist

        # Whenever a process group exists, one rank included: on one GPU the trainer's 1-rank FSDP2
        # group is NCCL only, and dcp.async_save needs a CPU backend (it asserts otherwise).
        if async_save and dist.is_available() and dist.is_initialized():
            # collective: every rank builds it here; its timeout bounds the background writes' gathers
            self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        if env.is_main:
            self.dir.mkdir(parents=True, exist_ok=True)

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, components: dict[str, Stateful], info: dict | None = None) -> Path:
        """Collective: every rank must call it. Returns the final checkpoint path (with
        ``async_save``: where it will appear once written).

        meta.json holds each component's state under its name, and ``info`` (descriptive
        fields nothing restores from).
        """
        self.wait()
        name = f"step_{step:08d}"
        final, tmp = self.dir / name, self.dir / f".tmp-{name}"
        if self.env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        barrier(self.env)
        model_sd, optim_sd = get_state_dict(model, optimizer, options=_options(OPTIM_LAYOUT))
        # What rank 0 writes beside the tensors, taken now (the loop moves on under an async save).
        extra = None
        if self.env.is_main:
            rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
            if torch.cuda.is_available():
                rng["cuda"] = torch.cuda.get_rng_state_all()
            meta = {**(info or {}), **{key: c.state_dict() for key, c in components.items()}}
            meta.update(step=step, world_size=self.env.world, optimizer_layout=OPTIM_LAYOUT)
            extra = (rng, json.dumps(meta, indent=1, sort_keys=True))
        state, where = {"model": model_sd, "optim": optim_sd}, str(tmp / "state")
        with warnings.catch_warnings():  # single process: DCP warns that it is not distributed
            warnings.simplefilter("ignore", UserWarning)
            if self.async_save:
                # DCP works without a process group by itself (no `no_dist`: torch 2.6 has none)
                kw = {"process_group": self._group} if self._group is not None else {}
                self._pending = (dcp.async_save(state, checkpoint_id=where, **kw), (name, tmp, final, extra))
                return final
            dcp.save(state, checkpoint_id=where)
        self._finish(name, tmp, final, extra)
        return final

    def wait(self) -> None:
        """Finish an async save still in flight: wait for its writes, then make it visible.
        Collective (call it on every rank: before the next save, and at the end of a run)."""
        if self._pending is None:
            return
        future, args = self._pending
        self._pending = None
        future.result()
        self._finish(*args)

    def _finish(self, name: str, tmp: Path, final: Path, extra) -> None:
        if self.env.is_main:
            rng, meta = extra
            torch.save(rng, tmp / "rng.pt")
            write_text_atomic(tmp / "meta.json", meta)
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
            write_text_atomic(self.dir / LATEST, name + "\n")
            self._prune(keep=final)
        barrier(self.env)

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
    meta = json.loads((path / "meta.json").read_text())
    options = _options(meta.get("optimizer_layout"))
    optimizers = [optimizer] if optimizer is not None else []
    model_sd, optim_sd = get_state_dict(model, optimizers, options=options)
    state = {"model": model_sd}
    if optimizer is not None:
        state["optim"] = optim_sd
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.load(state, checkpoint_id=str(path / "state"))
    set_state_dict(model, optimizers, model_state_dict=state["model"], optim_state_dict=state.get("optim", {}), options=options)
    rng = torch.load(path / "rng.pt", weights_only=False)
    torch.set_rng_state(rng["torch"])
    np.random.set_state(rng["numpy"])
    random.setstate(rng["python"])
    if "cuda" in rng and torch.cuda.is_available() and len(rng["cuda"]) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(rng["cuda"])
    meta = broadcast_object(meta, env)
    for name, component in (components or {}).items():
        if name in meta:
            component.load_state_dict(meta[name])
    return meta
