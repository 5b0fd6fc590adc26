"""Per-language filter rules: ``by_lang`` and ``lang_config: fineweb2`` on the Gopher, C4 and
FineWeb filters, on real pages (``tests/data/lang_rules/pages.jsonl.gz``, see its README line).

- a German / French (Spanish, Polish) news page that Gopher's English stop words drop is
  kept with its language's rules; Chinese and Japanese pages are split into characters;
- English pages (and pages in a language without an entry) are judged exactly as without
  per-language rules, and a stage without ``by_lang`` / ``lang_config`` hashes as before;
- thresholds are applied per row in ``decide``: stored rows re-decide with other per-language
  thresholds without any text processing, also through a rerun of a DAG; the signals hash
  follows the stop-word lists, not the thresholds;
- a bad ``by_lang`` fails validation with one clear line.
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from conftest import REPO
from curation.pipeline.dag import DagError, parse_dag
from curation.stages.c4_quality import C4QualityFilter
from curation.stages.fineweb_quality import FineWebQualityFilter
from curation.stages.gopher_quality import GopherQualityFilter
from curation.stages.gopher_repetition import GopherRepetitionFilter
from curation.text import lang_rules
from curation.text import state as text_state
from curation.text import segments as text_segments
from curation.text import words as text_words

DATA = Path(__file__).parent / "data" / "lang_rules"
PAGES = [json.loads(line) for line in gzip.open(DATA / "pages.jsonl.gz", "rt", encoding="utf-8")]
LANGS = [p["lang"] for p in PAGES]


def pages(langs: list[str | None] | None = None) -> pa.Table:
    n = len(PAGES)
    return pa.table({"id": [p["id"] for p in PAGES], "text": [p["text"] for p in PAGES],
                     "source": ["web"] * n, "lang": pa.array(LANGS if langs is None else langs, pa.string())})


def _rows_of(table: pa.Table) -> str:
    """The table's rows as JSON (NaN equal to NaN, unlike ``==`` on ``to_pylist``)."""
    return json.dumps(table.to_pylist(), allow_nan=True, default=str)


def _rows(lang: str) -> list[int]:
    return [i for i, x in enumerate(LANGS) if x == lang]


FILTERS = (GopherRepetitionFilter, GopherQualityFilter, FineWebQualityFilter)


def _chain(stages, table: pa.Table) -> list[str | None]:
    """Each page's reason through the stages in order (None: kept by all), text states passed on."""
    out: list[str | None] = [None] * table.num_rows
    idx = np.arange(table.num_rows)
    text = None
    for st in stages:
        res = st.run_batch(table, text)
        reasons = res.reasons.to_pylist()
        for i, r in zip(idx, reasons):
            out[i] = out[i] or r
        keep = np.flatnonzero(pc.is_null(res.reasons).to_numpy(zero_copy_only=False))
        idx, table, text = idx[keep], res.table.take(keep), res.text.take(keep)
    return out


# ---------------------------------------------------------------------------------------------
# Real pages
# ---------------------------------------------------------------------------------------------


def test_fixture_holds_the_languages_the_tests_need():
    assert {lang: LANGS.count(lang) for lang in ("de", "fr", "es", "pl", "en", "zh", "ja")} == \
        {"de": 3, "fr": 2, "es": 1, "pl": 1, "en": 4, "zh": 2, "ja": 2}


@pytest.mark.parametrize("lang", ["de", "fr", "es", "pl"])
def test_pages_the_english_stop_words_drop_are_kept_with_their_languages_rules(lang):
    table = pages()
    english = GopherQualityFilter().run_batch(table).reasons.to_pylist()
    preset = GopherQualityFilter(lang_config="fineweb2").run_batch(table).reasons.to_pylist()
    own = lang_rules.preset("fineweb2")[lang]["gopher_quality"]["stop_words"]
    explicit = GopherQualityFilter(by_lang={lang: {"stop_words": own}}).run_batch(table).reasons.to_pylist()
    for i in _rows(lang):
        assert english[i] == "gopher_quality:stop_words", PAGES[i]["id"]
        assert preset[i] is None and explicit[i] is None, PAGES[i]["id"]
    # and through the whole chain (repetition -> quality -> FineWeb) with FineWeb-2's rules
    chain = _chain([cls(lang_config="fineweb2") for cls in FILTERS], table)
    assert [chain[i] for i in _rows(lang)] == [None] * len(_rows(lang))


