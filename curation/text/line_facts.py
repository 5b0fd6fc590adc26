"""The lines of a batch of texts (``str.splitlines``) with what C4's line rules read of each, from
one compiled pass over the UTF-8 bytes: where the line and its stripped part (``str.strip``) lie,
its ``str.split()`` word count, its longest such word and whether it holds a "[".

C4 reads every line of every page it sees and keeps a few; in Arrow the same facts took a split,
a trim, a length, a bracket scan and a word count over the lines (each a pass over the bytes and
most a copy of them), about half of the stage on the long bench pages. What the rules keep is
then cut from the bytes by the spans (``values``), so only surviving lines are copied. Every
line break of ``str.splitlines`` is whitespace to ``str.split`` and ``str.strip``, so one scan
finds lines, words and the stripped span together (a line's stripped span runs from its first
word's start to its last word's end).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
from numba import njit

from curation.text.arrow import byte_spans, text_bytes
from curation.text.counts import space_after

#: per byte: 0 none of these; 1 an ASCII Python whitespace byte (``str.isspace``) that breaks no
#: line (\t \x1f space); 2 a byte that may lead a multi-byte whitespace character that breaks no
#: line (E1: U+1680, E3: U+3000); 3 an ASCII line break (``str.splitlines``: \n \r \v \f \x1c
#: \x1d \x1e); 4 a byte that may lead a multi-byte whitespace character that may break one
#: (C2: U+0085 breaks, U+00A0 does not; E2: U+2028 and U+2029 break, U+2000-U+200A, U+202F,
#: U+205F do not). ``space_after`` decides the multi-byte ones, ``_break_width`` the breaks
_KIND = np.zeros(256, np.uint8)
_KIND[[9, 31, 32]] = 1
_KIND[[0xE1, 0xE3]] = 2
_KIND[[10, 11, 12, 13, 28, 29, 30]] = 3
_KIND[[0xC2, 0xE2]] = 4


@njit(cache=True, nogil=True)
def _break_width(b, i, e):
    """Bytes of the ``str.splitlines`` line break at ``i`` ("\\r\\n" is one), 0 if none."""
    c = b[i]
    if c == 0x0D:
        return 2 if i + 1 < e and b[i + 1] == 0x0A else 1
    if (0x0A <= c <= 0x0C) or (0x1C <= c <= 0x1E):
        return 1
    if c == 0xC2 and i + 1 < e and b[i + 1] == 0x85:
        return 2
    if c == 0xE2 and i + 2 < e and b[i + 1] == 0x80 and (b[i + 2] == 0xA8 or b[i + 2] == 0xA9):
        return 3
    return 0


@njit(cache=True, nogil=True)
def _line_facts(b, doff, kind):
    # at most one line per byte that can start a line break, plus one per text (the lines
    # are counted as they are cut: a counting pass of its own cost a fifth of the kernel)
    bound = len(doff) - 1
    for i in range(len(b)):
        bound += kind[b[i]] >= 3
    ls = np.empty(bound, np.int64)  # the line, without its break
    le = np.empty(bound, np.int64)
    ss = np.empty(bound, np.int64)  # its stripped part
    se = np.empty(bound, np.int64)
    words = np.empty(bound, np.int64)
    longest = np.empty(bound, np.int64)
    counts = np.zeros(len(doff) - 1, np.int64)
    k = 0
    for d in range(len(doff) - 1):
        i, e = doff[d], doff[d + 1]
        k0 = k
        line_start = i
        first = -1  # the line's first word's start, -1 before one
        last_end = i
        nw = 0
        most = 0
        while True:
            brk = 0
            at_end = i >= e
            if not at_end:
                t = kind[b[i]]
                w = 1 if t == 1 or t == 3 else (space_after(b, i, e) if t >= 2 else 0)
                if w == 0:  # a word: its bytes in a tight loop, up to the next whitespace
                    nw += 1
                    if first < 0:
                        first = i
                    s0 = i
                    i += 1
                    while i < e:
                        t = kind[b[i]]
                        if t != 0 and (t == 1 or t == 3 or space_after(b, i, e) > 0):
                            break
                        i += 1
                    last_end = i
                    most = max(most, i - s0)
                    continue
                if t >= 3:
                    brk = _break_width(b, i, e)
                if brk == 0:
                    i += w
                    continue
            elif line_start >= e:  # the text ended with a line break (or is empty): no line
                break
            # the line ends here: at a break, or at the text's end with text since the last one
            ls[k] = line_start
            le[k] = i
            ss[k] = first if first >= 0 else i
            se[k] = last_end if first >= 0 else i
            words[k] = nw
            longest[k] = most
            k += 1
            if at_end:
                break
            i += brk
            line_start = i
            first = -1
            nw = 0
            most = 0
            if i >= e:
                break
        counts[d] = k - k0
    return counts, ls[:k], le[:k], ss[:k], se[:k], words[:k], longest[:k]


@dataclass
class LineFacts:
    """Every line of a batch (``str.splitlines``), flat: ``offsets[d]:offsets[d + 1]`` are text
    ``d``'s. ``start``/``end``: the line's bytes without its break; ``s``/``e``: its stripped
    part; ``words``: ``len(line.split())``; ``longest``: bytes of its longest such word (at
    least its characters: ``longest_chars`` counts those, for the few lines that need it);
    ``bracket``: it holds a "[" (the only lines C4's citation rule can change)."""

    offsets: np.ndarray
    doc: np.ndarray
    start: np.ndarray
    end: np.ndarray
    s: np.ndarray
    e: np.ndarray
    words: np.ndarray
    longest: np.ndarray
    bracket: np.ndarray
    b: np.ndarray
    buf: pa.Buffer | None
    base: int

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def stripped(self, idx: np.ndarray) -> pa.Array:
        """The stripped lines ``idx`` (ascending) as Arrow strings, cut from the bytes."""
        return byte_spans(self.buf, self.base, self.s[idx], self.e[idx])

    def longest_chars(self, idx: np.ndarray) -> np.ndarray:
        """Characters of the longest ``str.split()`` word of each line ``idx`` (in Python: a
        rule on words of 1,000 characters asks this of a few lines a batch)."""
        return np.array([max((len(w) for w in line.split()), default=0) for line in self.stripped(idx).to_pylist()],
                        dtype=np.int64)

    def ends_with(self, idx: np.ndarray, table: np.ndarray) -> np.ndarray:
        """Whether each stripped line ``idx`` ends in a byte ``table`` marks (ASCII only: an
        ASCII byte is never inside a multi-byte character)."""
        end = self.e[idx]
        return (end > self.s[idx]) & table[self.b[np.maximum(end - 1, 0)]]

    def ends_with_dots(self, idx: np.ndarray) -> np.ndarray:
        """Whether each stripped line ``idx`` ends with "..."."""
        end, b = self.e[idx], self.b
        out = end - self.s[idx] >= 3
        for back in (1, 2, 3):
            out &= b[np.maximum(end - back, 0)] == 0x2E
        return out


def line_facts(texts: pa.Array) -> LineFacts:
    """The lines of every text and their facts (see ``LineFacts``), in one compiled pass."""
    b, doff, buf, base = text_bytes(texts)
    counts, ls, le, ss, se, words, longest = _line_facts(b, doff, _KIND)
    offsets = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    # lines holding a "[": one vectorised pass over the bytes, each found in the line spans
    bracket = np.zeros(len(ls), dtype=bool)
    at = np.flatnonzero(b == 0x5B)
    if len(at):
        bracket[np.searchsorted(ls, at, side="right") - 1] = True
    doc = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    return LineFacts(offsets, doc, ls, le, ss, se, words, longest, bracket, b, buf, base)
