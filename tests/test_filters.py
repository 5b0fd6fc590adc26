"""Heuristic filters: Gopher quality/repetition, C4, FineWeb.

Signals are checked against slow, obvious pure-Python implementations (below) on real
documents; decisions against what datatrove decided on the same documents (stored in
tests/data/filters, see its README); every rule with a minimal document made to break it.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import re
import unicodedata
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pydantic import ValidationError

from curation.stages import registry
from curation.stages.c4_quality import C4_POLICY_PHRASES, C4QualityFilter
from curation.stages.fineweb_quality import FineWebQualityFilter
from curation.stages.gopher_quality import GOPHER_STOP_WORDS, GopherQualityFilter
from curation.stages.gopher_repetition import GopherRepetitionFilter
from curation.text import words as text_signals
from curation.text.state import TextState
from curation.text.chars import PUNCTUATION, TERMINAL_PUNCTUATION
from curation.text.counts import bullet_and_ellipsis_lines, hashes_and_ellipses
from curation.text.segments import (Segments, duplicate_stats, ends_with_any, replace_regex_in_some, split_lines,
                                    split_newlines)
from curation.text.words import count_py_words, split_words

DATA = Path(__file__).parent / "data" / "filters"


def _jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


REAL = _jsonl(DATA / "real_docs.jsonl.gz")
DATATROVE = {rec["id"]: rec for rec in _jsonl(DATA / "datatrove_reference.jsonl.gz")}


def batch(texts: list[str | None], **extra) -> pa.Table:
    n = len(texts)
    cols = {
        "id": [f"d{i}" for i in range(n)],
        "text": pa.array(texts, pa.string()),
        "source": ["web"] * n,
        "url": [""] * n,
        "meta": ["{}"] * n,
    }
    cols.update(extra)
    return pa.table(cols)


def reasons(stage, texts: list[str | None]) -> list[str | None]:
    return stage.process(batch(texts)).reasons.to_pylist()


def words_of(text: str) -> list[str]:
    """Our word split of one text, as Python strings."""
    return split_words(pa.array([text])).values().to_pylist()


def detokenize_wikitext(line: str) -> str:
    """Undo WikiText's tokenized spacing (" , " " @-@ " "<unk>"): plain Wikipedia prose."""
    s = line.strip().replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")
    s = re.sub(r" ?<unk>", "", s)
    s = re.sub(r" ([,.;:!?)%])", r"\1", s)
    return s.replace("( ", "(").replace(" 's", "'s").replace(" n't", "n't")


# Real Wikipedia prose (a WikiText-2 article about a blues song): its paragraphs, detokenized.
WIKI_RAW = next(d["text"] for d in REAL if d["source"] == "wikitext" and "Blues =" in d["text"][:40])
PROSE = [detokenize_wikitext(p) for p in WIKI_RAW.split("\n") if len(p.split()) > 40]
WIKI = "\n\n".join(PROSE)


# ---------------------------------------------------------------------------------------------
# Pure-Python references: the definitions, written plainly, one document at a time.
# ---------------------------------------------------------------------------------------------


def _duplicates(parts: list[str]) -> tuple[int, int]:
    seen: set[str] = set()
    count = chars = 0
    for part in parts:
        if part in seen:
            count += 1
            chars += len(part)
        else:
            seen.add(part)
    return count, chars


def ref_gopher_quality(text: str, words: list[str]) -> dict:
    n = len(words)
    real = [w for w in words if any(c not in PUNCTUATION for c in w)]
    lines = text.splitlines()
    return {
        "gopher_n_words": len(real),
        "gopher_mean_word_length": sum(map(len, real)) / len(real) if real else math.nan,
        "gopher_symbol_word_ratio": text.count("#") / n if n else 0.0,
        "gopher_ellipsis_word_ratio": (text.count("...") + text.count("…")) / n if n else 0.0,
        "gopher_bullet_lines_frac": (
            sum(line.lstrip().startswith(("•", "-")) for line in lines) / len(lines) if lines else 0.0),
        "gopher_ellipsis_lines_frac": (
            sum(line.rstrip().endswith(("...", "…")) for line in lines) / len(lines) if lines else 0.0),
        "gopher_alpha_words_frac": sum(any(c.isalpha() for c in w) for w in words) / n if n else 0.0,
        "gopher_stop_words": len(set(GOPHER_STOP_WORDS) & set(words)),
    }


def ref_gopher_repetition(text: str, words: list[str], top_ns=(2, 3, 4), dup_ns=range(5, 11)) -> dict:
    size = len(text)
    paragraphs = re.split(r"\n{2,}", text.strip())
    lines = re.split(r"\n+", text)
    para_dups, para_chars = _duplicates(paragraphs)
    line_dups, line_chars = _duplicates(lines)
    out = {
        "gopher_dup_para_frac": para_dups / len(paragraphs),
        "gopher_dup_para_char_frac": para_chars / size if size else 0.0,
        "gopher_dup_line_frac": line_dups / len(lines),
        "gopher_dup_line_char_frac": line_chars / size if size else 0.0,
    }
    for n in top_ns:
        grams = [tuple(words[i: i + n]) for i in range(len(words) - n + 1)]
        top = 0
        if grams:
            gram, count = Counter(grams).most_common(1)[0]  # ties: the first seen
            top = len(" ".join(gram)) * count
        out[f"gopher_top_{n}_gram_frac"] = top / size if size else 0.0
    for n in dup_ns:
        seen: set[tuple] = set()
        chars, i = 0, 0
        while i < len(words) - n + 1:  # datatrove's scan: a repeat jumps n words ahead
            gram = tuple(words[i: i + n])
            if gram in seen:
                chars += len("".join(gram))
                i += n
            else:
                seen.add(gram)
                i += 1
        out[f"gopher_dup_{n}_gram_frac"] = chars / size if size else 0.0
    return out


def ref_sentences(line: str) -> int:
    """spaCy's sentencizer rule, word by word."""
    count, waiting = 0, False
    for i, w in enumerate(words_of(line)):
        ender = len(w) == 1 and w in TERMINAL_PUNCTUATION
        punct = all(unicodedata.category(c).startswith("P") for c in w)
        if i == 0:
            count = 1
        if waiting and not punct and not ender:
            count += 1
            waiting = False
        elif ender:
            waiting = True
    return count


CITATION = re.compile(r"\[\d*]|\[edit]|\[citation needed]")