def test_stop_words_are_counted_with_the_pages_own_list():
    table = pages()
    english = GopherQualityFilter().measure(table)[0].column("gopher_stop_words").to_pylist()
    preset = GopherQualityFilter(lang_config="fineweb2").measure(table)[0].column("gopher_stop_words").to_pylist()
    for i, lang in enumerate(LANGS):
        if lang == "en":
            assert preset[i] == english[i] >= 2
        else:  # none of "the be to of and that have with" in a German page; most of its own list
            assert english[i] <= 1 and preset[i] >= 5, (PAGES[i]["id"], english[i], preset[i])


def test_french_elisions_count_as_stop_words():
    t = pa.table({"text": ["L'homme d'État et l’amour de la vie."], "lang": ["fr"]})
    got = GopherQualityFilter(lang_config="fineweb2").measure(t)[0].column("gopher_stop_words").to_pylist()
    assert got == [5]  # d', et, l' (from l’amour), de, la; "L'homme" is capitalised: no
    assert GopherQualityFilter(by_lang={"fr": {"stop_words": ["de"]}}).measure(t)[0] \
        .column("gopher_stop_words").to_pylist() == [1]


@pytest.mark.parametrize("cls", [*FILTERS, C4QualityFilter])
def test_english_pages_are_judged_the_same_either_way(cls):
    table = pages()
    plain = cls().run_batch(table)
    per_lang = cls(by_lang={"de": {}, "fr": {}, "zh": {}, "ja": {}}) if cls is C4QualityFilter \
        else cls(lang_config="fineweb2")
    res = per_lang.run_batch(table)
    en = _rows("en")
    assert [res.reasons.to_pylist()[i] for i in en] == [plain.reasons.to_pylist()[i] for i in en]
    for col in plain.table.column_names:
        got, want = res.table.column(col).to_pylist(), plain.table.column(col).to_pylist()
        assert [got[i] for i in en] == [want[i] for i in en]
    # a table of English pages alone: byte for byte what the stage without rules gives (plus, for
    # repetition, the columns of n-gram sizes only other languages have a threshold for)
    only = table.take(en)
    alone, ref = per_lang.run_batch(only), cls().run_batch(only)
    assert alone.table.select(ref.table.column_names).equals(ref.table) and alone.reasons.equals(ref.reasons)


@pytest.mark.parametrize("cls", FILTERS)
def test_a_language_without_an_entry_uses_the_top_level_rules(cls):
    table = pages()
    plain = cls().run_batch(table).reasons.to_pylist()
    unknown = cls(lang_config="fineweb2").run_batch(pages(["xx"] * len(PAGES))).reasons.to_pylist()
    nulls = cls(lang_config="fineweb2").run_batch(pages([None] * len(PAGES))).reasons.to_pylist()
    assert unknown == plain == nulls


@pytest.mark.parametrize("cls", [*FILTERS, C4QualityFilter])
def test_a_mixed_batch_is_measured_row_by_row(cls):
    """Grouping rows by language changes nothing a row gets: measuring a mixed batch equals
    measuring each page alone (what re-deciding stored rows relies on)."""
    stage = cls(by_lang={"de": {"words": "spaces"}, "zh": {}, "ja": {}}) if cls is C4QualityFilter \
        else cls(lang_config="fineweb2")
    table = pages()
    whole = stage.run_batch(table)
    for i in range(table.num_rows):
        one = stage.run_batch(table.slice(i, 1))
        assert _rows_of(one.table) == _rows_of(whole.table.slice(i, 1)), PAGES[i]["id"]
        assert one.reasons.to_pylist() == whole.reasons.to_pylist()[i: i + 1]


def test_chinese_and_japanese_words_are_characters():
    table = pages()
    zh_ja = _rows("zh") + _rows("ja")
    english = GopherQualityFilter().measure(table)[0]
    preset = GopherQualityFilter(lang_config="fineweb2").measure(table)[0]
    for i in zh_ja:
        han = len([c for c in PAGES[i]["text"] if "\u4e00" <= c <= "\u9fff" or "\u3040" <= c <= "\u30ff"])
        assert preset.column("gopher_n_words")[i].as_py() >= han > 10 * english.column("gopher_n_words")[i].as_py()
        assert 1 <= preset.column("gopher_mean_word_length")[i].as_py() < 1.5
    reasons = _chain([cls(lang_config="fineweb2") for cls in FILTERS], table)
    assert [reasons[i] for i in zh_ja] == [None] * 4  # news pages kept
    assert all(r is not None for r in _chain([cls() for cls in FILTERS], table.take(zh_ja)))  # English rules: none
    # C4's lines: full-width full stops end a line, words per line are characters
    c4 = C4QualityFilter(by_lang={"zh": {}, "ja": {}}).run_batch(table).reasons.to_pylist()
    assert [C4QualityFilter().run_batch(table).reasons.to_pylist()[i] for i in zh_ja] == \
        ["c4_quality:too_few_sentences"] * 4
    assert [c4[i] for i in zh_ja] == [None] * 4


