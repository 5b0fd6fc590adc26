"""Heuristic quality filters: Gopher quality, Gopher repetition, C4 and FineWeb.

Each stage measures signals for a whole batch (vectorised, see ``curation.text.words``), writes them
as columns, and drops a document with the first rule it violates, in datatrove's order, as
``<stage type>:<rule>``. Defaults are the published thresholds, which are also datatrove's
defaults; ``None`` switches a rule off.

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

from abc import abstractmethod

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

from curation.text import words as ts
from curation.stages.base import MapStage, StageResult, registry
from curation.text.repetition import repetition_chars

#: Gopher's stop words (Rae et al. 2021, appendix A1).
GOPHER_STOP_WORDS = ["the", "be", "to", "of", "and", "that", "have", "with"]
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


def _first_reason(stage: str, n: int, rules: list[tuple[str, np.ndarray]]) -> pa.Array:
    """Per row, ``stage:rule`` of the first violated rule in order, or null."""
    code = np.full(n, -1, dtype=np.int64)
    for i, (_, violated) in enumerate(rules):
        code[(code < 0) & violated] = i
    names = pa.array([f"{stage}:{name}" for name, _ in rules] or [""], pa.string())
    return names.take(pa.array(code, mask=code < 0))


def _lt(values: np.ndarray, threshold: float | None) -> np.ndarray:
    """``values < threshold``, all false when the rule is off (NaN never violates)."""
    if threshold is None:
        return np.zeros(len(values), dtype=bool)
    return values < threshold


def _gt(values: np.ndarray, threshold: float | None) -> np.ndarray:
    if threshold is None:
        return np.zeros(len(values), dtype=bool)
    return values > threshold


class _FilterStage(MapStage):
    """Common shape: ``signals(texts) -> (columns, rules)``, then reasons."""

    @abstractmethod
    def signals(self, texts: pa.Array) -> tuple[dict[str, np.ndarray], list[tuple[str, np.ndarray]]]:
        """Signal columns and ``(rule, violated)`` pairs in the order rules are checked."""

    def process(self, batch: pa.Table) -> StageResult:
        texts = ts.text_column(batch)
        columns, rules = self.signals(texts)
        return StageResult(_with_columns(batch, columns), _first_reason(self.type, len(texts), rules))


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

    def signals(self, texts):
        n = len(texts)
        words = ts.split_words(texts)
        doc = words.doc
        n_words = words.counts
        real = ~words.symbol
        n_real = np.bincount(doc[real], minlength=n)
        real_chars = np.bincount(doc[real], weights=words.lengths[real], minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            # Undefined (NaN) without words, like np.mean([]) in datatrove: no rule fires.
            mean_len = np.where(n_real > 0, real_chars / np.maximum(n_real, 1), np.nan)
        hashes = ts._np(pc.count_substring(texts, "#"))
        ellipses = ts._np(pc.count_substring(texts, "...")) + ts._np(pc.count_substring(texts, "…"))
        lines = ts.split_lines(texts)
        ws = ts.re2_class(ts.PY_WHITESPACE)
        bullet = ts._mask(pc.match_substring_regex(lines.values, f"^[{ws}]*[•\\-]"))
        ell_end = ts._mask(pc.match_substring_regex(lines.values, f"(?:\\.\\.\\.|…)[{ws}]*$"))
        n_lines = lines.counts
        stop_idx = words.match(self.stop_words)
        has_stop = stop_idx >= 0
        # Distinct stop words per document: unique (document, stop word) pairs.
        k = len(self.stop_words) + 1
        key = np.unique(doc[has_stop] * k + stop_idx[has_stop])
        n_stop = np.bincount(key // k, minlength=n)
        columns = {
            "gopher_n_words": n_real,
            "gopher_mean_word_length": mean_len,
            "gopher_symbol_word_ratio": ts.safe_div(hashes, n_words),
            "gopher_ellipsis_word_ratio": ts.safe_div(ellipses, n_words),
            "gopher_bullet_lines_frac": ts.safe_div(lines.per_doc_sum(bullet), n_lines),
            "gopher_ellipsis_lines_frac": ts.safe_div(lines.per_doc_sum(ell_end), n_lines),
            "gopher_alpha_words_frac": ts.safe_div(np.bincount(doc[words.alpha], minlength=n), n_words),
            "gopher_stop_words": n_stop,
        }
        c = columns
        rules = [
            ("empty", ts._np(pc.binary_length(texts)) == 0),
            ("too_few_words", _lt(n_real, self.min_doc_words)),
            ("too_many_words", _gt(n_real, self.max_doc_words)),
            ("mean_word_length", _lt(mean_len, self.min_avg_word_length)
             | _gt(mean_len, self.max_avg_word_length)),
            ("symbol_word_ratio", _gt(c["gopher_symbol_word_ratio"], self.max_symbol_word_ratio)),
            ("ellipsis_word_ratio", _gt(c["gopher_ellipsis_word_ratio"], self.max_symbol_word_ratio)),
            ("bullet_lines_frac", _gt(c["gopher_bullet_lines_frac"], self.max_bullet_lines_ratio)),
            ("ellipsis_lines_frac", _gt(c["gopher_ellipsis_lines_frac"], self.max_ellipsis_lines_ratio)),
            ("alpha_words_frac", _lt(c["gopher_alpha_words_frac"], self.min_alpha_words_ratio)),
            ("stop_words", _lt(n_stop, self.min_stop_words)),
        ]
        return columns, rules


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

    def signals(self, texts):
        n = len(texts)
        text_len = ts._np(pc.utf8_length(texts)).astype(np.int64)
        paragraphs = ts.split_newlines(ts.strip(texts), min_run=2)
        para_dups, para_chars = ts.duplicate_stats(paragraphs)
        lines = ts.split_newlines(texts)
        line_dups, line_chars = ts.duplicate_stats(lines)
        columns = {
            "gopher_dup_para_frac": ts.safe_div(para_dups, paragraphs.counts),
            "gopher_dup_para_char_frac": ts.safe_div(para_chars, text_len),
            "gopher_dup_line_frac": ts.safe_div(line_dups, lines.counts),
            "gopher_dup_line_char_frac": ts.safe_div(line_chars, text_len),
        }
        c = columns
        rules = [
            ("empty", text_len == 0),
            ("dup_para_frac", _gt(c["gopher_dup_para_frac"], self.dup_para_frac)),
            ("dup_para_char_frac", _gt(c["gopher_dup_para_char_frac"], self.dup_para_char_frac)),
            ("dup_line_frac", _gt(c["gopher_dup_line_frac"], self.dup_line_frac)),
            ("dup_line_char_frac", _gt(c["gopher_dup_line_char_frac"], self.dup_line_char_frac)),
        ]
        sizes = set(self.top_n_grams) | set(self.dup_n_grams)
        top = dup = np.zeros((n, 1), np.int64)
        if sizes:
            words = ts.split_words(texts)
            top, dup = repetition_chars(words.hash, words.lengths.astype(np.int64), words.offsets, min(sizes),
                                        max(sizes))
        top = {size: ts.safe_div(top[:, size], text_len) for size in self.top_n_grams}
        dup = {size: ts.safe_div(dup[:, size], text_len) for size in self.dup_n_grams}
        for size, frac in self.top_n_grams.items():
            columns[f"gopher_top_{size}_gram_frac"] = top[size]
            rules.append((f"top_{size}_gram", _gt(top[size], frac)))
        for size, frac in self.dup_n_grams.items():
            columns[f"gopher_dup_{size}_gram_frac"] = dup[size]
            rules.append((f"dup_{size}_gram", _gt(dup[size], frac)))
        return columns, rules


@registry.register("c4_quality")
class C4QualityFilter(MapStage):
    """C4's line filter (Raffel et al. 2020) and page rules; rewrites ``text``.

    Each line (stripped, Wikipedia-style citations such as "[12]" removed) is kept only if
    it has no word over ``max_word_length`` chars, ends in terminal punctuation (. ? ! " ')
    but not "...", has at least ``min_words_per_line`` words and mentions neither
    "javascript" nor a cookie/terms-of-use phrase. The page is dropped when a surviving line
    contains "lorem ipsum" or "{", or when the kept lines hold fewer than
    ``min_num_sentences`` sentences. Kept pages get the kept lines as their text; dropped
    pages keep their original text. Signals: ``c4_lines_kept``, ``c4_lines_removed``,
    ``c4_n_sentences``.
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

    def process(self, batch: pa.Table) -> StageResult:
        texts = ts.text_column(batch)
        n = len(texts)
        lines = ts.split_lines(texts)
        raw = ts.strip(lines.values)
        false = np.zeros(len(raw), dtype=bool)
        too_long = false.copy()
        if self.max_word_length is not None:
            # Only lines longer than the limit can hold such a word; split just those.
            long_idx = np.flatnonzero(ts._np(pc.utf8_length(raw)) > self.max_word_length)
            if len(long_idx):
                chunks = ts.split_chunks(raw.take(pa.array(long_idx)))
                too = chunks.lengths() > self.max_word_length
                too_long[long_idx[np.unique(chunks.doc[too])]] = True
        line = raw
        if self.remove_citations:
            line = pc.replace_substring_regex(line, r"\[\p{Nd}*\]|\[edit\]|\[citation needed\]", "")
        survives = ~too_long
        if self.filter_no_terminal_punct:
            ends = ts.ends_with_any(line, ".?!\"'")
            ellipsis = ts._mask(pc.ends_with(line, "..."))
            survives &= ends & ~ellipsis
        if self.min_words_per_line is not None:
            # Word counts only for the lines still in the running.
            idx = np.flatnonzero(survives)
            few = ts.count_py_words(raw.take(pa.array(idx))) < self.min_words_per_line
            survives[idx[few]] = False
        # Phrase checks only on surviving lines that mention any phrase at all.
        phrases = ((["lorem ipsum"] if self.filter_lorem_ipsum else [])
                   + (["javascript"] if self.filter_javascript else [])
                   + (list(self.policy_phrases) if self.filter_policy else []))
        markers = ["".join(f"\\x{{{ord(c):x}}}" for c in p) for p in phrases]
        markers += ["\\{"] if self.filter_curly_bracket else []
        lorem, js, curly, policy = (false.copy() for _ in range(4))
        idx = np.flatnonzero(survives)
        if markers and len(idx):
            sub = line.take(pa.array(idx))
            hit = ts._mask(pc.match_substring_regex(sub, "(?i)" + "|".join(markers)))
            idx, sub = idx[hit], sub.filter(pa.array(hit))
            lower = pc.utf8_lower(sub)

            def has(phrase: str, on=lower) -> np.ndarray:
                return ts._mask(pc.match_substring(on, phrase))

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
            d, first = np.unique(lines.doc[drop_idx], return_index=True)
            first_drop[d] = drop_idx[first]
        kept = survives & ~lorem & ~js & ~curly & ~policy
        kept_lines = ts.Segments.from_counts(
            line.filter(pa.array(kept)), np.bincount(lines.doc[kept], minlength=n))
        n_kept = kept_lines.counts
        line_words, line_sents = self._kept_line_words(texts, lines, raw, line, kept)
        if self.min_num_sentences is not None:
            n_sent = np.bincount(kept_lines.doc, weights=line_sents, minlength=n).astype(np.int64)
        else:
            n_sent = np.zeros(n, dtype=np.int64)

        has_drop = first_drop >= 0
        reason_lorem = np.zeros(n, dtype=bool)
        reason_lorem[has_drop] = page_lorem[first_drop[has_drop]]
        rules = [
            ("empty", ts._np(pc.binary_length(texts)) == 0),
            ("lorem_ipsum", reason_lorem),
            ("curly_bracket", has_drop & ~reason_lorem),
            ("too_few_sentences", _lt(n_sent, self.min_num_sentences)),
        ]
        reasons = _first_reason(self.type, n, rules)
        new_text = ts.strip(pc.binary_join(kept_lines.to_lists(), pa.scalar("\n", line.type)))
        keep = pa.array(ts._mask(pc.is_null(reasons)))
        out_text = pc.if_else(keep, new_text, texts)
        # Words never cross a line break, so the kept lines' words are the new text's words:
        # a FineWeb stage after this one counts them without splitting again.
        ts.remember_word_counts(new_text, np.bincount(kept_lines.doc, weights=line_words, minlength=n))
        table = batch.set_column(batch.schema.get_field_index("text"), "text", out_text)
        table = _with_columns(table, {
            "c4_lines_kept": n_kept,
            "c4_lines_removed": lines.counts - n_kept,
            "c4_n_sentences": n_sent,
        })
        return StageResult(table, reasons)

    @staticmethod
    def _kept_line_words(texts: pa.Array, lines: ts.Segments, raw: pa.Array, line: pa.Array,
                         kept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Words and sentences of each kept line (stripped, citations removed).

        Words never cross a line break, so when the documents' words are at hand (the filter
        before this one split them) a line the citation rule left alone takes the words in
        its byte range; only the other lines are split."""
        kept_idx = np.flatnonzero(kept)
        n_words = np.zeros(len(kept_idx), np.int64)
        n_sents = np.zeros(len(kept_idx), np.int64)
        fresh = np.ones(len(kept_idx), dtype=bool)
        doc_words = ts.reused_words(texts) if len(kept_idx) else None
        if doc_words is not None:
            same = ts._np(pc.binary_length(line)) == ts._np(pc.binary_length(raw))
            use = same[kept_idx]
            li = kept_idx[use]
            lo = np.searchsorted(doc_words.start, lines.byte_start[li])
            counts = np.searchsorted(doc_words.start, lines.byte_start[li] + lines.byte_len[li]) - lo
            widx = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(int(counts.sum()))
            wline = np.repeat(np.arange(len(li)), counts)
            n_words[use] = counts
            n_sents[use] = ts.sentence_counts_of(counts, wline, doc_words.ender[widx], doc_words.punct[widx])
            fresh[use] = False
        if fresh.any():
            words = ts.split_words(line.take(pa.array(kept_idx[fresh])))
            n_words[fresh] = words.counts
            n_sents[fresh] = ts.sentence_counts(words)
        return n_words, n_sents


@registry.register("fineweb_quality")
class FineWebQualityFilter(_FilterStage):
    """FineWeb's extra rules (Penedo et al. 2024) over non-blank lines: enough lines end in
    terminal punctuation, not too many short lines, few chars in duplicated lines, not too
    many newlines per word (list-like pages).

    Signals: ``fineweb_line_punct_frac``, ``fineweb_short_line_frac``,
    ``fineweb_char_dup_frac``, ``fineweb_newline_per_word``.
    """

    type: str = "fineweb_quality"
    line_punct_thr: float | None = Field(0.12, ge=0, le=1)
    #: Keep pages where no line ends in punctuation (the rule then only catches partial cases).
    line_punct_exclude_zero: bool = False
    #: Characters that count as terminal punctuation; default: all scripts' sentence enders.
    stop_chars: str | None = None
    short_line_thr: float | None = Field(0.67, ge=0, le=1)
    short_line_length: int = Field(30, ge=0)
    char_duplicates_ratio: float | None = Field(0.01, ge=0)
    new_line_ratio: float | None = Field(0.3, ge=0)

    def signals(self, texts):
        n = len(texts)
        lines = ts.split_newlines(texts, runs=False)
        nonblank = ts._mask(pc.greater(pc.binary_length(ts.strip(lines.values)), 0))
        lines = lines.select(nonblank)
        n_lines = lines.counts
        stop = ts.TERMINAL_PUNCTUATION if self.stop_chars is None else self.stop_chars
        punct = ts.ends_with_any(lines.values, stop)
        lengths = lines.lengths()
        punct_frac = ts.safe_div(lines.per_doc_sum(punct), n_lines)
        short_frac = ts.safe_div(lines.per_doc_sum(lengths <= self.short_line_length), n_lines)
        _, dup_chars = ts.duplicate_stats(lines, lengths)
        newlines = ts._np(pc.count_substring(texts, "\n")).astype(np.int64)
        chars = ts._np(pc.utf8_length(texts)).astype(np.int64) - newlines
        n_words = ts.word_counts(texts)
        columns = {
            "fineweb_line_punct_frac": punct_frac,
            "fineweb_short_line_frac": short_frac,
            "fineweb_char_dup_frac": ts.safe_div(dup_chars, chars),
            "fineweb_newline_per_word": ts.safe_div(newlines, n_words),
        }
        c = columns
        punct_low = _lt(punct_frac, self.line_punct_thr)
        if self.line_punct_exclude_zero:
            punct_low &= punct_frac != 0
        rules = [
            ("empty", n_lines == 0),
            ("line_punct_frac", punct_low),
            ("short_line_frac", _gt(short_frac, self.short_line_thr)),
            ("char_dup_frac", _gt(c["fineweb_char_dup_frac"], self.char_duplicates_ratio)),
            ("newline_per_word", _gt(c["fineweb_newline_per_word"], self.new_line_ratio)),
        ]
        return columns, rules
