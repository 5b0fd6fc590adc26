"""Heuristic quality filters: Gopher quality, Gopher repetition, C4 and FineWeb.

Each stage measures signals for a whole batch (vectorised, see ``curation.text.words``), writes them
as columns, and drops a document with the first rule it violates, in datatrove's order, as
``<stage type>:<rule>``. Defaults are the published thresholds, which are also datatrove's
defaults; ``None`` switches a rule off.

Measure, then decide: each stage's ``measure`` writes its signal columns (and C4 its
rewritten text); its ``rules`` table (class attribute, see ``curation.stages.base.Rule``)
says which column is compared with which threshold field, in the order rules are checked.
``decide`` applies that table to the measured columns only, so stored rows can be re-decided
with other thresholds without splitting anything. Thresholds are not signal parameters;
everything else (stop words, n-gram sizes, C4's line rules, FineWeb's short-line length and
stop chars) is. ``GopherQualityFilter.rules_markdown()`` etc. render the tables for docs.

Per-language rules (``by_lang``, ``lang_config``): every stage here takes
``by_lang: {LANG: {field: value, ...}}``, fields of the stage itself (thresholds, stop words,
n-gram thresholds, C4's line rules...) plus ``words: spaces|chars``, and ``lang_config: NAME``,
a shipped preset of such entries (``fineweb2``: FineWeb-2's published per-language values for
67 languages, and ``no`` as ``nb``; ``curation/text/data/lang_rules/``). A page is judged by its ``lang`` column
(the ``langid`` stage's codes: ISO 639-1 where one exists): a language with an entry is
measured and decided by the stage's *view* for it (the stage with the entry's fields in place
of its own; ``by_lang`` goes over the preset field by field, a dict field such as
``top_n_grams`` is replaced whole); a page in any other language, or with no language, by the
stage's own (English) fields. Measure / decide stay split: signals that depend on the
language (stop words counted with its list, words split its way, its n-gram sizes) are
measured per language group, thresholds are applied per row in ``decide`` from the stored
``lang`` column, so re-thresholding from stored rows works; the signals hash follows stop
words, word splitting and n-gram sizes of every language, not thresholds. Every row gets the
columns of every n-gram size any language has a threshold for. Without ``by_lang`` and
``lang_config`` nothing changes, hashes included.

Words for Chinese and Japanese (``words: chars``, the default for zh, ja, yue, wuu, lzh): every
Han / kana character (and CJK punctuation) is a word, the rest of the text is split as usual
(``curation.text.lang_rules.char_words``). FineWeb-2 used jieba and SudachiPy; the preset
scales the thresholds that count words for characters (README of the preset). For C4 such a
line also ends in 。！？」』”, and its words are characters.

Text state: the stages take the batch's ``TextState`` (``curation.text.state``) and split
words and lines through it, so a fused chain splits each document once; C4 returns the state
of the text it rewrote, with the word counts of its kept lines already filled in.

Known differences from datatrove (on the benchmark's 4,581 real documents the keep/drop
decisions of repetition -> quality -> C4 agree 100%; see ``tests/benchmarks/bench_pipeline.py``):

- Words: datatrove splits English with spaCy's rule tokenizer; ``split_words`` reproduces its
  prefix/suffix/infix/URL rules and special cases (abbreviations, contractions, common
  emoticons) but not all of spaCy's ~1,300 exceptions, nor a few quirks ("US$700",
  runs of "……" followed by dots). On 1M real words, 10 differ.
- Duplicated n-grams are compared by their word sequence; datatrove compares the words
  joined without spaces, so "ab c" and "a bc" count as the same n-gram there, not here.
- Empty text (or null) is dropped as ``<stage>:empty`` by every stage; datatrove calls it a
  short document (Gopher quality) or too few sentences (C4).
- C4 always works line by line (datatrove's ``split_paragraph=True``, the C4 default), and
  its sentence count uses spaCy's sentencizer rule over our words.
- Thresholds: ``None`` switches a rule off; datatrove also treats 0 as off.
"""

from __future__ import annotations

import functools
import json
from abc import abstractmethod
from dataclasses import dataclass, replace
from typing import Annotated, Any, Callable, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import (BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, create_model, field_validator,
                      model_validator)

from curation.io.shards import replace_column
from curation.stages.base import MapStage, Rule, StageResult, registry
from curation.stages.paths import PathParam
from curation.text import lang_rules
from curation.text import words as text_words
from curation.text.arrow import mask, safe_div, to_numpy
from curation.text.chars import TERMINAL_PUNCTUATION
from curation.text.counts import page_tallies, word_tallies
from curation.text.duplicate_parts import duplicate_lines_and_paragraphs
from curation.text.line_facts import line_facts
from curation.text import segments
from curation.text.segments import Segments
from curation.text.repetition import repetition_chars
from curation.text.state import TextState