def test_preset_holds_fineweb2s_published_values():
    de = lang_rules.preset("fineweb2")["de"]
    assert de["gopher_quality"]["stop_words"][:3] == ["der", "und", "die"]
    assert (de["gopher_quality"]["max_avg_word_length"], de["gopher_quality"]["min_alpha_words_ratio"]) == (15, 0.774)
    assert de["gopher_repetition"]["dup_line_frac"] == 0.263 and de["gopher_repetition"]["top_n_grams"]["2"] == 0.169
    assert (de["fineweb_quality"]["line_punct_thr"], de["fineweb_quality"]["new_line_ratio"]) == (0.0, 0.152)
    assert de["fineweb_quality"]["short_line_thr"] is None and de["fineweb_quality"]["char_duplicates_ratio"] == 0.1
    presets = lang_rules.preset("fineweb2")
    assert {"de", "fr", "es", "pt", "pl", "ru", "zh", "ja", "it", "nl"} <= set(presets) and "en" not in presets
    ja = presets["ja"]
    assert ja["gopher_quality"]["words"] == "chars" and ja["gopher_quality"]["min_doc_words"] == 80
    assert list(ja["gopher_repetition"]["dup_n_grams"]) == ["8", "10", "11", "13", "14", "16"]
    stage = GopherRepetitionFilter(lang_config="fineweb2")
    assert stage.view("de").dup_para_frac is None and stage.view("de").top_n_grams == {2: 0.169, 3: 0.153, 4: 0.137}
    assert stage.view("en").top_n_grams == {2: 0.2, 3: 0.18, 4: 0.16}
    # by_lang goes over the preset field by field
    q = GopherQualityFilter(lang_config="fineweb2", by_lang={"de": {"min_stop_words": 4}}).view("de")
    assert q.min_stop_words == 4 and q.stop_words[:2] == ["der", "und"] and q.max_avg_word_length == 15


# ---------------------------------------------------------------------------------------------
# Hashes and re-deciding
# ---------------------------------------------------------------------------------------------


def test_without_per_language_rules_hashes_are_unchanged():
    # computed with the code before by_lang existed
    before = {"gopher_quality": ("4d48ce68d6225998", "a34aa8585f7bfc3d"),
              "gopher_repetition": ("a1595a283aad4d01", "cd130a5af1099d4d"),
              "c4_quality": ("e369b7e21d7b7dce", "1decc8bf2eb45c95"),
              "fineweb_quality": ("2e0cc0bc3ff0fbee", "2aafc2bb2b098fb2")}
    for cls in (*FILTERS, C4QualityFilter):
        st = cls()
        assert (st.params_hash(["up"]), st.signals_hash(["up"])) == before[st.type]
        assert "by_lang" not in st.params() and "lang_config" not in st.signal_params()


def test_signals_hash_follows_stop_words_not_thresholds():
    base = GopherQualityFilter(by_lang={"de": {"stop_words": ["der", "die", "das"], "min_stop_words": 2}})
    h = base.signals_hash(["up"])
    same = [GopherQualityFilter(by_lang={"de": {"stop_words": ["der", "die", "das"], "min_stop_words": 3}}),
            GopherQualityFilter(by_lang={"de": {"stop_words": ["der", "die", "das"], "min_doc_words": 10,
                                                "max_avg_word_length": 20}}),
            GopherQualityFilter(by_lang={"de": {"stop_words": ["der", "die", "das"]}, "fr": {"min_stop_words": 1}})]
    for st in same:
        assert st.signals_hash(["up"]) == h and st.params_hash(["up"]) != base.params_hash(["up"])
    other = [GopherQualityFilter(by_lang={"de": {"stop_words": ["der", "die"], "min_stop_words": 2}}),
             GopherQualityFilter(by_lang={"de": {"stop_words": ["der", "die", "das"], "words": "chars"}}),
             GopherQualityFilter(by_lang={"de": {"stop_words": ["der", "die", "das"]}, "fr": {"stop_words": ["le"]}}),
             GopherQualityFilter()]
    assert len({st.signals_hash(["up"]) for st in other} | {h}) == len(other) + 1
    # the preset: its stop words are signals, its thresholds are not
    preset = GopherQualityFilter(lang_config="fineweb2")
    assert GopherQualityFilter(lang_config="fineweb2", by_lang={"de": {"min_stop_words": 5}}).signals_hash(["up"]) == \
        preset.signals_hash(["up"]) != GopherQualityFilter().signals_hash(["up"])
    assert GopherQualityFilter(lang_config="fineweb2", by_lang={"de": {"stop_words": ["der"]}}).signals_hash(["up"]) \
        != preset.signals_hash(["up"])
    rep = GopherRepetitionFilter(lang_config="fineweb2")
    assert GopherRepetitionFilter(lang_config="fineweb2", by_lang={"de": {"dup_line_frac": 0.1}}).signals_hash(["u"]) \
        == rep.signals_hash(["u"])
    new_size = GopherRepetitionFilter(lang_config="fineweb2", by_lang={"de": {"top_n_grams": {5: 0.1}}})
    assert new_size.signals_hash(["u"]) != rep.signals_hash(["u"])  # a new n-gram size is measured


