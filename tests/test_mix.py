"""The mix stage: targets with redistribution, seeded sub/upsampling, interleaving, and the
realised mix of a real four-source DAG (pipelines/mix-multi.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from pydantic import ValidationError

from conftest import REPO
from curation.pipeline.dag import parse_dag
from curation.pipeline.executor import run_dag
from curation.stages.mix import Mix, MixError, interleave, select_copies, source_targets
from curation.pipeline.stats import connect
from curation.tokenizer.model import train_tokenizer

# ---------------------------------------------------------------------------------------------
# the real DAG, shared with test_pack.py (run once per session per worker count)

_RUNS: dict[str, Path] = {}


def mix_multi_tokenizer(root: Path) -> Path:
    from test_tokenize import fixture_corpus

    if "tok" not in _RUNS:
        corpus = fixture_corpus(root / "corpus" / "texts.parquet")
        _RUNS["tok"] = train_tokenizer(corpus, root / "tok", kind="bpe", vocab_size=2048, progress=False).path.parent
    return _RUNS["tok"]


def mix_multi_dag(tokenizer: Path, edit=None):
    d = yaml.safe_load((REPO / "pipelines/mix-multi.yaml").read_text())
    d["stages"]["tokenize"]["tokenizer"] = str(tokenizer)
    if edit:
        edit(d)
    return parse_dag(d, "pipelines/mix-multi.yaml", base_dir=str(REPO))


def mix_multi_run(tmp_path_factory, workers: int) -> Path:
    """pipelines/mix-multi.yaml with a tokenizer trained on the fixtures, on ``workers`` workers."""
    key = f"run{workers}"
    if key not in _RUNS:
        root = tmp_path_factory.getbasetemp() / "mix-multi"
        root.mkdir(exist_ok=True)
        tok = mix_multi_tokenizer(root)
        run_dag(mix_multi_dag(tok), root / key, workers=workers, quiet=True)
        _RUNS[key] = root / key
    return _RUNS[key]


@pytest.fixture(scope="module")
def run2(tmp_path_factory, ray_session) -> Path:
    return mix_multi_run(tmp_path_factory, 2)


# ---------------------------------------------------------------------------------------------
# planning, without Ray


def test_targets_cap_small_sources_and_redistribute_by_weight():
    t = source_targets({"a": 100, "b": 1000, "c": 3000}, {"a": 0.5, "b": 0.25, "c": 0.25}, 2000, max_epochs=4)
    assert t["a"] == 400  # 4 epochs of 100 tokens; the 600 it cannot give go to b and c 1:1
    assert t["b"] == pytest.approx(800) and t["c"] == pytest.approx(800)
    # cascade: b then hits its own cap, the rest goes to c
    t = source_targets({"a": 100, "b": 150, "c": 5000}, {"a": 0.5, "b": 0.4, "c": 0.1}, 3000, max_epochs=2)
    assert (t["a"], t["b"]) == (200, 300) and t["c"] == pytest.approx(2500)
    # everything capped: the total is not reachable, nothing is invented
    t = source_targets({"a": 10, "b": 10}, {"a": 1, "b": 1}, 1000, max_epochs=3)
    assert t == {"a": 30, "b": 30}


def test_select_copies_hits_the_target_within_one_small_document():
    rng = np.random.default_rng(1)
    tokens = rng.integers(5, 800, 2000)
    avail = int(tokens.sum())
    for frac in (0.013, 0.3, 1.0, 2.5, 3.999):
        idx, ep = select_copies(tokens, frac * avail, np.random.default_rng(7))
        gap = frac * avail - int(tokens[idx].sum())
        full = int(frac)
        counts = np.bincount(idx, minlength=len(tokens))
        # under target, and no document left out of the partial epoch would still fit the gap
        assert gap >= 0 and (tokens[counts == full] > gap).all(), frac
        assert gap < 800 / 2 or frac > 3.99, frac  # with many small documents left, the gap is tiny
        assert counts.min() >= full and counts.max() <= full + 1  # whole epochs, then a partial one
        assert np.array_equal(ep, np.sort(ep))  # epochs in order
        for e in range(full):  # each whole epoch is a permutation
            assert np.array_equal(np.sort(idx[ep == e]), np.arange(len(tokens)))
        again, _ = select_copies(tokens, frac * avail, np.random.default_rng(7))
        assert np.array_equal(idx, again)
    other, _ = select_copies(tokens, 0.3 * avail, np.random.default_rng(8))
    first, _ = select_copies(tokens, 0.3 * avail, np.random.default_rng(7))
    assert not np.array_equal(np.sort(other), np.sort(first))


def test_interleave_keeps_every_prefix_at_the_mix():
    rng = np.random.default_rng(3)
    seqs = [rng.integers(1, 300, n) for n in (500, 40, 1200)]
    src, seq = interleave(seqs)
    assert len(src) == sum(map(len, seqs))
    for s, q in enumerate(seqs):  # each source's copies keep their order
        assert np.array_equal(seq[src == s], np.arange(len(q)))
    toks = np.array([seqs[s][j] for s, j in zip(src, seq)])
    share = np.array([q.sum() for q in seqs]) / sum(q.sum() for q in seqs)
    cum = np.zeros(3)
    worst = 0.0
    for i, (s, t) in enumerate(zip(src, toks)):
        cum[s] += t
        worst = max(worst, np.abs(cum - share * cum.sum()).max())
    assert worst <= 300  # never more than one document ahead or behind


def _shards(tmp_path: Path, per_source: dict[str, list[int]]) -> list[str]:
    paths = []
    for s, toks in per_source.items():
        p = tmp_path / f"{s}.parquet"
        pq.write_table(pa.table({"id": [f"{s}/{i}" for i in range(len(toks))], "source": [s] * len(toks),
                                 "num_tokens": pa.array(toks, pa.int32())}), p)
        paths.append(str(p))
    return paths


def test_weights_must_match_the_data_and_unweighted_sources_are_rejected(tmp_path):
    paths = _shards(tmp_path, {"web": [100] * 50, "math": [10] * 50, "misc": [5] * 10})
    with pytest.raises(MixError, match=r"weights name \['code'\]"):
        Mix(weights={"web": 1, "code": 1}, total_tokens=1000).plan(paths)
    plan = Mix(weights={"web": 3, "math": 1}, total_tokens=1000).plan(paths)
    rep = plan["report"]["sources"]
    assert rep["misc"]["realised_tokens"] == 0 and rep["misc"]["docs_rejected"] == 10
    assert plan["per_shard"][2]["rej_reasons"] == ["mix:not_in_weights"] * 10
    # targets 750 / 250: web lands within one of its 100-token documents
    assert rep["math"]["realised_tokens"] == 250 and rep["web"]["realised_tokens"] == 700
    assert set(plan["per_shard"][0]["rej_reasons"]) == {"mix:subsampled"}


def test_temperature_flattens_natural_shares_and_config_errors():
    m = Mix(total_tokens=1, temperature=2.0)
    w = m.resolve_weights({"a": 900, "b": 100})
    assert w["a"] == pytest.approx(0.9 ** 0.5 / (0.9 ** 0.5 + 0.1 ** 0.5))
    assert Mix(total_tokens=1).resolve_weights({"a": 900, "b": 100}) == pytest.approx({"a": 0.9, "b": 0.1})
    with pytest.raises(ValidationError, match="weights or temperature"):
        Mix(total_tokens=1, temperature=2, weights={"a": 1})
    with pytest.raises(ValidationError, match="at least one > 0"):
        Mix(total_tokens=1, weights={"a": 0})


# ---------------------------------------------------------------------------------------------
# the real multi-source DAG


def _mix_rows(run: Path):
    """The mix output in output order (shards by key, rows in order)."""
    return pa.concat_tables(pq.read_table(p, columns=["id", "source", "num_tokens", "input_ids"])
                            for p in sorted((run / "mix").glob("mix-*.parquet")))


def test_realised_mix_is_within_one_percent_of_target(run2):
    report = json.loads((run2 / "mix" / "_mix_report.json").read_text())
    weights = {"web": 0.4, "math": 0.2, "code": 0.15, "multilingual": 0.25}
    con = connect(run2)
    got = dict(con.execute("select source, sum(num_tokens) from mix group by 1").fetchall())
    total = sum(got.values())
    assert total == report["realised_tokens"]
    assert abs(total - 120000) / 120000 < 0.01
    for s, w in weights.items():
        r = report["sources"][s]
        assert r["target_share"] == pytest.approx(w)  # nothing capped at 4 epochs here
        assert got[s] == r["realised_tokens"]
        assert abs(got[s] / total - w) <= 0.01, (s, got[s] / total, w)
    # code is upsampled (more than one epoch), the others subsampled
    assert report["sources"]["code"]["epochs"] > 1 and report["sources"]["web"]["epochs"] < 1
    assert report["shards"] == len(list((run2 / "mix").glob("mix-*.parquet"))) >= 2


def test_copies_are_renamed_rejections_accounted_and_tokens_unchanged(run2):
    con = connect(run2)
    mix = _mix_rows(run2)
    ids = mix.column("id").to_pylist()
    assert len(ids) == len(set(ids))
    code_ids = [i for i, s in zip(ids, mix.column("source").to_pylist()) if s == "code"]
    assert any(i.endswith("#epoch1") for i in code_ids) and any("#" not in i.split("/", 1)[1] for i in code_ids)
    tok = {r["id"]: r["input_ids"] for r in con.sql("select id, input_ids from tokenize").to_arrow_table().to_pylist()}
    for i, ids_ in zip(ids, mix.column("input_ids").to_pylist()):
        assert ids_ == tok[i.split("#epoch")[0]]
    # each tokenized document is either used (at least once) or rejected, never both
    used = {i.split("#epoch")[0] for i in ids}
    rejected = dict(con.execute("select id, reason from rejected where stage = 'mix'").fetchall())
    assert used.isdisjoint(rejected) and used | set(rejected) == set(tok)
    assert set(rejected.values()) == {"mix:subsampled"}
    stats = {r[0]: r[1:] for r in con.execute(
        "select stage, sum(rows_in), sum(rows), sum(rejected_rows) from manifest group by 1").fetchall()}
    assert stats["mix"] == (len(tok), len(ids), len(rejected))


def test_every_prefix_of_the_output_is_near_the_mix(run2):
    mix = _mix_rows(run2)
    src = mix.column("source").to_pylist()
    n = mix.column("num_tokens").to_numpy()
    names = sorted(set(src))
    share = {s: n[[x == s for x in src]].sum() / n.sum() for s in names}
    biggest = int(n.max())
    cum = dict.fromkeys(names, 0)
    for i, (s, t) in enumerate(zip(src, n)):
        cum[s] += int(t)
        done = sum(cum.values())
        for x in names:  # within one (largest) document of the target at every row
            assert abs(cum[x] - share[x] * done) <= biggest, (i, x)


def test_rerun_writes_nothing(run2, ray_session):
    before = {p: p.stat().st_mtime_ns for p in run2.rglob("*.parquet")}
    run_dag(mix_multi_dag(_RUNS["tok"]), run2, workers=2, quiet=True)
    assert before == {p: p.stat().st_mtime_ns for p in run2.rglob("*.parquet")}
    assert not (run2 / "mix" / "_work").exists()  # fragments dropped once committed


def test_new_seed_new_sample_same_mix(run2):
    paths = sorted(str(p) for p in (run2 / "tokenize").glob("*.parquet"))
    st = mix_multi_dag(_RUNS["tok"]).stages["mix"]
    a, b = st.plan(paths), st.model_copy(update={"seed": 1}).plan(paths)
    assert a["report"] == st.plan(paths)["report"]
    picked = [np.concatenate([p["rows"] * 100000 + i for i, p in enumerate(x["per_shard"])]) for x in (a, b)]
    assert set(picked[0].tolist()) != set(picked[1].tolist())
    for s, r in a["report"]["sources"].items():
        assert abs(r["realised_share"] - b["report"]["sources"][s]["realised_share"]) < 0.01
