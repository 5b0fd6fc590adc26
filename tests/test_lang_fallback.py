"""Rules for every language: with ``lang_config: fineweb2`` no language the ``langid`` stage can
name falls back to the stages' English rules.

- every code of CLD2 and ISO 639-1 (but English) has an entry: FineWeb-2's own values where it
  has a config (Scottish Gaelic included), else the preset's fallback (no stop-word rule);
- natural pages of languages that had no entry (Korean, Tagalog, Shona, Zulu, Latin, Telugu:
  ``tests/data/lang_rules/lingua_nopreset.jsonl.gz``) are kept, where English rules drop them;
- unnatural pages built from the same words (menus, tag clouds, repeated paragraphs) are
  still caught.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from curation.stages.fineweb_quality import FineWebQualityFilter
from curation.stages.gopher_quality import GopherQualityFilter
from curation.stages.gopher_repetition import GopherRepetitionFilter
from curation.stages.gopher_quality import GOPHER_STOP_WORDS
from curation.text import lang_rules

DATA = Path(__file__).parent / "data" / "lang_rules"
NATURAL = [json.loads(line) for line in gzip.open(DATA / "lingua_nopreset.jsonl.gz", "rt", encoding="utf-8")]
FILTERS = (GopherRepetitionFilter, GopherQualityFilter, FineWebQualityFilter)


def _table(rows: list[dict]) -> pa.Table:
    n = len(rows)
    return pa.table({"id": [str(i) for i in range(n)], "text": [r["text"] for r in rows], "source": ["t"] * n,
                     "lang": [r["lang"] for r in rows]})


def _kept(stages, table: pa.Table) -> np.ndarray:
    keep = np.ones(table.num_rows, bool)
    idx = np.arange(table.num_rows)
    text = None
    for st in stages:
        res = st.run_batch(table, text)
        k = pc.is_null(res.reasons).to_numpy(zero_copy_only=False)
        keep[idx[~k]] = False
        idx, table, text = idx[k], res.table.filter(pa.array(k)), res.text.take(np.flatnonzero(k))
        if not len(idx):
            break
    return keep


def _unnatural(rows: list[dict]) -> list[dict]:
    """Per language: a navigation menu, a tag cloud and a repeated paragraph, from its words."""
    rng = random.Random(0)
    out = []
    for lang in dict.fromkeys(r["lang"] for r in rows):
        text = "\n".join(r["text"] for r in rows if r["lang"] == lang)
        vocab = sorted({w for w in text.split() if w.isalpha()})
        sents = text.split("\n")
        menu = "\n".join(" ".join(rng.sample(vocab, rng.randint(1, 3))) for _ in range(40))
        out.append({"lang": lang, "text": menu + "\n" + sents[0]})
        out.append({"lang": lang, "text": sents[1] + "\n" + ", ".join(rng.sample(vocab, min(80, len(vocab))))})
        out.append({"lang": lang, "text": "\n".join([sents[2]] * 5)})
    return out


def test_every_language_has_non_english_rules():
    table = lang_rules.preset("fineweb2")
    codes = lang_rules._load("fineweb2")["codes"]
    assert {"gd", "ko", "tl", "sn", "zu", "la", "te", "th", "br", "fy", "lb", "mt"} <= set(codes) <= set(table)
    assert "en" not in table and "xx" not in table
    stage = GopherQualityFilter(lang_config="fineweb2")
    for code in codes:
        assert stage.view(code).stop_words != list(GOPHER_STOP_WORDS), code
    # Scottish Gaelic: FineWeb-2's own gla_Latn values (stop words included), not the fallback
    gd = stage.view("gd")
    assert lang_rules.has_own_entry("gd") and gd.stop_words[:4] == ["an", "a", "ann", "na"]
    assert gd.min_stop_words == 2 and gd.min_alpha_words_ratio == 0.788
    # a language FineWeb-2 has no config for gets the fallback: no stop-word rule
    assert not lang_rules.has_own_entry("tl")
    assert stage.view("tl").min_stop_words is None and lang_rules.fallback_entry("tl")["gopher_quality"]["stop_words"] == []
    # the stage's own rules still judge English and unknown pages
    assert stage.view("en").stop_words == list(GOPHER_STOP_WORDS) == stage.view("xx").stop_words


def test_natural_pages_of_languages_without_a_list_are_kept():
    table = _table(NATURAL)
    english = _kept([cls() for cls in FILTERS], table)
    per_lang = _kept([cls(lang_config="fineweb2") for cls in FILTERS], table)
    assert english.mean() < 0.1  # English rules drop nearly all of them
    assert per_lang.mean() >= 0.9, [(r["lang"], k) for r, k in zip(NATURAL, per_lang) if not k]


def test_unnatural_pages_are_still_caught():
    table = _table(_unnatural(NATURAL))
    caught = ~_kept([cls(lang_config="fineweb2") for cls in FILTERS], table)
    assert caught.all(), table.column("lang").to_pylist()


@pytest.mark.parametrize("cls", FILTERS)
def test_the_preset_hashes_its_fallback(cls):
    """The fallback entries are part of the stage's parameters: a new preset version rehashes."""
    p = json.loads(json.dumps(cls(lang_config="fineweb2").params()))
    assert p["by_lang"]["tl"] == lang_rules.fallback_entry("tl")[cls().type]