#: Gopher's stop words (Rae et al. 2021, appendix A1).
GOPHER_STOP_WORDS = ["the", "be", "to", "of", "and", "that", "have", "with"]
#: What also ends a line for C4 in a language whose words are characters (``words: chars``):
#: the full-width full stop, exclamation and question marks and closing quotes.
_CJK_LINE_ENDS = "。！？」』”"
#: What ends a line for C4 (terminal punctuation and closing quotes), as a byte table too.
_C4_LINE_ENDS = ".?!\"'"
_C4_LINE_END_BYTES = np.zeros(256, dtype=bool)
_C4_LINE_END_BYTES[[ord(c) for c in _C4_LINE_ENDS]] = True
#: Phrases that mark cookie and legal boilerplate lines (C4's extra line filter).
C4_POLICY_PHRASES = [
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
]



def _with_columns(table: pa.Table, columns: dict[str, np.ndarray | pa.Array]) -> pa.Table:
    """Append (or overwrite) signal columns."""
    for name, values in columns.items():
        arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
        idx = table.schema.get_field_index(name)
        table = table.set_column(idx, name, arr) if idx >= 0 else table.append_column(name, arr)
    return table


#: Stage fields a ``by_lang`` entry cannot set.
_NOT_PER_LANG = ("type", "input", "by_lang", "lang_config")


@functools.lru_cache(maxsize=None)
def _entry_model(cls: type) -> type[BaseModel]:
    """The model of one ``by_lang`` entry of a stage class: every field of the stage (same
    types and bounds, all optional) except the wiring, plus ``words``."""
    fields: dict[str, Any] = {}
    for name, info in cls.model_fields.items():
        if name in _NOT_PER_LANG:
            continue
        ann = Annotated[(info.annotation, *info.metadata)] if info.metadata else info.annotation
        fields[name] = (ann, None)
    fields["words"] = (Literal[lang_rules.WORD_MODES] | None, None)
    return create_model(f"{cls.__name__}ByLang", __config__=ConfigDict(extra="forbid"), **fields)


def _check_entry(cls: type, where: str, entry: Any) -> dict[str, Any]:
    """One ``by_lang`` entry validated: only the fields it sets, with their types."""
    model = _entry_model(cls)
    stype = cls.model_fields["type"].default
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: a mapping of {stype} fields, e.g. {{min_stop_words: 2, stop_words: [...]}}")
    unknown = [k for k in entry if k not in model.model_fields]
    if unknown:
        raise ValueError(f"{where}.{unknown[0]}: unknown field; a {stype} by_lang entry takes "
                         f"{', '.join(model.model_fields)}")
    try:
        return model.model_validate(entry).model_dump(exclude_unset=True)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise ValueError(f"{where}.{loc}: {err['msg']} (got {err['input']!r})") from None


