"""The reference for ``markup.plain_view``: Markdown's plain-view rules (``markup.RULES``) run
as RE2 patterns through Arrow, in order, each group only on the texts holding one of its mark
bytes. Tests hold the compiled scans equal to this (as ``rules_reference`` is words.py's)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from curation.text.arrow import text_bytes
from curation.text.markup import RULES, one_string_array
from curation.text.segments import replace_regex_where

#: bit of each mark byte in ``_marks_held``'s per-text flags
_MARK_BITS = {m: 1 << i for i, m in enumerate(sorted({m for marks, _ in RULES for m in marks}))}
_LUT = np.zeros(256, dtype=np.uint16)
for _m, _bit in _MARK_BITS.items():
    _LUT[_m[0]] = _bit


def _marks_held(texts: pa.Array) -> np.ndarray:
    """Per text, the OR of ``_MARK_BITS`` of the mark bytes it holds: one pass over the bytes.
    Taken once, before any rule: rules only remove characters (or put back what they
    captured), so a text without a mark never gains one."""
    data, off, _, _ = text_bytes(texts)
    flags = np.zeros(len(texts), dtype=np.uint16)
    if len(data) == 0:
        return flags
    per_byte = _LUT[data]
    starts = off[:-1]
    nonempty = starts < off[1:]
    flags[nonempty] = np.bitwise_or.reduceat(per_byte, starts[nonempty])
    return flags


def plain_view_by_rules(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``plain_view`` by the rules themselves: each group's RE2 patterns through Arrow, in order,
    on the texts holding one of its bytes. The reference ``plain_view`` is held equal to."""
    out = one_string_array(texts)
    held = _marks_held(out)
    every = np.ones(len(out), dtype=bool)
    for marks, rules in RULES:
        out = replace_regex_where(out, (held & sum(_MARK_BITS[m] for m in marks)) != 0 if marks else every, rules)
    return out
