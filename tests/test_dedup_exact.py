"""Exact dedup: the Bloom filter (measured false-positive rate, OR-merge, persisted headers)
and the ``exact_dedup`` stage on real documents with planted duplicates (lowest id survives,
paragraph level, worker-count independence, incremental dedup against an earlier run)."""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import curation.stages  # noqa: F401  (registers the stages)
from conftest import DATA
from curation.dedup.bloom import BloomFilter, BloomHeaderMismatch, bloom_size
from curation.pipeline.context import GlobalContext
from dedup_helpers import run_global, write_upstream
from curation.io.shards import Manifest
from curation.dedup.minhash import collapse_whitespace, normalize_text
from curation.stages.dedup_exact import REPORT, ExactDedup

DEDUP = DATA / "dedup"


def fixture_edits():
    """The edit functions that built the near-duplicate fixtures (tests/data/dedup)."""
    spec = importlib.util.spec_from_file_location("dedup_build_fixtures", DEDUP / "build_fixtures.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _base_docs() -> list[dict]:
    with gzip.open(DEDUP / "dclm_docs_150.jsonl.gz", "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _run(stage: ExactDedup, run_dir: Path, upstream, workers: int = 2) -> GlobalContext:
    return run_global(stage, run_dir, "exact", upstream, workers)


def _kept(run_dir: Path, name: str = "exact") -> pa.Table:
    files = sorted((run_dir / name).glob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files])


def _rejected(run_dir: Path, name: str = "exact") -> pa.Table | None:
    files = sorted((run_dir / "rejected" / name).glob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else None


# ---------------------------------------------------------------------------------------------
# Bloom filter


def test_bloom_false_positive_rate_on_never_inserted_keys_is_as_configured():
    rng = np.random.default_rng(0)
    for n, p in ((100_000, 1e-3), (20_000, 1e-2)):
        bf = BloomFilter.for_capacity(n, p, seed=5)
        assert (bf.m, bf.k) == bloom_size(n, p)
        assert bf.m == int(np.ceil(-n * np.log(p) / np.log(2) ** 2)) and bf.k == round(bf.m / n * np.log(2))
        keys = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
        bf.add(keys)
        assert bf.contains(keys).all()  # no false negatives
        probe = rng.integers(0, 2**64 - 1, 1_000_000, dtype=np.uint64, endpoint=True)
        probe = probe[~np.isin(probe, keys)]  # keys never inserted
        measured = bf.contains(probe).mean()
        print(f"n={n} p={p}: measured FP {measured:.2e}, predicted {bf.predicted_false_positive_rate():.2e}, "
              f"fill {bf.fill_ratio():.3f}")
        assert p / 2 <= measured <= 2 * p
        assert abs(bf.fill_ratio() - 0.5) < 0.05  # an optimally sized filter is half full


def test_bloom_or_merge_persistence_and_header_refusal(tmp_path):
    rng = np.random.default_rng(1)
    a = BloomFilter.for_capacity(10_000, 1e-4, seed=3, params={"level": "document"})
    b = BloomFilter.for_capacity(10_000, 1e-4, seed=3, params={"level": "document"})
    ka = rng.integers(0, 2**63, 4000, dtype=np.uint64)
    kb = rng.integers(0, 2**63, 4000, dtype=np.uint64)
    a.add(ka)
    b.add(kb)
    assert a.contains(kb).mean() < 0.01
    a.save(tmp_path / "a.bloom")
    loaded = BloomFilter.load(tmp_path / "a.bloom", expected=b.header)
    assert (loaded.bits == a.bits).all() and loaded.header == a.header
    loaded.merge(b)
    assert loaded.contains(ka).all() and loaded.contains(kb).all()
    assert (loaded.bits == (a.bits | b.bits)).all()
    # add_new: already held keys and repeats within the batch are duplicates, the rest are new
    fresh = rng.integers(2**63, 2**64 - 1, 3, dtype=np.uint64)
    batch = np.r_[ka[:2], fresh, fresh[:1]]
    assert loaded.add_new(batch).tolist() == [True, True, False, False, False, True]
    for other in (BloomFilter.for_capacity(10_000, 1e-3, seed=3, params={"level": "document"}),
                  BloomFilter.for_capacity(10_000, 1e-4, seed=4, params={"level": "document"}),
                  BloomFilter.for_capacity(10_000, 1e-4, seed=3, params={"level": "paragraph"})):
        with pytest.raises(BloomHeaderMismatch):
            BloomFilter.load(tmp_path / "a.bloom", expected=other.header)
        with pytest.raises(BloomHeaderMismatch):
            other.merge(a)
    raw = (tmp_path / "a.bloom").read_bytes()
    (tmp_path / "cut.bloom").write_bytes(raw[:-8])
    with pytest.raises(BloomHeaderMismatch, match="truncated"):
        BloomFilter.load(tmp_path / "cut.bloom")


# ---------------------------------------------------------------------------------------------
# the stage, document level


def _planted_corpus() -> tuple[list[dict], dict[str, str]]:
    """Real documents plus exact copies (verbatim, other spacing / capitals) under ids that
    sort before and after the original. Returns docs and {id: expected survivor id}."""
    whitespace_and_case = fixture_edits().whitespace_and_case
    rng = random.Random(7)
    docs = _base_docs()
    out = [dict(d) for d in docs]
    for i, d in enumerate(docs[:60]):
        text = d["text"] if i % 3 == 0 else whitespace_and_case(d["text"], rng)
        prefix = "a-early" if i % 2 else "z-late"  # before or after "dclm-..."
        out.append({"id": f"{prefix}-{i:03d}", "text": text})
    groups: dict[str, list[str]] = {}
    for d in out:
        key = collapse_whitespace(normalize_text(pa.array([d["text"]]))).to_pylist()[0]
        groups.setdefault(key, []).append(d["id"])
    survivor = {i: min(ids) for ids in groups.values() for i in ids}
    rng.shuffle(out)
    return out, survivor


@pytest.fixture(scope="module")
def planted(tmp_path_factory, ray_session):
    docs, survivor = _planted_corpus()
    root = tmp_path_factory.mktemp("exact")
    upstream = write_upstream(root, docs, 3)
    stage = ExactDedup(input="up", partitions=4, bloom={"expected_items": 10_000, "false_positive_rate": 1e-6})
    _run(stage, root / "run2", upstream, workers=2)
    return docs, survivor, upstream, root


def test_document_level_keeps_lowest_id_of_each_normalised_text(planted):
    docs, survivor, upstream, root = planted
    run = root / "run2"
    kept = _kept(run)
    rejected = _rejected(run)
    assert sorted(kept.column("id").to_pylist()) == sorted(set(survivor.values()))
    assert set(rejected.column("reason").to_pylist()) == {"exact_dedup:duplicate"}
    assert kept.num_rows + rejected.num_rows == len(docs)
    assert sorted(kept.column("id").to_pylist() + rejected.column("id").to_pylist()) == sorted(d["id"] for d in docs)
    # one output shard per upstream shard, same keys, with the upstream's columns
    entries = Manifest(run, "exact").load()
    assert sorted(entries) == [k for k, _ in upstream]
    assert all(e["rows_in"] == e["rows"] + e["rejected_rows"] for e in entries.values())
    assert kept.schema.names == ["id", "text", "source"]
    report = json.loads((run / "exact" / REPORT).read_text())
    assert report["keys"] == len(docs) and report["duplicates"] == rejected.num_rows
    assert 0 < report["fill_ratio"] < 0.05 and report["predicted_false_positive_rate"] < 1e-6
    assert len(report["per_partition"]) == 4 and (Path(report["bloom_dir"]) / "part-00003.bloom").exists()


def test_same_output_with_one_two_and_four_workers(planted, ray_session):
    docs, survivor, upstream, root = planted
    stage = ExactDedup(input="up", partitions=4, bloom={"expected_items": 10_000, "false_positive_rate": 1e-6})
    ref = {k: (e["sha256"], e.get("rejected_sha256")) for k, e in Manifest(root / "run2", "exact").load().items()}
    for workers in (1, 4):
        _run(stage, root / f"run{workers}", upstream, workers=workers)
        got = {k: (e["sha256"], e.get("rejected_sha256")) for k, e in Manifest(root / f"run{workers}", "exact").load().items()}
        assert got == ref


def test_rerun_redoes_nothing(planted, ray_session):
    docs, survivor, upstream, root = planted
    run = root / "run2"
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*.parquet")}
    stage = ExactDedup(input="up", partitions=4, bloom={"expected_items": 10_000, "false_positive_rate": 1e-6})
    _run(stage, run, upstream)
    assert before == {p: p.stat().st_mtime_ns for p in run.rglob("*.parquet")}


def test_incremental_dedup_against_an_earlier_dump(planted, tmp_path, ray_session):
    """A new dump deduplicated against the first run's persisted filters loses the documents
    the first dump already had; a filter built with other parameters is refused."""
    docs, survivor, upstream, root = planted
    first = root / "run2" / "exact"
    old_texts = {d["text"] for d in docs}
    base = _base_docs()
    new_docs = [{"id": f"new-{i:03d}", "text": d["text"] + "\nUpdated."} for i, d in enumerate(base[:20])]
    new_docs += [{"id": f"new-{i:03d}", "text": base[i]["text"]} for i in range(20, 30)]  # seen in dump 1
    up2 = write_upstream(tmp_path, new_docs, 2)
    stage = ExactDedup(input="up", partitions=4, bloom={"expected_items": 10_000, "false_positive_rate": 1e-6},
                       against=[str(first)])
    _run(stage, tmp_path / "run", up2)
    kept = set(_kept(tmp_path / "run").column("id").to_pylist())
    assert kept == {d["id"] for d in new_docs if d["text"] not in old_texts}
    assert len(kept) == 20
    # the new run's filters hold both dumps: OR-merged, so a third dump can use them alone
    report = json.loads((tmp_path / "run" / "exact" / REPORT).read_text())
    assert all(p["loaded_filters"] == 1 for p in report["per_partition"])
    wrong = ExactDedup(input="up", partitions=4, bloom={"expected_items": 20_000, "false_positive_rate": 1e-6},
                       against=[str(first)])
    with pytest.raises(BloomHeaderMismatch, match="m:"):
        _run(wrong, tmp_path / "wrong", up2)
    with pytest.raises(BloomHeaderMismatch, match="partitions"):
        _run(ExactDedup(input="up", partitions=8, bloom={"expected_items": 10_000}, against=[str(first)]),
             tmp_path / "wrong8", up2)
    with pytest.raises(FileNotFoundError, match="bloom folder"):
        _run(ExactDedup(input="up", partitions=4, against=[str(tmp_path)]), tmp_path / "nowhere", up2)


# ---------------------------------------------------------------------------------------------
# paragraph level


def _reference_paragraph_dedup(docs: list[dict]) -> dict[str, str | None]:
    """Plain-Python reference: walk documents by id, drop lines whose normalised text was seen
    before; None when a document lost lines and nothing but blank lines is left."""
    seen: set[str] = set()
    out: dict[str, str | None] = {}
    for d in sorted(docs, key=lambda d: d["id"]):
        lines = d["text"].split("\n")
        norm = collapse_whitespace(normalize_text(pa.array(lines))).to_pylist()
        keep = []
        removed = 0
        for line, key in zip(lines, norm):
            if key and key in seen:
                removed += 1
                continue
            if key:
                seen.add(key)
            keep.append(line)
        text = "\n".join(keep)
        out[d["id"]] = None if removed and not text.strip() else text
    return out


def test_paragraph_level_removes_lines_seen_earlier_in_id_order(tmp_path, ray_session):
    HEADERS, FOOTERS = fixture_edits().HEADERS, fixture_edits().FOOTERS
    base = _base_docs()[:40]
    rng = random.Random(11)
    docs = []
    for i, d in enumerate(base):
        text = d["text"]
        if i % 2 == 0:  # shared navigation / footer boilerplate, as crawled pages carry
            text = rng.choice(HEADERS) + "\n" + text + "\n" + rng.choice(FOOTERS)
        docs.append({"id": d["id"], "text": text})
    # a page made only of lines other pages already have, and a copy of one paragraph
    docs.append({"id": "zz-only-boilerplate", "text": HEADERS[0] + "\n\n" + FOOTERS[1]})
    docs.append({"id": "zz-quote", "text": base[3]["text"].split("\n")[0].upper() + "\nA new closing line."})
    up = write_upstream(tmp_path, docs, 3)
    stage = ExactDedup(input="up", level="paragraph", partitions=3, bloom={"expected_items": 50_000})
    _run(stage, tmp_path / "run", up)
    kept = _kept(tmp_path / "run")
    rejected = _rejected(tmp_path / "run")
    ref = _reference_paragraph_dedup(docs)
    got = dict(zip(kept.column("id").to_pylist(), kept.column("text").to_pylist()))
    assert got == {i: t for i, t in ref.items() if t is not None}
    assert rejected.column("id").to_pylist() == ["zz-only-boilerplate"]
    assert rejected.column("reason").to_pylist() == ["exact_dedup:empty_after_paragraph_dedup"]
    removed = dict(zip(kept.column("id").to_pylist(), kept.column("dup_paragraphs").to_pylist()))
    assert removed["zz-quote"] == 1 and sum(removed.values()) > 20
