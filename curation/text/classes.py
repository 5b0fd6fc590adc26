"""Per-character classes for the word splitter: the class bits (``curation.text.chars``) of
a code point, of a byte, and the per-process tables that cache them (each code point is
classified once, on first sight: a compiled lookup returns the ones not yet known)."""

from __future__ import annotations

import functools
import unicodedata

import numpy as np

from curation.text import kernels
from curation.text.chars import (
    ALPHA, BYTE_DIGIT, BYTE_DOT_AFTER, BYTE_LETTER, BYTE_LOWER, BYTE_NEEDS_RULES, BYTE_PREFIX, BYTE_PUNCTUATION,
    BYTE_SPACE, BYTE_SUFFIX, BYTE_TERMINAL, BYTE_UNICODE_PUNCT, BYTE_UPPER, CURRENCY, DEGREE_LETTER, DIGIT,
    DOT_AFTER, HYPHEN, IN_SPECIAL_CASE, INFIX_SYMBOL, LOWER, NEEDS_RULES, OPERATOR, OTHER_SYMBOL, PREFIX, PUNCT,
    PUNCTUATION, QUOTE, QUOTES, RULE_PUNCT, SPACE, SUFFIX, TERMINAL_PUNCTUATION, UNIT_STRINGS, UPPER,
)
from curation.text.special_cases import SPECIAL_CHARS

def char_flags(c: str) -> int:
    cat = unicodedata.category(c)
    so = cat == "So"
    f = (
        SPACE * c.isspace()
        | PREFIX * (so or c in "§%=—–+" + RULE_PUNCT + QUOTES + CURRENCY)
        | SUFFIX * (so or c in RULE_PUNCT + QUOTES + "—–")
        | DIGIT * ("0" <= c <= "9")
        | LOWER * (cat in ("Ll", "Lo"))
        | UPPER * (cat in ("Lu", "Lo"))
        | ALPHA * c.isalpha()
        | QUOTE * (c in QUOTES)
        | PUNCT * (c in RULE_PUNCT)
        | DOT_AFTER * (c in "%²-+|")
        | OTHER_SYMBOL * so
        | INFIX_SYMBOL * (c in ":<>=/")
        | DEGREE_LETTER * (c in "FfCcKk")
        | HYPHEN * (c in "-–—~")
        | OPERATOR * (c in "+-*^")
    )
    # Characters any rule looks at (a chunk without them is one word, unless it is a number
    # with a unit or a contraction, both checked per distinct word).
    if (f & (PREFIX | SUFFIX | QUOTE | PUNCT | OTHER_SYMBOL | INFIX_SYMBOL | HYPHEN | OPERATOR)) or c in ".'’":
        f |= NEEDS_RULES
    if c in SPECIAL_CHARS:
        f |= IN_SPECIAL_CASE
    return f


_CP_FLAGS = np.zeros(0x110000, np.uint32)  # ``char_flags`` by code point, filled on demand
_CP_FLAGS_KNOWN = np.zeros(0x110000, bool)


def _looked_up(lookup, table: np.ndarray, known: np.ndarray, classify):
    """``lookup()`` (a compiled table lookup returning (classes, code points not yet known));
    the unknown code points are classified with ``classify`` once per process and the lookup
    is run again (rare after the first batch)."""
    out, missing = lookup()
    if len(missing):
        _learn(missing, table, known, classify)
        out, missing = lookup()
    return out


def _learn(missing: np.ndarray, table: np.ndarray, known: np.ndarray, classify) -> None:
    """Classify the code points ``missing`` with ``classify`` into ``table``, once per process."""
    for c in np.unique(missing).tolist():
        table[c] = classify(chr(c))
        known[c] = True


def code_point_flags(cp: np.ndarray) -> np.ndarray:
    """``char_flags`` of every code point."""
    return _looked_up(lambda: kernels.code_point_classes(cp, _CP_FLAGS, _CP_FLAGS_KNOWN), _CP_FLAGS, _CP_FLAGS_KNOWN,
                      char_flags)


def byte_class_of(c: str) -> int:
    f = char_flags(c)
    return (
        BYTE_SPACE * bool(f & SPACE)
        | BYTE_NEEDS_RULES * bool(f & NEEDS_RULES)
        | BYTE_PUNCTUATION * (c in PUNCTUATION)
        | BYTE_LETTER * c.isalpha()
        | BYTE_UNICODE_PUNCT * unicodedata.category(c).startswith("P")
        | BYTE_TERMINAL * (c in TERMINAL_PUNCTUATION)
        | BYTE_DIGIT * ("0" <= c <= "9")
        | BYTE_PREFIX * bool(f & PREFIX)
        | BYTE_SUFFIX * bool(f & SUFFIX)
        | BYTE_LOWER * bool(f & LOWER)
        | BYTE_UPPER * bool(f & UPPER)
        | BYTE_DOT_AFTER * bool(f & DOT_AFTER)
    )


_ASCII_CLASS = np.array([byte_class_of(chr(i)) for i in range(128)] + [0] * 128, dtype=np.uint16)


_CP_CLASS = np.zeros(0x110000, np.uint16)  # class bits by code point, filled on demand
_CP_KNOWN = np.zeros(0x110000, bool)


def byte_classes(b: np.ndarray) -> np.ndarray:
    """Class bits of every byte (non-ASCII characters classified from their code points,
    each distinct one once per process: the bytes of characters first seen here are filled
    in after they are)."""
    out, missing, missing_at = kernels.byte_classes(b, _ASCII_CLASS, _CP_CLASS, _CP_KNOWN)
    if len(missing):
        _learn(missing, _CP_CLASS, _CP_KNOWN, byte_class_of)
        kernels.fill_byte_classes(out, b, missing, missing_at, _CP_CLASS)
    return out


@functools.lru_cache(maxsize=2)
def unit_rows(bytes_: bool) -> tuple[np.ndarray, np.ndarray]:
    """What the rules split off after a number (units, currency signs, "+") as zero-padded
    rows of code points, or of UTF-8 bytes (``bytes_``), and their lengths."""
    units = [list(u.encode()) if bytes_ else [ord(c) for c in u] for u in UNIT_STRINGS.to_pylist()]
    table = np.zeros((len(units), max(map(len, units))), np.uint8 if bytes_ else np.uint32)
    for i, u in enumerate(units):
        table[i, :len(u)] = u
    return table, np.array([len(u) for u in units], np.int64)