def ref_c4(text: str) -> dict:
    kept, sentences, lines = [], 0, text.splitlines()
    reason = None
    for line in lines:
        line = line.strip()
        words = line.split()
        if any(len(w) > 1000 for w in words):
            continue
        line = CITATION.sub("", line)
        if not line.endswith((".", "?", "!", '"', "'")) or line.endswith("..."):
            continue
        if len(words) < 3:
            continue
        low = line.lower()
        if "lorem ipsum" in low:
            reason = "lorem_ipsum"
            break
        if "javascript" in low:
            continue
        if "{" in line:
            reason = "curly_bracket"
            break
        if any(p in low for p in C4_POLICY_PHRASES):
            continue
        sentences += ref_sentences(line)
        kept.append(line)
    if reason is None and sentences < 5:
        reason = "too_few_sentences"
    return {"reason": reason, "text": "\n".join(kept).strip(), "c4_n_sentences": sentences,
            "c4_lines_kept": len(kept) if reason != "lorem_ipsum" and reason != "curly_bracket" else None}


def ref_fineweb(text: str, words: list[str]) -> dict:
    lines = [line for line in text.split("\n") if line.strip() != ""]
    if not lines:
        return {}
    return {
        "fineweb_line_punct_frac": sum(line.endswith(tuple(TERMINAL_PUNCTUATION)) for line in lines) / len(lines),
        "fineweb_short_line_frac": sum(len(line) <= 30 for line in lines) / len(lines),
        "fineweb_char_dup_frac": _duplicates(lines)[1] / len(text.replace("\n", "")),
        "fineweb_newline_per_word": text.count("\n") / len(words),
    }


def assert_signals_equal(got: dict, want: dict, label: str) -> None:
    for name, value in want.items():
        g = got[name]
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(g), (label, name, g)
        else:
            assert g == pytest.approx(value, rel=1e-12, abs=1e-12), (label, name, g, value)


# ---------------------------------------------------------------------------------------------
# Signals equal the references on real documents
# ---------------------------------------------------------------------------------------------


def test_gopher_quality_signals_equal_reference_on_real_docs():
    texts = [d["text"] for d in REAL]
    table = GopherQualityFilter().process(batch(texts)).table.to_pylist()
    for d, row in zip(REAL, table):
        assert_signals_equal(row, ref_gopher_quality(d["text"], words_of(d["text"])), d["id"])


def test_gopher_marks_equal_python_on_every_kind_of_whitespace():
    # The compiled byte scans behind the symbol, ellipsis, bullet and ellipsis-line signals,
    # against str.count / lstrip / rstrip on texts with every character str.isspace knows.
    rng = random.Random(3)
    spaces = [c for c in map(chr, range(0x3001)) if c.isspace() and c not in "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"]
    pieces = ["#", "...", "....", "…", "..", "-", "•", "word", "é", "ж", "\u2026\u2026", "a.b"] + spaces * 2
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
             + "".join(rng.choice(["\n", "\r\n", "\u2028"]) + "".join(rng.choice(pieces) for _ in range(rng.randint(0, 8)))
                       for _ in range(rng.randint(0, 4))) for _ in range(3000)]
    arr = pa.array(texts)
    hashes, ellipses = hashes_and_ellipses(arr)
    assert hashes.tolist() == [t.count("#") for t in texts]
    assert ellipses.tolist() == [t.count("...") + t.count("…") for t in texts]
    lines = split_lines(arr)
    bullet, ell = bullet_and_ellipsis_lines(arr, lines)
    py_lines = [line for t in texts for line in t.splitlines()]
    assert bullet.tolist() == [line.lstrip().startswith(("•", "-")) for line in py_lines]
    assert ell.tolist() == [line.rstrip().endswith(("...", "…")) for line in py_lines]
    assert 0 < sum(bullet) < len(py_lines) and 0 < sum(ell) < len(py_lines)


def test_duplicate_parts_counted_like_python_within_each_document():
    rng = random.Random(5)
    parts = ["", "a", "ab", "é", "ж ж", "the same line", "the same line ", "x" * 300, "…"]
    docs = [[rng.choice(parts) for _ in range(rng.randint(0, 30))] for _ in range(400)]
    seg = Segments.from_lists(pa.array(docs, pa.list_(pa.string())))
    count, chars = duplicate_stats(seg)
    assert (count.tolist(), chars.tolist()) == ([_duplicates(d)[0] for d in docs], [_duplicates(d)[1] for d in docs])
    assert count.sum() > 1000  # and nothing counted across documents: each starts afresh


def test_gopher_repetition_signals_equal_reference_on_real_docs():
    texts = [d["text"] for d in REAL]
    table = GopherRepetitionFilter().process(batch(texts)).table.to_pylist()
    for d, row in zip(REAL, table):
        assert_signals_equal(row, ref_gopher_repetition(d["text"], words_of(d["text"])), d["id"])


def test_gopher_repetition_duplicated_ngrams_on_repetitive_text():
    # Heavy, overlapping repetition exercises the skip-ahead scan: after a repeat the skipped
    # n-grams are not remembered, so later copies of them count as new.
    base = PROSE[1].split()[:60]
    texts = [
        " ".join(base[:12] * 6 + base[12:40] + base[5:30] * 3),
        " ".join((base[:7] + ["x"]) * 9 + base[:20]),
        " ".join(base[i % 9] for i in range(300)),
        " ".join(["a", "b"] * 40 + ["a"] * 33),
    ]
    rows = GopherRepetitionFilter().process(batch(texts)).table.to_pylist()
    for text, row in zip(texts, rows):
        assert_signals_equal(row, ref_gopher_repetition(text, words_of(text)), text[:30])
    # other sizes: unigrams counted, gaps between sizes, a dup size below a top size
    stage = GopherRepetitionFilter(top_n_grams={1: 0.5, 6: 0.2}, dup_n_grams={3: 0.1, 12: 0.1})
    texts += [d["text"] for d in REAL[:40]] + ["", "one", "a a"]
    rows = stage.process(batch(texts)).table.to_pylist()
    for text, row in zip(texts, rows):
        want = ref_gopher_repetition(text, words_of(text), top_ns=(1, 6), dup_ns=(3, 12))
        assert_signals_equal(row, want, text[:30])


