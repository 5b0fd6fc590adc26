"""C4's bad-word check: count a language's listed words and phrases in each document.

The lists are the LDNOOBW lists C4 and mC4 used (shipped in ``data/badwords/``, CC-BY-4.0,
see the README there), one per language; ``load_words(lang)`` reads one. As in C4 (and
datatrove's ``C4BadWordsFilter``) the text is lower-cased and a word matches only between
non-word characters (or the text's ends), except in Japanese, Thai and Chinese, written
without spaces, where any occurrence counts; mC4's allowlist (``ja``: sm, グロ, 女の子;
``zh``: 性, words that would drop over 10% of those languages' pages) is removed.

Differences from datatrove: list entries are lower-cased too (its Spanish list has 61
capitalised entries, which can never match lower-cased text there), the allowlist applies to
its own language only (datatrove removes both languages' words from every list), and
matches are counted rather than found once.

Speed: one RE2 alternation per language (Arrow, a DFA: the list's size hardly matters) finds
the documents with at least one match; only those are counted, with Python's ``re`` and the
same word boundaries (lookarounds, which RE2 lacks). A "word character" is a letter, a
number or ``_`` (Python's ``\\w``), in both engines.
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

DATA_DIR = Path(__file__).resolve().parent / "data" / "badwords"
#: languages written without spaces: words match anywhere, not only between non-word chars
NO_SPACE_LANGS = frozenset({"ja", "th", "zh"})
#: mC4's allowlist: common sub-words of languages without spaces
ALLOWLIST = {"ja": frozenset({"sm", "グロ", "女の子"}), "zh": frozenset({"性"})}
#: language codes other tools emit for a list's language (CLD2: ``tl`` for Filipino, ``nb``)
ALIASES = {"tl": "fil", "nb": "no", "nn": "no"}

_WORD_RE2 = r"[\p{L}\p{N}_]"
_NONWORD_RE2 = r"[^\p{L}\p{N}_]"
_WORDLIKE = re.compile(r"\w+")


def shipped_languages() -> list[str]:
    """Codes of the lists shipped with the package."""
    return sorted(p.stem for p in DATA_DIR.glob("*.txt"))


def list_language(lang: str | None) -> str | None:
    """The shipped list for a language code (``en``, ``tl`` -> ``fil``), or None."""
    if not lang:
        return None
    lang = ALIASES.get(lang, lang)
    return lang if (DATA_DIR / f"{lang}.txt").is_file() else None


def read_words(path: str | Path) -> list[str]:
    """Entries of a word-list file: one a line, stripped, blank lines skipped."""
    with open(path, encoding="utf-8") as f:
        return [w for w in (line.strip() for line in f) if w]


@lru_cache(maxsize=None)
def load_words(lang: str) -> tuple[str, ...]:
    """The shipped list of a language, lower-cased, allowlist removed, sorted (longest first)."""
    code = list_language(lang)
    if code is None:
        raise KeyError(f"no bad-word list for language {lang!r} (shipped: {', '.join(shipped_languages())})")
    return prepare(read_words(DATA_DIR / f"{code}.txt"), code)


def prepare(words: Iterable[str], lang: str | None = None) -> tuple[str, ...]:
    """Lower-case, remove the language's allowlist, de-duplicate; longest first, so that a
    phrase wins over a word it starts with."""
    allow = ALLOWLIST.get(lang or "", frozenset())
    out = {w.strip().lower() for w in words if w.strip()} - allow
    return tuple(sorted(out, key=lambda w: (-len(w), w)))


def _re2_literal(word: str) -> str:
    return "".join(f"\\x{{{ord(c):x}}}" for c in word)


class BadWords:
    """Counts one language's words in texts (see the module docstring)."""

    def __init__(self, words: Iterable[str], boundaries: bool = True):
        self.words = tuple(words)
        self.boundaries = boundaries
        self.re2 = self._re2(self.words) if self.words else None
        # With boundaries, a listed word made only of word characters matches exactly where
        # a maximal run of word characters equals it: those are counted by splitting the text
        # into such runs (Arrow); only entries holding other characters (phrases, "a$$")
        # need a regex with lookarounds.
        self.single = pa.array(sorted(w for w in self.words if _WORDLIKE.fullmatch(w)), pa.string())
        phrases = [w for w in self.words if not _WORDLIKE.fullmatch(w)]
        self.phrases_re2 = self._re2(phrases) if phrases and boundaries else None
        self.phrases_py = (re.compile(r"(?<!\w)(?:{})(?!\w)".format("|".join(re.escape(w) for w in phrases)))
                           if phrases and boundaries else None)

    def _re2(self, words) -> str:
        alternation = "|".join(_re2_literal(w) for w in words)
        if self.boundaries:
            return f"(?:^|{_NONWORD_RE2})(?:{alternation})(?:{_NONWORD_RE2}|$)"
        return f"(?:{alternation})"

    @classmethod
    def for_language(cls, lang: str, words: Iterable[str] | None = None) -> BadWords:
        code = list_language(lang) or lang
        return cls(load_words(lang) if words is None else prepare(words, code), boundaries=code not in NO_SPACE_LANGS)

    def count(self, texts: pa.Array) -> np.ndarray:
        """Matches per text (non-overlapping, leftmost; nulls count 0). With boundaries, a
        listed word inside a matched listed phrase counts as well."""
        n = len(texts)
        if self.re2 is None or n == 0:
            return np.zeros(n, np.int64)
        lower = pc.utf8_lower(texts)
        if not self.boundaries:  # RE2 counts leftmost-first, non-overlapping, as re.finditer
            return _np_int(pc.count_substring_regex(lower, self.re2))
        hit = pc.fill_null(pc.match_substring_regex(lower, self.re2), False).to_numpy(zero_copy_only=False)
        counts = np.zeros(n, np.int64)
        idx = np.flatnonzero(hit)
        if not len(idx):
            return counts
        sub = lower.take(pa.array(idx))
        got = np.zeros(len(idx), np.int64)
        if len(self.single):
            runs = pc.split_pattern_regex(sub, _NONWORD_RE2 + "+")
            listed = pc.is_in(pc.list_flatten(runs), value_set=self.single).to_numpy(zero_copy_only=False)
            got += np.bincount(pc.list_parent_indices(runs).to_numpy()[listed], minlength=len(idx))
        if self.phrases_py is not None:
            has = pc.fill_null(pc.match_substring_regex(sub, self.phrases_re2), False).to_numpy(zero_copy_only=False)
            for j in np.flatnonzero(has).tolist():
                got[j] += sum(1 for _ in self.phrases_py.finditer(sub[j].as_py()))
        # RE2 found a match: at least 1 even where Python's tables class a rare character
        # differently
        counts[idx] = np.maximum(got, 1)
        return counts


def _np_int(arr) -> np.ndarray:
    return pc.fill_null(arr, 0).to_numpy(zero_copy_only=False).astype(np.int64)


def whitespace_words(texts: pa.Array) -> np.ndarray:
    """Whitespace-separated tokens per text (``str.split()``; the denominator of
    ``badwords_frac``, only needed where a bad word was found)."""
    return np.array([len(t.split()) if t else 0 for t in texts.to_pylist()], np.int64)
