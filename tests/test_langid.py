"""Language ID: accuracy of the default detector on real multilingual documents, label
normalisation, fastText models (GlotLID-style labels), bad input and bad model files, and a
real run through the executor with rejections and their reasons."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from conftest import DATA, REPO
from curation.quality.classifier import LOADS, ModelLoadError, train_fasttext_isolated
from curation.quality.langid import detector_for, normalize_lang, sample_text, sample_texts
from curation.stages.langid import LanguageId

FIXTURE = DATA / "langid" / "lingua_docs_gt200chars_14lang.jsonl.gz"


def _docs() -> list[dict]:
    with gzip.open(FIXTURE, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _table(texts: list) -> pa.Table:
    return pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": pa.array(texts, pa.string())})


def test_default_detector_is_at_least_95_percent_right_on_docs_over_200_chars():
    docs = _docs()
    assert len(docs) == 280 and all(len(d["text"]) > 200 for d in docs)
    res = LanguageId(type="langid", min_score=0.0).process(_table([d["text"] for d in docs]))
    got = res.table.column("lang").to_pylist()
    per_lang: dict[str, list[bool]] = {}
    for d, g in zip(docs, got):
        per_lang.setdefault(d["lang"], []).append(g == d["lang"])
    acc = sum(sum(v) for v in per_lang.values()) / len(docs)
    assert acc >= 0.95, per_lang
    assert all(sum(v) / len(v) >= 0.9 for v in per_lang.values()), per_lang
    # and the default threshold keeps (nearly) all of them: real sentences, one language each
    scores = res.table.column("lang_score").to_pylist()
    assert sum(s is not None and s >= 0.65 for s in scores) / len(scores) >= 0.95


def test_keep_english_drops_others_with_their_language_as_reason():
    docs = _docs()
    res = LanguageId(type="langid", keep=["en"]).process(_table([d["text"] for d in docs]))
    reasons = res.reasons.to_pylist()
    for d, r in zip(docs, reasons):
        if d["lang"] == "en":
            assert r is None
        else:
            assert r in (f"langid:lang={d['lang']}", "langid:low_score"), (d["id"], r)
    assert reasons.count("langid:lang=de") >= 18


@pytest.mark.parametrize("text", ["", "   \n\t ", "!!! ??? ... ---", "12345 67890", "3.14 + 2.71 = 5.85 %", None])
def test_no_text_is_a_reason_not_a_crash(text):
    res = LanguageId(type="langid", keep=["en"]).process(_table([text, "This is plainly an English sentence, written "
                                                                       "by a person about an ordinary afternoon walk."]))
    assert res.reasons.to_pylist() == ["langid:no_text", None]
    assert res.table.column("lang").to_pylist() == [None, "en"]
    assert res.table.column("lang_score").to_pylist()[0] is None


def test_letters_but_no_language_is_low_score():
    res = LanguageId(type="langid", keep=["en"]).process(_table(["xq zzv", "ok"]))
    assert res.reasons.to_pylist() == ["langid:low_score", "langid:low_score"]


def test_mojibake_control_characters_do_not_break_detection():
    text = "Il est l\x92un des meilleurs joueurs de l\x92équipe, et il l\x92a encore montré samedi soir devant son public."
    res = LanguageId(type="langid").process(_table([text]))
    assert res.table.column("lang").to_pylist() == ["fr"]
    # the stage hands CLD2 an Arrow array of windows; Python strings give the same answers
    det = detector_for(None)
    texts = [text, "plain English text about the weather and the sea", "\x85\x92"]
    codes, scores = det.detect(pa.array(texts, pa.large_string()))
    assert codes[0] == "fr" and codes[2] is None
    assert (codes, scores.tolist()) == (lambda c, s: (c, s.tolist()))(*det.detect(texts))


def test_normalize_lang_covers_lid176_glotlid_cld2_and_legacy_codes():
    cases = {
        "__label__en": "en", "__label__eng_Latn": "en", "__label__deu_Latn": "de", "arb_Arab": "ar",
        "cmn_Hani": "zh", "zh-Hant": "zh", "iw": "he", "__label__ceb": "ceb", "__label__als": "als",
        "als_Latn": "sq", "nob_Latn": "nb", "srp_Cyrl": "sr", "EN": "en", "": None, None: None,
    }
    assert {k: normalize_lang(k) for k in cases} == cases


def test_keep_accepts_three_letter_codes():
    assert LanguageId(type="langid", keep=["eng", "de"]).keep == ["de", "en"]
    with pytest.raises(ValidationError):
        LanguageId(type="langid", keep=[])


# ---------------------------------------------------------------------------------------------
# fastText models: trained here on the fixture, with GlotLID-style labels


@pytest.fixture(scope="module")
def glotlid_style_model(tmp_path_factory) -> Path:
    docs = _docs()
    iso3 = {"en": "eng_Latn", "de": "deu_Latn", "fr": "fra_Latn", "es": "spa_Latn", "it": "ita_Latn",
            "pt": "por_Latn", "nl": "nld_Latn", "pl": "pol_Latn", "ru": "rus_Cyrl", "tr": "tur_Latn",
            "ar": "arb_Arab", "hi": "hin_Deva", "zh": "cmn_Hani", "ja": "jpn_Jpan"}
    rows = [f"__label__{iso3[d['lang']]} {d['text']}" for d in docs if int(d["id"][-2:]) < 14]
    random.Random(0).shuffle(rows)
    d = tmp_path_factory.mktemp("lidmodel")
    (d / "train.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    # in its own process: fastText training in a process that already ran other models can NaN
    train_fasttext_isolated(d / "train.txt", d / "lid.bin", dict(dim=32, epoch=100, lr=1.0, minn=1, maxn=4,
                                                                 bucket=100_000, thread=1, seed=0, verbose=0))
    return d / "lid.bin"


def test_fasttext_model_labels_are_normalised(glotlid_style_model):
    held = [d for d in _docs() if int(d["id"][-2:]) >= 14]  # documents the model never saw
    st = LanguageId(type="langid", model=str(glotlid_style_model), min_score=0.0)
    st.setup()
    res = st.process(_table([d["text"].replace(". ", ".\n") for d in held]))  # newlines too
    got = res.table.column("lang").to_pylist()
    assert set(got) <= {d["lang"] for d in held}
    assert sum(g == d["lang"] for g, d in zip(got, held)) / len(held) >= 0.9
    scores = res.table.column("lang_score").to_pylist()
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert st.params()["model"]["sha256"]  # the params hash follows the file's contents


def test_detector_is_built_once_per_process(glotlid_style_model):
    before = LOADS[str(glotlid_style_model.resolve())]
    for _ in range(3):
        st = LanguageId(type="langid", model=str(glotlid_style_model))
        st.setup()
        st.process(_table(["Ein kurzer deutscher Text über das Wetter in Berlin."]))
    assert detector_for(str(glotlid_style_model)) is st._detector
    assert LOADS[str(glotlid_style_model.resolve())] - before <= 1


def test_missing_or_corrupt_model_is_a_clear_config_error(tmp_path, glotlid_style_model):
    with pytest.raises(ValidationError, match="cannot load .*nope.bin.*no such file"):
        LanguageId(type="langid", model=str(tmp_path / "nope.bin"))
    bad = tmp_path / "truncated.bin"
    bad.write_bytes(glotlid_style_model.read_bytes()[:5000])  # fastText itself would crash on it
    with pytest.raises(ValidationError, match="cannot load .*truncated.bin.*truncated"):
        LanguageId(type="langid", model=str(bad))
    txt = tmp_path / "notes.txt"
    txt.write_text("this is not a model\n")
    with pytest.raises(ValidationError, match="not a fastText model"):
        LanguageId(type="langid", model=str(txt))


def test_model_corrupted_after_validation_fails_setup_naming_the_file(tmp_path, glotlid_style_model):
    path = tmp_path / "lid.bin"
    path.write_bytes(glotlid_style_model.read_bytes())
    st = LanguageId(type="langid", model=str(path))
    path.write_bytes(b"\0" * 100)
    with pytest.raises(ModelLoadError, match=r"langid.model: cannot load '.*lid.bin': not a fastText model"):
        st.setup()


# ---------------------------------------------------------------------------------------------
# through the executor


def test_langid_stage_in_a_run(tmp_path, ray_session):
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag

    dag = parse_dag({
        "name": "langid-test",
        "inputs": {"docs": {"format": "jsonl", "paths": [str(FIXTURE)], "source": "web", "id_field": "id"}},
        "stages": {"langid": {"type": "langid", "keep": ["en"], "min_score": 0.65}},
    }, "langid-test.yaml", base_dir=str(REPO))
    run_dag(dag, tmp_path / "run", workers=2, quiet=True)
    kept = pa.concat_tables([pq.read_table(p) for p in sorted((tmp_path / "run" / "langid").glob("*.parquet"))])
    rej = pa.concat_tables([pq.read_table(p) for p in sorted((tmp_path / "run" / "rejected" / "langid").glob("*.parquet"))])
    assert kept.num_rows + rej.num_rows == 280
    assert set(kept.column("lang").to_pylist()) == {"en"} and kept.num_rows >= 19
    reasons = rej.column("reason").to_pylist()
    assert reasons.count("langid:lang=ja") == 20 and all(r.startswith("langid:") for r in reasons)
    assert "lang_score" in rej.column_names  # the measurement travels with the rejected row


def test_sample_text_takes_evenly_spaced_windows_of_a_long_text():
    assert sample_text("short text", 100, 4) == "short text"
    text = "".join(chr(ord("a") + i % 26) for i in range(10_000))
    got = sample_text(text, 1000, 4)
    parts = got.split("\n")
    assert [len(p) for p in parts] == [250] * 4
    assert parts[0] == text[:250] and parts[-1] == text[-250:]  # the head and the tail are both seen
    assert all(p in text for p in parts)
    assert sample_text(text, 1000, 1) == text[:1000]


def test_a_long_document_is_detected_on_windows_that_see_its_whole_length():
    # 20 real German documents joined (~9,000 chars) after 2,000 chars of English: the
    # head alone would say English; windows over the whole text see mostly German.
    docs = _docs()
    de = "\n".join(d["text"] for d in docs if d["lang"] == "de")
    en = "\n".join(d["text"] for d in docs if d["lang"] == "en")[:2000]
    text = en + "\n" + de
    assert len(text) > 6000
    sampled = LanguageId(type="langid", min_score=0.0).process(_table([text]))
    whole = LanguageId(type="langid", min_score=0.0, sample_chars=None).process(_table([text]))
    head = LanguageId(type="langid", min_score=0.0, sample_chars=2000, sample_windows=1).process(_table([text]))
    assert sampled.table.column("lang").to_pylist() == whole.table.column("lang").to_pylist() == ["de"]
    assert head.table.column("lang").to_pylist() == ["en"]
    s, w = sampled.table.column("lang_score")[0].as_py(), whole.table.column("lang_score")[0].as_py()
    assert abs(s - w) < 0.15, (s, w)
    assert "sample_chars" in LanguageId(type="langid").params()


class _Spy:
    """A detector that records the lengths of the texts it is given."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def detect(self, texts):
        self.seen.append([len(t) for t in (texts.to_pylist() if isinstance(texts, pa.Array) else texts)])
        return self.inner.detect(texts)