def test_c4_output_and_signals_equal_reference_on_real_docs():
    texts = [d["text"] for d in REAL]
    res = C4QualityFilter().process(batch(texts))
    rows = res.table.to_pylist()
    for d, row, reason in zip(REAL, rows, res.reasons.to_pylist()):
        want = ref_c4(d["text"])
        assert reason == (f"c4_quality:{want['reason']}" if want["reason"] else None), d["id"]
        if want["reason"] in (None, "too_few_sentences"):
            assert row["c4_n_sentences"] == want["c4_n_sentences"], d["id"]
            assert row["c4_lines_kept"] == want["c4_lines_kept"], d["id"]
        assert row["text"] == (want["text"] if reason is None else d["text"]), d["id"]


def _c4_awkward_pages(n: int = 400) -> list[str]:
    """Pages of lines made to trip C4's line rules: citations at the end and inside, brackets
    that are no citation, ellipses, every kind of line break and Unicode space, words of over
    1,000 characters, the marker phrases, blank lines (seeded)."""
    rng = random.Random(7)
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    breaks = ["\n", "\r\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\n\n"]
    sentences = [s.strip() + "." for s in " ".join(PROSE[:4]).split(". ") if len(s.split()) > 3][:30]
    bits = ["[1]", "[12]", "[edit]", "[citation needed]", "[x]", "[", "...", "…", '"', "'", "!", "?", "{",
            "JavaScript", "lorem ipsum", "privacy policy", "x" * 1001, "é" * 1001, "日本語です。", "ok", "a b"]

    def line() -> str:
        words = rng.choice(sentences).split()
        for _ in range(rng.randint(0, 3)):
            words.insert(rng.randint(0, len(words)), rng.choice(bits))
        out = "".join(w + rng.choice([" ", " ", " ", rng.choice(spaces)]) for w in words).rstrip()
        if rng.random() < 0.3:
            out += rng.choice(bits)
        return rng.choice(["", " ", "\t", "\xa0"]) + out + rng.choice(["", " ", "\u3000"])

    return ["".join(line() + rng.choice(breaks) for _ in range(rng.randint(0, 12))) + rng.choice(["", "tail"])
            for _ in range(n)]


def test_c4_line_rules_in_one_compiled_pass_equal_the_reference():
    """C4's line rules from the compiled pass over the bytes (``line_facts``) give the
    reference's decisions, text and counts on awkward pages (Python's ``splitlines``/``strip``/
    ``split``: ``ref_c4``), and the same tables as the Arrow passes they replaced under other
    settings (no citation removal, no terminal punctuation rule, short word limits...)."""
    pages = _c4_awkward_pages() + [d["text"] for d in REAL[:40]] + ["", "\n", "a\r", "\r\n\r\n"]
    res = C4QualityFilter().process(batch(pages))
    for i, (row, reason) in enumerate(zip(res.table.to_pylist(), res.reasons.to_pylist())):
        want = ref_c4(pages[i])
        if not pages[i].splitlines():
            assert reason == "c4_quality:empty", i
            continue
        assert reason == (f"c4_quality:{want['reason']}" if want["reason"] else None), (i, pages[i][:80])
        if want["reason"] in (None, "too_few_sentences"):
            assert (row["c4_n_sentences"], row["c4_lines_kept"]) == (want["c4_n_sentences"], want["c4_lines_kept"]), i
        assert row["text"] == (want["text"] if reason is None else pages[i]), i
    # the two ways of applying the line rules, table for table (the Arrow word split for long
    # words treats U+001C..U+001F as part of a word, Python's str.split does not: left out here)
    plain = [p.translate({c: " " for c in range(0x1C, 0x20)}) for p in pages]
    for params in ({}, {"remove_citations": False}, {"filter_no_terminal_punct": False}, {"min_words_per_line": None},
                   {"max_word_length": 5}, {"max_word_length": None, "filter_policy": False}):
        stage = C4QualityFilter(**params)
        for texts in (plain, [d["text"] for d in REAL]):
            state = TextState(pa.array(texts))
            state.words  # with the words at hand: kept lines take theirs from the documents
            for st in (state, TextState(pa.array(texts))):
                got, got_state = stage._measure_lines(batch(texts), st, stage._lines_by_facts(st))
                want, want_state = stage._measure_lines(batch(texts), st, stage._lines_by_arrays(st))
                assert got.equals(want), params
                assert got_state.texts.equals(want_state.texts)
                assert np.array_equal(got_state.known_word_counts(), want_state.known_word_counts()), params


def test_fineweb_signals_equal_reference_on_real_docs():
    texts = [d["text"] for d in REAL]
    table = FineWebQualityFilter().process(batch(texts)).table.to_pylist()
    for d, row in zip(REAL, table):
        assert_signals_equal(row, ref_fineweb(d["text"], words_of(d["text"])), d["id"])


# ---------------------------------------------------------------------------------------------
# Decisions and words agree with datatrove (and spaCy) on real documents
# ---------------------------------------------------------------------------------------------

DATATROVE_REASONS = {
    "gopher_short_doc": "too_few_words", "gopher_long_doc": "too_many_words",
    "gopher_below_avg_threshold": "mean_word_length", "gopher_above_avg_threshold": "mean_word_length",
    "gopher_too_many_hashes": "symbol_word_ratio", "gopher_too_many_ellipsis": "ellipsis_word_ratio",
    "gopher_too_many_bullets": "bullet_lines_frac", "gopher_too_many_end_ellipsis": "ellipsis_lines_frac",
    "gopher_below_alpha_threshold": "alpha_words_frac", "gopher_enough_stop_words": "stop_words",
    **{f"duplicated_{n}_n_grams": f"dup_{n}_gram" for n in range(5, 11)},
    "line_punct_ratio": "line_punct_frac", "short_line_ratio": "short_line_frac",
    "char_dup_ratio": "char_dup_frac", "list_ratio": "newline_per_word",
}


@pytest.mark.parametrize("stage", [GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(),
                                   FineWebQualityFilter()], ids=lambda s: s.type)
