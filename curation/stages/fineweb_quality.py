"""``fineweb_quality``: FineWeb's extra rules (Penedo et al. 2024), by language (``by_lang``, see
``curation.stages.language_rules``)."""

from __future__ import annotations

from typing import ClassVar

import pyarrow.compute as pc
from pydantic import Field

from curation.stages.base import Rule, registry
from curation.stages.language_rules import SignalFilterStage
from curation.text.arrow import mask, safe_div
from curation.text.chars import TERMINAL_PUNCTUATION
from curation.text import segments

@registry.register("fineweb_quality")
class FineWebQualityFilter(SignalFilterStage):
    """FineWeb's extra rules (Penedo et al. 2024) over non-blank lines: enough lines end in
    terminal punctuation, not too many short lines, few chars in duplicated lines, not too
    many newlines per word (list-like pages).

    Signals: ``fineweb_line_punct_frac``, ``fineweb_short_line_frac``,
    ``fineweb_char_dup_frac``, ``fineweb_newline_per_word``.
    """

    type: str = "fineweb_quality"
    splits_words: ClassVar[bool] = False
    line_punct_thr: float | None = Field(0.12, ge=0, le=1)
    #: Keep pages where no line ends in punctuation (the rule then only catches partial cases).
    line_punct_exclude_zero: bool = False
    #: Characters that count as terminal punctuation; default: all scripts' sentence enders.
    stop_chars: str | None = None
    short_line_thr: float | None = Field(0.67, ge=0, le=1)
    short_line_length: int = Field(30, ge=0)
    char_duplicates_ratio: float | None = Field(0.01, ge=0)
    new_line_ratio: float | None = Field(0.3, ge=0)

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule("empty", "text", "blank"),  # no non-blank line
        Rule("line_punct_frac", "fineweb_line_punct_frac", "< unless 0", ("line_punct_thr", "line_punct_exclude_zero")),
        Rule("short_line_frac", "fineweb_short_line_frac", ">", "short_line_thr"),
        Rule("char_dup_frac", "fineweb_char_dup_frac", ">", "char_duplicates_ratio"),
        Rule("newline_per_word", "fineweb_newline_per_word", ">", "new_line_ratio"),
    )

    def signals(self, text):
        lines = text.newlines(runs=False)
        newlines = lines.counts - 1  # text.split("\n") has one part more than newlines
        nonblank = mask(pc.greater(pc.binary_length(segments.strip(lines.values)), 0))
        lines = lines.select(nonblank)
        n_lines = lines.counts
        stop = TERMINAL_PUNCTUATION if self.stop_chars is None else self.stop_chars
        punct = segments.ends_with_any(lines.values, stop)
        lengths = lines.lengths()
        punct_frac = safe_div(lines.per_doc_sum(punct), n_lines)
        short_frac = safe_div(lines.per_doc_sum(lengths <= self.short_line_length), n_lines)
        _, dup_chars = segments.duplicate_stats(lines, lengths)
        chars = text.char_lengths - newlines
        n_words = self._word_counts(text)
        return {
            "fineweb_line_punct_frac": punct_frac,
            "fineweb_short_line_frac": short_frac,
            "fineweb_char_dup_frac": safe_div(dup_chars, chars),
            "fineweb_newline_per_word": safe_div(newlines, n_words),
        }
