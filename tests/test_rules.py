"""Measure once, decide cheaply: the filters' (and langid's) rules tables.

- ``decide(measure(batch))`` gives exactly what ``process`` gave before signals and rules were
  separated: ``OLD`` holds, for real documents (``tests/data/filters``, ``tests/data/langid``)
  and a few crafted ones, a digest of the old ``process``'s reasons per row (and their counts,
  to read) and of each column it wrote, computed with the code before the change;
- measured rows written to Parquet and read back re-decide, with other thresholds, exactly as
  measuring afresh with those thresholds would, without splitting or scanning any text;
- ``signals_hash`` ignores thresholds and follows everything else;
- text states carry words from one fused stage to the next.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from curation.stages.base import OPS, MapStage, Rule, StageResult
from curation.stages.c4_quality import C4QualityFilter
from curation.stages.fineweb_quality import FineWebQualityFilter
from curation.stages.gopher_quality import GopherQualityFilter
from curation.stages.gopher_repetition import GopherRepetitionFilter
from curation.stages.langid import LanguageId
from curation.text import state as text_state
from curation.text import segments as text_segments
from curation.text import words as text_words
from curation.text.arrow import text_column
from curation.text.state import TextState

DATA = Path(__file__).parent / "data"


def _jsonl(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


REAL = _jsonl(DATA / "filters" / "real_docs.jsonl.gz")
LANG = _jsonl(DATA / "langid" / "lingua_docs_gt200chars_14lang.jsonl.gz")

GOOD = "\n".join(f"Sentence number {w} is written here in full."
                 for w in ["one", "two", "three", "four", "five", "six"])
CRAFTED = [  # every C4 page rule, in and out of order
    GOOD,
    GOOD + "\nLorem ipsum dolor sit amet, consectetur.",
    GOOD + "\nfunction f() { return 1; } is code.",
    GOOD + "\nfunction f() { return 1; } is code.\nLorem ipsum dolor sit amet, consectetur.",
    "Lorem ipsum dolor sit amet, consectetur.\n" + GOOD + "\nfunction f() { return 1; } is code.",
    GOOD + "\nvar x = {a: 1}; // javascript.",
    "One sentence here.\nAnd another one here.",
    "Menu\nHome\n...",
]
TEXTS = [d["text"] for d in REAL] + [None, "", "\n \n", "   "] + CRAFTED
LANG_TEXTS = [d["text"] for d in LANG] + ["", None, "12345", "xq zzv", "!!! ???"]


def batch(texts: list[str | None]) -> pa.Table:
    n = len(texts)
    return pa.table({"id": [f"d{i}" for i in range(n)], "text": pa.array(texts, pa.string()),
                     "source": ["web"] * n, "url": [""] * n, "meta": ["{}"] * n})


def lang_batch(texts: list[str | None]) -> pa.Table:
    return pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": pa.array(texts, pa.string())})


CONFIGS = {
    "gopher_quality": GopherQualityFilter(),
    "gopher_quality_loose": GopherQualityFilter(min_doc_words=20, max_avg_word_length=6, max_symbol_word_ratio=0.01,
                                                min_stop_words=None),
    "gopher_repetition": GopherRepetitionFilter(),
    "gopher_repetition_sizes": GopherRepetitionFilter(top_n_grams={1: 0.5, 6: 0.02}, dup_n_grams={3: 0.05, 12: 0.01}),
    "c4_quality": C4QualityFilter(),
    "c4_quality_3": C4QualityFilter(min_num_sentences=3, filter_no_terminal_punct=False),
    "fineweb_quality": FineWebQualityFilter(),
    "fineweb_quality_ez": FineWebQualityFilter(line_punct_exclude_zero=True, line_punct_thr=0.5, short_line_thr=None),
}
LANG_CONFIGS = {"langid": LanguageId(keep=["en"]), "langid_all": LanguageId(min_score=0.9)}

#: Gopher quality's signal columns: the same whatever the thresholds (what measure-once relies on)
_GOPHER_COLUMNS = {'text': '7a2cbde18c449537',
    'gopher_n_words': '4cbe0d2120c14e4e',
    'gopher_mean_word_length': 'f39ea2cb7d179ed5',
    'gopher_symbol_word_ratio': '7662a991cee64d79',
    'gopher_ellipsis_word_ratio': 'b7224cbceb2443cd',
    'gopher_bullet_lines_frac': '9b68f9938e030b62',
    'gopher_ellipsis_lines_frac': '9ba5718a91b28759',
    'gopher_alpha_words_frac': '74bb328f32bbf682',
    'gopher_stop_words': 'f02eb818b08f5384'
}

#: What ``process`` gave before this change (``reasons``: sha256 of the JSON list of reasons
#: per row, first 16 hex digits; ``columns``: the same of each column's values).
OLD = {'gopher_quality': {'reasons': '630a417cf404a3e6',
                    'counts': {'gopher_quality:alpha_words_frac': 30,
                               'gopher_quality:ellipsis_lines_frac': 1,
                               'gopher_quality:empty': 2,
                               'gopher_quality:stop_words': 3,
                               'gopher_quality:too_few_words': 9},
                    'columns': _GOPHER_COLUMNS},
 'gopher_quality_loose': {'reasons': 'bd5fa8cf9f3dda4d',
                          'counts': {'gopher_quality:alpha_words_frac': 26,
                                     'gopher_quality:ellipsis_word_ratio': 9,
                                     'gopher_quality:empty': 2,
                                     'gopher_quality:mean_word_length': 3,
                                     'gopher_quality:too_few_words': 4},
                          'columns': _GOPHER_COLUMNS},
 'gopher_repetition': {'reasons': '09ba96fedba81a6a',
                       'counts': {'gopher_repetition:dup_line_frac': 6,
                                  'gopher_repetition:empty': 2,
                                  'gopher_repetition:top_2_gram': 8,
                                  'gopher_repetition:top_3_gram': 2,
                                  'gopher_repetition:top_4_gram': 3},
                       'columns': {'text': '7a2cbde18c449537',
                                   'gopher_dup_para_frac': '9d861f0801d54ab7',
                                   'gopher_dup_para_char_frac': '4ebfe8a671923284',
                                   'gopher_dup_line_frac': '2ebf56334da22823',
                                   'gopher_dup_line_char_frac': 'e4235328b32650fd',
                                   'gopher_top_2_gram_frac': '8e67bd0f8f95df6f',
                                   'gopher_top_3_gram_frac': '6c433e12c0dcdc1c',
                                   'gopher_top_4_gram_frac': 'c3ee74c8d8a4ceec',
                                   'gopher_dup_5_gram_frac': '6703c9c465bd71f7',
                                   'gopher_dup_6_gram_frac': 'b89c43d7690b7e2e',
                                   'gopher_dup_7_gram_frac': 'd38b916303759b9a',
                                   'gopher_dup_8_gram_frac': '8562335573e5d171',
                                   'gopher_dup_9_gram_frac': '6bad57b8e48cf2b2',
                                   'gopher_dup_10_gram_frac': '59fd0a7eb1d9f5b4'}},
 'gopher_repetition_sizes': {'reasons': '7b0cd87850835cc0',
                             'counts': {'gopher_repetition:dup_3_gram': 15,
                                        'gopher_repetition:dup_line_frac': 6,
                                        'gopher_repetition:empty': 2,
                                        'gopher_repetition:top_6_gram': 79},
                             'columns': {'text': '7a2cbde18c449537',
                                         'gopher_dup_para_frac': '9d861f0801d54ab7',
                                         'gopher_dup_para_char_frac': '4ebfe8a671923284',
                                         'gopher_dup_line_frac': '2ebf56334da22823',
                                         'gopher_dup_line_char_frac': 'e4235328b32650fd',
                                         'gopher_top_1_gram_frac': 'df0d6375cef0eac7',
                                         'gopher_top_6_gram_frac': '01613455bef675e2',
                                         'gopher_dup_3_gram_frac': 'a81b6433f2210dc2',
                                         'gopher_dup_12_gram_frac': '58fec565dbd9ecaf'}},
 'c4_quality': {'reasons': '1a73470979d80a07',
                'counts': {'c4_quality:curly_bracket': 2,
                           'c4_quality:empty': 2,
                           'c4_quality:lorem_ipsum': 2,
                           'c4_quality:too_few_sentences': 31},
                'columns': {'text': '1881db148a0fb03c',
                            'c4_lines_kept': '3fb86051e6695163',
                            'c4_lines_removed': '7f6c9a2fe0d78684',
                            'c4_n_sentences': '738adb5ea33cdae8'}},
 'c4_quality_3': {'reasons': 'e9eba9a3074a66bc',
                  'counts': {'c4_quality:curly_bracket': 3,
                             'c4_quality:empty': 2,
                             'c4_quality:lorem_ipsum': 2,
                             'c4_quality:too_few_sentences': 4},
                  'columns': {'text': '8e88172fa1db0d32',
                              'c4_lines_kept': '8d582c9cc190e8f9',
                              'c4_lines_removed': '574bb43bcd3f6cd3',
                              'c4_n_sentences': '8d8b3deb5a9e441d'}},
 'fineweb_quality': {'reasons': 'a4ab57550d52ff1a',
                     'counts': {'fineweb_quality:char_dup_frac': 4,
                                'fineweb_quality:empty': 4,
                                'fineweb_quality:line_punct_frac': 24,
                                'fineweb_quality:short_line_frac': 3},
                     'columns': {'text': '7a2cbde18c449537',
                                 'fineweb_line_punct_frac': '53bafac504a7ab86',
                                 'fineweb_short_line_frac': 'f3a12a0880605817',
                                 'fineweb_char_dup_frac': '37261721b50f5a45',
                                 'fineweb_newline_per_word': '931fc11567790354'}},
 'fineweb_quality_ez': {'reasons': '2cdc11b3508cba3f',
                        'counts': {'fineweb_quality:char_dup_frac': 1,
                                   'fineweb_quality:empty': 4,
                                   'fineweb_quality:line_punct_frac': 38},
                        'columns': {'text': '7a2cbde18c449537',
                                    'fineweb_line_punct_frac': '53bafac504a7ab86',
                                    'fineweb_short_line_frac': 'f3a12a0880605817',
                                    'fineweb_char_dup_frac': '37261721b50f5a45',
                                    'fineweb_newline_per_word': '931fc11567790354'}},
 'langid': {'reasons': '4c992b2fe8156a46',
            'counts': {'langid:lang=ar': 20,
                       'langid:lang=de': 20,
                       'langid:lang=es': 19,
                       'langid:lang=fr': 20,
                       'langid:lang=hi': 20,
                       'langid:lang=it': 20,
                       'langid:lang=ja': 20,
                       'langid:lang=nl': 19,
                       'langid:lang=pl': 20,
                       'langid:lang=pt': 19,
                       'langid:lang=ru': 19,
                       'langid:lang=tr': 20,
                       'langid:lang=zh': 20,
                       'langid:low_score': 5,
                       'langid:no_text': 4},
            'columns': {'text': '7bce4dc786b07364', 'lang': '88cd6e1381670f75', 'lang_score': 'c993c8b4c33087a8'}},
 'langid_all': {'reasons': 'a862062f32e3d2e3',
                'counts': {'langid:low_score': 10, 'langid:no_text': 4},
                'columns': {'text': '7bce4dc786b07364',
                            'lang': '88cd6e1381670f75',
                            'lang_score': 'c993c8b4c33087a8'}}}


def _digest(values: list) -> str:
    return hashlib.sha256(json.dumps(values, allow_nan=True).encode()).hexdigest()[:16]


def _same(a: pa.Table, b: pa.Table) -> bool:
    """Same columns and values (NaN equal to NaN, unlike ``Table.equals``)."""
    return a.column_names == b.column_names and all(
        a.schema.field(c).type == b.schema.field(c).type
        and _digest(a.column(c).to_pylist()) == _digest(b.column(c).to_pylist()) for c in a.column_names)


def _reasons(r: pa.Array | None, n: int) -> list[str | None]:
    return r.to_pylist() if r is not None else [None] * n


def _check_old(name: str, table: pa.Table, reasons: pa.Array | None, skip: tuple[str, ...] = ()) -> None:
    old = OLD[name]
    got = _reasons(reasons, table.num_rows)
    assert dict(sorted(Counter(r for r in got if r).items())) == old["counts"], name
    assert _digest(got) == old["reasons"], name
    for col, digest in old["columns"].items():
        if col not in skip:
            assert _digest(table.column(col).to_pylist()) == digest, (name, col)


# ---------------------------------------------------------------------------------------------
# decide(measure(batch)) == the old process
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(CONFIGS))
def test_decide_after_measure_gives_the_old_decisions_and_table(name):
    stage = CONFIGS[name]
    b = batch(TEXTS)
    table, _ = stage.measure(b)
    reasons = stage.decide(table)
    if stage.type != "c4_quality":
        _check_old(name, table, reasons)
    else:
        # C4's measured rows hold the kept lines also on pages that only too few sentences
        # drop (re-deciding with a lower minimum must keep them with that text)...
        _check_old(name, table, reasons, skip=("text",))
        got = reasons.to_pylist()
        assert "c4_quality:too_few_sentences" in got
        as_kept = stage.model_copy(update={"min_num_sentences": None}).process(b).table.column("text").to_pylist()
        for text, reason, orig, kept_text in zip(table.column("text").to_pylist(), got, TEXTS, as_kept):
            want = (orig or "") if reason in ("c4_quality:lorem_ipsum", "c4_quality:curly_bracket") else kept_text
            assert text == want, reason
        # ... and process puts the original text back on every dropped page, as before.
        _check_old(name, stage.process(b).table, reasons)
    run = stage.run_batch(b)
    assert _same(run.table, table) and run.reasons.equals(reasons)
    if stage.type != "c4_quality":
        res = stage.process(b)
        assert _same(res.table, table) and res.reasons.equals(reasons)


@pytest.mark.parametrize("name", list(LANG_CONFIGS))
def test_langid_decide_after_measure_gives_the_old_decisions_and_table(name):
    stage = LANG_CONFIGS[name]
    table, _ = stage.measure(lang_batch(LANG_TEXTS))
    _check_old(name, table, stage.decide(table))
    res = stage.process(lang_batch(LANG_TEXTS))
    _check_old(name, res.table, res.reasons)
    everything = LanguageId(min_score=0.0).process(lang_batch([LANG_TEXTS[0]]))
    assert everything.reasons is None  # nothing dropped: no reasons at all, as before


# ---------------------------------------------------------------------------------------------
# Re-deciding stored rows with other thresholds
# ---------------------------------------------------------------------------------------------

CHANGES = [
    (GopherQualityFilter(), dict(min_doc_words=20, max_avg_word_length=8.0, max_symbol_word_ratio=0.01,
                                 min_stop_words=None, min_alpha_words_ratio=0.9)),
    (GopherQualityFilter(), dict(min_avg_word_length=None, max_doc_words=300, max_bullet_lines_ratio=0.05)),
    (GopherRepetitionFilter(), dict(top_n_grams={2: 0.05, 3: 0.05, 4: 0.04}, dup_line_frac=0.1, dup_para_frac=None)),
    (GopherRepetitionFilter(), dict(dup_n_grams={5: 0.02, 6: 0.02, 7: 0.01, 8: 0.01, 9: 0.01, 10: 0.01})),
    (C4QualityFilter(), dict(min_num_sentences=2)),
    (C4QualityFilter(), dict(min_num_sentences=12)),
    (C4QualityFilter(), dict(min_num_sentences=None)),
    (FineWebQualityFilter(), dict(line_punct_thr=0.5, line_punct_exclude_zero=True, short_line_thr=0.3,
                                  char_duplicates_ratio=None, new_line_ratio=0.1)),
    (FineWebQualityFilter(), dict(line_punct_thr=None, short_line_thr=None, char_duplicates_ratio=0.2)),
]


def _no_text_processing(monkeypatch) -> None:
    """Any word, line or paragraph split, or a new text state, fails the test."""
    def boom(*a, **k):
        raise AssertionError("decide processed text")

    for fn in ("split_words", "_split_words", "count_py_words", "sentence_counts"):
        monkeypatch.setattr(text_words, fn, boom)
    for fn in ("split_lines", "split_newlines", "_split_at", "split_chunks", "strip", "duplicate_stats"):
        monkeypatch.setattr(text_segments, fn, boom)
    monkeypatch.setattr(text_state.TextState, "__init__", boom)


def _stored(table: pa.Table, tmp_path: Path) -> pa.Table:
    path = tmp_path / "measured.parquet"
    pq.write_table(table, path)
    return pq.read_table(path)


@pytest.mark.parametrize("stage,change", CHANGES, ids=lambda x: x.type if isinstance(x, MapStage) else ",".join(x))
def test_stored_rows_redecide_like_measuring_afresh(stage, change, tmp_path, monkeypatch):
    b = batch(TEXTS)
    measured = stage.run_batch(b)
    stored = _stored(measured.table, tmp_path)
    new = stage.model_copy(update=change)
    fresh = new.run_batch(b)
    assert _same(fresh.table, measured.table)  # thresholds do not change what is measured
    assert new.signals_hash(["up"]) == stage.signals_hash(["up"])
    assert new.params_hash(["up"]) != stage.params_hash(["up"])
    with monkeypatch.context() as m:
        _no_text_processing(m)
        again = new.decide(stored)
        assert again.equals(new.decide(measured.table)) and stage.decide(stored).equals(measured.reasons)
    assert again.to_pylist() == fresh.reasons.to_pylist()
    assert again.to_pylist() != measured.reasons.to_pylist()  # the change mattered
    # what the executor keeps after re-deciding is what it keeps after measuring afresh
    keep = pc.is_null(again)
    assert stored.filter(keep).to_pylist() == fresh.table.filter(pc.is_null(fresh.reasons)).to_pylist()


def test_c4_redecided_pages_get_the_text_a_fresh_run_writes(tmp_path):
    b = batch(TEXTS)
    stored = _stored(C4QualityFilter().run_batch(b).table, tmp_path)
    looser = C4QualityFilter(min_num_sentences=1)
    kept = stored.filter(pc.is_null(looser.decide(stored)))
    fresh = looser.process(b)
    assert kept.column("text").to_pylist() == fresh.table.filter(pc.is_null(fresh.reasons)).column("text").to_pylist()
    assert kept.num_rows > C4QualityFilter().process(b).reasons.null_count  # pages came back


@pytest.mark.parametrize("change", [dict(min_score=0.9), dict(keep=["en", "de"]), dict(keep=None, min_score=0.0)])
def test_langid_stored_rows_redecide_without_detecting(change, tmp_path, monkeypatch):
    stage = LanguageId(keep=["en"])
    b = lang_batch(LANG_TEXTS)
    measured = stage.run_batch(b)
    stored = _stored(measured.table, tmp_path)
    new = stage.model_copy(update=change)
    fresh = new.run_batch(b)
    assert new.signals_hash(["up"]) == stage.signals_hash(["up"])
    with monkeypatch.context() as m:
        m.setattr(type(stage._detector), "detect", lambda *a: (_ for _ in ()).throw(AssertionError("detected")))
        _no_text_processing(m)
        again = new.decide(stored)
    assert _reasons(again, b.num_rows) == _reasons(fresh.reasons, b.num_rows)
    assert _reasons(again, b.num_rows) != _reasons(measured.reasons, b.num_rows)


def test_nan_and_null_never_violate_a_comparison(tmp_path):
    # No real word: the mean word length is undefined (NaN) and no length rule fires.
    stage = GopherQualityFilter(min_doc_words=None, min_alpha_words_ratio=None, min_stop_words=None)
    table, _ = stage.measure(batch(["!!! ???", "#"]))
    stored = _stored(table, tmp_path)
    assert all(math.isnan(v) for v in stored.column("gopher_mean_word_length").to_pylist())
    assert stage.decide(stored).to_pylist() == [None, "gopher_quality:symbol_word_ratio"]
    nulls = stored.set_column(stored.schema.get_field_index("gopher_symbol_word_ratio"), "gopher_symbol_word_ratio",
                              pa.array([None, None], pa.float64()))
    assert stage.decide(nulls).to_pylist() == [None, None]


# ---------------------------------------------------------------------------------------------
# Signal parameters and hashes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stage,change", [
    (GopherQualityFilter(), dict(stop_words=["the", "and"])),
    (GopherRepetitionFilter(), dict(top_n_grams={2: 0.2, 5: 0.1})),
    (GopherRepetitionFilter(), dict(dup_n_grams={})),
    (C4QualityFilter(), dict(min_words_per_line=5)),
    (C4QualityFilter(), dict(filter_lorem_ipsum=False)),
    (C4QualityFilter(), dict(policy_phrases=["cookie"])),
    (FineWebQualityFilter(), dict(short_line_length=20)),
    (FineWebQualityFilter(), dict(stop_chars=".")),
], ids=lambda x: x.type if isinstance(x, MapStage) else ",".join(x))
def test_signals_hash_follows_measure_params(stage, change):
    new = stage.model_copy(update=change)
    assert new.signals_hash(["up"]) != stage.signals_hash(["up"])
    assert new.params_hash(["up"]) != stage.params_hash(["up"])
    assert stage.signals_hash(["up"]) != stage.signals_hash(["other"])


def test_signal_params_leave_out_thresholds_but_keep_ngram_sizes():
    rep = GopherRepetitionFilter().signal_params()
    assert rep["top_n_grams"] == [2, 3, 4] and rep["dup_n_grams"] == [5, 6, 7, 8, 9, 10]
    assert "dup_line_frac" not in rep and rep["type"] == "gopher_repetition"
    assert GopherRepetitionFilter(top_n_grams={4: 0.1, 2: 0.3, 3: 0.3}).signal_params() == rep
    q = GopherQualityFilter().signal_params()
    assert set(q) == {"type", "stop_words"}
    assert set(C4QualityFilter().signal_params()) == set(C4QualityFilter().params()) - {"min_num_sentences"}
    assert set(FineWebQualityFilter().signal_params()) == {"type", "stop_chars", "short_line_length"}
    lang = LanguageId(keep=["en"])
    assert "keep" not in lang.signal_params() and "min_score" not in lang.signal_params()
    assert lang.signal_params()["detector"] == lang.params()["detector"]


# ---------------------------------------------------------------------------------------------
# The rules tables
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", [GopherQualityFilter, GopherRepetitionFilter, C4QualityFilter, FineWebQualityFilter,
                                 LanguageId])
def test_rules_table_renders_as_markdown(cls):
    md = cls.rules_markdown().splitlines()
    stage = cls.model_construct()
    bound = stage.bound_rules()
    assert md[0] == "| reason | signal | drops when | default |" and len(md) == len(bound) + 2
    for line, rule in zip(md[2:], bound):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[0] == f"`{stage.type}:{rule.name}`" and all(f"`{s}`" in cells[1] for s in rule.signals)
        assert all(f"`{p}`" in cells[2] for p in rule.params)
    assert cls.rules_markdown(header=False).splitlines() == md[2:]
    assert md[2].startswith(f"| `{stage.type}:")


def test_rules_tables_name_their_thresholds():
    assert "| `gopher_repetition:top_3_gram` | `gopher_top_3_gram_frac` | > `top_n_grams[3]` | `0.18` |" in \
        GopherRepetitionFilter.rules_markdown()
    assert ("| `gopher_quality:ellipsis_word_ratio` | `gopher_ellipsis_word_ratio` | > `max_symbol_word_ratio` "
            "| `0.1` |") in GopherQualityFilter.rules_markdown()
    assert "`c4_quality:too_few_sentences` | `c4_n_sentences` | < `min_num_sentences` | `5`" in \
        C4QualityFilter.rules_markdown()
    for cls in (GopherQualityFilter, GopherRepetitionFilter, C4QualityFilter, FineWebQualityFilter, LanguageId):
        assert all(r.op in OPS for r in cls.rules) and cls.rules[0].name in ("empty", "no_text")
    with pytest.raises(ValueError, match="unknown op"):
        Rule("x", "y", "~")
    with pytest.raises(ValueError, match="takes 2"):
        Rule("x", "y", "outside", "a")


# ---------------------------------------------------------------------------------------------
# Text states through a fused chain
# ---------------------------------------------------------------------------------------------


def _chain(stages, table, monkeypatch=None, pass_state=True):
    calls = []
    if monkeypatch is not None:
        real = text_words.split_words
        monkeypatch.setattr(text_words, "split_words", lambda t, **kw: calls.append(len(t)) or real(t, **kw))
    text, out = None, []
    for st in stages:
        res = st.run_batch(table, text)
        keep = np.flatnonzero(pc.is_null(res.reasons).to_numpy(zero_copy_only=False))
        out.append(res.reasons.to_pylist())
        table = res.table.take(keep)
        text = res.text.take(keep) if pass_state and res.text is not None else None
    return table, out, calls


def test_a_fused_chain_splits_words_once(monkeypatch):
    stages = [GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(), FineWebQualityFilter()]
    b = batch([d["text"] for d in REAL])
    plain, plain_reasons, _ = _chain(stages, b, pass_state=False)
    with monkeypatch.context() as m:
        table, reasons, calls = _chain(stages, b, m)
    assert _same(table, plain) and reasons == plain_reasons
    # repetition splits every document; quality, C4 and FineWeb reuse that split (C4 splits
    # only the kept lines whose citations it cut), FineWeb counts C4's lines' words
    assert calls[0] == len(REAL) and all(c < 10 for c in calls[1:]) and len(calls) <= 2


def test_results_carry_the_state_of_their_text():
    b = batch(TEXTS)
    for st in (GopherQualityFilter(), C4QualityFilter(), FineWebQualityFilter()):
        for res in (st.process(b), st.run_batch(b)):
            assert res.text is not None and res.text.texts.equals(text_column(res.table))
            assert res.text.word_counts().tolist() == text_words.split_words(res.text.texts).counts.tolist()
    state = TextState.of(b)
    res = GopherQualityFilter().process(b, state)
    assert res.text is state and state.has_words
    with pytest.raises(ValueError, match="rows"):
        GopherQualityFilter().process(b.slice(1), state)


class _Legacy(MapStage):  # a stage written before text states: process(batch) only
    type: str = "legacy_test_stage"

    def process(self, batch: pa.Table) -> StageResult:
        return StageResult.keep_all(batch)


def test_stages_without_text_state_keep_working():
    b = batch(["one", "two"])
    state = TextState.of(b)
    assert _Legacy().process(b).table.equals(b)
    assert _Legacy().process(b, state).text is None
    assert _Legacy().run_batch(b, state).table.equals(b)
    assert LanguageId(keep=["en"]).run_batch(lang_batch(["An English sentence about the weather today."]),
                                            TextState(pa.array(["An English sentence about the weather today."]))
                                            ).reasons is None
    with pytest.raises(NotImplementedError):
        type("NoProcess", (MapStage,), {"__annotations__": {"type": str}, "type": "np"})().process(b)


def _compiled_signatures() -> dict[str, int]:
    """Every compiled kernel of the curation package loaded so far: how many argument types
    it has been compiled for."""
    import sys

    from numba.core.registry import CPUDispatcher

    return {f"{name}.{attr}": len(fn.signatures) for name, mod in list(sys.modules.items())
            if name.startswith("curation.") and mod is not None
            for attr, fn in vars(mod).items() if isinstance(fn, CPUDispatcher)}


def test_an_empty_batch_compiles_no_kernel_again(tmp_path):
    """A batch of empty texts (the tail of a shard, a page of nothing but markup), or one read
    back from Parquet, takes the kernels as they were compiled for the first batch: an array of
    another type (read-only where the first was writable, uint8 classes where they are uint16)
    compiled each kernel again in the middle of a run, ~3 s of a worker's CPU for the word
    measures alone."""
    from curation.dedup.minhash import MinHasher, normalize_collapsed

    stages = [LanguageId(), GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(),
              FineWebQualityFilter()]
    hasher = MinHasher(num_perm=16, ngram=5)

    def run(rows: list[str] | pa.Table) -> None:
        b = rows if isinstance(rows, pa.Table) else batch(rows)
        texts = b.column("text").combine_chunks()
        text = None
        for st in stages:  # every stage sees every row, so that every kernel runs on them
            res = st.run_batch(b, text)
            b, text = res.table, res.text
        for st in stages[1:]:
            st.run_batch(batch(texts.to_pylist()), None)  # and each on its own, splitting words itself
        normalize_collapsed(texts)
        hasher.signatures(texts, normalized=True)

    pages = [d["text"] for d in REAL[:20]]
    run(pages)
    before = _compiled_signatures()
    pq.write_table(batch(pages), tmp_path / "pages.parquet")
    for rows in ([""] * 3, ["", " \n "], [], pq.read_table(tmp_path / "pages.parquet")):
        run(rows)
    after = _compiled_signatures()
    assert {k: (before.get(k, 0), n) for k, n in after.items() if n > before.get(k, 0)} == {}