def test_decisions_agree_with_datatrove(stage):
    res = stage.process(batch([d["text"] for d in REAL]))
    ours = res.reasons.to_pylist()
    theirs = [DATATROVE[d["id"]][stage.type] for d in REAL]
    theirs = [None if t is None else f"{stage.type}:{DATATROVE_REASONS.get(t, t)}" for t in theirs]
    same_decision = sum((o is None) == (t is None) for o, t in zip(ours, theirs)) / len(REAL)
    same_reason = sum(o == t for o, t in zip(ours, theirs)) / len(REAL)
    assert same_decision >= 0.99 and same_reason >= 0.98, list(zip(ours, theirs))
    assert sum(o is None for o in ours) >= 5 and sum(o is not None for o in ours) >= 5  # both kinds
    if stage.type == "c4_quality":
        texts = res.table.column("text").to_pylist()
        for d, o, t, text in zip(REAL, ours, theirs, texts):
            if o is None and t is None:
                assert text == DATATROVE[d["id"]]["c4_text"], d["id"]


def test_words_agree_with_spacy_on_real_docs():
    words = split_words(pa.array([d["text"] for d in REAL]))
    values = words.values().to_pylist()
    same = total = 0
    for i, d in enumerate(REAL):
        ours, theirs = values[words.offsets[i]: words.offsets[i + 1]], DATATROVE[d["id"]]["words"]
        same += ours == theirs
        total += len(theirs)
    assert same / len(REAL) >= 0.98
    assert abs(len(values) - total) <= total * 1e-4


@pytest.mark.parametrize("text,expected", [
    ('Hello, world! Don\'t do it... U.S. well-known (test) 3.5% "quoted"',
     ["Hello", ",", "world", "!", "Do", "n't", "do", "it", "...", "U.S.", "well", "-", "known", "(",
      "test", ")", "3.5", "%", '"', "quoted", '"']),
    ("Visit http://example.com/a?b=1 or www.example.org, e-mail me: a@b.com.",
     ["Visit", "http://example.com/a?b=1", "or", "www.example.org", ",", "e", "-", "mail", "me", ":",
      "a@b.com", "."]),
    ("Mr. Smith paid $5 for 10kg at 9am (about 3-4 hours) -- cannot complain :)",
     ["Mr.", "Smith", "paid", "$", "5", "for", "10", "kg", "at", "9", "am", "(", "about", "3", "-", "4",
      "hours", ")", "--", "can", "not", "complain", ":)"]),
    ("Prices rose 10%. The U.K. and N.Y. agreed; e.g. this, i.e. that.",
     ["Prices", "rose", "10", "%", ".", "The", "U.K.", "and", "N.Y.", "agreed", ";", "e.g.", "this", ",",
      "i.e.", "that", "."]),
    ("“Smart quotes” — and an ellipsis… plus rock'n'roll, C++ and and/or.",
     ["“", "Smart", "quotes", "”", "—", "and", "an", "ellipsis", "…", "plus", "rock'n'roll", ",", "C++",
      "and", "and/or", "."]),
    ("#hashtag @user 1,000,000 2019-2020 12:30 a/b/c x=y <tag> ***",
     ["#", "hashtag", "@user", "1,000,000", "2019", "-", "2020", "12:30", "a", "/", "b", "/", "c", "x", "=",
      "y", "<", "tag", ">", "*", "*", "*"]),
    # A unit is split off before special cases merge words ("m." is one); "$" after a number
    # is split off like a unit.
    ("raised $460m. for 25$ and 10kg. or 5мбар, (3km) 2$.",
     ["raised", "$", "460", "m.", "for", "25", "$", "and", "10", "kg", ".", "or", "5", "мбар", ",", "(",
      "3", "km", ")", "2$."]),
])
def test_words_like_spacy_on_crafted_text(text, expected):
    # Expected lists are spaCy's (``spacy.blank("en")``, as datatrove uses it).
    assert words_of(text) == expected


def _fuzz_texts(n_texts: int, seed: int = 7) -> list[str]:
    """Texts of chunks built the way the rules read them (prefixes, a core of parts joined by
    infixes, suffixes), and of random characters every rule looks at."""
    rng = random.Random(seed)
    pre = list("(\"“$#'…+-*<[„«‘‚¿¡©°") + ["..", "€"]
    parts = ["word", "Word", "ABC", "x", "12", "3.5", "don't", "it's", "жук", "Ж", "é", "の", "U.S", "5kg",
             "10m", "25$", "7мбар", "°C", "am", "10am", "http://x.com/a-b", "www.a.org", "e.g", "Mr", "s",
             # non-ASCII cores take the quick path too: the dot rule reads whole characters
             "ÉÉ", "ÉA", "AÉ", "É", "Straße", "中文", "ŒUVRE", "5²"]
    infix = ["-", "--", "---", "----", "—", "——", "–", "~", "/", ":", "=", "<", ".", "..", "...", "…", ",",
             "+", "*", "^", "’", "'", "²", "%", "&"]
    suf = list(".,;:!?)\"”'’…+$%]“»›©°") + ["'s", "’S", "..", "……", "………", "kg", "km", "😀"]
    chars = list("aBcZé09") + ["ж", "の"] + list(".,'’-—–~…$€+()\"“”:/=%°#*^²!?<>;")
    texts = []
    for _ in range(n_texts):
        chunks = []
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.2:
                chunks.append("".join(rng.choice(chars) for _ in range(rng.randint(1, 8))))
                continue
            core = rng.choice(parts)
            for _ in range(rng.choice([0, 0, 1, 1, 2])):
                core += rng.choice(infix) + rng.choice(parts)
            chunks.append("".join(rng.choice(pre) for _ in range(rng.choice([0, 0, 0, 1, 2]))) + core
                          + "".join(rng.choice(suf) for _ in range(rng.choice([0, 0, 1, 1, 2, 3]))))
        texts.append("".join(c + rng.choice([" ", " ", "\n", "\u00a0"]) for c in chunks))
    return texts


def test_words_quick_paths_and_compiled_rules_agree_with_the_array_rules():
    # ``reference=True`` sends every chunk through the array version of the full rules; the
    # default takes compiled quick paths for plain and "word," chunks and the compiled rules
    # for the rest. Same words on real pages and on fuzzed rule-heavy text.
    texts = [d["text"] for d in REAL] + _fuzz_texts(400) + ["a " * 3000, "b, c. " * 800,
                                                            "30,1 °C. „Vivy“ «mot» Stadt“ “It’s ’s °F. x° 😀word"]
    # a batch denser than the chunk scan's first room (a chunk per 4 bytes): scanned again
    dense = ["a " * 3000, "b, c. " * 800, "x", "1 2 3"]
    for batch in (texts, dense):
        arr = pa.array(batch)
        quick, full = split_words(arr), split_words(arr, reference=True)
        assert len(quick.start) > (90_000 if batch is texts else 4_000)
        for i in range(len(batch)):
            a = slice(quick.offsets[i], quick.offsets[i + 1])
            b = slice(full.offsets[i], full.offsets[i + 1])
            assert (quick.start[a].tolist(), quick.end[a].tolist()) == (full.start[b].tolist(), full.end[b].tolist()), batch[i]
    assert split_words(pa.array(dense)).values().to_pylist()[:3] == ["a", "a", "a"]


