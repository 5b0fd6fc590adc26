"""Tokenizer training (BPE and Unigram), the Tokenizer interface, the tokenize stage, the
fertility report."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import DATA, REPO
from curation.pipeline.dag import DagError, parse_dag
from curation.pipeline.executor import run_dag
from curation.pipeline.rundir import resolve_corpus
from curation.stages.tokenize import TOKENIZER_METADATA, Tokenize
from curation.tokenizer.model import EOS, ParquetCorpus, Tokenizer, TokenizerError, train_tokenizer
from curation.tokenizer.report import tokenizer_report

FIXTURES = [("dolma_cc_en_head-0091.jsonl.gz", "text", "web"), ("dolma_cc_en_head-0174.jsonl.gz", "text", "web"),
            ("gsm8k_train_head400.jsonl.gz", "question", "math"), ("humaneval_head60_code.jsonl.gz", "text", "code"),
            ("lingua_sentences_6lang_head160.jsonl.gz", "text", "multilingual")]

SAMPLES = [
    "Hello world.\n\nTwo  spaces,\ttabs and a trailing newline\n",
    "def f(x):\n    return x ** 2  # 42\n",
    "Die Straße ist naß; élève, 東京都, Москва, القاهرة 😀",
    f"a forged {EOS} boundary",
    " leading space",
]


def fixture_corpus(path: Path) -> Path:
    """The text fixtures as one Parquet file with source and lang columns (lang from the
    multilingual fixture, '-' elsewhere)."""
    rows = {"id": [], "text": [], "source": [], "lang": []}
    for name, field, source in FIXTURES:
        with gzip.open(DATA / "jsonl" / name, "rt") as f:
            for i, line in enumerate(f):
                obj = json.loads(line)
                rows["id"].append(f"{name}#{i}")
                rows["text"].append(obj[field])
                rows["source"].append(source)
                rows["lang"].append(obj.get("lang", "-"))
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(rows), path, row_group_size=100)  # several batches to stream
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return fixture_corpus(tmp_path_factory.mktemp("corpus") / "texts.parquet")


@pytest.fixture(scope="module", params=["bpe", "unigram"])
def trained(request, corpus, tmp_path_factory) -> Tokenizer:
    # 0.99: ~1,700 distinct characters (zh, ar, ru...) would not fit a 1,200 vocab; bytes cover the rest
    return train_tokenizer(corpus, tmp_path_factory.mktemp(request.param), kind=request.param, vocab_size=1200,
                           character_coverage=0.99, progress=False)


def test_card_records_how_it_was_made(trained, corpus):
    card = json.loads((trained.path.parent / "card.json").read_text())
    assert card["kind"] == trained.kind and card["vocab_size"] == trained.vocab_size
    assert 900 <= trained.vocab_size <= 1200
    assert card["special_tokens"] == {"<|endoftext|>": 0, "<|pad|>": 1} and (trained.eos_id, trained.pad_id) == (0, 1)
    assert card["training"]["files"] == [{"file": str(corpus.resolve()),
                                          "sha256": hashlib.sha256(corpus.read_bytes()).hexdigest()}]
    n = pq.read_metadata(corpus).num_rows
    assert card["training"]["docs"] == n
    assert card["training"]["bytes"] == sum(len(t.encode()) for t in pq.read_table(corpus)["text"].to_pylist())
    assert card["training"]["seconds"] > 0 and card["training"]["peak_rss_mb"] > 0
    assert card["versions"]["tokenizers"] and card["versions"]["sentencepiece"]
    assert trained.fingerprint == hashlib.sha256(trained.path.read_bytes()).hexdigest() == card["model_sha256"]


def test_roundtrip_is_lossless_and_special_strings_stay_text(trained):
    tok = Tokenizer.load(trained.path.parent)
    ids = tok.encode_batch(SAMPLES)
    assert all(a.dtype == np.int32 and len(a) > 0 for a in ids)
    assert [tok.decode(a) for a in ids] == SAMPLES
    assert all(tok.eos_id not in a and tok.pad_id not in a for a in ids)  # "<|endoftext|>" in text is just text
    assert all(int(a.max()) < tok.vocab_size for a in ids)
    assert np.array_equal(tok.encode(SAMPLES[2]), ids[2])
    assert tok.encode_batch([]) == []


def test_unigram_vocab_too_small_for_the_characters_is_a_clear_error(corpus, tmp_path):
    with pytest.raises(TokenizerError, match="raise vocab_size or lower character_coverage"):
        train_tokenizer(corpus, tmp_path, kind="unigram", vocab_size=1200, progress=False)


def test_load_refuses_a_folder_without_a_tokenizer(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer here"):
        Tokenizer.load(tmp_path)
    with pytest.raises(TokenizerError, match="no such stage directory"):
        ParquetCorpus.resolve(tmp_path / "nope")


def test_tokenize_stage_adds_ids_rejects_empty_and_records_tokenizer(trained):
    texts = SAMPLES + ["", "   \n", None]
    batch = pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": texts, "source": ["web"] * len(texts)})
    stage = Tokenize(tokenizer=str(trained.path.parent))
    res = stage.process(batch)  # no setup(): loads lazily
    n = len(SAMPLES)
    assert res.reasons.to_pylist() == [None] * n + ["tokenize:empty"] * 3
    ids = res.table.column("input_ids")
    assert ids.type == pa.list_(pa.int32()) and res.table.schema.field("num_tokens").type == pa.int32()
    expect = trained.encode_batch(SAMPLES)
    for i in range(n):
        assert ids[i].as_py() == expect[i].tolist() + [trained.eos_id]
    assert res.table.column("num_tokens").to_pylist() == [len(e) + 1 for e in expect] + [0, 0, 0]
    meta = json.loads(res.table.schema.metadata[TOKENIZER_METADATA])
    assert meta == trained.describe()
    # no eos, no text
    res2 = Tokenize(tokenizer=str(trained.path.parent), add_eos=False, keep_text=False).process(batch.slice(0, n))
    assert "text" not in res2.table.column_names and res2.reasons is None
    assert res2.table.column("input_ids").to_pylist() == [e.tolist() for e in expect]


def test_params_hash_follows_the_model_not_the_path(corpus, tmp_path):
    a = tmp_path / "a"
    train_tokenizer(corpus, a, kind="bpe", vocab_size=600, progress=False)
    h = Tokenize(tokenizer=str(a)).params_hash(["up"])
    b = tmp_path / "b"
    shutil.copytree(a, b)
    assert Tokenize(tokenizer=str(b)).params_hash(["up"]) == h  # moved: outputs still valid
    train_tokenizer(corpus, a, kind="bpe", vocab_size=700, progress=False)
    assert Tokenize(tokenizer=str(a)).params_hash(["up"]) != h  # retrained: outputs invalid


def test_dag_with_missing_tokenizer_is_one_clear_error(tmp_path):
    dag = {"name": "t", "inputs": {"math": {"format": "jsonl", "paths": ["x.jsonl"], "source": "math"}},
           "stages": {"tokenize": {"tokenizer": str(tmp_path / "missing")}}}
    with pytest.raises(DagError, match=r"stages\.tokenize\.tokenizer.*no tokenizer here"):
        parse_dag(dag, "t.yaml")


def test_train_from_a_stage_of_a_run_then_tokenize_in_a_dag(tmp_path, ray_session, in_repo):
    """Training reads a stage's committed shards (hashes from its manifest); the tokenize stage
    then runs on Ray, one tokenizer load per worker, output equal to encoding in-process."""
    run = tmp_path / "run"
    dag = {"name": "tok", "inputs": {"math": {"format": "jsonl", "paths": [str(DATA / "jsonl/gsm8k_train_head400.jsonl")],
                                              "source": "math", "text_field": "question", "split_bytes": 40000}},
           "stages": {"all": {"type": "union", "inputs": ["math"]}}}  # a union materialises its inputs
    run_dag(parse_dag(dag), run, workers=2, quiet=True)
    corpus = resolve_corpus(run / "math")
    manifest = [json.loads(x) for x in (run / "math" / "_manifest.jsonl").read_text().splitlines()]
    assert len(corpus.files) == len(manifest) >= 2
    assert sorted(corpus.sha256) == sorted(e["sha256"] for e in manifest)
    tok = train_tokenizer(run / "math", tmp_path / "tok", kind="bpe", vocab_size=800, progress=False)
    assert tok.card["training"]["docs"] == 400 and tok.card["training"]["fingerprint"] == corpus.fingerprint

    dag["stages"] = {"tokenize": {"type": "tokenize", "input": "math", "tokenizer": str(tmp_path / "tok")}}
    run2 = tmp_path / "run2"
    run_dag(parse_dag(dag), run2, workers=2, quiet=True)
    out = pa.concat_tables([pq.read_table(p) for p in sorted((run2 / "tokenize").glob("*.parquet"))])
    expect = tok.encode_batch(out.column("text").to_pylist())
    assert out.column("input_ids").to_pylist() == [e.tolist() + [tok.eos_id] for e in expect]
    assert out.num_rows == 400


def test_fertility_report_by_source_and_lang(trained, corpus, tmp_path):
    from rich.console import Console

    console = Console(record=True, width=140)
    rows = tokenizer_report(trained.path.parent, corpus, out_png=tmp_path / "f.png", console=console)
    keys = {(r["source"], r["lang"]) for r in rows}
    assert {("web", "-"), ("math", "-"), ("code", "-"), ("multilingual", "de"), ("multilingual", "zh")} <= keys
    by = {(r["source"], r["lang"]): r for r in rows}
    assert sum(r["docs"] for r in rows) == pq.read_metadata(corpus).num_rows
    for r in rows:
        assert r["tokens_per_word"] > 0.5 and 1.0 <= r["bytes_per_token"] < 10
    # English web text compresses better than Chinese under a tokenizer trained mostly on English
    assert by[("web", "-")]["bytes_per_token"] > by[("multilingual", "zh")]["bytes_per_token"]
    png = tmp_path / "f.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    assert json.loads(png.with_suffix(".json").read_text())["rows"] == json.loads(json.dumps(rows))
    text = console.export_text()
    assert "tokens/word" in text and "multilingual" in text
