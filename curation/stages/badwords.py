"""``badwords``: C4's bad-word filter with the LDNOOBW lists of the document's language
(``curation.text.badwords``); signals ``badwords_count``, ``badwords_frac``; reasons
``badwords:too_many`` / ``badwords:too_frequent``. It measures, then decides with its ``rules``;
word-list files are hashed into the parameters."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PrivateAttr, field_validator

from curation.io.shards import replace_column
from curation.stages.base import MapStage, Rule, registry
from curation.stages.paths import PathStr, existing_file, file_ids
from curation.text import badwords as bw

if TYPE_CHECKING:  # pragma: no cover
    from curation.text.state import TextState


@registry.register("badwords")
class BadWordsFilter(MapStage):
    """C4's bad-words filter: drop a document that holds a word or phrase of its language's
    LDNOOBW list (``curation.text.badwords``: matching rules, lists shipped, differences from
    datatrove).

    The language is the row's ``lang`` (the ``langid`` stage's column), or ``default_lang``
    where there is none (no column, or null); ``tl`` reads the ``fil`` list, ``nb``/``nn`` the
    ``no`` list. A language without a list is not checked: its ``badwords_count`` is null and
    the rules never fire (datatrove raises unless told otherwise). ``word_lists`` maps a
    language to a word-list file (one entry a line) used instead of the shipped one, or for a
    language without one.

    Signals: ``badwords_count`` (matches), ``badwords_frac`` (matches per whitespace-separated
    word; in Japanese, Thai and Chinese, written without spaces, that is not a word count:
    use ``max_badwords`` there). Rules, in order: ``too_many`` (``badwords_count`` >
    ``max_badwords``; C4: 0, any match drops), ``too_frequent`` (``badwords_frac`` >
    ``max_badwords_frac``; off by default). C4's ``keep_fraction`` (keep a random share of
    matching pages) is not provided: a random draw is not a stored signal.
    """

    type: str = "badwords"
    default_lang: str | None = "en"
    lang_column: str = "lang"
    word_lists: dict[str, PathStr] = Field(default_factory=dict)
    max_badwords: int | None = Field(0, ge=0)
    max_badwords_frac: float | None = Field(None, ge=0)

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule("too_many", "badwords_count", ">", "max_badwords"),
        Rule("too_frequent", "badwords_frac", ">", "max_badwords_frac"),
    )

    _matchers: dict[str, bw.BadWords | None] = PrivateAttr(default_factory=dict)

    @field_validator("word_lists")
    @classmethod
    def _lists_exist(cls, v: dict[str, str]) -> dict[str, str]:
        return {lang: existing_file(p) for lang, p in v.items()}

    def params(self) -> dict[str, Any]:
        p = super().params()
        p["word_lists"] = {lang: file_ids([path])[0] for lang, path in self.word_lists.items()}
        return p

    def _matcher(self, lang: str) -> bw.BadWords | None:
        if lang not in self._matchers:
            path = self.word_lists.get(lang) or self.word_lists.get(bw.ALIASES.get(lang, lang))
            if path is not None:
                self._matchers[lang] = bw.BadWords.for_language(lang, bw.read_words(path))
            elif bw.list_language(lang) is not None:
                self._matchers[lang] = bw.BadWords.for_language(lang)
            else:
                self._matchers[lang] = None
        return self._matchers[lang]

    def measure(self, batch: pa.Table, text: TextState | None = None) -> tuple[pa.Table, TextState | None]:
        n = batch.num_rows
        texts = batch.column("text").combine_chunks()
        if self.lang_column in batch.column_names:
            langs = batch.column(self.lang_column).combine_chunks().cast(pa.string())
            if self.default_lang is not None:
                langs = pc.fill_null(langs, self.default_lang)
        else:
            langs = pa.array([self.default_lang] * n, pa.string())
        counts = np.zeros(n, np.int64)
        checked = np.zeros(n, bool)
        for lang in pc.unique(langs).to_pylist():
            if lang is None or (m := self._matcher(lang)) is None:
                continue
            rows = np.flatnonzero(pc.fill_null(pc.equal(langs, lang), False).to_numpy(zero_copy_only=False))
            checked[rows] = True
            counts[rows] = m.count(texts.take(pa.array(rows)))
        frac = np.zeros(n, np.float64)
        hit = np.flatnonzero(counts > 0)
        if len(hit):
            words = bw.whitespace_words(texts.take(pa.array(hit)))
            frac[hit] = counts[hit] / np.maximum(words, 1)
        table = replace_column(batch, "badwords_count", pa.array(counts, pa.int32(), mask=~checked))
        table = replace_column(table, "badwords_frac", pa.array(frac, pa.float32(), mask=~checked))
        return table, text