def test_special_case_keys_cut_alike_by_quick_paths_and_array_rules():
    """The special-case tables are cut by the array rules; each key cut by the quick paths
    must give the same words, or a quick path differs from the rules where they meet (a
    multi-byte first character took "°C." as "°" "C." where the degree rule makes "°" "C" ".")."""
    from curation.text.words import SPECIAL_CASES

    keys = [k for k in SPECIAL_CASES if len(k.encode()) <= 16]
    quick = split_words(pa.array(keys), special_cases=False)
    rules = split_words(pa.array(keys), special_cases=False, reference=True)
    assert len(keys) > 1000
    differ = [k for i, k in enumerate(keys)
              if (quick.start[quick.offsets[i]:quick.offsets[i + 1]].tolist(), quick.end[quick.offsets[i]:quick.offsets[i + 1]].tolist())
              != (rules.start[rules.offsets[i]:rules.offsets[i + 1]].tolist(), rules.end[rules.offsets[i]:rules.offsets[i + 1]].tolist())]
    assert differ == []


def test_words_per_document_with_slices_and_nulls():
    texts = pa.array(["zero words?", None, "", "  \n\t ", "one two three", "naïve café — déjà vu."])
    table = pa.table({"text": texts}).slice(1)  # executors hand stages zero-copy slices
    words = split_words(table.column("text").combine_chunks().fill_null(""))
    assert words.counts.tolist() == [0, 0, 0, 3, 6]
    assert words.values().to_pylist()[3:] == ["naïve", "café", "—", "déjà", "vu", "."]
    assert words.lengths.tolist() == [3, 3, 5, 5, 4, 1, 4, 2, 1]


def test_words_reused_for_the_documents_a_previous_stage_kept(monkeypatch):
    texts = [d["text"] for d in REAL[:60]] + [REAL[0]["text"]]  # with a duplicate
    state = TextState(pa.array(texts))
    first = state.words
    first.hash, first.lengths  # measurements made by the previous stage travel along
    keep = [i for i in range(len(texts)) if i % 3 != 1]
    kept = [texts[i] for i in keep]
    calls = []
    real_split = text_signals.split_words
    monkeypatch.setattr(text_signals, "split_words", lambda t, **kw: calls.append(len(t)) or real_split(t, **kw))
    reused = state.take(keep).words  # the state the next stage gets: nothing split again
    assert calls == []
    # nothing measured again either: the measurements are read from the words as split
    measured = []
    real_measure = text_signals.kernels.word_measures_and_keys
    monkeypatch.setattr(text_signals.kernels, "word_measures_and_keys",
                        lambda *a: measured.append(1) or real_measure(*a))
    got = {name: getattr(reused, name) for name in ("lengths", "symbol", "alpha", "punct", "ender", "hash")}
    assert measured == []
    # a subset of a subset reads from the words as split too (one generation kept, no chain)
    sub = state.take(keep).take([2, 0]).words
    sub_lengths, sub_hash = sub.lengths, sub.hash
    assert sub._root is first and measured == []
    assert np.array_equal(sub_lengths, split_words(pa.array([kept[2], kept[0]])).lengths)
    assert np.array_equal(sub_hash[sub.offsets[1]:], got["hash"][:reused.offsets[1]])
    fresh = split_words(pa.array(kept))  # split from scratch
    assert reused.values().to_pylist() == fresh.values().to_pylist()
    assert reused.offsets.tolist() == fresh.offsets.tolist()
    assert reused.doc.tolist() == fresh.doc.tolist() == np.repeat(np.arange(len(kept)), fresh.counts).tolist()
    for name in ("lengths", "symbol", "alpha", "punct", "ender"):
        assert np.array_equal(got[name], getattr(fresh, name)), name
    # Word ids: the same partition into equal words (long words get per-batch ids).
    def partition(h):  # each word labelled by the first position holding an equal word
        _, first, inverse = np.unique(h, return_index=True, return_inverse=True)
        return first[inverse]

    assert np.array_equal(partition(reused.hash), partition(fresh.hash))
    one_changed = kept[:5] + [kept[5] + " and more words."] + kept[6:]
    assert TextState(pa.array(one_changed)).word_counts()[5] == fresh.counts[5] + 4
    # the rows of the subset in any order, repeated: still the words of those texts
    order = [len(kept) - 1, 0, 3, 3]
    again = state.take(keep).take(order).words
    assert again.values().to_pylist() == split_words(pa.array([kept[i] for i in order])).values().to_pylist()


def test_gopher_quality_after_a_filter_reads_the_kept_rows_tallies_where_the_words_lie(monkeypatch):
    """The state a filter hands on holds the earlier words, not moved yet: Gopher quality
    tallies each kept page from the words as split (no span moved, the same signals as on
    moved words and as on a fresh split); a state holding under half of those texts moves its
    words first; a later stage that reads words moves them from the words as split."""
    texts = [d["text"] for d in REAL[:60]] + [REAL[0]["text"], "", "no stop words here at all"]
    state = TextState(pa.array(texts))
    first = state.words
    first.hash, first.lengths  # what Gopher repetition measured
    keep = np.array([i for i in range(len(texts)) if i % 5 != 1])
    kept = pa.table({"id": [str(i) for i in keep], "text": pa.array([texts[i] for i in keep])})
    moved = []
    real_take = text_signals.Words.take_docs
    monkeypatch.setattr(text_signals.Words, "take_docs", lambda self, *a: moved.append(len(a[0])) or real_take(self, *a))
    gq = GopherQualityFilter()
    lazy = state.take(keep)
    assert lazy.has_words and lazy.words_source()[0] is first
    in_place = gq.measure(kept, lazy)[0]
    assert moved == []  # read where they lie: no span moved
    eager = state.take(keep)
    eager.words  # moved
    assert moved == [len(keep)]
    on_moved = gq.measure(kept, eager)[0]
    fresh = gq.measure(kept)[0]  # split from scratch
    cols = [c for c in fresh.column_names if c.startswith("gopher_")]
    assert len(cols) >= 8
    for c in cols:
        assert in_place.column(c).to_pylist() == on_moved.column(c).to_pylist() == fresh.column(c).to_pylist(), c
    counts = split_words(kept.column("text").combine_chunks()).counts.tolist()
    assert lazy.known_word_counts().tolist() == lazy.word_counts().tolist() == counts
    few = state.take(keep[:20])  # under half of the texts: moved before they are read
    assert few.words_source() == (few.words, None) and moved[-1] == 20
    # a subset of a subset still reads from the words as split
    sub = lazy.take([3, 0, 3])
    assert sub.words_source(0.01)[0] is first and sub.words_source(0.01)[1].tolist() == keep[[3, 0, 3]].tolist()
    assert sub.words._root is first


