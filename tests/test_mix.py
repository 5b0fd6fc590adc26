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
from curation.sampling.mixture import doc_keys, emission_positions, source_targets
from curation.stages import mix as mix_module
from curation.stages.mix import Mix, MixError
from dedup_helpers import run_global
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


def _shards(tmp_path: Path, per_source: dict[str, list[int]], split: int = 1) -> list[tuple[str, str]]:
    """One source per file (``split`` files each), ``num_tokens`` given: (key, path) pairs."""
    out = []
    for s, toks in per_source.items():
        for k in range(split):
            sel = list(range(k, len(toks), split))
            p = tmp_path / f"{s}-{k}.parquet"
            pq.write_table(pa.table({"id": [f"{s}/{i}" for i in sel], "source": [s] * len(sel),
                                     "num_tokens": pa.array([toks[i] for i in sel], pa.int32())}), p)
            out.append((f"{s}-{k}", str(p)))
    return out


def _run(stage: Mix, run: Path, upstream) -> tuple[dict, pa.Table, pa.Table]:
    run_global(stage, run, "mix", upstream)
    report = json.loads((run / "mix" / "_mix_report.json").read_text())
    out = pa.concat_tables([pq.read_table(p) for p in sorted((run / "mix").glob("mix-*.parquet"))])
    rej = [pq.read_table(p) for p in sorted((run / "rejected" / "mix").glob("*.parquet"))]
    return report, out, (pa.concat_tables(rej) if rej else None)


def test_partial_epoch_takes_the_lowest_keys_that_fit_with_or_without_refining(tmp_path, monkeypatch, ray_session):
    """The partial epoch is the documents in ascending (hash(seed, source, id), id) order taken
    while they fit, then first-fit from the rest: found from merged histograms (refined digit by
    digit when the cap is tiny) and bounded fill rounds, it equals the brute-force walk, and
    lands within the smallest unused document of the target."""
    rng = np.random.default_rng(5)
    toks = rng.integers(1, 800, 3000).tolist()
    upstream = _shards(tmp_path, {"web": toks}, split=5)
    target = 0.37 * sum(toks)
    u = doc_keys(7, "web", [f"web/{i}" for i in range(len(toks))])
    order = sorted(range(len(toks)), key=lambda i: (int(u[i]), f"web/{i}"))
    taken, expect, cut = 0, set(), False
    for i in order:  # taken while they fit, then the gap filled first-fit from the rest
        if taken + toks[i] > target:
            cut = True
        if not cut or taken + toks[i] <= target:
            taken += toks[i]
            expect.add(f"web/{i}")
    results = {}
    for cap in (mix_module.GATHER_CAP, 0):
        monkeypatch.setattr(mix_module, "GATHER_CAP", cap)
        report, out, _ = _run(Mix(total_tokens=target, seed=7, rows_per_shard=400), tmp_path / f"cap{cap}", upstream)
        assert set(out.column("id").to_pylist()) == expect
        r = report["sources"]["web"]
        assert r["realised_tokens"] == taken and 0 <= target - taken < min(
            t for i, t in enumerate(toks) if f"web/{i}" not in expect)
        results[cap] = out.column("id").to_pylist()
    assert results[0] == results[mix_module.GATHER_CAP]  # same rows, same order


def test_upsampling_repeats_whole_epochs_then_a_partial_one(tmp_path, ray_session):
    toks = [50] * 40 + [7] * 60
    upstream = _shards(tmp_path, {"code": toks}, split=3)
    report, out, rej = _run(Mix(total_tokens=2.5 * sum(toks), rows_per_shard=100), tmp_path / "up", upstream)
    ids = out.column("id").to_pylist()
    base = [i.split("#epoch")[0] for i in ids]
    counts = {b: base.count(b) for b in set(base)}
    assert len(counts) == len(toks) and set(counts.values()) <= {2, 3} and rej is None
    assert all(f"{b}#epoch1" in ids for b in counts) and len(ids) == len(set(ids))
    assert abs(report["sources"]["code"]["realised_tokens"] - 2.5 * sum(toks)) < 50