class _LangRules(MapStage):
    """Per-language rules: ``by_lang`` and ``lang_config`` (see the module docstring).

    A page is judged by its ``lang`` column (written by ``langid``): a language with an entry
    is measured and decided as the stage with the entry's fields in place of its own (its
    *view*); every other page (no entry, no language) as the stage itself. Without ``by_lang``
    and ``lang_config`` nothing changes, hashes included."""

    #: language code (as in the ``lang`` column) -> fields overriding the stage's own for the
    #: pages in that language (thresholds, stop words, ...), plus ``words: spaces|chars``.
    #: Applied over ``lang_config``'s entry, field by field.
    by_lang: dict[str, dict[str, Any]] | None = None
    #: a shipped preset of ``by_lang`` entries (``curation/text/data/lang_rules/NAME.json``):
    #: ``fineweb2`` = FineWeb-2's per-language thresholds and stop words; or a file of them by
    #: path, e.g. ``RUN/STAGE/_calibration.json`` written by a ``calibrate_rules`` stage.
    lang_config: Annotated[str, PathParam(when=lang_rules.is_file)] | None = None

    #: how this view splits words: ``spaces`` (``TextState.words``) or ``chars`` (CJK)
    _word_mode: str = PrivateAttr("spaces")
    _cache: dict = PrivateAttr(default_factory=dict)
    #: whether measuring needs every row's words (they are then split once for the batch)
    splits_words: ClassVar[bool] = True

    @field_validator("by_lang", mode="before")
    @classmethod
    def _check_by_lang(cls, v: Any) -> Any:
        if v is None:
            return None
        if not isinstance(v, dict):
            raise ValueError("a mapping of language code -> fields, e.g. {de: {stop_words: [der, die, das]}}")
        out = {}
        for lang, entry in v.items():
            if lang is False:  # YAML 1.1 reads the key `no:` (Norwegian) as false
                lang = "no"
            if not isinstance(lang, str) or not lang_rules.LANG_CODE.match(lang):
                raise ValueError(f"{lang!r}: not a language code as the lang column holds them "
                                 "(ISO 639-1 where one exists, e.g. 'de', else ISO 639-3)")
            out[lang] = _check_entry(cls, lang, entry)
        return out

    @field_validator("lang_config")
    @classmethod
    def _check_lang_config(cls, v: str | None) -> str | None:
        if v is None:
            return None
        known = lang_rules.presets()
        if lang_rules.is_file(v):  # a calibration file (calibrate_rules) or a preset of one's own
            from pathlib import Path  # noqa: PLC0415

            path = Path(v).expanduser()
            if not path.is_file():
                raise ValueError(f"{v!r}: no such file (lang_config names a shipped preset: {', '.join(known)}, "
                                 "or a .json file such as RUN/STAGE/_calibration.json)")
            v = str(path.resolve())
            lang_rules.preset(v)  # parses, or says why not
        elif v not in known:
            raise ValueError(f"unknown preset {v!r} (known: {', '.join(known)}); or name a .json file")
        stype = cls.model_fields["type"].default
        stages = lang_rules.preset_stages(v)
        if stype not in stages:
            raise ValueError(f"preset {v!r} has no values for {stype} (only for {', '.join(stages)}); "
                             "give by_lang instead")
        return v

    @model_validator(mode="after")
    def _check_views(self):
        # every language's view must be a valid stage (field validators across fields too)
        own = self.model_dump(exclude={"by_lang", "lang_config", "input"})
        for lang, over in self.lang_table().items():
            fields = {k: v for k, v in over.items() if k != "words"}
            try:
                type(self).model_validate({**own, **fields})
            except ValidationError as e:
                err = e.errors()[0]
                raise ValueError(f"by_lang.{lang}.{'.'.join(str(x) for x in err['loc'])}: {err['msg']}") from None
        return self

    def model_copy(self, *, update: dict[str, Any] | None = None, deep: bool = False):
        """A copy with its own (empty) cache of views: ``update`` may change the rules."""
        out = super().model_copy(update=update, deep=deep)
        out._cache = {}
        return out

    # -- the table and the views ----------------------------------------------------------

    def lang_table(self) -> dict[str, dict[str, Any]]:
        """language -> the fields its pages use instead of the stage's: ``lang_config``'s entry
        with ``by_lang``'s fields over it. Empty without either."""
        if "table" not in self._cache:
            table: dict[str, dict[str, Any]] = {}
            if self.lang_config:
                for lang, stages in lang_rules.preset(self.lang_config).items():
                    if self.type in stages:
                        table[lang] = _check_entry(type(self), f"{self.lang_config}.{lang}", stages[self.type])
            for lang, entry in (self.by_lang or {}).items():
                table[lang] = {**table.get(lang, {}), **entry}
            self._cache["table"] = {k: table[k] for k in sorted(table)}
        return self._cache["table"]

    def view(self, lang: str | None) -> _LangRules:
        """The stage that measures and decides pages in ``lang`` (itself, without per-language
        rules, for a language without an entry)."""
        key = ("view", lang)
        if key not in self._cache:
            over = dict(self.lang_table().get(lang, {})) if lang is not None else {}
            mode = over.pop("words", None) or (lang_rules.default_words(lang) if lang in self.lang_table()
                                               else "spaces")
            v = self.model_copy(update={**over, "by_lang": None, "lang_config": None})
            v._word_mode = mode
            self._cache[key] = v
        return self._cache[key]

    def _dict_fields(self) -> list[str]:
        """Threshold fields holding dicts (n-gram size -> threshold): their keys are measured."""
        fields = dict.fromkeys(p for rule in self.rules for p in rule.params)
        return [f for f in fields if isinstance(getattr(self, f), dict)]

    def measure_view(self, lang: str | None) -> _LangRules:
        """``view(lang)`` measuring every n-gram size any language has a threshold for, so that
        all rows get the same signal columns."""
        key = ("measure", lang)
        if key not in self._cache:
            v = self.view(lang)
            union = {}
            for f in self._dict_fields():
                keys = dict.fromkeys([*getattr(self, f)]
                                     + [k for e in self.lang_table().values() for k in e.get(f) or {}])
                own = getattr(v, f)
                union[f] = {k: own.get(k, getattr(self, f).get(k, 0.0)) for k in keys}
            if union and any(list(union[f]) != list(getattr(v, f)) for f in union):
                mode = v._word_mode
                v = v.model_copy(update=union)
                v._word_mode = mode
            self._cache[key] = v
        return self._cache[key]

    def _signal_key(self, lang: str | None) -> str:
        """What ``measure_view(lang)`` measures with: languages with the same key are measured
        together."""
        key = ("signal_key", lang)
        if key not in self._cache:
            v = self.measure_view(lang)
            self._cache[key] = json.dumps([v._word_mode, v.signal_params()], sort_keys=True)
        return self._cache[key]

    # -- hashes -----------------------------------------------------------------------------

    def params(self) -> dict[str, Any]:
        p = super().params()
        for f in ("by_lang", "lang_config"):
            if p.get(f) is None:
                p.pop(f, None)
        if self.lang_table():
            p["by_lang"] = self.lang_table()  # with the preset's values: a new preset version rehashes
        if self.lang_config and lang_rules.is_file(self.lang_config):
            p["lang_config"] = {"file_sha256": lang_rules.sha256(self.lang_config)}  # moving it does not rehash
        return p

    def signal_params(self) -> dict[str, Any]:
        """Without per-language rules: as ``Stage.signal_params``. With them: the measuring
        stage's signal parameters (n-gram sizes of every language) plus, per language measured
        differently (its own stop words, n-gram sizes or word splitting), what differs;
        thresholds (anywhere) are left out."""
        if not self.lang_table():
            return super().signal_params()
        base = self.measure_view(None).signal_params()
        default = self._signal_key(None)
        langs = {}
        for lang in self.lang_table():
            if self._signal_key(lang) != default:
                v = self.measure_view(lang)
                sig = v.signal_params()
                langs[lang] = {"words": v._word_mode, **{k: x for k, x in sig.items() if base.get(k) != x}}
        if langs:
            base["by_lang"] = langs
        return base

    # -- measure and decide per language ------------------------------------------------------

    def _lang_groups(self, table: pa.Table, key) -> list[tuple[str | None, np.ndarray | None]]:
        """Rows grouped by ``key(lang)`` (one representative language per group, ``None`` for
        rows without an entry), with their indices; ``[(lang, None)]`` when all rows share one."""
        if "lang" not in table.column_names:
            raise ValueError(f"{self.type}: by_lang / lang_config judge each page by its 'lang' column, which the "
                             f"input lacks (columns: {table.column_names}); put a langid stage upstream")
        enc = pc.dictionary_encode(table.column("lang")).combine_chunks()
        codes = enc.dictionary.to_pylist()
        table_langs = self.lang_table()
        group_of_key: dict[Any, int] = {key(None): 0}
        reps: list[str | None] = [None]
        code_group = np.zeros(len(codes) + 1, np.int64)  # last slot: null
        for i, c in enumerate(codes):
            if c in table_langs:
                k = key(c)
                if k not in group_of_key:
                    group_of_key[k] = len(reps)
                    reps.append(c)
                code_group[i] = group_of_key[k]
        idx = to_numpy(pc.fill_null(enc.indices, len(codes))).astype(np.int64)
        row_group = code_group[idx]
        present = np.unique(row_group)
        if len(present) == 1:
            return [(reps[present[0]], None)]
        order = np.argsort(row_group, kind="stable")
        bounds = np.searchsorted(row_group[order], present)
        return [(reps[g], part) for g, part in zip(present, np.split(order, bounds[1:]))]

    def measure(self, batch: pa.Table, text: TextState | None = None) -> tuple[pa.Table, TextState | None]:
        """``_measure`` of each row's language view (see ``_LangRules``); plain ``_measure``
        without per-language rules."""
        if not self.lang_table():
            return self._measure(batch, text)
        groups = self._lang_groups(batch, self._signal_key)
        if len(groups) == 1:
            return self.measure_view(groups[0][0])._measure(batch, text)
        text = self.text_state(batch, text)
        views = [self.measure_view(lang) for lang, _ in groups]
        if self.splits_words and any(v._word_mode == "spaces" for v in views):
            text.words  # noqa: B018  split once for the batch; the groups take their words along
        tables, states = [], []
        for v, (_, idx) in zip(views, groups):
            t, s = v._measure(batch.take(pa.array(idx)), text.take(idx))
            tables.append(t)
            states.append(s)
        perm = np.concatenate([idx for _, idx in groups])
        inv = np.empty_like(perm)
        inv[perm] = np.arange(len(perm))
        table = pa.concat_tables(tables).take(pa.array(inv)).combine_chunks()
        if not self.rewrites_text:
            return table, text
        counts = np.concatenate([s.known_word_counts() for s in states])[inv]
        return table, TextState(table.column("text"), word_counts=counts, markup=text.markup)

    # ``rewrites_text`` (Stage): whether ``_measure`` returns new text (C4); otherwise the
    # state passed in is the result's

    def decide(self, table: pa.Table) -> pa.Array | None:
        """Each row decided by its language's view (its thresholds); reads only columns."""
        if not self.lang_table():
            return super().decide(table)
        groups = self._lang_groups(table, lambda lang: lang)
        if len(groups) == 1:
            return self.view(groups[0][0]).decide(table)
        parts = []
        for lang, idx in groups:
            r = self.view(lang).decide(table.take(pa.array(idx)))
            parts.append(pa.nulls(len(idx), pa.string()) if r is None else r)
        perm = np.concatenate([idx for _, idx in groups])
        inv = np.empty_like(perm)
        inv[perm] = np.arange(len(perm))
        return pa.concat_arrays(parts).take(pa.array(inv))

    # -- words ----------------------------------------------------------------------------------

    def _words(self, text: TextState) -> text_words.Words:
        """The words this view counts: ``text.words``, or characters for CJK (``chars``)."""
        if self._word_mode == "chars":
            return text._cached("char_words", lambda: lang_rules.char_words(text.texts))
        return text.words

    def _word_counts(self, text: TextState) -> np.ndarray:
        return self._words(text).counts if self._word_mode == "chars" else text.word_counts()

    @abstractmethod
    def _measure(self, batch: pa.Table, text: TextState | None = None) -> tuple[pa.Table, TextState]:
        """The signal columns (and text state) of the batch, with this stage's own fields."""


