"""Searching a distributed key distribution digit by digit: the prefix of the high digits
fixed so far. Shards send histograms of the next digit among their keys with the prefix; the
driver adds them and extends the prefix with the bin it needs (a quantile, a weighted cut),
so it never holds more than one histogram. Used by ``quality_top`` and ``mix``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np


@dataclass(frozen=True)
class KeyPrefix:
    """The first ``level`` digits (``BITS`` bits each, high first) of ``KEY_BITS``-bit keys."""

    BITS: ClassVar[int]
    KEY_BITS: ClassVar[int]

    level: int = 0
    value: int = 0

    def _shift(self, level: int) -> np.uint64:
        return np.uint64(self.KEY_BITS - self.BITS * level)

    def matches(self, keys: np.ndarray) -> np.ndarray:
        """Which keys start with this prefix."""
        if self.level == 0:
            return np.ones(len(keys), bool)
        return (keys >> self._shift(self.level)) == np.uint64(self.value)

    def next_digit(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask of keys with this prefix, their next digit)."""
        m = self.matches(keys)
        d = (keys[m] >> self._shift(self.level + 1)) & np.uint64((1 << self.BITS) - 1)
        return m, d.astype(np.int64)

    def extend(self, digit: int) -> KeyPrefix:
        return type(self)(self.level + 1, (self.value << self.BITS) | digit)