def test_state_of_kept_rows_takes_the_kept_tables_text_without_copying_it():
    """The executor hands the next stage the kept table's text column (already filtered) to
    the state's ``take``: the state then holds that very array (no second copy), its words
    are the words of those texts, and text that is not those rows is refused."""
    texts = [d["text"] for d in REAL[:40]] + [None, ""]
    table = pa.table({"id": [str(i) for i in range(len(texts))], "text": pa.array(texts, pa.string())})
    state = TextState.of(table)
    state.words
    keep = np.array([i for i in range(len(texts)) if i % 4 != 2])
    kept_col = table.filter(pa.array(np.isin(np.arange(len(texts)), keep))).column("text")
    taken = state.take(keep, kept_col)
    assert kept_col.null_count == 1  # the null stands for "": same state as taking the state's text
    assert taken.texts.to_pylist() == state.take(keep).texts.to_pylist()
    clean = table.slice(0, 40)  # no null: the state holds the kept column's own buffer
    clean_col = clean.filter(pa.array(np.arange(40) % 4 != 2)).column("text")
    assert clean_col.num_chunks == 1
    held = TextState.of(clean).take(np.flatnonzero(np.arange(40) % 4 != 2), clean_col).texts
    assert held.buffers()[2].address == clean_col.chunk(0).buffers()[2].address
    assert taken.words.values().to_pylist() == split_words(state.take(keep).texts).values().to_pylist()
    same_rows = table.filter(pa.array(np.isin(np.arange(len(texts)), keep[:-1]))).column("text")
    with pytest.raises(ValueError, match="texts of"):
        state.take(keep, same_rows)  # one row short
    other = pa.array([(t or "") + "x" for t in kept_col.to_pylist()])
    with pytest.raises(ValueError, match="texts of"):
        state.take(keep, other)  # as many rows, other bytes


def test_c4_after_a_splitting_filter_takes_line_words_from_the_documents(monkeypatch):
    """C4 after a filter that split the documents reads each line's words from the
    documents' words (citation-free lines) and must give exactly what splitting gives."""
    texts = [d["text"] for d in REAL] + [WIKI + "\nIt was a hit.[1] Critics agreed [12] at once. Then more came."]
    fresh = C4QualityFilter().process(batch(texts))
    state = TextState.of(batch(texts))
    state.words  # what the filter before C4 does: it passes its text state on
    calls = []
    real_split = text_signals.split_words
    monkeypatch.setattr(text_signals, "split_words", lambda t, **kw: calls.append(len(t)) or real_split(t, **kw))
    reused = C4QualityFilter().process(batch(texts), state)
    assert reused.table.equals(fresh.table) and reused.reasons.equals(fresh.reasons)
    assert len(calls) == 1 and 0 < calls[0] < 10  # only the lines whose citations were cut


def test_fineweb_after_c4_counts_words_without_splitting_again(monkeypatch):
    texts = [d["text"] for d in REAL]
    res = C4QualityFilter().process(batch(texts))
    keep = np.flatnonzero(res.reasons.is_null().to_numpy(zero_copy_only=False))
    kept = res.table.take(keep)  # what the next stage sees, with C4's text state for those rows
    state = res.text.take(keep)
    assert 0 < kept.num_rows < len(texts)
    out = kept.column("text").combine_chunks()
    calls = []
    real_split = text_signals.split_words
    monkeypatch.setattr(text_signals, "split_words", lambda t, **kw: calls.append(len(t)) or real_split(t, **kw))
    known = state.word_counts()
    assert calls == []  # C4 told it the counts of every text it wrote
    assert known.tolist() == real_split(out).counts.tolist()
    # FineWeb's signals are the same either way, and it splits nothing when given the state
    table = pa.table({"id": kept.column("id"), "text": out})
    cached = FineWebQualityFilter().process(table, state).table
    assert calls == []
    fresh = FineWebQualityFilter().process(table).table
    assert calls and cached.equals(fresh)
    # a changed text is not taken for a known one: a new text has a new state, and a stage
    # refuses a state that is not its batch's text
    changed = pa.array([out[0].as_py() + " two more"])
    assert TextState(changed).word_counts()[0] == known[0] + 2
    with pytest.raises(ValueError, match="not its text"):
        FineWebQualityFilter().process(pa.table({"id": ["x"], "text": changed}), state.take([0]))


@pytest.mark.parametrize("split,reference", [
    (split_lines, str.splitlines),
    (split_newlines, lambda t: re.split(r"\n+", t)),
    (lambda a: split_newlines(a, min_run=2), lambda t: re.split(r"\n{2,}", t)),
    (lambda a: split_newlines(a, runs=False), lambda t: t.split("\n")),
])
def test_line_and_paragraph_splits_equal_python(split, reference):
    texts = ["\na\n\nb\n", "x", "", "\n", "a\r\nb\rc\x0bd\x1ce\u2028f\x85g\n", "p\n\n\nq\n\n", "\n\nlead",
             "né\n\n\n", *[d["text"] for d in REAL[:20]]]
    seg = split(pa.array(texts))
    values = seg.values.to_pylist()
    assert [values[seg.offsets[i]: seg.offsets[i + 1]] for i in range(len(texts))] == [reference(t) for t in texts]
    assert count_py_words(pa.array(texts)).tolist() == [len(t.split()) for t in texts]