def test_a_work_folder_left_by_an_older_version_is_refused(tmp_path, ray_session):
    """Phase records without a header (mix before version 3 counted per shard, not per block):
    refused with a message, never resumed as if its jobs were this version's; once deleted,
    the stage runs and writes its header."""
    import shutil

    from curation.io.artifacts import ArtifactMismatch
    from curation.pipeline.rundir import RunDir

    toks = [50] * 40 + [7] * 60
    upstream = _shards(tmp_path, {"code": toks}, split=3)
    stage = Mix(total_tokens=sum(toks) // 2, rows_per_shard=100)
    run = tmp_path / "run"
    work = Path(RunDir(run).work_dir("mix", stage.params_hash(["up"])))
    (work / "_phases").mkdir(parents=True)
    (work / "_phases" / "count.jsonl").write_text('{"job": 0, "result": {"docs": 1}}\n')
    with pytest.raises(ArtifactMismatch, match="older version of refinery"):
        _run(stage, run, upstream)
    shutil.rmtree(work)
    report, out, _ = _run(stage, run, upstream)
    assert out.num_rows and abs(report["sources"]["code"]["realised_tokens"] - sum(toks) // 2) < 50


def test_positions_spread_each_shard_evenly_so_prefixes_keep_the_mix():
    rng = np.random.default_rng(3)
    per_source = [rng.integers(1, 300, n) for n in (500, 40, 1200)]
    pos, src, tok = [], [], []
    for s, t in enumerate(per_source):
        u = rng.integers(0, 2**63, len(t), dtype=np.uint64)
        doc, epoch, p = emission_positions(u, t, np.ones(len(t), np.int64), seed=0)
        assert sorted(doc.tolist()) == list(range(len(t))) and (np.diff(p) > 0).all()
        pos.append(p)
        src += [s] * len(t)
        tok.append(t[doc])
    order = np.argsort(np.concatenate(pos), kind="stable")
    src, tok = np.asarray(src)[order], np.concatenate(tok)[order]
    share = np.array([t.sum() for t in per_source]) / sum(t.sum() for t in per_source)
    cum, worst = np.zeros(3), 0.0
    for s, t in zip(src, tok):
        cum[s] += t
        worst = max(worst, np.abs(cum - share * cum.sum()).max())
    assert worst <= 300  # one shard: never more than one document ahead or behind


def test_weights_must_match_the_data_and_unweighted_sources_are_rejected(tmp_path, ray_session):
    upstream = _shards(tmp_path, {"web": [100] * 50, "math": [10] * 50, "misc": [5] * 10})
    with pytest.raises(MixError, match=r"weights name \['code'\]"):
        _run(Mix(weights={"web": 1, "code": 1}, total_tokens=1000), tmp_path / "bad", upstream)
    report, out, rej = _run(Mix(weights={"web": 3, "math": 1}, total_tokens=1000), tmp_path / "ok", upstream)
    rep = report["sources"]
    assert rep["misc"]["realised_tokens"] == 0 and rep["misc"]["docs_rejected"] == 10
    reasons = dict(zip(rej.column("id").to_pylist(), rej.column("reason").to_pylist()))
    assert {r for i, r in reasons.items() if i.startswith("misc/")} == {"mix:not_in_weights"}
    assert sum(i.startswith("misc/") for i in reasons) == 10
    # targets 750 / 250: web lands within one of its 100-token documents
    assert rep["math"]["realised_tokens"] == 250 and rep["web"]["realised_tokens"] == 700
    assert {r for i, r in reasons.items() if i.startswith("web/")} == {"mix:subsampled"}


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
    # each upstream shard spreads its copies evenly (within half a document of its share at any
    # position), so a prefix is within (upstream shards) largest documents of the mix
    shards = len(list((run2 / "tokenize").glob("*.parquet")))
    cum = dict.fromkeys(names, 0)
    worst = 0.0
    for i, (s, t) in enumerate(zip(src, n)):
        cum[s] += int(t)
        done = sum(cum.values())
        for x in names:
            worst = max(worst, abs(cum[x] - share[x] * done))
    print(f"worst prefix deviation {worst:.0f} tokens; largest document {biggest}; {shards} upstream shards")
    assert worst <= shards * biggest


def test_rerun_writes_nothing(run2, ray_session):
    before = {p: p.stat().st_mtime_ns for p in run2.rglob("*.parquet")}
    run_dag(mix_multi_dag(_RUNS["tok"]), run2, workers=2, quiet=True)
    assert before == {p: p.stat().st_mtime_ns for p in run2.rglob("*.parquet")}
    assert not (run2 / "mix" / "_work").exists()  # fragments dropped once committed


def test_new_seed_new_sample_same_mix(run2, tmp_path, ray_session):
    upstream = sorted((p.stem, str(p)) for p in (run2 / "tokenize").glob("*.parquet"))
    st = mix_multi_dag(_RUNS["tok"]).stages["mix"]
    a, out_a, _ = _run(st, tmp_path / "a", upstream)
    b, out_b, _ = _run(st.model_copy(update={"seed": 1}), tmp_path / "b", upstream)
    dag_report = json.loads((run2 / "mix" / "_mix_report.json").read_text())
    assert a["sources"] == dag_report["sources"] and a["rows"] == dag_report["rows"]  # same choice as the DAG run
    assert set(out_a.column("id").to_pylist()) != set(out_b.column("id").to_pylist())
    for s, r in a["sources"].items():
        assert abs(r["realised_share"] - b["sources"][s]["realised_share"]) < 0.01