def test_a_first_look_decides_one_language_texts_and_sends_mixed_ones_to_the_full_windows():
    docs = _docs()
    de = "\n".join(d["text"] for d in docs if d["lang"] == "de")
    en = "\n".join(d["text"] for d in docs if d["lang"] == "en")
    mixed = en[:2000] + "\n" + de
    assert len(de) > 2000 and len(en) > 2000 and len(mixed) > 6000
    texts = [de, en, mixed]
    stage = LanguageId(type="langid", min_score=0.0)
    stage.setup()
    spy = stage._detector = _Spy(stage._detector)
    codes, scores = stage._detect(texts)
    # one call on the first looks (1,500 chars in 6 windows), one on the full windows for the
    # text the first look was not sure of: the mixed one
    assert len(spy.seen) == 2
    assert all(n <= 1500 + 5 for n in spy.seen[0]) and len(spy.seen[0]) == 3
    assert len(spy.seen[1]) == 1 and spy.seen[1][0] > 5000
    without = LanguageId(type="langid", min_score=0.0, first_look_chars=None)
    without.setup()
    ref_codes, ref_scores = without._detect(texts)
    assert codes == ref_codes == ["de", "en", "de"]
    assert scores[0] >= 0.95 and scores[1] >= 0.95
    assert scores[2] == ref_scores[2]  # detected on the same windows as without a first look
    assert "first_look_chars" in stage.params()