def test_compiled_line_helpers_equal_python():
    """C4's per-line helpers that skip Arrow's per-string regex: ``count_py_words`` (one
    compiled pass) against ``len(t.split())`` with every Unicode space, ``ends_with_any``
    (the last byte) against ``t[-1:] in chars``, ``replace_regex_in_some`` (the regex only
    on strings holding its byte) against the regex on every string; real lines, sliced
    arrays and nulls included."""
    rng = random.Random(7)
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace()]
    soup = spaces + list("ab é日.?!'\"[]1x") + ["\u00a8", "\u200b", "\u180e", "\u2060", "\ufeff", "[12]", "[edit]"]
    lines = [line for d in REAL[:40] for line in d["text"].split("\n")]
    texts = lines + ["".join(rng.choice(soup) for _ in range(rng.randint(0, 25))) for _ in range(3000)]
    texts += [f"a{c}b" for c in spaces] + ["", " ", "é.", "end…", "x?"]
    arr = pa.array(texts)
    assert count_py_words(arr).tolist() == [len(t.split()) for t in texts]
    assert count_py_words(arr.slice(5, 300)).tolist() == [len(t.split()) for t in texts[5:305]]
    for chars in (".?!\"'", ".?!\"'。！？"):  # ASCII: by the last byte; else the regex
        assert ends_with_any(arr, chars).tolist() == [t[-1:] != "" and t[-1] in chars for t in texts]
        with_null = pa.array(texts[:50] + [None])
        assert ends_with_any(with_null.slice(3), chars).tolist() == [t[-1:] != "" and t[-1] in chars
                                                                     for t in texts[3:50]] + [False]
    cite = r"\[\p{Nd}*\]|\[edit\]|\[citation needed\]"
    for a in (arr, arr.slice(100, 2000), pa.array(["no bracket", "a[1]b", None, "[citation needed]"]),
              pa.array(["plain"] * 3)):
        assert replace_regex_in_some(a, 0x5B, cite, "").to_pylist() == pc.replace_substring_regex(a, cite, "").to_pylist()


# ---------------------------------------------------------------------------------------------
# Each rule, with a minimal document that breaks it
# ---------------------------------------------------------------------------------------------

def test_clean_wikipedia_text_passes_every_filter():
    text = WIKI
    for stage in (GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(), FineWebQualityFilter()):
        assert reasons(stage, [text]) == [None], stage.type


def test_gopher_repetition_rules():
    unique = [" ".join(p.split()[:12]) for p in PROSE[:8]]
    forty_percent_dup_lines = "\n".join(unique[:6] + [unique[0]] * 4)
    dup_paragraphs = "\n\n".join(unique[:6] + [unique[0]] * 4)
    long_para = PROSE[0]
    dup_para_chars = "\n\n".join([long_para, "Short one.", "Another short one.", "A third.", "Fourth.", long_para])
    dup_line_chars = "\n".join([long_para, "Short one.", "Another short one.", "A third.", "Fourth.", long_para])
    top_bigram = " ".join(["hello world"] * 30 + PROSE[0].split()[:20])
    body = PROSE[1].split()[:120]
    repeated = PROSE[2].split()[:25]
    dup_5grams = " ".join(body[:60] + repeated + body[60:] + repeated + repeated)
    stage = GopherRepetitionFilter()
    got = reasons(stage, [forty_percent_dup_lines, dup_paragraphs, dup_para_chars, dup_line_chars,
                          top_bigram, dup_5grams])
    assert got == [
        "gopher_repetition:dup_line_frac",
        "gopher_repetition:dup_para_frac",
        "gopher_repetition:dup_para_char_frac",
        "gopher_repetition:dup_line_char_frac",
        "gopher_repetition:top_2_gram",
        "gopher_repetition:dup_5_gram",
    ]


def test_gopher_quality_rules():
    prose = " ".join(PROSE[0].split()[:80])
    cases = {
        "too_few_words": "The cat sat on the mat with the hat.",
        "mean_word_length": " ".join(["the", "and", "with"] + ["extraordinarilylongwords"] * 60),
        "symbol_word_ratio": prose + " " + "#tag " * 20,
        "ellipsis_word_ratio": prose + " wait..." * 20,
        "bullet_lines_frac": "\n".join("- " + " ".join(PROSE[0].split()[i: i + 8]) for i in range(0, 80, 8)),
        "ellipsis_lines_frac": "\n".join(" ".join(PROSE[0].split()[i: i + 25]) + " ..." for i in range(0, 100, 25)),
        "alpha_words_frac": prose + " " + " ".join(str(i) for i in range(60)),
        "stop_words": " ".join(w for w in WIKI.split() if w.isalpha() and w.lower() not in GOPHER_STOP_WORDS),
    }
    got = reasons(GopherQualityFilter(), list(cases.values()))
    assert got == [f"gopher_quality:{rule}" for rule in cases]
    assert reasons(GopherQualityFilter(max_doc_words=50), [prose]) == ["gopher_quality:too_many_words"]


def test_c4_rules_and_line_removal():
    sentences = [s.strip() + "." for s in " ".join(PROSE[:3]).split(". ") if len(s.split()) > 4][:8]
    good = "\n".join(sentences)
    assert reasons(C4QualityFilter(), [good]) == [None]
    noisy = "\n".join([
        "Please enable JavaScript to view this page properly.",
        sentences[0] + " [12]",  # a citation after the period leaves a trailing space: dropped
        sentences[1],
        "Menu",  # no terminal punctuation
        "Too short.",  # fewer than 3 words
        "This site uses cookies to give you a better experience.",
        "x" * 1001 + " is a very long word indeed.",
        *sentences[2:],
        "Ends with an ellipsis...",
    ])
    res = C4QualityFilter().process(batch([noisy]))
    assert res.reasons.to_pylist() == [None]
    row = res.table.to_pylist()[0]
    assert row["text"] == "\n".join(sentences[1:])
    assert row["c4_lines_kept"] == len(sentences) - 1 and row["c4_lines_removed"] == 7
    lorem = good + "\nLorem ipsum dolor sit amet, consectetur."
    curly = good + "\nfunction f() { return 1; } is code."
    js_curly = good + "\nvar x = {a: 1}; // javascript."  # javascript removes the line first
    few = "One sentence here.\nAnd another one here."
    got = reasons(C4QualityFilter(), [lorem, curly, js_curly, few, ""])
    assert got == ["c4_quality:lorem_ipsum", "c4_quality:curly_bracket", None, "c4_quality:too_few_sentences",
                   "c4_quality:empty"]
    no_punct = "\n".join(s.rstrip(".") for s in sentences)
    assert reasons(C4QualityFilter(), [no_punct]) == ["c4_quality:too_few_sentences"]
    assert reasons(C4QualityFilter(filter_no_terminal_punct=False), [no_punct]) == [None]