def test_auto_catches_word_salad_that_the_stop_word_count_lets_through():
    """``lang_config: auto``: fineweb2 plus the share of stop words, calibrated per language. A
    page of word salad around two real sentences has FineWeb-2's 2 stop words, not their share."""
    rng = random.Random(1)
    rows = []
    for lang in ("ko", "tl", "sn", "zu", "la", "te"):
        pages = [r["text"] for r in NATURAL if r["lang"] == lang]
        vocab = sorted({w for p in pages for w in p.split() if w.isalpha()})
        sents = "\n".join(pages).split("\n")
        salad = [" ".join(rng.choice(vocab) for _ in range(12)) + "." for _ in range(10)]
        rows.append({"lang": lang, "text": "\n".join([sents[0], *salad, sents[1]])})
    de = [json.loads(line) for line in gzip.open(DATA / "pages.jsonl.gz", "rt", encoding="utf-8")]
    de = [p for p in de if p["lang"] == "de"]
    words = sorted({w for p in de for w in p["text"].split() if w.isalpha()})
    salad = "\n".join(" ".join(rng.choice(words) for _ in range(12)) + "." for _ in range(12))
    rows.append({"lang": "de", "text": de[0]["text"].split("\n")[0] + "\n" + salad})
    table = _table(rows)
    fineweb2 = _kept([cls(lang_config="fineweb2") for cls in FILTERS], table)
    auto = _kept([cls(lang_config="auto") for cls in FILTERS], table)
    assert fineweb2[-1] and not auto[-1]  # German: the stop-word count passes, the share does not
    assert auto.sum() <= fineweb2.sum()
    # natural German pages and the pages of languages without a list are kept as with fineweb2
    nat = _table([{"lang": "de", "text": p["text"]} for p in de] + NATURAL)
    assert (_kept([cls(lang_config="auto") for cls in FILTERS], nat)
            == _kept([cls(lang_config="fineweb2") for cls in FILTERS], nat)).all()


def test_the_stop_word_share_is_off_and_unhashed_by_default():
    plain = GopherQualityFilter()
    assert "min_stop_words_frac" not in plain.params() and "stop_words_frac" not in plain.signal_params()
    cols = plain.measure(_table(NATURAL[:2]))[0].column_names
    assert "gopher_stop_words_frac" not in cols
    auto = GopherQualityFilter(lang_config="auto")
    assert auto.signal_params()["stop_words_frac"] is True
    assert "gopher_stop_words_frac" in auto.measure(_table(NATURAL[:2]))[0].column_names
    # a threshold change re-decides, it does not re-measure
    assert auto.signal_params() == GopherQualityFilter(lang_config="auto", by_lang={"de": {"min_stop_words_frac": 0.2}}
                                                       ).signal_params()