def test_windows_cut_from_the_bytes_equal_sample_text_on_every_length_and_script():
    # sample_texts walks UTF-8 bytes (1-4 per character) to sample_text's windows: the same
    # strings on texts around every edge (at, under and over `chars`, windows landing on
    # multi-byte characters, one window), on the real pages of the test data, with nulls
    rng = random.Random(7)
    alphabet = "ab cd\nÄé€中文😀ё\u0301"
    texts = ["", "a", "😀" * 1500, "é" * 1501, "中" * 6000, "x" * 6001]
    texts += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 9000))) for _ in range(150)]
    texts += [d["text"] for d in _docs()]
    arr = pa.array(texts + [None], pa.string())
    rows = np.array([i for i in range(len(texts) + 1) if i % 7 != 3])  # a subset, in order
    for chars, windows in ((1500, 6), (6000, 6), (1000, 1), (100, 7), (7, 7)):
        got = sample_texts(arr, rows, chars, windows)
        want = [sample_text(texts[i] if i < len(texts) else "", chars, windows) for i in rows]
        assert got == want, (chars, windows)
    lengths = pc.utf8_length(pc.fill_null(arr, "")).to_numpy().astype(np.int64)
    assert sample_texts(arr, rows, 1500, 6, lengths) == sample_texts(arr, rows, 1500, 6)
    assert sample_texts(arr, np.array([], np.int64), 1500, 6) == []
