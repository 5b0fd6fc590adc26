"""Exact selection by digit histograms over shards.

Keys are spread over many shards and the driver wants a cut among them: the k-th largest
quality score (``quality_top``, ``curation.quality.topk``), or, per source, the document where
ascending keys' cumulative tokens pass a budget (``mix``, ``curation.sampling.mixture``). No
key list is ever gathered. Keys are read as digits of ``BITS`` bits, high first: shards send a
histogram of the first digit, the driver adds them and picks the bin that holds the cut
(``choose``), then asks the shards for the next digit's histogram among the keys in that bin
(``KeyPrefix``: the digits fixed so far), and so on, only while the bin holds more than
``gather_cap`` keys and digits remain. The shards then send the few keys left in the bin and
the driver cuts exactly among them. The driver holds one histogram per search and at most
``gather_cap`` candidates (more only on a massive tie: keys equal in every digit).

``narrow`` is that driver loop; the refine and gather steps are the caller's (a stage runs them
as phases over its shards).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Hashable

import numpy as np

#: the final bin is gathered once it holds at most this many keys
GATHER_CAP = 100_000


@dataclass(frozen=True)
class KeyPrefix:
    """The first ``level`` digits (``BITS`` bits each, high first) of ``KEY_BITS``-bit keys."""

    BITS: ClassVar[int]
    KEY_BITS: ClassVar[int]

    level: int = 0
    value: int = 0

    @classmethod
    def bins(cls) -> int:
        """Values of one digit (bins of a histogram)."""
        return 1 << cls.BITS

    @classmethod
    def levels(cls) -> int:
        """Digits of a key."""
        return cls.KEY_BITS // cls.BITS

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
        d = (keys[m] >> self._shift(self.level + 1)) & np.uint64(self.bins() - 1)
        return m, d.astype(np.int64)

    def extend(self, digit: int) -> KeyPrefix:
        return type(self)(self.level + 1, (self.value << self.BITS) | digit)


#: ``choose(weights, need) -> (bin, bins passed)``: the bin of the next digit that holds the cut,
#: given the weight per bin and the weight still ``need``ed; the bins passed are the ones
#: wholly on the selected side of the cut (a slice of the histogram)
Chooser = Callable[[np.ndarray, int], tuple[int, slice]]


@dataclass
class Search:
    """One selection: the prefix fixed so far, the weight still needed inside it, and the
    histogram of the next digit among its keys (keys per bin, and their weight per bin: the
    same array when every key weighs one). ``keys_passed``/``weight_passed`` add up the bins
    passed on the way (wholly selected, or wholly not, as the chooser decides)."""

    prefix: KeyPrefix
    need: int
    keys: np.ndarray
    weights: np.ndarray
    keys_passed: int = 0
    weight_passed: int = 0


def narrow(searches: dict[Hashable, Search], choose: Chooser,
           refine: Callable[[int, dict[Hashable, KeyPrefix]], dict[Hashable, tuple[np.ndarray, np.ndarray]]],
           gather_cap: int = GATHER_CAP) -> int:
    """Fix digits of every search's prefix, in lockstep, until its chosen bin holds at most
    ``gather_cap`` keys or every digit is fixed. ``refine(level, prefixes)`` returns, for each
    search still narrowing, the merged (keys, weights) histograms of the next digit among the
    keys with its new prefix (one pass over the shards). Updates the searches in place;
    returns the number of refine passes."""
    active = dict(searches)
    passes = 0
    while active:
        for name, s in list(active.items()):
            b, passed = choose(s.weights, s.need)
            below = int(s.weights[passed].sum())
            s.prefix, s.need = s.prefix.extend(b), s.need - below
            s.weight_passed += below
            s.keys_passed += int(s.keys[passed].sum())
            if s.keys[b] <= gather_cap or s.prefix.level == s.prefix.levels():
                del active[name]
        if not active:
            break
        level = next(iter(active.values())).prefix.level
        for name, (keys, weights) in refine(level, {n: s.prefix for n, s in active.items()}).items():
            active[name].keys, active[name].weights = np.asarray(keys, np.int64), np.asarray(weights, np.int64)
        passes += 1
    return passes
