"""``gopher_quality``: Gopher's quality rules (Rae et al. 2021), by language (``by_lang``, see
``curation.stages.language_rules``)."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import pyarrow.compute as pc
from pydantic import Field, PrivateAttr

from curation.stages.base import Rule, registry
from curation.stages.language_rules import SignalFilterStage
from curation.text import words as text_words
from curation.text.arrow import mask, safe_div
from curation.text.counts import page_tallies, word_tallies

#: Gopher's stop words (Rae et al. 2021, appendix A1).
GOPHER_STOP_WORDS = ["the", "be", "to", "of", "and", "that", "have", "with"]


@registry.register("gopher_quality")
class GopherQualityFilter(SignalFilterStage):
    """Gopher quality rules (Rae et al. 2021): word count, mean word length, symbol ratios,
    bullet and ellipsis lines, alphabetic words, stop words.

    Words are spaCy-style English words; "symbol words" (only punctuation) do not count
    towards the word count or the mean length, but do count in the ratios' denominators,
    as in datatrove. Signals: ``gopher_n_words``, ``gopher_mean_word_length``,
    ``gopher_symbol_word_ratio``, ``gopher_ellipsis_word_ratio``, ``gopher_bullet_lines_frac``,
    ``gopher_ellipsis_lines_frac``, ``gopher_alpha_words_frac``, ``gopher_stop_words``.
    """

    type: str = "gopher_quality"
    min_doc_words: int | None = Field(50, ge=0)
    max_doc_words: int | None = Field(100_000, ge=0)
    min_avg_word_length: float | None = Field(3, ge=0)
    max_avg_word_length: float | None = Field(10, ge=0)
    max_symbol_word_ratio: float | None = Field(0.1, ge=0)
    max_bullet_lines_ratio: float | None = Field(0.9, ge=0)
    max_ellipsis_lines_ratio: float | None = Field(0.3, ge=0)
    #: Drop when fewer than this fraction of words contain a letter (datatrove names it
    #: ``max_non_alpha_words_ratio`` but compares it the same way).
    min_alpha_words_ratio: float | None = Field(0.8, ge=0, le=1)
    min_stop_words: int | None = Field(2, ge=0)
    stop_words: list[str] = Field(default_factory=lambda: list(GOPHER_STOP_WORDS))
    #: Drop when fewer than this share of the words are stop words (occurrences, not distinct):
    #: the stop-word count alone lets a long page of word salad through on two real sentences.
    #: Off (None) by default, and then not measured nor hashed; ``lang_config: auto`` sets it
    #: per language (calibrated on natural text). Signal ``gopher_stop_words_frac`` is measured
    #: for every row when any language's rule is on.
    min_stop_words_frac: float | None = Field(None, ge=0, le=1)
    _stop_frac: bool = PrivateAttr(False)

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule("empty", "text", "empty"),
        Rule("too_few_words", "gopher_n_words", "<", "min_doc_words"),
        Rule("too_many_words", "gopher_n_words", ">", "max_doc_words"),
        Rule("mean_word_length", "gopher_mean_word_length", "outside", ("min_avg_word_length", "max_avg_word_length")),
        Rule("symbol_word_ratio", "gopher_symbol_word_ratio", ">", "max_symbol_word_ratio"),
        # datatrove compares the ellipsis ratio with the symbol threshold too
        Rule("ellipsis_word_ratio", "gopher_ellipsis_word_ratio", ">", "max_symbol_word_ratio"),
        Rule("bullet_lines_frac", "gopher_bullet_lines_frac", ">", "max_bullet_lines_ratio"),
        Rule("ellipsis_lines_frac", "gopher_ellipsis_lines_frac", ">", "max_ellipsis_lines_ratio"),
        Rule("alpha_words_frac", "gopher_alpha_words_frac", "<", "min_alpha_words_ratio"),
        Rule("stop_words", "gopher_stop_words", "<", "min_stop_words"),
        Rule("stop_words_frac", "gopher_stop_words_frac", "<", "min_stop_words_frac"),
    )

    def _wants_stop_frac(self) -> bool:
        return self.min_stop_words_frac is not None or any(
            e.get("min_stop_words_frac") is not None for e in self.lang_table().values())

    def measure_view(self, lang):
        v = super().measure_view(lang)
        v._stop_frac = self._wants_stop_frac()
        return v

    def signal_columns(self):
        cols = super().signal_columns()  # the stop-word share is measured only when a rule reads it
        return cols if self._wants_stop_frac() else [c for c in cols if c != "gopher_stop_words_frac"]

    def params(self):
        p = super().params()
        if p.get("min_stop_words_frac") is None:
            p.pop("min_stop_words_frac", None)  # off: hashes as before the rule existed
        return p

    def signal_params(self):
        p = super().signal_params()
        p.pop("min_stop_words_frac", None)
        if self._wants_stop_frac():
            p["stop_words_frac"] = True
        return p

    def signals(self, text):
        texts = text.plain  # a Markdown page's "#" heading marks are not Gopher's hash symbols
        # per-document tallies only: read where the words lie (``words_source``)
        words, docs = (self._words(text), None) if self._word_mode == "chars" else text.words_source()
        n_words = words.counts
        stop_idx = words.match(self.stop_words)
        stop_idx = _match_elisions(words, self.stop_words, stop_idx)
        tallies = word_tallies(words.offsets, words.symbol, words.alpha, words.lengths.astype(np.int64, copy=False),
                               stop_idx, len(self.stop_words))
        if docs is not None:
            n_words, tallies = n_words[docs], [x[docs] for x in tallies]
        n_real, real_chars, n_alpha, n_stop, n_stop_real = tallies
        with np.errstate(invalid="ignore", divide="ignore"):
            # Undefined (NaN) without words, like np.mean([]) in datatrove: no rule fires.
            mean_len = np.where(n_real > 0, real_chars / np.maximum(n_real, 1), np.nan)
        n_lines, bullets, ell_ends, hashes, ellipses = page_tallies(texts)
        return {
            "gopher_n_words": n_real,
            "gopher_mean_word_length": mean_len,
            "gopher_symbol_word_ratio": safe_div(hashes, n_words),
            "gopher_ellipsis_word_ratio": safe_div(ellipses, n_words),
            "gopher_bullet_lines_frac": safe_div(bullets, n_lines),
            "gopher_ellipsis_lines_frac": safe_div(ell_ends, n_lines),
            "gopher_alpha_words_frac": safe_div(n_alpha, n_words),
            "gopher_stop_words": n_stop,
            **({"gopher_stop_words_frac": safe_div(n_stop_real, n_real)}
               if self._stop_frac or self.min_stop_words_frac is not None else {}),
        }


_APOSTROPHES = ("'", "\u2019")


def _match_elisions(words: text_words.Words, stop_words: list[str], stop_idx: np.ndarray) -> np.ndarray:
    """Stop words ending in an apostrophe (French and Italian elisions: ``l'``, ``d'``) also
    match a word that starts with them, with either apostrophe (' or ’): spaCy's fr/it
    tokenizers, which FineWeb-2's stop-word lists were counted with, split ``l'homme`` into
    ``l'`` + ``homme``; ``split_words`` keeps it whole. Nothing changes for lists without
    such a word (Gopher's English list)."""
    elisions = [i for i, w in enumerate(stop_words) if len(w) > 1 and w[-1] in _APOSTROPHES]
    if not elisions or not len(stop_idx):
        return stop_idx
    values = words.values()
    out = stop_idx.copy()
    for i in elisions:
        stem = stop_words[i][:-1]
        for apostrophe in _APOSTROPHES:
            hit = mask(pc.starts_with(values, stem + apostrophe))
            out[(out < 0) & hit] = i
    return out