def _no_text_processing(monkeypatch) -> None:
    def boom(*a, **k):
        raise AssertionError("decide processed text")

    for fn in ("split_words", "_split_words", "count_py_words", "sentence_counts"):
        monkeypatch.setattr(text_words, fn, boom)
    for fn in ("split_lines", "split_newlines", "_split_at", "split_chunks", "strip", "duplicate_stats"):
        monkeypatch.setattr(text_segments, fn, boom)
    monkeypatch.setattr(lang_rules, "char_words", boom)
    monkeypatch.setattr(text_state.TextState, "__init__", boom)


CHANGES = [
    (GopherQualityFilter(lang_config="fineweb2"),
     dict(by_lang={"de": {"min_stop_words": 12}, "zh": {"min_doc_words": 1500}, "fr": {"max_avg_word_length": 4.5}})),
    (GopherQualityFilter(by_lang={"de": {"stop_words": ["der", "die", "das", "und"]}}),
     dict(min_stop_words=1, by_lang={"de": {"stop_words": ["der", "die", "das", "und"], "min_stop_words": 4}})),
    (GopherRepetitionFilter(lang_config="fineweb2"),
     dict(by_lang={"de": {"top_n_grams": {2: 0.02, 3: 0.02, 4: 0.02}},
                   "ja": {"dup_n_grams": {8: 0.01, 10: 0.01, 11: 0.01, 13: 0.01, 14: 0.01, 16: 0.01}}})),
    (FineWebQualityFilter(lang_config="fineweb2"),
     dict(by_lang={"fr": {"line_punct_thr": 0.9}, "zh": {"new_line_ratio": 0.001}, "pl": {"short_line_thr": 0.1}})),
    (C4QualityFilter(by_lang={"zh": {}, "ja": {}}), dict(by_lang={"zh": {"min_num_sentences": 40}, "ja": {}})),
]


@pytest.mark.parametrize("stage,change", CHANGES, ids=lambda x: x.type if hasattr(x, "type") else ",".join(x))
def test_stored_rows_redecide_with_other_per_language_thresholds(stage, change, tmp_path, monkeypatch):
    table = pages()
    measured = stage.run_batch(table)
    pq.write_table(measured.table, tmp_path / "m.parquet")
    stored = pq.read_table(tmp_path / "m.parquet")
    new = type(stage).model_validate({**stage.model_dump(), **change})  # validated like a DAG's stage
    fresh = new.run_batch(table)
    assert new.signals_hash(["up"]) == stage.signals_hash(["up"])
    assert new.params_hash(["up"]) != stage.params_hash(["up"])
    assert _rows_of(fresh.table) == _rows_of(measured.table)  # thresholds change nothing measured
    with monkeypatch.context() as m:
        _no_text_processing(m)
        again = new.decide(stored)
        assert stage.decide(stored).to_pylist() == measured.reasons.to_pylist()
    assert again.to_pylist() == fresh.reasons.to_pylist()
    assert again.to_pylist() != measured.reasons.to_pylist()  # the change mattered
    if set(change) == {"by_lang"}:  # only the pages of the languages changed change
        changed = {LANGS[i] for i, (a, b) in enumerate(zip(again.to_pylist(), measured.reasons.to_pylist())) if a != b}
        assert changed <= set(change["by_lang"])


def _demo(by_lang: dict) -> dict:
    return {
        "name": "lang_rules",
        "inputs": {"pages": {"format": "jsonl", "paths": [str(DATA / "pages.jsonl.gz")], "source": "web"}},
        "stages": {
            "langid": {"type": "langid", "min_score": 0.0},
            "gopher_rep": {"type": "gopher_repetition", "lang_config": "fineweb2"},
            "gopher": {"type": "gopher_quality", "lang_config": "fineweb2", "by_lang": by_lang},
            "fineweb": {"type": "fineweb_quality", "lang_config": "fineweb2"},
        },
    }