class _FilterStage(_LangRules):
    """Common shape: ``signals(text) -> columns`` appended to the batch; text unchanged."""

    @abstractmethod
    def signals(self, text: TextState) -> dict[str, np.ndarray]:
        """Signal columns of the batch whose text state is ``text``."""

    def _measure(self, batch: pa.Table, text: TextState | None = None) -> tuple[pa.Table, TextState]:
        text = self.text_state(batch, text)
        return _with_columns(batch, self.signals(text)), text


@registry.register("gopher_quality")
class GopherQualityFilter(_FilterStage):
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


def _ngram_thresholds(value: dict[int, float]) -> dict[int, float]:
    for n, frac in value.items():
        if n < 1:
            raise ValueError(f"n-gram size must be at least 1, got {n}")
        if frac < 0:
            raise ValueError(f"threshold for {n}-grams must be >= 0, got {frac}")
    return value


@registry.register("gopher_repetition")
class GopherRepetitionFilter(_FilterStage):
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


@registry.register("c4_quality")
class C4QualityFilter(_LangRules):
    """C4's line filter (Raffel et al. 2020) and page rules; rewrites ``text``.

    Each line (stripped, Wikipedia-style citations such as "[12]" removed) is kept only if
    it has no word over ``max_word_length`` chars, ends in terminal punctuation (. ? ! " ')
    but not "...", has at least ``min_words_per_line`` words and mentions neither
    "javascript" nor a cookie/terms-of-use phrase. The page is dropped when a surviving line
    contains "lorem ipsum" or "{", or when the kept lines hold fewer than
    ``min_num_sentences`` sentences. Kept pages get the kept lines as their text; dropped
    pages keep their original text. Signals: ``c4_lines_kept``, ``c4_lines_removed``,
    ``c4_n_sentences`` (always counted, also when ``min_num_sentences`` is None),
    ``c4_lorem_ipsum`` / ``c4_curly_bracket`` (bool: the first surviving line that drops the
    page says "lorem ipsum" / holds a "{").

    The line rules change the text, so their parameters are signal parameters; the page rules
    are ``rules`` over the stored columns. Only ``min_num_sentences`` is a threshold: the
    measured rows (``measure``, ``run_batch``) hold the kept lines as ``text`` on every page
    not dropped by a line (lorem ipsum, curly bracket), including pages that too few
    sentences drop, so that re-deciding with a lower minimum keeps them with the right text;
    ``process`` puts the original text back on every dropped page, as before.
    """

    type: str = "c4_quality"
    remove_citations: bool = True
    #: FineWeb turns this off.
    filter_no_terminal_punct: bool = True
    min_num_sentences: int | None = Field(5, ge=0)
    min_words_per_line: int | None = Field(3, ge=0)
    max_word_length: int | None = Field(1000, ge=1)
    filter_lorem_ipsum: bool = True
    filter_javascript: bool = True
    filter_curly_bracket: bool = True
    filter_policy: bool = True
    policy_phrases: list[str] = Field(default_factory=lambda: list(C4_POLICY_PHRASES))

    rules: ClassVar[tuple[Rule, ...]] = (
        Rule("empty", ("c4_lines_kept", "c4_lines_removed"), "= 0"),  # no line at all: ""
        Rule("lorem_ipsum", "c4_lorem_ipsum", "true"),
        Rule("curly_bracket", "c4_curly_bracket", "true"),
        Rule("too_few_sentences", "c4_n_sentences", "<", "min_num_sentences"),
    )

    def process(self, batch: pa.Table, text: TextState | None = None) -> StageResult:
        """``measure`` and ``decide``, then dropped pages get their original text back."""
        text = self.text_state(batch, text)
        res = self.run_batch(batch, text)
        keep = mask(pc.is_null(res.reasons))
        measured = res.table.column("text").combine_chunks()
        out_text = pc.if_else(pa.array(keep), measured, text.texts)
        table = replace_column(res.table, "text", out_text)
        counts = np.where(keep, res.text.known_word_counts(), text.known_word_counts())
        return StageResult(table, res.reasons, TextState(out_text, word_counts=counts, markup=text.markup))

    rewrites_text: ClassVar[bool] = True
    splits_words: ClassVar[bool] = False

    #: C4's citations: "[12]", "[edit]", "[citation needed]" (only a line holding "[" can match)
    _CITATION = r"\[\p{Nd}*\]|\[edit\]|\[citation needed\]"

    def _measure(self, batch: pa.Table, text: TextState | None = None) -> tuple[pa.Table, TextState]:
        text = self.text_state(batch, text)
        if self._word_mode == "chars":  # CJK words and line ends: the Arrow passes
            return self._measure_lines(batch, text, self._lines_by_arrays(text, chars=True))
        if text.markup != "text":
            return self._measure_lines(batch, text, self._plain_lines(text))
        return self._measure_lines(batch, text, self._lines_by_facts(text))

    def _plain_lines(self, text: TextState) -> _C4Lines:
        """Markdown: the line rules judge the plain view's lines (a heading's "#", a table row's
        pipes, a code fence are not its words or its end), and the kept lines are cut from the
        Markdown, line for line (the plain view keeps every line break)."""
        ln = self._lines_by_facts(TextState(text.plain))
        raw = line_facts(text.texts)
        # a last line the plain view empties ("```", "| --- |") is no line to str.splitlines:
        # a page's plain lines are its first Markdown lines, the missing ones are dropped
        if np.any(ln.counts > raw.counts):
            raise ValueError("c4_quality: the plain view has lines the Markdown has not")
        within = np.arange(len(raw.s)) - np.repeat(np.cumsum(raw.counts) - raw.counts, raw.counts)
        has = within < ln.counts[raw.doc]
        survives = np.zeros(len(raw.s), dtype=bool)
        survives[has] = ln.survives[(np.cumsum(ln.counts) - ln.counts)[raw.doc[has]] + within[has]]
        return replace(ln, doc=raw.doc, counts=raw.counts, survives=survives, values=raw.stripped,
                       byte_start=raw.start, byte_len=raw.end - raw.start, unchanged=np.ones(len(raw.s), dtype=bool))

    def _lines_by_facts(self, text: TextState) -> _C4Lines:
        """The line rules from one compiled pass over the bytes (``line_facts``): only lines
        holding "[" go through the citation regex, only surviving lines are cut from the bytes."""
        lf = line_facts(text.texts)
        n_lines = len(lf.s)
        survives = np.ones(n_lines, dtype=bool)
        if self.max_word_length is not None:  # bytes first: a word's bytes bound its characters
            over = np.flatnonzero(lf.longest > self.max_word_length)
            if len(over):
                survives[over] = lf.longest_chars(over) <= self.max_word_length
        changed = np.zeros(0, np.int64)  # lines a citation was cut from, ascending
        fixed = pa.array([], pa.string())  # and what is left of them
        if self.remove_citations:
            bi = np.flatnonzero(lf.bracket)
            if len(bi):
                after = pc.replace_substring_regex(lf.stripped(bi), self._CITATION, "")
                ch = to_numpy(pc.binary_length(after)) != (lf.e - lf.s)[bi]
                changed, fixed = bi[ch], after.filter(pa.array(ch))
        if self.filter_no_terminal_punct:
            every = np.arange(n_lines)
            ends = lf.ends_with(every, _C4_LINE_END_BYTES) & ~lf.ends_with_dots(every)
            if len(changed):  # a citation cut from the end: the line now ends in what was before it
                ends[changed] = segments.ends_with_any(fixed, _C4_LINE_ENDS) & ~mask(pc.ends_with(fixed, "..."))
            survives &= ends
        if self.min_words_per_line is not None:
            survives &= lf.words >= self.min_words_per_line  # counted on the line with its citations

        def values(idx: np.ndarray) -> pa.Array:
            out = lf.stripped(idx)
            if len(changed) and len(idx):
                at = np.minimum(np.searchsorted(changed, idx), len(changed) - 1)
                hit = changed[at] == idx
                if hit.any():
                    out = pc.replace_with_mask(out, pa.array(hit), fixed.take(pa.array(at[hit])).cast(out.type))
            return out

        unchanged = np.ones(n_lines, dtype=bool)
        unchanged[changed] = False
        return _C4Lines(lf.doc, lf.counts, survives, values, lf.start, lf.end - lf.start, unchanged)

    def _lines_by_arrays(self, text: TextState, chars: bool = False) -> _C4Lines:
        """The line rules by Arrow passes over the lines (``words: chars`` languages, and the
        reference the tests hold ``_lines_by_facts`` to)."""
        lines = text.lines
        raw = segments.strip(lines.values)
        false = np.zeros(len(raw), dtype=bool)
        too_long = false.copy()
        if self.max_word_length is not None:
            # Only lines longer than the limit can hold such a word; split just those.
            long_idx = np.flatnonzero(to_numpy(pc.utf8_length(raw)) > self.max_word_length)
            if len(long_idx):
                long_lines = raw.take(pa.array(long_idx))
                chunks = segments.split_chunks(lang_rules.cjk_spaced(long_lines) if chars else long_lines)
                too = chunks.lengths() > self.max_word_length
                too_long[long_idx[np.unique(chunks.doc[too])]] = True
        line = raw
        if self.remove_citations:
            line = segments.replace_regex_in_some(line, 0x5B, self._CITATION, "")
        survives = ~too_long
        if self.filter_no_terminal_punct:
            ends = segments.ends_with_any(line, _C4_LINE_ENDS + (_CJK_LINE_ENDS if chars else ""))
            ellipsis = mask(pc.ends_with(line, "..."))
            survives &= ends & ~ellipsis
        if self.min_words_per_line is not None:
            # Word counts only for the lines still in the running.
            idx = np.flatnonzero(survives)
            count = lang_rules.count_char_words if chars else text_words.count_py_words
            few = count(raw.take(pa.array(idx))) < self.min_words_per_line
            survives[idx[few]] = False
        unchanged = to_numpy(pc.binary_length(line)) == to_numpy(pc.binary_length(raw))
        return _C4Lines(lines.doc, lines.counts, survives, lambda idx: line.take(pa.array(idx)),
                        lines.byte_start, lines.byte_len, unchanged, chars)

    def _measure_lines(self, batch: pa.Table, text: TextState, ln: _C4Lines) -> tuple[pa.Table, TextState]:
        """The page rules and the kept text, from the line rules' outcome ``ln``."""
        texts = text.texts
        n = len(texts)
        survives = ln.survives
        false = np.zeros(len(survives), dtype=bool)
        # Phrase checks only on surviving lines that mention any phrase at all.
        phrases = ((["lorem ipsum"] if self.filter_lorem_ipsum else [])
                   + (["javascript"] if self.filter_javascript else [])
                   + (list(self.policy_phrases) if self.filter_policy else []))
        markers = ["".join(f"\\x{{{ord(c):x}}}" for c in p) for p in phrases]
        markers += ["\\{"] if self.filter_curly_bracket else []
        lorem, js, curly, policy = (false.copy() for _ in range(4))
        idx = np.flatnonzero(survives)
        if markers and len(idx):
            sub = ln.values(idx)
            hit = mask(pc.match_substring_regex(sub, "(?i)" + "|".join(markers)))
            idx, sub = idx[hit], sub.filter(pa.array(hit))
            lower = pc.utf8_lower(sub)

            def has(phrase: str, on=lower) -> np.ndarray:
                return mask(pc.match_substring(on, phrase))

            if self.filter_lorem_ipsum:
                lorem[idx] = has("lorem ipsum")
            if self.filter_javascript:
                js[idx] = has("javascript")
            if self.filter_curly_bracket:
                curly[idx] = has("{", sub)
            if self.filter_policy:
                for phrase in self.policy_phrases:
                    policy[idx] |= has(phrase)
        # In datatrove's order: lorem ipsum drops the page before the javascript check, a
        # curly bracket after it; the first such line decides the reason.
        page_lorem = survives & lorem
        page_curly = survives & ~lorem & ~js & curly
        page_drop = page_lorem | page_curly
        first_drop = np.full(n, -1, dtype=np.int64)
        drop_idx = np.flatnonzero(page_drop)
        if len(drop_idx):
            d, first = np.unique(ln.doc[drop_idx], return_index=True)
            first_drop[d] = drop_idx[first]
        kept = survives & ~lorem & ~js & ~curly & ~policy
        kept_idx = np.flatnonzero(kept)
        kept_values = ln.values(kept_idx)
        kept_lines = Segments.from_counts(kept_values, np.bincount(ln.doc[kept], minlength=n))
        n_kept = kept_lines.counts
        line_words, line_sents = self._kept_line_words(text, ln, kept_idx, kept_values)
        n_sent = np.bincount(kept_lines.doc, weights=line_sents, minlength=n).astype(np.int64)

        has_drop = first_drop >= 0
        reason_lorem = np.zeros(n, dtype=bool)
        reason_lorem[has_drop] = page_lorem[first_drop[has_drop]]
        new_text = segments.strip(pc.binary_join(kept_lines.to_lists(), pa.scalar("\n", kept_values.type)))
        # A page a line drops keeps its text whatever the thresholds; every other page holds
        # the kept lines (``process`` restores the original text where ``decide`` drops).
        out_text = pc.if_else(pa.array(~has_drop), new_text, texts)
        # Words never cross a line break, so the kept lines' words are the new text's words:
        # a FineWeb stage after this one counts them without splitting again.
        new_counts = np.bincount(kept_lines.doc, weights=line_words, minlength=n).astype(np.int64)
        if ln.chars or text.markup != "text":  # characters, or Markdown lines: not the words a TextState counts
            new_counts[:] = -1
        state = TextState(out_text, word_counts=np.where(has_drop, text.known_word_counts(), new_counts),
                          markup=text.markup)
        table = replace_column(batch, "text", out_text)
        table = _with_columns(table, {
            "c4_lines_kept": n_kept,
            "c4_lines_removed": ln.counts - n_kept,
            "c4_n_sentences": n_sent,
            "c4_lorem_ipsum": reason_lorem,
            "c4_curly_bracket": has_drop & ~reason_lorem,
        })
        return table, state

    @staticmethod
    def _kept_line_words(text: TextState, ln: _C4Lines, kept_idx: np.ndarray,
                         kept_values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """Words and sentences of each kept line (stripped, citations removed).

        Words never cross a line break, so when the documents' words are at hand (the filter
        before this one split them and passed its text state on) a line the citation rule
        left alone takes the words in its byte range; only the other lines are split. ``chars``:
        CJK characters are words (``lang_rules.char_words``), every line is split."""
        n_words = np.zeros(len(kept_idx), np.int64)
        n_sents = np.zeros(len(kept_idx), np.int64)
        fresh = np.ones(len(kept_idx), dtype=bool)
        # a Markdown state's words are its plain view's: their byte ranges are not these lines'
        doc_words = (text.words if len(kept_idx) and text.has_words and not ln.chars and text.markup == "text"
                     else None)
        if doc_words is not None:
            use = ln.unchanged[kept_idx]
            li = kept_idx[use]
            lo = np.searchsorted(doc_words.start, ln.byte_start[li])
            counts = np.searchsorted(doc_words.start, ln.byte_start[li] + ln.byte_len[li]) - lo
            widx = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
            wline = np.repeat(np.arange(len(li)), counts)
            n_words[use] = counts
            n_sents[use] = text_words.sentence_counts_of(counts, wline, doc_words.ender[widx], doc_words.punct[widx])
            fresh[use] = False
        if fresh.any():
            split = lang_rules.char_words if ln.chars else text_words.split_words
            words = split(kept_values.filter(pa.array(fresh)))
            n_words[fresh] = words.counts
            n_sents[fresh] = text_words.sentence_counts(words)
        return n_words, n_sents


@dataclass
class _C4Lines:
    """C4's line rules applied to a batch's lines (``str.splitlines``, flat): each line's
    document, lines per document, which survive the line rules, ``values(idx)`` (the stripped
    lines ``idx``, ascending, citations cut), each line's byte range in the text (for its
    words) and whether the citation rule left it as it was."""

    doc: np.ndarray
    counts: np.ndarray
    survives: np.ndarray
    values: Callable[[np.ndarray], pa.Array]
    byte_start: np.ndarray
    byte_len: np.ndarray
    unchanged: np.ndarray
    chars: bool = False


@registry.register("fineweb_quality")
class FineWebQualityFilter(_FilterStage):
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
