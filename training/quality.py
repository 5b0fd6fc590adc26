"""Time to quality: when a run's held-out loss reaches each target, and its loss at fixed token
budgets, so data choices are compared by what they cost to reach a quality, not by step speed.

Tokens are the training tokens that carry loss, summed over ranks (a step's ``n_global``); wall
seconds are the run's training time (over resumes: the count is checkpointed), without the time
spent evaluating, so the figures do not depend on ``eval.every``. A target is reached at the
first eval whose loss is at or below it (resolution: ``eval.every`` steps); a budget's loss is
measured by an eval at the first step whose tokens reach it.
"""

from __future__ import annotations

import time

import torch


def _key(x: float) -> str:
    return f"{x:g}"


class TimeToQuality:
    """Counts tokens and wall time; records targets reached and the loss at token budgets."""

    def __init__(self, targets: list[float], budgets: list[float]):
        self.targets, self.budgets = list(targets), list(budgets)
        self.tokens = 0.0
        self.wall_s = 0.0
        self.reached: dict[str, dict] = {}  # target -> {step, tokens, wall_s, eval_loss}
        self.at_budget: dict[str, dict] = {}  # budget -> {step, tokens, wall_s, eval_loss}
        self._pending: torch.Tensor | None = None  # device token counts not read yet (guard off)
        self._clock: float | None = None  # perf_counter when the clock last started

    # -- counting ---------------------------------------------------------------------------
    def start(self) -> None:
        self._clock = time.perf_counter()

    def pause(self) -> None:
        if self._clock is not None:
            self.wall_s += time.perf_counter() - self._clock
            self._clock = None

    def add(self, n: float | torch.Tensor) -> None:
        """One step's global tokens with loss: a float, or a device tensor summed on the device
        (no host read inside a step with the guard off) and read when a figure is needed."""
        if isinstance(n, torch.Tensor):
            self._pending = n.detach().double() if self._pending is None else self._pending + n.detach().double()
        else:
            self.tokens += float(n)

    def read(self) -> tuple[float, float]:
        """(tokens, wall seconds) now."""
        if self._pending is not None:
            self.tokens += float(self._pending)
            self._pending = None
        wall = self.wall_s + (time.perf_counter() - self._clock if self._clock is not None else 0.0)
        return self.tokens, wall

    # -- what an eval says ------------------------------------------------------------------
    def budget_due(self) -> float | None:
        """The first token budget reached and not measured yet (reads the token count)."""
        if not self.budgets or len(self.at_budget) == len(self.budgets):
            return None
        tokens, _ = self.read()
        due = [b for b in self.budgets if _key(b) not in self.at_budget and tokens >= b]
        return due[0] if due else None

    def on_eval(self, step: int, loss: float, budget: float | None = None) -> list[dict]:
        """Record one eval; returns the events to log (targets newly reached, the budget)."""
        tokens, wall = self.read()
        point = {"step": step, "tokens": tokens, "wall_s": round(wall, 3), "eval_loss": loss}
        events = []
        for t in self.targets:
            if _key(t) not in self.reached and loss <= t:
                self.reached[_key(t)] = point
                events.append({"event": "target_reached", "target": t, **point,
                               "message": f"eval loss {loss:.4f} <= target {t:g} after {tokens:,.0f} tokens, {wall:.1f} s"})
        if budget is not None:
            self.at_budget[_key(budget)] = point
            events.append({"event": "token_budget", "budget": budget, **point,
                           "message": f"token budget {budget:,.0f}: eval loss {loss:.4f} (at {tokens:,.0f} tokens, {wall:.1f} s)"})
        return events

    def summary(self) -> dict:
        tokens, wall = self.read()
        return {"tokens": tokens, "wall_s": round(wall, 3),
                "targets": {_key(t): self.reached.get(_key(t)) for t in self.targets},
                "token_budgets": {_key(b): self.at_budget.get(_key(b)) for b in self.budgets}}

    # -- checkpointed -----------------------------------------------------------------------
    def state_dict(self) -> dict:
        tokens, wall = self.read()
        return {"tokens": tokens, "wall_s": wall, "reached": self.reached, "at_budget": self.at_budget}

    def load_state_dict(self, state: dict) -> None:
        self.tokens, self.wall_s = float(state["tokens"]), float(state["wall_s"])
        self.reached, self.at_budget = dict(state["reached"]), dict(state["at_budget"])
        self._pending = None
