"""What the loop counts: one logging interval's numbers (``Window``, this rank) and the
tokens seen over the whole run (``TokenCounts``, all ranks, checkpointed)."""

from __future__ import annotations

import numpy as np


class TokenCounts:
    """Tokens seen so far by source, over the whole run: resumes with the checkpoint.

    With ``sources`` the names are fixed, in that order (on resume onto changed data, the
    counts of sources the data no longer has are dropped); without, any name counts.
    """

    def __init__(self, sources: list[str] | None = None):
        self.fixed = sources is not None
        self.counts: dict[str, float] = {s: 0.0 for s in sources or []}

    def add(self, counts: dict[str, float]) -> None:
        for k, v in counts.items():
            self.counts[k] = self.counts.get(k, 0) + v

    def state_dict(self) -> dict[str, float]:
        return dict(self.counts)

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.counts = {s: float(state.get(s, 0)) for s in self.counts} if self.fixed else dict(state)


class Window:
    """Counters of one logging interval (this rank)."""

    def __init__(self, n_sources: int):
        self.by_source = np.zeros(n_sources, dtype=np.float64)
        self.content: dict[str, int] = {}
        self.loss_sum = self.data_time = self.step_time = 0.0
        self.steps = self.accepted = self.skipped = 0
        self.last_loss = self.last_grad_norm = float("nan")
        self.seq_len = 0

    def add(self, batch, loss: float, grad_norm: float, reason: str | None, data_time: float, step_time: float) -> None:
        self.by_source += batch.source_tokens
        self.steps += 1
        self.seq_len = batch.seq_len
        self.last_loss, self.last_grad_norm = loss, grad_norm
        self.data_time += data_time
        self.step_time += step_time
        if reason is None:
            self.accepted += 1
            self.loss_sum += loss
        else:
            self.skipped += 1
        for k, v in batch.content_tokens.items():
            self.content[k] = self.content.get(k, 0) + v