def test_fineweb_rules():
    prose_lines = [" ".join(p.split()[:30]) + "." for p in PROSE[:6]]
    cases = {
        "line_punct_frac": "\n".join(line.rstrip(".") for line in prose_lines),
        "short_line_frac": "\n".join(["Home", "About us", "Contact", "Shop", prose_lines[0]]),
        "char_dup_frac": "\n".join(prose_lines + [prose_lines[0]]),
        # Long lines of two long words: not short, but a newline every three words.
        "newline_per_word": "\n".join(f"Incomprehensibilities notwithstanding{i:03d}." for i in range(40)),
    }
    got = reasons(FineWebQualityFilter(), list(cases.values()) + ["\n".join(prose_lines), "\n \n"])
    assert got == [f"fineweb_quality:{rule}" for rule in cases] + [None, "fineweb_quality:empty"]


# ---------------------------------------------------------------------------------------------
# Configuration, empty input, batch shape
# ---------------------------------------------------------------------------------------------


def test_thresholds_are_configurable():
    dup = "\n".join(["same line here"] * 4 + ["other line", "third line", "fourth one", "fifth"])
    assert reasons(GopherRepetitionFilter(), [dup])[0] == "gopher_repetition:dup_line_frac"
    relaxed = GopherRepetitionFilter(dup_line_frac=0.5, dup_line_char_frac=None, top_n_grams={},
                                     dup_n_grams={})
    assert reasons(relaxed, [dup]) == [None]
    loose = {"min_avg_word_length": None, "min_alpha_words_ratio": None}
    assert reasons(GopherQualityFilter(min_doc_words=None, min_stop_words=None, **loose),
                   ["Short text, clearly."]) == [None]
    assert reasons(GopherQualityFilter(stop_words=["clearly"], min_doc_words=2, min_stop_words=1, **loose),
                   ["Short text, clearly."]) == [None]
    assert reasons(GopherQualityFilter(min_doc_words=2, min_stop_words=1, **loose),
                   ["Short text, clearly."]) == ["gopher_quality:stop_words"]
    assert reasons(C4QualityFilter(min_num_sentences=1), ["Just one sentence in here."]) == [None]
    assert reasons(FineWebQualityFilter(short_line_thr=1.0, line_punct_thr=0.0, new_line_ratio=None),
                   ["a\nb\nc"]) == [None]
    stage = GopherRepetitionFilter(top_n_grams={"3": 0.5}, dup_n_grams={7: 0.2})
    assert stage.top_n_grams == {3: 0.5}
    cols = stage.process(batch([WIKI])).table.column_names
    assert "gopher_top_3_gram_frac" in cols and "gopher_dup_7_gram_frac" in cols
    assert "gopher_top_2_gram_frac" not in cols


@pytest.mark.parametrize("cls,kwargs", [
    (GopherQualityFilter, {"min_doc_word": 10}),
    (GopherQualityFilter, {"min_doc_words": "many"}),
    (GopherRepetitionFilter, {"top_n_grams": {0: 0.2}}),
    (GopherRepetitionFilter, {"dup_line_frac": -0.1}),
    (C4QualityFilter, {"filter_javascript": "perhaps"}),
    (FineWebQualityFilter, {"stop_chars": 5}),
])
def test_invalid_config_raises(cls, kwargs):
    with pytest.raises(ValidationError):
        cls(**kwargs)


def test_stages_are_registered_with_their_type():
    for name, cls in [("gopher_quality", GopherQualityFilter), ("gopher_repetition", GopherRepetitionFilter),
                      ("c4_quality", C4QualityFilter), ("fineweb_quality", FineWebQualityFilter)]:
        assert registry[name] is cls
        assert cls().type == name
        assert cls.model_validate({"type": name, "input": "x"}).input == "x"


@pytest.mark.parametrize("stage", [GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(),
                                   FineWebQualityFilter()], ids=lambda s: s.type)
def test_empty_and_null_text_dropped_without_crash(stage):
    texts = [None, "", WIKI, None]
    res = stage.process(batch(texts))
    got = res.reasons.to_pylist()
    assert got[0] == got[1] == got[3] == f"{stage.type}:empty"
    assert got[2] is None
    assert res.table.num_rows == 4
    only_empty = stage.process(batch([None, ""]))
    assert only_empty.reasons.to_pylist() == [f"{stage.type}:empty"] * 2


@pytest.mark.parametrize("stage", [GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(),
                                   FineWebQualityFilter()], ids=lambda s: s.type)
def test_rows_columns_and_slices_preserved(stage):
    texts = [d["text"] for d in REAL[:40]]
    table = batch(texts, lang=["en"] * len(texts))
    whole = stage.process(table)
    assert whole.table.column("id").to_pylist() == table.column("id").to_pylist()
    assert whole.table.column("lang").to_pylist() == ["en"] * len(texts)
    assert whole.table.num_columns > table.num_columns
    # A slice (as the executor passes) and a large_string column give the same answer.
    part = stage.process(table.slice(10, 20))
    assert part.reasons.to_pylist() == whole.reasons.to_pylist()[10:30]
    assert part.table.slice(0).to_pylist() == whole.table.slice(10, 20).to_pylist()
    large = table.set_column(1, "text", table.column("text").cast(pa.large_string()))
    assert stage.process(large).reasons.to_pylist() == whole.reasons.to_pylist()
    # Rerunning on its own output replaces the signal columns instead of duplicating them.
    if stage.type != "c4_quality":
        again = stage.process(whole.table)
        assert again.table.column_names == whole.table.column_names


def test_signal_columns_are_numeric():
    res = GopherRepetitionFilter().process(batch([WIKI, "x"]))
    for name in res.table.column_names:
        if name.startswith("gopher_"):
            assert pa.types.is_floating(res.table.schema.field(name).type), name
    q = GopherQualityFilter().process(batch([WIKI])).table
    assert pa.types.is_integer(q.schema.field("gopher_n_words").type)
    assert np.isfinite(q.column("gopher_mean_word_length").to_numpy()).all()
