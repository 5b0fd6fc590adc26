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
from curation.pipeline.rundir import RunDir
from curation.dedup.minhash import collapse_whitespace, normalize_text
from curation.stages.exact_dedup import REPORT, ExactDedup

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
    entries = RunDir(run).entries("exact")
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
    ref = {k: (e["sha256"], e.get("rejected_sha256")) for k, e in RunDir(root / "run2").entries("exact").items()}
    for workers in (1, 4):
        _run(stage, root / f"run{workers}", upstream, workers=workers)
        got = {k: (e["sha256"], e.get("rejected_sha256")) for k, e in RunDir(root / f"run{workers}").entries("exact").items()}
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
    the first dump already had; a filter whose keys mean something else is refused."""
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
    # each run's filters record the keys it saw; a later run queries every filter it names
    report = json.loads((tmp_path / "run" / "exact" / REPORT).read_text())
    assert all(p["loaded_filters"] == 1 for p in report["per_partition"])
    assert report["against_duplicates"] == 10 and report["in_run_duplicates"] == 0
    # filters are sized from actual key counts, so another size is not "other parameters":
    # a run configured with another capacity queries the same filters and drops the same documents
    other_size = ExactDedup(input="up", partitions=4, bloom={"expected_items": 20_000, "false_positive_rate": 1e-6},
                            against=[str(first)])
    _run(other_size, tmp_path / "other_size", up2)
    assert set(_kept(tmp_path / "other_size").column("id").to_pylist()) == kept
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


# ---------------------------------------------------------------------------------------------
# no unique document is ever dropped, whatever the filter sizing (issue: silent data loss)


def _keys_file(path: Path, hashes: np.ndarray, hashes2: np.ndarray, header: dict) -> str:
    from curation.io.artifacts import write_partitioned

    n = len(hashes)
    write_partitioned(pa.table({"id": pa.array([f"d{i:08d}" for i in range(n)]),
                                "shard": pa.array(np.zeros(n, np.int32)), "row": pa.array(np.arange(n, dtype=np.int32)),
                                "para": pa.array(np.full(n, -1, np.int32)), "hash": pa.array(hashes),
                                "hash2": pa.array(hashes2)}), np.zeros(n, np.int32), path, header)
    return str(path)


def test_more_distinct_keys_than_expected_items_drops_no_unique_document(tmp_path):
    """Three chunks' worth (> 2 x 2^20) of distinct keys through one partition whose filter was
    configured for 1,000 keys: the old query-then-insert Bloom path flagged 36-91% of later
    chunks as seen; the exact decision flags none, and the saved filter is sized for them."""
    from curation.stages.exact_dedup import PartitionJob, partition_task

    n = 3 * (1 << 20) + 12_345
    rng = np.random.default_rng(7)
    h = np.unique(rng.integers(0, np.iinfo(np.uint64).max, size=n + 1000, dtype=np.uint64, endpoint=True))[:n]
    rng.shuffle(h)
    h2 = rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)
    stage = ExactDedup(input="up", partitions=1, bloom={"expected_items": 1000, "false_positive_rate": 1e-3})
    header = stage.header()
    kf = _keys_file(tmp_path / "keys.parquet", h, h2, header)
    stats = partition_task(PartitionJob(0, (kf,), str(tmp_path / "dups.parquet"), str(tmp_path / "b.bloom"), (),
                                        stage.partition_capacity(), 1e-3, 0, stage.bloom_params(), header))
    assert stats["keys"] == n and stats["duplicates"] == 0 and stats["distinct_keys"] == n
    assert pq.read_table(tmp_path / "dups.parquet").num_rows == 0
    assert stats["capacity"] == n and stats["fill_ratio"] < 0.55  # sized for what it holds
    # real duplicates among them are still found: the same 128-bit key twice, lowest id kept
    kf2 = _keys_file(tmp_path / "keys2.parquet", np.r_[h[:5], h[:5]], np.r_[h2[:5], h2[:5]], header)
    stats2 = partition_task(PartitionJob(0, (kf2,), str(tmp_path / "dups2.parquet"), str(tmp_path / "b2.bloom"), (),
                                         stage.partition_capacity(), 1e-3, 0, stage.bloom_params(), header))
    assert stats2["duplicates"] == 5 and sorted(pq.read_table(tmp_path / "dups2.parquet").column("row").to_pylist()) == [5, 6, 7, 8, 9]
    # equal first hash, different confirming hash: not a duplicate
    kf3 = _keys_file(tmp_path / "keys3.parquet", np.r_[h[:3], h[:3]], np.r_[h2[:3], h2[3:6]], header)
    stats3 = partition_task(PartitionJob(0, (kf3,), str(tmp_path / "dups3.parquet"), str(tmp_path / "b3.bloom"), (),
                                         stage.partition_capacity(), 1e-3, 0, stage.bloom_params(), header))
    assert stats3["duplicates"] == 0


def test_unique_documents_all_kept_with_a_tiny_expected_items(tmp_path, ray_session):
    """End to end through the stage: every document distinct, filters configured for 10 keys."""
    docs = [{"id": f"u{i:05d}", "text": f"document number {i} " + "word " * (i % 7)} for i in range(3000)]
    up = write_upstream(tmp_path, docs, 3)
    _run(ExactDedup(input="up", partitions=2, bloom={"expected_items": 10, "false_positive_rate": 1e-3}),
         tmp_path / "run", up)
    assert _kept(tmp_path / "run").num_rows == 3000 and _rejected(tmp_path / "run") is None
    report = json.loads((tmp_path / "run" / "exact" / REPORT).read_text())
    assert report["duplicates"] == 0 and all(p["capacity"] >= p["distinct_keys"] for p in report["per_partition"])


def test_an_overfilled_against_filter_is_refused_with_a_clear_message(planted, tmp_path, ray_session):
    """An earlier run's filter holding far more keys than it was sized for (as the old sizing
    wrote them) would answer "seen" for unique documents: the stage refuses it, naming it."""
    from curation.pipeline.tasks import TasksFailed

    docs, survivor, upstream, root = planted
    stage = ExactDedup(input="up", partitions=4, bloom={"expected_items": 10_000, "false_positive_rate": 1e-6})
    bloom_dir = tmp_path / "old" / "bloom"
    rng = np.random.default_rng(3)
    for p in range(4):
        bf = BloomFilter.for_capacity(100, 1e-6, stage.seed, stage.bloom_params())
        bf.add(rng.integers(0, np.iinfo(np.uint64).max, size=20_000, dtype=np.uint64, endpoint=True))
        bf.save(bloom_dir / f"part-{p:05d}.bloom")
    up2 = write_upstream(tmp_path, [{"id": f"n{i}", "text": f"brand new page {i}"} for i in range(50)], 2)
    over = ExactDedup(input="up", partitions=4, bloom={"expected_items": 10_000, "false_positive_rate": 1e-6},
                      against=[str(bloom_dir)])
    with pytest.raises(TasksFailed, match=r"part-0000\d\.bloom is overfilled: .*% of its bits are set"):
        _run(over, tmp_path / "run", up2)
    assert not list((tmp_path / "run" / "exact").glob("*.parquet"))  # nothing written, nothing dropped
