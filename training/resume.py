"""Where a run starts, and which phase plan and LR schedule apply from there.

A run starts fresh, continues from its own latest checkpoint (``auto``: also a preempted
anneal branch), from a given checkpoint, or branches an annealing phase off another run's
stable-phase checkpoint (``--anneal-from``). ``find_resume_point`` says which;
``resolve_plan`` gives the plan: the config's (which must still be the checkpoint's), the
checkpoint's own (an anneal branch's plan is authoritative), or a new branch cut from it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from training import checkpoint as ckpt
from training.config import ConfigError, TrainConfig
from training.data import PackedDataset, check_resume
from training.schedule import LRSchedule, Phases, branch_anneal, build_lr_schedule, plan_phases

#: Components a resume does not load: ``resolve_plan`` already settled the plan and LR
#: schedule (the checkpoint's, the config's or a branch's).
PLANNED = ("plans", "schedule")
#: ... nor, on a new anneal branch, the guard: its spike history and skip counts start afresh.
NOT_BRANCHED = ("guard",)


@dataclass(frozen=True)
class ResumePoint:
    """The checkpoint a run starts from (none: a fresh start), and its meta.json."""

    path: Path | None = None
    meta: dict | None = None
    branch: bool = False  # starts a new anneal branch off ``path``

    @property
    def step(self) -> int:
        return self.meta["step"] if self.meta is not None else 0

    def check_data(self, dataset: PackedDataset, cfg: TrainConfig, settings: dict | None = None) -> bool:
        """Refuse a data order the checkpoint cannot continue (``settings``: the order's,
        ``DataOrder.settings``); True when the shard set changed and that was allowed."""
        if self.meta is None:
            return False
        return check_resume(self.meta["data"], dataset, cfg.seed, cfg.train.global_batch, cfg.data.allow_data_change, settings)

    def restored(self, components: dict) -> dict:
        """The components to load from the checkpoint (by meta.json key)."""
        skip = PLANNED + (NOT_BRANCHED if self.branch else ())
        return {k: c for k, c in components.items() if k not in skip}

    def lineage(self, mix: dict[str, float] | None) -> dict:
        """Where this run comes from (logged at start; an anneal branch's goes into its checkpoints)."""
        if self.branch:
            return {"anneal_from": str(self.path), "at_step": self.step, "mix": mix}
        if self.meta is not None and "anneal" in self.meta:
            return {**self.meta["anneal"], "resumed_from": str(self.path)}
        return {"resumed_from": str(self.path) if self.path else None}


def anneal_record(lineage: dict) -> dict | None:
    """What an anneal branch's checkpoints record as ``anneal`` (None for other runs)."""
    if "anneal_from" in lineage or "at_step" in lineage:
        return {k: v for k, v in lineage.items() if k != "resumed_from"}
    return None


def find_resume_point(checkpointer: ckpt.Checkpointer, resume: str | None, anneal_from: str | None) -> ResumePoint:
    """``resume``: None / "auto" (this run's latest checkpoint, if any), "never"/"none", or a
    checkpoint path; ``anneal_from``: a checkpoint to branch from when there is none to resume."""
    own = checkpointer.latest()
    if resume in ("never", "none"):
        if own is not None:
            raise ConfigError(f"{checkpointer.dir} already has checkpoints; resume or pick a new run_dir")
        resume = None
    elif resume not in (None, "auto"):
        return _at(ckpt.resolve(resume))
    elif own is not None:  # auto: continue this run (also a preempted anneal branch)
        return _at(own)
    if anneal_from:
        parent = ckpt.resolve(anneal_from)
        if parent.parent.resolve() == checkpointer.dir.resolve():
            raise ConfigError("an anneal branch needs its own run_dir (e.g. --set run_dir=runs/NAME-anneal)")
        return _at(parent, branch=True)
    return ResumePoint()


def _at(path: Path, branch: bool = False) -> ResumePoint:
    return ResumePoint(path, ckpt.read_meta(path), branch)


def resolve_plan(cfg: TrainConfig, point: ResumePoint, source_rows: dict[str, int], data_changed: bool, mix: dict[str, float] | None,
                 source_tokens: dict[str, int] | None = None) -> tuple[Phases, LRSchedule]:
    """The phase plan and LR schedule: from the config, or from an anneal branch."""
    try:
        plans = plan_phases(cfg, source_rows, source_tokens)
    except ValueError as err:  # e.g. a mix names a source the data does not have
        raise ConfigError(f"phases: {err}") from None
    schedule = build_lr_schedule(cfg, plans)
    meta = point.meta
    if meta is not None and "anneal" in meta:  # resuming an anneal branch: its plan is authoritative
        plans.load_state_dict(meta["plans"])
        schedule.load_state_dict(meta["schedule"])
    elif meta is not None and meta["plans"] != plans.state_dict() and not (point.branch or data_changed):
        # (with allowed new data the natural mix weights legitimately move)
        brief = lambda ps: [(p["name"], p["start"], p["end"], p["weights"]) for p in ps]  # noqa: E731
        raise ConfigError(
            f"{cfg.run_dir}: the phases/steps in the config differ from the checkpoint's plan "
            f"(checkpoint {brief(meta['plans'])}, config {brief(plans.state_dict())}); "
            "the LR schedule and data order would change under the run. "
            "Branch with --anneal-from, or use a new run_dir"
        )
    if point.branch:
        if not mix:
            raise ConfigError("an anneal branch needs the annealing mix (--mix SOURCE=WEIGHT,...)")
        plans.load_state_dict(meta["plans"])
        schedule.load_state_dict(meta["schedule"])
        gb = cfg.train.global_batch
        steps = cfg.anneal.steps or (
            math.ceil(cfg.anneal.tokens / (gb * cfg.data.seq_len)) if cfg.anneal.tokens else None
        )
        if steps is None:
            raise ConfigError("an anneal branch needs a length: set anneal.steps or anneal.tokens (e.g. --set anneal.steps=200)")
        try:
            plans, schedule = branch_anneal(cfg, plans, schedule, meta["step"], mix, steps, source_rows)
        except ValueError as err:
            raise ConfigError(f"--mix: {err}") from None
    return plans, schedule
