"""``gopher_repetition``: Gopher's repetition rules (Rae et al. 2021, table A1), by language
(``by_lang``, see ``curation.stages.language_rules``)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from pydantic import Field, field_validator

from curation.stages.base import Rule, registry
from curation.stages.language_rules import SignalFilterStage
from curation.text.arrow import safe_div
from curation.text.duplicate_parts import duplicate_lines_and_paragraphs
from curation.text.repetition import repetition_chars

def _ngram_thresholds(value: dict[int, float]) -> dict[int, float]:
    for n, frac in value.items():
        if n < 1:
            raise ValueError(f"n-gram size must be at least 1, got {n}")
        if frac < 0:
            raise ValueError(f"threshold for {n}-grams must be >= 0, got {frac}")
    return value


@registry.register("gopher_repetition")
class GopherRepetitionFilter(SignalFilterStage):
    """Gopher repetition rules (Rae et al. 2021, table A1): duplicated lines and paragraphs
    (by count and by chars), the most frequent 2/3/4-gram's char share, and the chars in
    duplicated 5..10-grams.

    Lines are split on runs of newlines, paragraphs on two or more newlines. Char shares are
    relative to the whole text. Signals: ``gopher_dup_para_frac``, ``gopher_dup_para_char_frac``,
    ``gopher_dup_line_frac``, ``gopher_dup_line_char_frac``, ``gopher_top_{n}_gram_frac``,
    ``gopher_dup_{n}_gram_frac``.
    """

    type: str = "gopher_repetition"
    dup_line_frac: float | None = Field(0.3, ge=0)
    dup_para_frac: float | None = Field(0.3, ge=0)
    dup_line_char_frac: float | None = Field(0.2, ge=0)
    dup_para_char_frac: float | None = Field(0.2, ge=0)
    #: n -> max char share of the most frequent n-gram, checked in this order.
    top_n_grams: dict[int, float] = Field(default_factory=lambda: {2: 0.2, 3: 0.18, 4: 0.16})
    #: n -> max share of chars inside duplicated n-grams, checked in this order.
    dup_n_grams: dict[int, float] = Field(
        default_factory=lambda: {5: 0.15, 6: 0.14, 7: 0.13, 8: 0.12, 9: 0.11, 10: 0.10})

    _check_ngrams = field_validator("top_n_grams", "dup_n_grams")(_ngram_thresholds)

    #: The n-gram rules are one per key of ``top_n_grams`` / ``dup_n_grams`` (``{n}``): the
    #: sizes are signal parameters (they decide which columns exist), the values thresholds.
    rules: ClassVar[tuple[Rule, ...]] = (
        Rule("empty", "text", "empty"),
        Rule("dup_para_frac", "gopher_dup_para_frac", ">", "dup_para_frac"),
        Rule("dup_para_char_frac", "gopher_dup_para_char_frac", ">", "dup_para_char_frac"),
        Rule("dup_line_frac", "gopher_dup_line_frac", ">", "dup_line_frac"),
        Rule("dup_line_char_frac", "gopher_dup_line_char_frac", ">", "dup_line_char_frac"),
        Rule("top_{n}_gram", "gopher_top_{n}_gram_frac", ">", "top_n_grams"),
        Rule("dup_{n}_gram", "gopher_dup_{n}_gram_frac", ">", "dup_n_grams"),
    )

    def signals(self, text):
        n = len(text)
        text_len = text.char_lengths
        # paragraphs: the stripped text cut at runs of 2+ newlines; lines: at runs of newlines
        n_paras, para_dups, para_chars, n_lines, line_dups, line_chars = duplicate_lines_and_paragraphs(text.plain)
        columns = {
            "gopher_dup_para_frac": safe_div(para_dups, n_paras),
            "gopher_dup_para_char_frac": safe_div(para_chars, text_len),
            "gopher_dup_line_frac": safe_div(line_dups, n_lines),
            "gopher_dup_line_char_frac": safe_div(line_chars, text_len),
        }
        sizes = set(self.top_n_grams) | set(self.dup_n_grams)
        top = dup = np.zeros((n, 1), np.int64)
        if sizes:
            words = self._words(text)
            top, dup = repetition_chars(words.hash, words.lengths.astype(np.int64), words.offsets, min(sizes),
                                        max(sizes), top_ns=list(self.top_n_grams), dup_ns=list(self.dup_n_grams))
        top = {size: safe_div(top[:, size], text_len) for size in self.top_n_grams}
        dup = {size: safe_div(dup[:, size], text_len) for size in self.dup_n_grams}
        for size in self.top_n_grams:
            columns[f"gopher_top_{size}_gram_frac"] = top[size]
        for size in self.dup_n_grams:
            columns[f"gopher_dup_{size}_gram_frac"] = dup[size]
        return columns
