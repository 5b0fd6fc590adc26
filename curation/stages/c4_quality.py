"""``c4_quality``: C4's line filter and page rules (Raffel et al. 2020); rewrites ``text``. By
language (``by_lang``, see ``curation.stages.language_rules``)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from curation.io.shards import replace_column
from curation.stages.base import Rule, StageResult, registry
from curation.stages.language_rules import LanguageRulesStage, with_columns
from curation.text import lang_rules
from curation.text import words as text_words
from curation.text.arrow import mask, to_numpy
from curation.text.line_facts import line_facts
from curation.text import segments
from curation.text.segments import Segments
from curation.text.state import TextState

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


@registry.register("c4_quality")
class C4QualityFilter(LanguageRulesStage):
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
        table = with_columns(table, {
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
