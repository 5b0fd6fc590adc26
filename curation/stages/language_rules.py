"""What the heuristic filters share (``gopher_quality``, ``gopher_repetition``, ``c4_quality``,
``fineweb_quality``, each in the file named for it): measure, then decide, and per-language rules.

Each filter measures signals for a whole batch (vectorised, see ``curation.text.words``), writes
them as columns, and drops a document with the first rule it violates, in datatrove's order, as
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
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationError, create_model, field_validator, model_validator

from curation.stages.base import MapStage
from curation.stages.paths import PathParam
from curation.text import lang_rules
from curation.text import words as text_words
from curation.text.arrow import to_numpy
from curation.text.state import TextState


def with_columns(table: pa.Table, columns: dict[str, np.ndarray | pa.Array]) -> pa.Table:
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


class LanguageRulesStage(MapStage):
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

    def view(self, lang: str | None) -> LanguageRulesStage:
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

    def measure_view(self, lang: str | None) -> LanguageRulesStage:
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
        """``_measure`` of each row's language view (see ``LanguageRulesStage``); plain ``_measure``
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


class SignalFilterStage(LanguageRulesStage):
    """Common shape: ``signals(text) -> columns`` appended to the batch; text unchanged."""

    @abstractmethod
    def signals(self, text: TextState) -> dict[str, np.ndarray]:
        """Signal columns of the batch whose text state is ``text``."""

    def _measure(self, batch: pa.Table, text: TextState | None = None) -> tuple[pa.Table, TextState]:
        text = self.text_state(batch, text)
        return with_columns(batch, self.signals(text)), text

