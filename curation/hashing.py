"""64-bit integer mixing, the one home of splitmix64 (Steele, Lea & Flood 2014) and its
constants. Artifact headers, bucket files, Bloom bits, word ids and mix selections hold values
made with these functions: they must stay bit-exact.

- ``fmix64(x)``: the splitmix64 finaliser alone (a bijection with avalanche on every bit).
- ``splitmix64(x)``: ``GOLDEN`` added first, then ``fmix64`` (spreads small integers such as
  dictionary ids over 64 bits).
- ``splitmix64_one(x)``: the same for one ``np.uint64``, written so numba compiles it
  (``curation.text.kernels.mix64`` is ``njit(splitmix64_one)``).

A leaf: numpy only.
"""

from __future__ import annotations

import numpy as np

#: 2^64 / golden ratio, splitmix64's increment (also used as a salt and a second seed)
GOLDEN = 0x9E3779B97F4A7C15
#: the finaliser's multipliers
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB

_U30, _U27, _U31 = np.uint64(30), np.uint64(27), np.uint64(31)


def fmix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser over a uint64 array (a new array; ``x`` is not changed)."""
    t = x >> _U30
    x = x ^ t
    x *= np.uint64(MIX1)
    np.right_shift(x, _U27, out=t)  # one scratch array: these run over millions of words
    x ^= t
    x *= np.uint64(MIX2)
    np.right_shift(x, _U31, out=t)
    x ^= t
    return x


def splitmix64(x: np.ndarray) -> np.ndarray:
    """``fmix64(x + GOLDEN)`` over any integer array (wrapping)."""
    with np.errstate(over="ignore"):
        return fmix64(np.asarray(x).astype(np.uint64) + np.uint64(GOLDEN))


def splitmix64_one(x):
    """``splitmix64`` of one ``np.uint64`` (numba compiles this form)."""
    z = x + np.uint64(GOLDEN)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(MIX2)
    return z ^ (z >> np.uint64(31))
