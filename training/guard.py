"""Guard rails: which steps to skip (non-finite loss, grad-norm spikes), and when to stop."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from training.config import GuardConfig


class Guard:
    """Skip a step whose loss is not finite or whose grad norm spikes above
    ``spike_factor`` x the running median of recent accepted steps.

    A spike repeated on the next ``max_spike_skips`` batches is taken (clipped) instead:
    skipping leaves the model where it is, so when every new batch spikes the cause is the
    model state, not a batch, and only an update can move it (seen on the demo: one bad
    update, then 5 spiking batches in a row and a stopped run). OLMo-core's skip-step
    optimizer gets the same effect by keeping skipped steps in its rolling statistics.
    """

    def __init__(self, cfg: GuardConfig, state: dict | None = None):
        self.cfg = cfg
        self.note: str | None = None  # why the last verdict took a spiking step
        self.load_state_dict(state or {})

    def verdict(self, loss: float, grad_norm: float) -> str | None:
        """None to take the step, else the reason to skip it."""
        self.note = None
        if not math.isfinite(loss):
            return f"non-finite loss ({loss})"
        if not math.isfinite(grad_norm):
            return f"non-finite grad norm ({grad_norm})"
        if len(self.history) >= self.cfg.min_history:
            median = float(np.median(self.history))
            if grad_norm > self.cfg.spike_factor * median:
                spike = f"grad-norm spike ({grad_norm:.3g} > {self.cfg.spike_factor} x median {median:.3g})"
                if self.spikes >= self.cfg.max_spike_skips:
                    self.note = (f"{spike} after {self.spikes} skipped spike(s) in a row: the model moved, not "
                                 f"one batch; step taken with the gradient clipped")
                    return None
                self.spikes += 1
                return spike
        return None

    def accept(self, grad_norm: float) -> None:
        self.history.append(grad_norm)
        self.consecutive = 0
        self.spikes = 0

    def reject(self) -> bool:
        """Count a skip; True when the run must stop."""
        self.consecutive += 1
        return self.consecutive >= self.cfg.max_consecutive_skips

    def state_dict(self) -> dict:
        return {"history": list(self.history), "consecutive": self.consecutive, "spikes": self.spikes}

    state = state_dict  # the name tests/test_train_loop.py uses

    def load_state_dict(self, state: dict) -> None:
        # Missing keys start fresh: partial states (and older checkpoints) are fine.
        self.history: deque[float] = deque(state.get("history", []), maxlen=self.cfg.window)
        self.consecutive = state.get("consecutive", 0)
        self.spikes = state.get("spikes", 0)  # grad-norm spikes skipped in a row
