"""Model-based quality: teachers and labels, fastText training with its card, the compiled scorer
against fastText's own predict, the quality stage (min_score, exact keep_top on 1 and 2
workers), one model load per worker process, and bad input / bad model files."""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pydantic import ValidationError

from conftest import DATA, REPO
from curation.quality.classifier import (LOADS, FastTextScorer, ModelLoadError, card_path, load_fasttext,
                                         predict_batch, prepare_text, quality_eval, roc_auc,
                                         train_quality_classifier)
from curation.quality.labels import POSITIVE, label_documents, quality_label, read_documents, top_bottom
from curation.quality.teachers import (CallableTeacher, PerplexityTeacher, ReferenceTeacher, TeacherError,
                                       prose_line_share)
from curation.stages.quality import QualityScore
from curation.stages.quality_top import QualityTop

CRAWL = DATA / "quality" / "crawl_sample.jsonl.gz"
REFERENCE = DATA / "quality" / "reference_sample.jsonl.gz"


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Reference-teacher labels over the fixtures, and a classifier trained on them."""
    d = tmp_path_factory.mktemp("quality")
    meta = quality_label(CRAWL, REFERENCE, "reference", d / "labels.txt", seed=0)
    assert meta["labels"]["positives"] == 130 and meta["labels"]["negatives"] == 130
    train_quality_classifier(d / "labels.txt", d / "quality.bin", dim=32, epoch=20, seed=0)
    return d / "quality.bin"


def _docs(path: Path) -> list[dict]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


# ---------------------------------------------------------------------------------------------
# teachers and labels


def test_reference_teacher_labels_reference_vs_random_crawl_sample():
    crawl = read_documents(CRAWL)
    reference = read_documents(REFERENCE)
    copy = reference[0]
    pos, neg, summary = label_documents(ReferenceTeacher([t for _, t in reference]), crawl + [("dup", copy[1])],
                                        reference, seed=0)
    assert len(pos) == 130 and len(neg) == 130
    assert copy[1] not in neg and summary["reference_in_crawl"] == 1  # a reference doc is never a negative
    again = label_documents(ReferenceTeacher([t for _, t in reference]), crawl, reference, seed=0)
    assert again[1] == neg  # seeded: the same sample
    other = label_documents(ReferenceTeacher([t for _, t in reference]), crawl, reference, seed=1)
    assert other[1] != neg


def test_score_teachers_label_top_and_bottom_fractions_with_seeded_ties():
    scores = np.array([0.1, 0.9, 0.5, 0.5, 0.5, 0.3, 0.7, 0.2, 0.8, 0.4])
    ids = [f"d{i}" for i in range(10)]
    top, bottom = top_bottom(scores, ids, 0.3, seed=0)
    assert sorted(top.tolist()) == [1, 6, 8] and sorted(bottom.tolist()) == [0, 5, 7]
    flat = np.zeros(10)
    assert top_bottom(flat, ids, 0.3, seed=0)[0].tolist() == top_bottom(flat, ids, 0.3, seed=0)[0].tolist()


def test_callable_teacher_by_import_path():
    t = CallableTeacher("curation.quality.teachers:prose_line_share")
    prose = "This is a complete sentence that a person wrote about the weather today.\n" * 3
    menu = "Home\nAbout us\nContact\nLogin\nShare on Facebook\n"
    assert t.score([prose, menu]).tolist() == [1.0, 0.0]
    assert prose_line_share([""]).tolist() == [0.0]
    for bad in ("nodots", "curation.quality.teachers:nope", "no.such.module:f"):
        with pytest.raises(TeacherError):
            CallableTeacher(bad)


def test_perplexity_teacher_prefers_reference_like_text():
    reference = [d["text"] for d in _docs(REFERENCE)][:60]
    teacher = PerplexityTeacher(reference, steps=40, max_bytes=512, seed=0)
    prose = [d["text"] for d in _docs(REFERENCE)][100:110]
    junk = ["x7#k@ZQ 99 || {{}} 0x3F;;; " * 20, "ÿÿÿÿ ~~~~ ^^^^ 1234567890 " * 20]
    s = teacher.score(prose + junk)
    assert s[:10].min() > s[10:].max()
    assert teacher.describe()["training"]["steps"] == 40


def test_label_file_and_sidecar(trained):
    labels = trained.parent / "labels.txt"
    lines = labels.read_text().splitlines()
    assert len(lines) == 260 and all(ln.startswith(("__label__hq ", "__label__lq ")) for ln in lines)
    assert not any("\n" in ln for ln in lines) and any("__nl__" in ln for ln in lines)
    meta = json.loads(Path(f"{labels}.json").read_text())
    assert meta["teacher"]["name"] == "reference" and meta["labels"]["sha256"]


# ---------------------------------------------------------------------------------------------
# classifier: training, card, scoring


def test_card_records_data_balance_heldout_params_and_seed(trained):
    card = json.loads(card_path(trained).read_text())
    assert card["model_sha256"] == hashlib.sha256(trained.read_bytes()).hexdigest()
    assert card["training_data"][0]["sha256"] and card["label_balance"]["positives"] == 130
    assert card["fasttext_params"]["wordNgrams"] == 2 and card["seed"] == 0
    assert 0.8 <= card["heldout"]["auc"] <= 1.0 and card["heldout"]["docs"] == 26
    assert card["label_provenance"][0]["teacher"]["name"] == "reference"


def test_training_is_reproducible(trained, tmp_path):
    train_quality_classifier(trained.parent / "labels.txt", tmp_path / "again.bin", dim=32, epoch=20, seed=0)
    assert (tmp_path / "again.bin").read_bytes() == trained.read_bytes()


def test_fasttext_predict_works_under_numpy2(trained):
    model = load_fasttext(trained)
    labels, probs = model.predict(["a short line of text", "another one"], k=2)
    assert len(labels) == 2 and all(isinstance(p, np.ndarray) and abs(float(p.sum()) - 1) < 1e-4 for p in probs)


def test_compiled_scorer_equals_fasttext_predict(trained):
    model = load_fasttext(trained)
    texts = [d["text"] for d in _docs(CRAWL)][:80] + [
        "", " ", "\n\n\n", "word", "two\n\nlines \r\n with\tstuff", "héllo wörld ñ 中文 日本語 Ελληνικά",
        "nul\x00byte", "__label__hq pretending", "x" * 300 + " " + "é" * 90, "trailing space ", None,
    ]
    ours = FastTextScorer(model).score(pa.array(texts, pa.string()))
    labels, probs = predict_batch(model, [prepare_text(t or "") for t in texts], k=-1)
    ref = np.array([dict(zip(ls, ps)).get(POSITIVE, 0.0) for ls, ps in zip(labels, probs)])
    np.testing.assert_allclose(ours, ref, atol=1e-4)
    # a batch slice (Arrow offset) scores the same as the whole
    arr = pa.array(texts, pa.string())
    np.testing.assert_allclose(FastTextScorer(model).score(arr.slice(5, 40)), ours[5:45], atol=1e-6)


def test_compiled_word_hash_equals_reference():
    from curation.quality.fasttext_kernels import hash_spans
    from curation.quality.classifier import fnv1a_fasttext

    words = [b"", b"a", b"word", "héllo".encode(), "中文日本語".encode(), b"</s>", b"\xff\x80" * 40]
    offsets = np.zeros(len(words) + 1, np.int64)
    np.cumsum([len(w) for w in words], out=offsets[1:])
    got = hash_spans(np.frombuffer(b"".join(words), np.uint8), offsets)
    assert got.tolist() == fnv1a_fasttext(words).tolist()
    assert fnv1a_fasttext([b"a"])[0] == 0xE40C292C  # FNV-1a 32 of "a", the published test vector


def test_compiled_scorer_with_three_labels_equals_fasttext_predict(trained, tmp_path):
    """More than two labels: the softmax path (one projected column per label)."""
    import fasttext

    lines = (trained.parent / "labels.txt").read_text().splitlines()
    relabelled = [ln.replace("__label__lq ", "__label__mid ", 1) if i % 3 == 0 else ln for i, ln in enumerate(lines)]
    (tmp_path / "three.txt").write_text("\n".join(relabelled) + "\n")
    model = fasttext.train_supervised(str(tmp_path / "three.txt"), dim=16, epoch=10, wordNgrams=2, thread=1,
                                      seed=0, verbose=0)
    assert len(model.get_labels()) == 3
    texts = [d["text"] for d in _docs(CRAWL)][:40] + ["", "one\ntwo"]
    scorer = FastTextScorer(model)
    assert scorer.fast and scorer.proj.shape[1] == 3
    labels, probs = predict_batch(model, [prepare_text(t) for t in texts], k=-1)
    ref = np.array([dict(zip(ls, ps)).get(POSITIVE, 0.0) for ls, ps in zip(labels, probs)])
    np.testing.assert_allclose(scorer.score(texts), ref, atol=1e-4)


def test_quality_eval_reports_auc_and_length_baseline(trained, tmp_path):
    held = [{"text": d["text"], "label": 1} for d in _docs(REFERENCE)[-30:]]
    held += [{"text": d["text"], "label": 0} for d in _docs(CRAWL)[-30:]]
    path = tmp_path / "judgements.jsonl"
    path.write_text("".join(json.dumps(h) + "\n" for h in held))
    ev = quality_eval(trained, path)
    assert ev["docs"] == 60 and 0.0 <= ev["auc"] <= 1.0 and 0.0 <= ev["length_auc"] <= 1.0
    assert ev["own_heldout_auc"] > 0.8
    assert roc_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    assert roc_auc([0, 1], [0.5, 0.5]) == 0.5


# ---------------------------------------------------------------------------------------------
# the stage


def _table(texts) -> pa.Table:
    return pa.table({"id": [f"d{i}" for i in range(len(texts))], "text": pa.array(texts, pa.string())})


def test_min_score_stage_and_no_text(trained):
    st = QualityScore(type="quality", model=str(trained), min_score=0.5)
    assert st.kind == "map"
    texts = [d["text"] for d in _docs(REFERENCE)][:5] + ["", "   \n ", None, "Home\nLogin\nCart\nMenu"]
    res = st.process(_table(texts))
    q = res.table.column("quality").to_pylist()
    reasons = res.reasons.to_pylist()
    assert q[5:8] == [None, None, None] and reasons[5:8] == ["quality:no_text"] * 3
    assert all(0.0 <= x <= 1.0 for x in q[:5] + q[8:])
    assert all((r == "quality:low_score") == (x < 0.5) for r, x in zip(reasons[:5] + reasons[8:], q[:5] + q[8:]))
    # keep_top is the other stage (a corpus-level cut): `type: quality` + keep_top reads as it
    assert QualityScore.variant({"keep_top": 0.3}) is QualityTop
    assert QualityTop(type="quality", model=str(trained), keep_top=0.3).kind == "global"
    with pytest.raises(ValidationError, match="not both"):
        QualityTop(type="quality", model=str(trained), keep_top=0.3, min_score=0.5)


def test_missing_or_corrupt_model_is_a_clear_error(tmp_path, trained):
    with pytest.raises(ValidationError, match="cannot load .*missing.bin.*no such file"):
        QualityScore(type="quality", model=str(tmp_path / "missing.bin"))
    bad = tmp_path / "truncated.bin"
    bad.write_bytes(trained.read_bytes()[: trained.stat().st_size // 2])
    with pytest.raises(ValidationError, match="truncated"):
        QualityScore(type="quality", model=str(bad))
    path = tmp_path / "q.bin"
    path.write_bytes(trained.read_bytes())
    st = QualityScore(type="quality", model=str(path), min_score=0.5)
    path.write_bytes(b"garbage" * 10)  # replaced after the DAG was validated
    with pytest.raises(ModelLoadError, match=r"^quality.model: cannot load '.*q.bin': not a fastText model"):
        st.setup()


def test_dag_with_missing_model_fails_before_running(tmp_path):
    from curation.pipeline.dag import DagError, parse_dag

    with pytest.raises(DagError, match="quality.*cannot load.*nope.bin"):
        parse_dag({"name": "q", "inputs": {"docs": {"format": "jsonl", "paths": [str(CRAWL)], "source": "web"}},
                   "stages": {"quality": {"type": "quality", "model": str(tmp_path / "nope.bin"), "keep_top": 0.3}}})


def test_model_is_loaded_once_per_worker_process(trained, tmp_path, ray_session):
    import ray

    from curation.stages.quality_top import score_shard

    shard = tmp_path / "docs.parquet"
    pq.write_table(_table([d["text"] for d in _docs(CRAWL)][:100]), shard)
    f = ray.remote(num_cpus=1)(score_shard)
    facts = ray.get([f.remote(str(shard), str(trained), None, str(tmp_path / f"s{i}.parquet")) for i in range(8)])
    per_pid: dict[int, int] = {}
    for x in facts:
        per_pid[x["pid"]] = max(per_pid.get(x["pid"], 0), x["loads"])
    assert per_pid and set(per_pid.values()) == {1}  # 8 tasks, one load per worker process
    before = LOADS[os.path.realpath(trained)]
    for _ in range(3):  # and in this process: stages set up again and again reuse the model
        st = QualityScore(type="quality", model=str(trained), min_score=0.5)
        st.setup()
        st.process(_table(["A sentence of ordinary English prose, as people write it."] * 50))
    assert LOADS[os.path.realpath(trained)] - before <= 1


def _shard_hashes(run_dir: Path, stage: str) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for d in (run_dir / stage, run_dir / "rejected" / stage) for p in sorted(d.glob("*.parquet"))}


@pytest.mark.parametrize("workers", [1, 2])
def test_keep_top_keeps_the_exact_fraction(trained, tmp_path, ray_session, workers):
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag

    # uncompressed copies: a .jsonl.gz is one shard (not seekable); plain lines split by bytes.
    # Both worker counts read the same paths, since shards carry their origin file.
    inputs = tmp_path.parent / "keep_top_inputs"
    inputs.mkdir(exist_ok=True)
    plain = []
    for src in (CRAWL, REFERENCE):
        plain.append(inputs / src.name.removesuffix(".gz"))
        plain[-1].write_bytes(gzip.decompress(src.read_bytes()))
    dag = parse_dag({
        "name": "quality-top",
        "inputs": {"docs": {"format": "jsonl", "paths": [str(p) for p in plain], "source": "web",
                            "split_bytes": 40_000}},
        "stages": {"quality": {"type": "quality", "model": str(trained), "keep_top": 0.3}},
    }, "quality-top.yaml", base_dir=str(REPO))
    run = tmp_path / f"run{workers}"
    run_dag(dag, run, workers=workers, quiet=True)
    kept = pa.concat_tables([pq.read_table(p) for p in sorted((run / "quality").glob("*.parquet"))])
    rej = pa.concat_tables([pq.read_table(p) for p in sorted((run / "rejected" / "quality").glob("*.parquet"))])
    total = kept.num_rows + rej.num_rows
    assert total == 380 and len(list((run / "quality").glob("*.parquet"))) > 2
    assert abs(kept.num_rows / total - 0.3) <= 0.005 and kept.num_rows == 114
    assert set(rej.column("reason").to_pylist()) == {"quality:below_top_fraction"}
    assert min(kept.column("quality").to_pylist()) >= max(rej.column("quality").to_pylist())
    report = json.loads((run / "quality" / "_quality_report.json").read_text())
    assert report["kept"] == 114 and set(report["model_loads_per_worker_process"].values()) == {1}
    ref = tmp_path.parent / "keep_top_shards.json"
    hashes = _shard_hashes(run, "quality")
    if ref.exists():  # the other worker count ran first: byte-identical shards
        assert json.loads(ref.read_text()) == hashes
    else:
        ref.write_text(json.dumps(hashes))


def test_keep_top_with_a_tiny_gather_cap_refines_and_keeps_the_same_shards(trained, tmp_path, monkeypatch,
                                                                          ray_session):
    """The driver never gathers more than the cap of scores: with a cap of 0 it refines the
    chosen histogram bin byte by byte, and the shards are byte-identical to the default run."""
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag
    from curation.stages import quality_top as quality

    spec = {"name": "quality-top",
            "inputs": {"docs": {"format": "jsonl", "paths": [str(CRAWL), str(REFERENCE)], "source": "web",
                                "split_bytes": 40_000}},
            "stages": {"quality": {"type": "quality_top", "model": str(trained), "keep_top": 0.3}}}
    runs, default = {}, quality.GATHER_CAP
    for cap in (default, 0):
        monkeypatch.setattr(quality, "GATHER_CAP", cap)
        run = tmp_path / f"cap{cap}"
        run_dag(parse_dag(spec, "quality-top.yaml", base_dir=str(REPO)), run, workers=2, quiet=True)
        runs[cap] = run
    phases = json.loads((runs[0] / "quality" / "_phases.json").read_text())["phases"]
    assert "refine1" in phases and "refine1" not in json.loads(
        (runs[default] / "quality" / "_phases.json").read_text())["phases"]
    assert _shard_hashes(runs[0], "quality") == _shard_hashes(runs[default], "quality")
    report = json.loads((runs[0] / "quality" / "_quality_report.json").read_text())
    assert report["kept"] == 114
