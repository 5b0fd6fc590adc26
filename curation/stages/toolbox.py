"""Toolbox stages (issue #18, item 3): URL blocklists, PII scrubbing, C4 bad words, text clean-up.

- ``url_filter``: drops documents whose URL a domain / URL list, a regex or a sub-word blocks
  (``curation.text.urls``). Signals ``url_blocked`` (bool) and ``url_block_list`` (the name of
  the first list that blocks it, ``regex`` or ``subword``; null if none); reason
  ``url_filter:<list name>``.
- ``pii``: replaces e-mail addresses and public IP addresses in ``text``
  (``curation.text.pii``); never drops. Signals ``pii_emails``, ``pii_ips`` (replaced).
- ``badwords``: C4's bad-word filter with the LDNOOBW lists of the document's language
  (``curation.text.badwords``); signals ``badwords_count``, ``badwords_frac``; reasons
  ``badwords:too_many`` / ``badwords:too_frequent``.
- ``normalize``: ftfy's Unicode repair, symbol-only lines, whitespace
  (``curation.text.normalize``); never drops. Signals ``normalize_fixed`` (ftfy changed the
  text), ``normalize_lines_removed`` (symbol lines), ``normalize_chars_delta`` (characters
  after minus before, all steps together).

``url_filter`` and ``badwords`` measure, then decide with their ``rules`` (thresholds left out
of the signals hash, so a rerun with other thresholds re-decides from stored columns). ``pii``
and ``normalize`` rewrite the text, so they return a new ``TextState``: it carries the known
word counts of rows whose text did not change (the others are counted again when asked).
Files the stages read (blocklists, word lists) are hashed into the parameters, so editing
one re-runs the stage.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from curation.io.files import cached_file_sha256
from curation.io.shards import replace_column
from curation.stages.base import MapStage, Resources, Rule, StageResult, registry
from curation.stages.paths import PathStr
from curation.text import badwords as bw
from curation.text.normalize import Normalizer
from curation.text.pii import (DEFAULT_EMAIL_REPLACEMENTS, DEFAULT_IPV4_REPLACEMENTS, DEFAULT_IPV6_REPLACEMENTS,
                               PiiScrubber)
from curation.text.urls import REGEX, SUBWORD, NamedList, UrlBlocker, check_re2

if TYPE_CHECKING:  # pragma: no cover
    from curation.text.state import TextState


def _existing_file(p: str) -> str:
    path = Path(p).expanduser()
    if not path.is_file():
        raise ValueError(f"file {p} does not exist")
    return str(path.resolve())


def _file_ids(paths: list[str]) -> list[dict[str, str]]:
    """Files as they enter a params hash: base name and content hash (moving a file keeps
    the hash, editing it changes it)."""
    return [{"name": Path(p).name, "sha256": cached_file_sha256(p)} for p in paths]


def _rewritten_state(old: pa.Array, new: pa.Array, text: TextState | None, field: pa.Field) -> TextState:
    """The state of ``new``: known word counts carried over where the text is unchanged, the
    markup (Markdown or text) the state or the text ``field`` says."""
    from curation.text.markup import markup_of  # noqa: PLC0415
    from curation.text.state import TextState  # noqa: PLC0415 (the text layer loads compiled code)

    if text is None:
        return TextState(new, markup=markup_of(field))
    same = pc.fill_null(pc.equal(old, new), True).to_numpy(zero_copy_only=False)
    return TextState(new, word_counts=np.where(same, text.known_word_counts(), -1), markup=text.markup)


# ---------------------------------------------------------------------------------------------
# url_filter
# ---------------------------------------------------------------------------------------------


class Blocklist(BaseModel):
    """One named list: files (one domain or URL a line, ``#`` comments) and/or inline entries."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.\-]+$")
    paths: list[PathStr] = Field(default_factory=list)
    entries: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _one_path(cls, data: Any) -> Any:
        if isinstance(data, dict) and "path" in data:  # `path: x` for one file
            data = dict(data)
            path = data.pop("path")
            data["paths"] = [path, *data.get("paths", [])]
        return data

    @field_validator("paths")
    @classmethod
    def _exist(cls, v: list[str]) -> list[str]:
        return [_existing_file(p) for p in v]

    @model_validator(mode="after")
    def _not_empty(self) -> Blocklist:
        if not self.paths and not self.entries:
            raise ValueError(f"blocklist {self.name!r}: give `path`, `paths` or `entries`")
        return self


@registry.register("url_filter")
class UrlFilter(MapStage):
    """Drop documents whose ``url`` a blocklist blocks (``curation.text.urls`` says how).

    ``blocklists`` are checked in order, then ``url_regexes`` (RE2, searched in the URL as
    given), then ``url_subwords`` (plain strings, searched in the lower-cased URL); the first
    that blocks a URL names it in ``url_block_list`` and in the reason
    ``url_filter:<name>`` (``url_filter:regex``, ``url_filter:subword``). Rows without a URL
    (no column, null or empty) are never blocked.

    ``report_only``: names whose matches are recorded but not dropped (a threshold: changing
    it re-decides stored rows; ``null`` drops nothing). Example::

        block: {type: url_filter, input: extract,
                blocklists: [{name: adult, path: lists/adult/domains},
                             {name: manual, entries: [example.com, spam.example.org/page]}],
                url_regexes: ['^https?://[^/]*\\.xxx(?:[:/]|$)']}
    """

    type: str = "url_filter"
    columns: ClassVar[tuple[str, ...]] = ('url_blocked',)
    blocklists: list[Blocklist] = Field(default_factory=list)
    url_regexes: list[str] = Field(default_factory=list)
    url_subwords: list[str] = Field(default_factory=list)
    url_column: str = "url"
    report_only: list[str] | None = Field(default_factory=list)

    rules: ClassVar[tuple[Rule, ...]] = (Rule("{value}", "url_block_list", "not in", "report_only"),)
    resources: ClassVar[Resources] = Resources(cpus=1)

    _blocker: UrlBlocker | None = PrivateAttr(default=None)

    @field_validator("url_regexes")
    @classmethod
    def _re2(cls, v: list[str]) -> list[str]:
        for r in v:
            check_re2(r)
        return v

    @model_validator(mode="after")
    def _names(self) -> UrlFilter:
        names = [b.name for b in self.blocklists]
        if len(set(names)) != len(names):
            raise ValueError(f"blocklist names must be unique, got {names}")
        if {REGEX, SUBWORD} & set(names):
            raise ValueError(f"{REGEX!r} and {SUBWORD!r} name the regex and sub-word matches, not a list")
        return self

    def params(self) -> dict[str, Any]:
        p = super().params()
        for lst, b in zip(p["blocklists"], self.blocklists):
            lst["paths"] = _file_ids(b.paths)
        return p

    def setup(self) -> None:
        if self._blocker is None:
            lists = [NamedList.from_sources(b.name, b.paths, b.entries) for b in self.blocklists]
            self._blocker = UrlBlocker(lists, self.url_regexes, self.url_subwords)

    def measure(self, batch: pa.Table, text: TextState | None = None) -> tuple[pa.Table, TextState | None]:
        self.setup()
        n = batch.num_rows
        if self.url_column in batch.column_names:
            code = self._blocker.match(batch.column(self.url_column))
        else:
            code = np.full(n, -1, np.int64)
        names = pa.array(self._blocker.names, pa.string())
        listed = names.take(pa.array(code, pa.int64(), mask=code < 0))  # null where not blocked
        table = replace_column(batch, "url_blocked", pa.array(code >= 0, pa.bool_()))
        table = replace_column(table, "url_block_list", listed)
        return table, text


# ---------------------------------------------------------------------------------------------
# pii
# ---------------------------------------------------------------------------------------------


@registry.register("pii")
class PiiScrub(MapStage):
    """Replace e-mail addresses and public IP addresses in ``text`` (``curation.text.pii``:
    what counts, which replacements and why). Never drops a document.

    Signals: ``pii_emails``, ``pii_ips`` (how many were replaced in the row)."""

    type: str = "pii"
    columns: ClassVar[tuple[str, ...]] = ('pii_emails', 'pii_ips')
    rewrites_text: ClassVar[bool] = True
    emails: bool = True
    ips: bool = True
    #: replace only globally routable addresses (FineWeb); False: every valid address
    only_public_ips: bool = True
    email_replacements: list[str] = Field(default_factory=lambda: list(DEFAULT_EMAIL_REPLACEMENTS), min_length=1)
    ipv4_replacements: list[str] = Field(default_factory=lambda: list(DEFAULT_IPV4_REPLACEMENTS), min_length=1)
    ipv6_replacements: list[str] = Field(default_factory=lambda: list(DEFAULT_IPV6_REPLACEMENTS), min_length=1)

    _scrubber: PiiScrubber | None = PrivateAttr(default=None)

    def setup(self) -> None:
        if self._scrubber is None:
            self._scrubber = PiiScrubber(self.emails, self.ips, self.only_public_ips, tuple(self.email_replacements),
                                         tuple(self.ipv4_replacements), tuple(self.ipv6_replacements))

    def process(self, batch: pa.Table, text: TextState | None = None) -> StageResult:
        self.setup()
        if text is not None:
            text = self.text_state(batch, text)
        old = batch.column("text").combine_chunks()
        new, n_email, n_ip = self._scrubber.scrub_column(old)
        table = replace_column(batch, "text", new)
        table = replace_column(table, "pii_emails", pa.array(n_email, pa.int32()))
        table = replace_column(table, "pii_ips", pa.array(n_ip, pa.int32()))
        field = batch.schema.field("text")
        state = text if new is old and text is not None else _rewritten_state(old, new, text, field)
        return StageResult.keep_all(table, state)


# ---------------------------------------------------------------------------------------------
# badwords
# ---------------------------------------------------------------------------------------------


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
        return {lang: _existing_file(p) for lang, p in v.items()}

    def params(self) -> dict[str, Any]:
        p = super().params()
        p["word_lists"] = {lang: _file_ids([path])[0] for lang, path in self.word_lists.items()}
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


# ---------------------------------------------------------------------------------------------
# normalize
# ---------------------------------------------------------------------------------------------


@registry.register("normalize")
class Normalize(MapStage):
    """Unicode repair (ftfy), symbol-only lines, whitespace (``curation.text.normalize`` gives
    the steps and their order). Never drops a document (one left empty is dropped as
    ``empty`` by the filters after it).

    Signals: ``normalize_fixed`` (ftfy changed the text), ``normalize_lines_removed`` (symbol
    lines removed), ``normalize_chars_delta`` (characters after minus before)."""

    type: str = "normalize"
    columns: ClassVar[tuple[str, ...]] = ('normalize_fixed', 'normalize_lines_removed', 'normalize_chars_delta')
    rewrites_text: ClassVar[bool] = True
    fix_unicode: bool = True
    #: ftfy's HTML-entity decoding: "auto" decodes unless the text holds a "<"
    unescape_html: bool | Literal["auto"] = "auto"
    #: Unicode normalisation by ftfy (none by default, as FineWeb)
    normalization: Literal["NFC", "NFKC", "NFD", "NFKD"] | None = None
    strip_trailing_spaces: bool = True
    remove_symbol_lines: bool = True
    collapse_spaces: bool = True
    max_blank_lines: int | None = Field(1, ge=0)
    strip: bool = True

    def normalizer(self) -> Normalizer:
        return Normalizer(self.fix_unicode, self.unescape_html, self.normalization, self.strip_trailing_spaces,
                          self.remove_symbol_lines, self.collapse_spaces, self.max_blank_lines, self.strip)

    def params(self) -> dict[str, Any]:
        p = super().params()
        if self.fix_unicode:
            import ftfy  # noqa: PLC0415

            p["ftfy"] = ftfy.__version__  # its fixes change between versions
        return p

    def process(self, batch: pa.Table, text: TextState | None = None) -> StageResult:
        if text is not None:
            text = self.text_state(batch, text)
        old = batch.column("text").combine_chunks()
        if not pa.types.is_string(old.type):
            old = old.cast(pa.string())
        new, fixed, removed = self.normalizer().normalize(old)
        delta = (pc.fill_null(pc.utf8_length(new), 0).to_numpy(zero_copy_only=False).astype(np.int64)
                 - pc.fill_null(pc.utf8_length(old), 0).to_numpy(zero_copy_only=False).astype(np.int64))
        table = replace_column(batch, "text", new)
        table = replace_column(table, "normalize_fixed", pa.array(fixed, pa.bool_()))
        table = replace_column(table, "normalize_lines_removed", pa.array(removed, pa.int32()))
        table = replace_column(table, "normalize_chars_delta", pa.array(delta, pa.int32()))
        return StageResult.keep_all(table, _rewritten_state(old, new, text, batch.schema.field("text")))
