"""decontaminate: real eval items (GSM8K, MATH, HumanEval heads; WikiText-2 test head) planted
in real web pages (CCNet documents) in the forms leaks take on the web."""

from __future__ import annotations

import gzip
import html
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import curation.text.decontam as dc
from curation.io.benchmarks import benchmark_items, file_items, find_benchmark
from curation.pipeline.dag import parse_dag
from curation.pipeline.executor import run_dag
from curation.stages.decontaminate import REASON, REASON_EMPTY, REPORT, Decontaminate
from curation.text.decontam import EvalIndex, EvalItem, remove_spans, words_of

from conftest import DATA

EVAL = DATA / "ablate" / "wikitext2_test_head4.txt"
EVAL_DIR = DATA / "decontam"


def _jsonl(path) -> list[dict]:
    return [json.loads(x) for x in open(path) if x.strip()]


def _web() -> list[str]:
    return [json.loads(x)["text"] for x in gzip.open(DATA / "jsonl" / "dolma_cc_en_head-0091.jsonl.gz")]


def _gsm8k(i: int) -> str:
    r = _jsonl(EVAL_DIR / "gsm8k_test.jsonl")[i]
    return r["question"] + "\n" + r["answer"]


def _humaneval(i: int) -> str:
    r = _jsonl(EVAL_DIR / "HumanEval.jsonl")[i]
    return r["prompt"] + r["canonical_solution"]


def _stage(**kw) -> Decontaminate:
    st = Decontaminate(type="decontaminate", eval_sets=["gsm8k", "math", "humaneval"], eval_dir=str(EVAL_DIR), **kw)
    st.setup()
    return st


