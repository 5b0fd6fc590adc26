"""decontaminate: real eval text (WikiText-2 test head) vs real web docs (CCNet)."""

from __future__ import annotations

import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from curation.pipeline.dag import parse_dag
from curation.pipeline.executor import run_dag
from curation.stages.decontaminate import REASON, Decontaminate, eval_ngram_hashes, ngram_hashes, normalise_words

from conftest import DATA

EVAL = DATA / "ablate" / "wikitext2_test_head4.txt"


def _eval_lines() -> list[str]:
    return [l.strip() for l in EVAL.read_text().splitlines() if len(l.split()) > 60]


def _web_docs() -> list[dict]:
    return [json.loads(l) for l in gzip.open(DATA / "jsonl" / "dolma_cc_en_head-0091.jsonl.gz")]


def _docs_table() -> tuple[pa.Table, list[str]]:
    web = _web_docs()
    para = _eval_lines()[1].split()
    passage = " ".join(para[10:25])  # 15 words copied from an eval paragraph
    ids, texts = [], []
    # a real web page with the eval passage pasted in the middle (and different case)
    host = web[1]["text"]
    mid = len(host) // 2
    ids.append("contaminated")
    texts.append(host[:mid] + " " + passage.upper() + " " + host[mid:])
    # only 12 of the words: below the 13-gram, must be kept
    ids.append("short-overlap")
    texts.append(web[2]["text"] + " " + " ".join(para[10:22]))
    for i, d in enumerate(web[3:8]):
        ids.append(f"clean-{i}")
        texts.append(d["text"])
    return pa.table({"id": ids, "text": texts, "source": ["web"] * len(ids)}), ids


def test_ngram_hashes_windows():
    words = normalise_words("A b C d E")
    h = ngram_hashes(words, 3)
    assert len(h) == 3 and len(set(h.tolist())) == 3
    assert ngram_hashes(words, 6).size == 0
    # same words, same hash, whatever the case and spacing
    assert ngram_hashes(normalise_words("x  a B\nc"), 3)[1] == h[0]


def test_stage_drops_copied_passage_keeps_unrelated():
    table, ids = _docs_table()
    st = Decontaminate(type="decontaminate", eval_paths=[str(EVAL)])
    st.setup()
    res = st.process(table)
    reasons = dict(zip(ids, res.reasons.to_pylist()))
    overlaps = dict(zip(ids, res.table.column("decontam_overlaps").to_pylist()))
    assert reasons["contaminated"] == REASON
    assert overlaps["contaminated"] == 3  # 15 words -> 3 windows of 13
    assert reasons["short-overlap"] is None and overlaps["short-overlap"] == 0
    for i in ids[2:]:
        assert reasons[i] is None and overlaps[i] == 0, i
    # the eval set itself is fully contaminated
    own = st.process(pa.table({"text": _eval_lines()[:5]}))
    assert all(r == REASON for r in own.reasons.to_pylist())


def test_eval_formats_agree(tmp_path):
    lines = _eval_lines()[:4]
    p = tmp_path / "e.jsonl"
    p.write_text("".join(json.dumps({"text": l}) + "\n" for l in lines))
    q = tmp_path / "e.parquet"
    pq.write_table(pa.table({"text": lines}), q)
    a, b = eval_ngram_hashes([str(p)], 13), eval_ngram_hashes([str(q)], 13)
    assert len(a) > 100 and (a == b).all()


def test_missing_eval_file_is_a_config_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        Decontaminate(type="decontaminate", eval_paths=[str(tmp_path / "nope.txt")])


def test_in_a_dag_records_drops(tmp_path, ray_session):
    table, ids = _docs_table()
    src = tmp_path / "docs.parquet"
    pq.write_table(table, src)
    dag = parse_dag({
        "name": "decontam-test",
        "inputs": {"docs": {"format": "parquet", "paths": [str(src)], "source": "web", "id_field": "id"}},
        "stages": {"decontaminate": {"eval_paths": [str(EVAL)]}},
        "output": "decontaminate",
    })
    run_dag(dag, tmp_path / "run", workers=1, quiet=True)
    kept = pq.read_table(list((tmp_path / "run" / "decontaminate").glob("*.parquet"))).column("id").to_pylist()
    assert "docs/contaminated" not in kept and "docs/clean-0" in kept and len(kept) == len(ids) - 1
    rej = pq.read_table(tmp_path / "run" / "rejected" / "decontaminate")
    assert rej.column("id").to_pylist() == ["docs/contaminated"]
    assert rej.column("reason").to_pylist() == [REASON]
    assert rej.column("decontam_overlaps").to_pylist() == [3]
    man = [json.loads(l) for l in (tmp_path / "run" / "decontaminate" / "_manifest.jsonl").read_text().splitlines()]
    assert sum(e.get("rejected_rows", 0) for e in man) == 1