def test_a_rerun_with_other_per_language_thresholds_redecides_stored_rows(tmp_path, ray_session):
    from curation.pipeline.executor import run_dag
    from curation.pipeline.rundir import RunDir

    def run(by_lang, out, overwrite=False):
        os.chdir(REPO)
        run_dag(parse_dag(_demo(by_lang), "lang_rules.yaml"), out, workers=2, quiet=True, overwrite=overwrite)
        return RunDir(out)

    def shards(run_):
        return {f"{s}/{k}": (e.get("sha256"), e.get("rejected_sha256"), e["rows"], e["rejected_rows"])
                for s in ("gopher", "fineweb") for k, e in sorted(run_.entries(s).items())}

    first = run({}, tmp_path / "run")
    assert sum(e["measured_rows"] for e in first.entries("gopher").values()) > 0
    stricter = {"de": {"min_stop_words": 12}, "fr": {"min_stop_words": 12}}
    again = run(stricter, tmp_path / "run", overwrite=True)
    assert sum(e["measured_rows"] for e in again.entries("gopher").values()) == 0
    assert sum(e["measured_rows"] for e in again.entries("fineweb").values()) == 0
    fresh = run(stricter, tmp_path / "fresh")
    assert shards(again) == shards(fresh)
    dropped = fresh.connect().execute("select count(*) from rejected where reason = 'gopher_quality:stop_words'")
    assert dropped.fetchone()[0] > 0


# ---------------------------------------------------------------------------------------------
# Validation
# ---------------------------------------------------------------------------------------------


def _dag_error(stage: dict) -> str:
    d = {"name": "x", "inputs": {"pages": {"format": "jsonl", "paths": ["x.jsonl"], "source": "web"}},
         "stages": {"f": stage}}
    with pytest.raises(DagError) as e:
        parse_dag(d, "x.yaml")
    return str(e.value)


def test_an_unknown_by_lang_field_fails_with_a_clear_message():
    msg = _dag_error({"type": "gopher_quality", "by_lang": {"de": {"min_stop_word": 2}}})
    assert "stages.f.by_lang" in msg and "de.min_stop_word: unknown field" in msg and "min_stop_words" in msg
    assert msg.count("\n") == 0


@pytest.mark.parametrize("stage,expect", [
    ({"type": "gopher_quality", "by_lang": {"de": {"min_stop_words": -1}}}, "de.min_stop_words: Input should be gr"),
    ({"type": "gopher_quality", "by_lang": {"de": {"stop_words": "der"}}}, "de.stop_words: Input should be a valid"),
    ({"type": "gopher_quality", "by_lang": {"de": {"words": "jieba"}}}, "de.words: Input should be 'spaces' or"),
    ({"type": "gopher_quality", "by_lang": {"de": {"type": "c4_quality"}}}, "de.type: unknown field"),
    ({"type": "gopher_quality", "by_lang": {"German": {}}}, "'German': not a language code"),
    ({"type": "gopher_quality", "by_lang": ["de"]}, "a mapping of language code"),
    ({"type": "gopher_quality", "by_lang": {"de": 2}}, "de: a mapping of gopher_quality fields"),
    ({"type": "gopher_repetition", "by_lang": {"de": {"top_n_grams": {0: 0.1}}}}, "n-gram size must be at least 1"),
    ({"type": "gopher_quality", "lang_config": "fineweb3"}, "unknown preset 'fineweb3' (known: auto, fineweb2)"),
    ({"type": "c4_quality", "lang_config": "fineweb2"}, "preset 'fineweb2' has no values for c4_quality"),
])
def test_bad_per_language_rules_fail_with_a_clear_message(stage, expect):
    assert expect in _dag_error(stage)


def test_norwegian_survives_yaml():
    import yaml

    st = GopherQualityFilter.model_validate(yaml.safe_load("by_lang: {no: {min_stop_words: 1}}"))
    assert st.lang_table() == {"no": {"min_stop_words": 1}}


def test_per_language_rules_need_a_lang_column():
    t = pa.table({"id": ["a"], "text": [PAGES[0]["text"]]})
    with pytest.raises(ValueError, match="put a langid stage upstream"):
        GopherQualityFilter(lang_config="fineweb2").run_batch(t)
    assert GopherQualityFilter(by_lang={}).run_batch(t).reasons.to_pylist() == \
        GopherQualityFilter().run_batch(t).reasons.to_pylist()  # an empty table needs none


def test_a_stage_model_rejects_bad_entries_directly():
    with pytest.raises(ValidationError, match="unknown field"):
        FineWebQualityFilter(by_lang={"fr": {"stop_word": "."}})