def _plant(host: str, leak: str) -> str:
    at = host.find("\n", len(host) // 2) + 1 or len(host)
    if at == len(host) and not host.endswith("\n"):
        return host + "\n" + leak + "\n"
    return host[:at] + leak + "\n" + host[at:]


# -- the forms a leak takes (each one alone) --------------------------------------------------------

def _spaced(t: str) -> str:
    return re.sub(r"([^\w\s])", r" \1 ", t)


def _typographic(t: str) -> str:
    return re.sub(r"(^|\s)'", "\\1\u2018", t).replace("'", "\u2019").replace('"', "\u201d")


def _entities(t: str) -> str:
    return "".join(f"&#{ord(c)};" if ord(c) > 127 else c for c in html.escape(t)).replace(" ", "&nbsp;", 5)


def _split(t: str) -> str:
    w = t.split(" ")
    k = len(w) // 2
    return " ".join(w[:k]) + "\nAdvertisement\n" + " ".join(w[k:])


def _reflow(t: str) -> str:
    if "\n    " in t:
        return re.sub(r"^((?:    )+)", lambda m: "\t" * (len(m.group(1)) // 4), t, flags=re.M)
    return re.sub(r"(\S+ \S+ \S+ \S+ \S+ \S+) ", "\\1\n   ", t)


def _compat(t: str) -> str:
    t = re.sub(r"\b(\w{4})(\w{4,})", "\\1\u00ad\\2", t)  # soft hyphens in long words
    return "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() and i % 3 == 0 else c
                   for i, c in enumerate(t)).replace(" ", "\u00a0")


FORMS = {"verbatim": lambda t: t, "spaced_punct": _spaced, "typographic": _typographic, "html_entities": _entities,
         "boilerplate_split": _split, "reflow": _reflow, "upper": str.upper, "unicode_compat": _compat}


def test_words_survive_every_form():
    text = _gsm8k(0)
    want = [words_of([text]).word(i) for i in range(words_of([text]).n_words)]
    assert want[:4] == ["janet", "s", "ducks", "lay"]
    for name, form in FORMS.items():
        if name == "boilerplate_split":
            continue
        w = words_of([form(text)])
        assert [w.word(i) for i in range(w.n_words)] == want, name


def test_words_details():
    w = words_of(["It&#39;s caf&eacute; &quot;x&quot;&nbsp;y ＦＵＬＬ ﬁle co\u00adoperate a\u200bb 漢字です", None, ""])
    assert [w.word(i) for i in range(w.n_words)] == ["it", "s", "café", "x", "y", "full", "file", "cooperate",
                                                      "a", "b", "漢", "字", "で", "す"]
    assert w.doc_tok.tolist() == [0, 14, 14, 14]
    # byte spans point into the original text
    t = "Hello,  WORLD"
    w = words_of([t])
    assert [t.encode()[s:e].decode() for s, e in zip(w.start, w.end)] == ["Hello", "WORLD"]


@pytest.mark.parametrize("form", list(FORMS))
def test_each_form_caught(form):
    st = _stage()
    web = _web()
    leaks = [_gsm8k(3), _gsm8k(17), _humaneval(2)]
    docs = [_plant(web[i + 1], FORMS[form](leak)) for i, leak in enumerate(leaks)]
    res = st.process(pa.table({"text": docs}))
    assert res.reasons.to_pylist() == [REASON] * 3
    m = res.table.column("decontam_matches").to_pylist()
    assert [(x[0]["benchmark"], x[0]["item"]) for x in m] == [("gsm8k", "3"), ("gsm8k", "17"), ("humaneval", "HumanEval/2")]
    assert all(x[0]["coverage"] > 0.9 for x in m)


def test_clean_documents_and_lookalikes_kept():
    st = _stage()
    train = [r["question"] + "\n" + r["answer"] for r in _jsonl(EVAL_DIR / "gsm8k_train_head.jsonl")]
    docs = _web() + train
    res = st.process(pa.table({"text": docs}))
    assert res.reasons.to_pylist() == [None] * len(docs)
    assert res.table.column("decontam_overlaps").to_pylist() == [0] * len(docs)
    # a 12-word piece of an item is below the 13-gram
    q = _jsonl(EVAL_DIR / "gsm8k_test.jsonl")[5]["question"].split()
    res = st.process(pa.table({"text": [_web()[2] + " " + " ".join(q[:12])]}))
    assert res.reasons.to_pylist() == [None]


def test_short_items_indexed_whole():
    items = [EvalItem("b", "short", ["What is the least common multiple of 12 and 18?"]),
             EvalItem("b", "tiny", ["Compute 2+2."])]
    idx = EvalIndex.build(items, 13, 8)
    assert idx.short_items == 1  # "tiny" has 3 words: never matched
    counts, hits = idx.match(words_of(["Quiz: what is the LEAST common multiple of 12 and 18 ? Answer below",
                                       "the least common multiple of 12 and"]))
    assert counts.tolist() == [1, 0] and hits[0].coverage == 1.0


def test_hash_collisions_are_verified(monkeypatch):
    """Every window of every text gets the same key: only word-for-word equal windows match."""
    monkeypatch.setattr(dc, "_hash_words", lambda data, off: np.zeros(len(off) - 1, np.uint64))
    items = [EvalItem("b", "0", ["one two three four five six seven eight nine ten eleven twelve thirteen"])]
    idx = EvalIndex.build(items, 13, 8)
    docs = ["a b c d e f g h i j k l m n o p q r s t", "one two three four five six seven eight nine ten eleven twelve thirteen"]
    counts, hits = idx.match(words_of(docs))
    assert counts.tolist() == [0, 1] and [h.doc for h in hits] == [1]


def test_remove_spans_keeps_the_rest():
    st = _stage(mode="remove_spans")
    web = _web()
    host = web[4]
    leak = _split(_typographic(_gsm8k(8)))
    doc = _plant(host, leak)
    res = st.process(pa.table({"text": [doc, web[5], _gsm8k(9)]}))
    assert res.reasons.to_pylist() == [None, None, REASON_EMPTY]
    out = res.table.column("text").to_pylist()
    assert out[0] == host  # the leak (and its boilerplate line) cut out, every other byte kept
    assert out[1] == web[5]
    m = res.table.column("decontam_matches").to_pylist()[0][0]
    assert doc[m["start"]:m["end"]] == leak.rstrip("\n") and m["coverage"] == 1.0
    assert res.table.column("decontam_overlaps").to_pylist()[1] == 0


def test_remove_spans_lines():
    assert remove_spans("a\nxx yy\nb", [(2, 7)]) == "a\nb"
    assert remove_spans("a xx b", [(2, 4)]) == "a  b"
    t = "é x y"
    assert remove_spans(t, [(3, 4)]) == "é  y"


def test_eval_formats_agree(tmp_path):
    lines = [l for l in EVAL.read_text().splitlines() if len(l.split()) > 60][:4]
    p = tmp_path / "e.jsonl"
    p.write_text("".join(json.dumps({"text": l}) + "\n" for l in lines))
    q = tmp_path / "e.parquet"
    pq.write_table(pa.table({"text": lines}), q)
    a, b = EvalIndex.build(file_items(str(p)), 13), EvalIndex.build(file_items(str(q)), 13)
    assert len(a.keys) > 100 and (a.keys == b.keys).all()


def test_registry(tmp_path, monkeypatch):
    assert find_benchmark("gsm8k", [str(EVAL_DIR)]).endswith("gsm8k_test.jsonl")
    items = benchmark_items("humaneval", find_benchmark("humaneval", [str(EVAL_DIR)]))
    assert [i.item for i in items] == [f"HumanEval/{k}" for k in range(5)]
    g = benchmark_items("gsm8k", find_benchmark("gsm8k", [str(EVAL_DIR)]))[0]
    assert "<<" in g.texts[0] and "<<" not in g.texts[1]  # with and without calculator annotations
    with pytest.raises(ValueError, match="unknown eval set"):
        Decontaminate(type="decontaminate", eval_sets=["mmlu-nope"])
    monkeypatch.delenv("REFINERY_EVAL_DIR", raising=False)
    with pytest.raises(ValueError, match="no file matching"):
        Decontaminate(type="decontaminate", eval_sets=["gsm8k"], eval_dir=str(tmp_path))
    monkeypatch.setenv("REFINERY_EVAL_DIR", str(EVAL_DIR))
    assert Decontaminate(type="decontaminate", eval_sets=["gsm8k"]).resolved_sets()[0][0] == "gsm8k"


def test_config_errors(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        Decontaminate(type="decontaminate", eval_paths=[str(tmp_path / "nope.txt")])
    with pytest.raises(ValueError, match="needs eval_sets"):
        Decontaminate(type="decontaminate")


def test_text_file_items_by_line():
    st = Decontaminate(type="decontaminate", eval_paths=[str(EVAL)])
    para = [l for l in EVAL.read_text().splitlines() if len(l.split()) > 60][1]
    res = st.process(pa.table({"text": [_web()[1] + " " + " ".join(para.split()[10:25]).upper()]}))
    assert res.reasons.to_pylist() == [REASON]
    assert res.table.column("decontam_overlaps").to_pylist()[0] >= 1  # 15 words, punctuation tokens aside
    assert res.table.column("decontam_matches").to_pylist()[0][0]["item"].startswith("line")


@pytest.mark.parametrize("mode", ["drop", "remove_spans"])
def test_in_a_dag_report(tmp_path, ray_session, mode):
    web = _web()
    ids = ["leak-a", "leak-b", "leak-c", *[f"clean-{i}" for i in range(5)]]
    texts = [_plant(web[0], _gsm8k(3)), _plant(web[1], _entities(_gsm8k(3))), _plant(web[2], _humaneval(1)),
             *web[3:8]]
    src = tmp_path / "docs.parquet"
    pq.write_table(pa.table({"id": ids, "text": texts, "source": ["web"] * len(ids)}), src)
    dag = parse_dag({
        "name": "decontam-test",
        "inputs": {"docs": {"format": "parquet", "paths": [str(src)], "source": "web", "id_field": "id"}},
        "stages": {"decontaminate": {"eval_sets": ["gsm8k", "humaneval"], "eval_dir": str(EVAL_DIR), "mode": mode}},
        "output": "decontaminate",
    })
    run = tmp_path / "run"
    run_dag(dag, run, workers=1, quiet=True)
    kept = pq.read_table(list((run / "decontaminate").glob("*.parquet")))
    if mode == "drop":
        assert sorted(kept.column("id").to_pylist()) == sorted(f"docs/{i}" for i in ids[3:])
        rej = pq.read_table(run / "rejected" / "decontaminate")
        assert sorted(rej.column("id").to_pylist()) == ["docs/leak-a", "docs/leak-b", "docs/leak-c"]
        assert set(rej.column("reason").to_pylist()) == {REASON}
    else:
        assert kept.num_rows == len(ids)
        by_id = dict(zip(kept.column("id").to_pylist(), kept.column("text").to_pylist()))
        assert by_id["docs/leak-a"].rstrip() == web[0].rstrip() and by_id["docs/leak-c"].rstrip() == web[2].rstrip()
    report = json.loads((run / "decontaminate" / REPORT).read_text())
    assert report["contaminated_documents"] == 3 and report["documents"] == len(ids)
    b = {x["benchmark"]: x for x in report["benchmarks"]}
    assert b["gsm8k"]["items"] == 30 and b["gsm8k"]["leaked_items"] == 1 and b["gsm8k"]["contaminated_documents"] == 2
    assert b["gsm8k"]["leaks"][0]["item"] == "3" and b["gsm8k"]["leaks"][0]["documents"] == 2
    assert b["gsm8k"]["leaks"][0]["span"].startswith(_jsonl(EVAL_DIR / "gsm8k_test.jsonl")[3]["question"][:40])
    assert b["humaneval"]["leaks"][0]["item"] == "HumanEval/1"
    from typer.testing import CliRunner

    from curation.cli import app
    out = CliRunner().invoke(app, ["stats", str(run)])
    assert out.exit_code == 0, out.output
    assert "decontamination" in out.output and "HumanEval/1" in out.output
