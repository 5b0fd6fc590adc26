"""Bad input never crashes a run and is never lost: each problem is a counted reject row with
its file and offset, and every good document still comes through."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from curation.io.inputs import InputSpec, plan_input
from curation.io.read import read_shard
from conftest import DATA


def _read(fmt: str, path, **kw):
    spec = InputSpec(format=fmt, paths=[str(path)], source="web", **kw)
    docs, rejects = [], []
    for shard in plan_input("in", spec):
        d, r = read_shard(shard, spec).tables()
        docs += d.to_pylist()
        rejects += r.to_pylist()
    return docs, rejects


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    lines = gzip.open(DATA / "jsonl/gsm8k_train_head400.jsonl.gz").read().splitlines(keepends=True)
    # corrupt gzip: flip bytes in the middle of the compressed stream
    raw = bytearray(gzip.compress(b"".join(lines), mtime=0))
    for i in range(len(raw) // 2, len(raw) // 2 + 64):
        raw[i] ^= 0x5A
    (d / "corrupt.jsonl.gz").write_bytes(bytes(raw))
    # invalid UTF-8 on line 3 of 10
    body = b"".join(lines[:10])
    bad_lines = body.splitlines(keepends=True)
    bad_lines[2] = b'{"question": "caf\xe9 \xff\xfe broken"}\n'
    (d / "invalid_utf8.jsonl").write_bytes(b"".join(bad_lines))
    (d / "empty.jsonl").write_bytes(b"")
    # one 50 MB document between two good ones
    big = json.dumps({"question": "word " * (10 * 1024 * 1024)}).encode() + b"\n"
    (d / "huge.jsonl").write_bytes(lines[0] + big + lines[1])
    shutil.copy(DATA / "bad/resiliparse_clipped.warc.gz", d / "clipped.warc.gz")
    warc = bytearray((DATA / "warc/resiliparse_warcfile.warc.gz").read_bytes())
    for i in range(60000, 60400):
        warc[i] ^= 0x5A
    (d / "corrupt.warc.gz").write_bytes(bytes(warc))
    return d


def test_corrupt_gzip_keeps_lines_before_the_damage(bad_dir):
    docs, rejects = _read("jsonl", bad_dir / "corrupt.jsonl.gz", text_field="question")
    assert 0 < len(docs) < 400
    # Garbled lines decoded before the CRC check fails are rejected one by one; then the stream.
    r = rejects[-1]
    assert {x["reason"] for x in rejects[:-1]} <= {"read:invalid_json", "read:invalid_utf8", "read:missing_text"}
    assert r["reason"] == "read:corrupt_stream" and r["file"].endswith("corrupt.jsonl.gz")
    assert r["offset"] > 0 and "after line" in r["detail"]
    good = [json.loads(x)["question"] for x in gzip.open(DATA / "jsonl/gsm8k_train_head400.jsonl.gz").read().splitlines()]
    assert [d["text"] for d in docs] == good[: len(docs)]


def test_invalid_utf8_line_is_rejected_alone(bad_dir):
    docs, rejects = _read("jsonl", bad_dir / "invalid_utf8.jsonl", text_field="question")
    assert len(docs) == 9
    (r,) = rejects
    offset = sum(len(x) for x in (bad_dir / "invalid_utf8.jsonl").read_bytes().splitlines(keepends=True)[:2])
    assert r["reason"] == "read:invalid_utf8" and r["id"].endswith(f"#{offset}")  # ids are byte offsets
    assert r["offset"] == offset
    assert "\ufffd" in r["text"]  # what could be decoded is kept for inspection


def test_empty_file_is_zero_documents_not_a_rejected_one(bad_dir):
    """An empty file is 0 documents: noted (``ReadResult.empty``, and on the input's manifest
    line as ``empty_file``), never a rejected row that stats would count as a document in."""
    spec = InputSpec(format="jsonl", paths=[str(bad_dir / "empty.jsonl")], source="web")
    (shard,) = plan_input("in", spec)
    res = read_shard(shard, spec)
    docs, rejects = res.tables()
    assert docs.num_rows == 0 and rejects.num_rows == 0 and res.empty == "no JSON line in file"


def test_huge_document_rejected_with_preview_and_neighbours_kept(bad_dir):
    docs, rejects = _read("jsonl", bad_dir / "huge.jsonl", text_field="question")
    assert len(docs) == 2
    (r,) = rejects
    first = gzip.open(DATA / "jsonl/gsm8k_train_head400.jsonl.gz").readline()
    assert r["reason"] == "read:doc_too_large" and r["id"].endswith(f"#{len(first)}")  # the line's offset
    assert "bytes > max_doc_bytes" in r["detail"] and len(r["text"]) <= 2000


def test_truncated_warc_yields_partial_record_and_reports_it(bad_dir):
    docs, rejects = _read("warc", bad_dir / "clipped.warc.gz")
    assert len(docs) == 1 and len(docs[0]["html"]) > 50_000
    assert json.loads(docs[0]["meta"])["truncated"] is True
    assert [r["reason"] for r in rejects] == ["read:truncated_record"]


def test_corrupt_warc_keeps_records_before_and_after_damage(bad_dir):
    """400 bytes flipped at the end of a response's gzip member (and in the header of the next
    member): what decompresses of that record is kept, marked truncated and reported, with a
    corrupt stream at its member's offset; the walk goes on at the next record's member, so
    every other record still comes through whole, in file order."""
    docs, rejects = _read("warc", bad_dir / "corrupt.warc.gz")
    good, _ = _read("warc", DATA / "warc/resiliparse_warcfile.warc.gz")
    offset = lambda d: int(d["id"].rsplit("#", 1)[1])  # noqa: E731
    assert [d["url"] for d in docs] == [d["url"] for d in good]
    damaged = [(d, g) for d, g in zip(docs, good) if d["html"] != g["html"]]
    assert len(damaged) == 1
    d, g = damaged[0]
    assert offset(d) < 60_000 < offset(d) + 20_000 and json.loads(d["meta"])["truncated"] is True
    assert len(d["html"]) < len(g["html"])
    assert [(r["reason"], r["offset"]) for r in rejects] == [("read:truncated_record", offset(d)),
                                                             ("read:corrupt_stream", offset(d))]
    assert "skipped to the next record" in rejects[-1]["detail"]


def test_warc_skips_non_documents_and_ids_are_stable():
    docs, rejects = _read("warc", DATA / "warc/dolma_sample-0000.warc.gz")
    docs2, _ = _read("warc", DATA / "warc/dolma_sample-0000.warc.gz")
    assert len(docs) + len(rejects) == 22  # 22 response records; request/resource/metadata skipped
    assert [d["id"] for d in docs] == [d["id"] for d in docs2]
    assert all(d["url"].startswith("http") for d in docs)


def test_split_large_file_deals_every_record_to_exactly_one_shard(tmp_path):
    gz = DATA / "jsonl/gsm8k_train_head400.jsonl.gz"
    # a compressed file cannot be entered in the middle: one task, whatever split_bytes says
    assert len(plan_input("in", InputSpec(format="jsonl", paths=[str(gz)], source="m", split_bytes=20_000))) == 1
    path = tmp_path / "gsm8k.jsonl"
    path.write_bytes(gzip.decompress(gz.read_bytes()))
    whole, _ = _read("jsonl", path, text_field="question")
    split, _ = _read("jsonl", path, text_field="question", split_bytes=20_000)
    shards = plan_input("in", InputSpec(format="jsonl", paths=[str(path)], source="m", split_bytes=20_000))
    assert len(shards) == -(-path.stat().st_size // 20_000) and shards[-1].end == path.stat().st_size
    assert [d["id"] for d in split] == [d["id"] for d in whole] and len({d["id"] for d in split}) == 400
    assert [d["text"] for d in split] == [d["text"] for d in whole]


def test_wet_reader_reads_conversion_records():
    docs, rejects = _read("wet", DATA / "wet/whirlwind.warc.wet.gz")
    assert len(docs) == 1 and not rejects
    assert "Escopete" in docs[0]["text"] and json.loads(docs[0]["meta"])["cc_lang"] == "spa"


def test_parquet_reader_by_row_group(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pa.table({"text": [f"doc {i}" for i in range(100)], "url": [f"u{i}" for i in range(100)]})
    pq.write_table(t, tmp_path / "a.parquet", row_group_size=10)
    size = (tmp_path / "a.parquet").stat().st_size
    docs, rejects = _read("parquet", tmp_path / "a.parquet", split_bytes=max(1, size // 3))
    assert sorted(d["text"] for d in docs) == sorted(t.column("text").to_pylist()) and not rejects


def test_an_empty_file_in_a_run_is_noted_on_its_manifest_line(tmp_path, ray_session):
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag
    from curation.pipeline.rundir import RunDir
    from curation.pipeline.stats import stage_table

    (tmp_path / "empty.jsonl").write_bytes(b"")
    dag = parse_dag({"name": "empty", "inputs": {"math": {
        "format": "jsonl", "source": "math", "text_field": "question",
        "paths": [str(DATA / "jsonl/gsm8k_train_head400.jsonl.gz"), str(tmp_path / "empty.jsonl")]}},
        "stages": {"g": {"type": "gopher_quality", "min_doc_words": 1}, "all": {"type": "union", "inputs": ["g"]}}},
        "empty.yaml")
    run_dag(dag, tmp_path / "run", workers=2, quiet=True)
    entries = RunDir(tmp_path / "run").entries("math")
    (empty,) = [e for e in entries.values() if e.get("empty_file")]
    assert empty["empty_file"] == "no JSON line in file" and empty["rows_in"] == 0 and empty["rejected_rows"] == 0
    row = next(r for r in stage_table(str(tmp_path / "run")) if r["stage"] == "math")
    assert row["docs_in"] == 400 and row["rejected"] == 0  # no phantom document
    # ... and not lost silently: `refinery stats` names it
    from typer.testing import CliRunner

    from curation.cli import app

    out = CliRunner().invoke(app, ["stats", str(tmp_path / "run")])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("empty input files"))
    assert line.startswith("empty input files (1, 0 documents): math/") and line.endswith(
        "/empty.jsonl (no JSON line in file)"), line
