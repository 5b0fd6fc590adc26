"""Where every document came from (``origin_file``/``origin_offset``/``origin_length``, written by
the readers) and the ``reextract`` stage that re-reads only the kept documents' WARC records by
byte range and extracts them again (curation/io/records.py, curation/stages/reextract.py), on
the real WARCs of tests/data/warc, local and on the S3 test server."""

from __future__ import annotations

import gzip
import json
import os
import zlib
from pathlib import Path
from typing import ClassVar

import fsspec
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from fsspec.implementations.local import LocalFileSystem

from conftest import DATA, REPO
from curation.formats.documents import ORIGIN_COLUMNS
from curation.io.inputs import InputSpec, plan_input
from curation.io.read import iter_read, read_shard
from curation.io.records import Wanted, plan_reads, read_records
from curation.stages.extract import Extract
from curation.stages.reextract import Reextract
from curation.extract.engines import decode_html, extract_page
from test_s3 import BUCKET, s3  # noqa: F401 (the S3 server fixture)

WARCS = sorted((DATA / "warc").glob("*.warc.gz"))


class CountingFS(LocalFileSystem):
    """Local files under ``counting://``, every ``cat_file`` range written down."""

    protocol = ("counting",)
    reads: ClassVar[list[tuple[str, int, int, int]]] = []

    @classmethod
    def _strip_protocol(cls, path):
        return super()._strip_protocol(str(path).removeprefix("counting://"))

    def cat_file(self, path, start=None, end=None, **kwargs):
        data = super().cat_file(path, start, end, **kwargs)
        CountingFS.reads.append((self._strip_protocol(path), start, end, len(data)))
        return data


fsspec.register_implementation("counting", CountingFS, clobber=True)


def _read(paths: list[str], fmt: str = "warc", **spec_kw) -> pa.Table:
    spec = InputSpec(format=fmt, paths=paths, source="web", **spec_kw)
    return pa.concat_tables([read_shard(sh, spec).tables()[0] for sh in plan_input("crawl", spec)])


@pytest.fixture(scope="module")
def crawl() -> tuple[pa.Table, pa.Table]:
    """The WARCs' documents with their HTML, and the first pass (resiliparse text) kept rows."""
    html = _read([str(p) for p in WARCS])
    first = Extract().process(html)
    return html, first.table.filter(pc.is_null(first.reasons))


def _expected(html_rows: pa.Table, ids: list[str], **how) -> list[str]:
    by_id = {r["id"]: r for r in html_rows.select(["id", "html", "charset"]).to_pylist()}
    return [extract_page(decode_html(by_id[i]["html"], by_id[i]["charset"]), **how).strip() for i in ids]


def _with(table: pa.Table, **cols) -> pa.Table:
    for name, values in cols.items():
        i = table.schema.get_field_index(name)
        table = table.set_column(i, table.schema.field(name), pa.array(values, table.schema.field(name).type))
    return table


# ---------------------------------------------------------------------------------------------
# provenance columns


def test_origin_of_a_warc_record_is_its_gzip_member(crawl):
    html, _ = crawl
    assert html.num_rows == 54 and html.column("origin_length").null_count == 0
    assert html.schema.field("origin_file").type == pa.dictionary(pa.int32(), pa.string())
    rows = html.to_pylist()
    data = {str(p): p.read_bytes() for p in WARCS}
    for r in rows:
        f, off, n = r["origin_file"], r["origin_offset"], r["origin_length"]
        assert f in data and os.path.isabs(f) and r["id"].endswith(f"#{off}")
        d = zlib.decompressobj(31)
        block = d.decompress(data[f][off:off + n])
        # exactly one gzip member, holding this response record, and the next member starts after it
        assert d.eof and not d.unused_data and block.startswith(b"WARC/1.")
        assert json.loads(r["meta"])["warc_record_id"].encode() in block[:2000]
        assert off + n == len(data[f]) or data[f][off + n:off + n + 2] == b"\x1f\x8b"
    # the record at (file, offset, length) is the HTML the first pass extracted, byte for byte
    pages, stats = read_records([Wanted(r["origin_file"], r["origin_offset"], r["origin_length"],
                                        json.loads(r["meta"])["warc_record_id"]) for r in rows], max_gap=0)
    assert [(p.html, p.charset, p.reason) for p in pages] == [(r["html"], r["charset"], None) for r in rows]
    assert stats.bytes_read == sum(r["origin_length"] for r in rows) and stats.reads == len(rows)


def test_origin_the_same_whatever_the_parts_and_batches(crawl):
    # a member's length is known once it was read to its end: it must reach its document when
    # the file is cut into parts and every record is a batch of its own
    html, _ = crawl
    want = html.select(["id", *ORIGIN_COLUMNS]).to_pylist()
    spec = InputSpec(format="warc", paths=[str(p) for p in WARCS], source="web", split_bytes=40_000)
    shards = plan_input("crawl", spec)
    assert len(shards) > len(WARCS)
    got = [r for sh in shards for b in iter_read(sh, spec, batch_rows=1)
           for r in b.tables()[0].select(["id", *ORIGIN_COLUMNS]).to_pylist()]
    assert sorted(got, key=lambda r: r["id"]) == sorted(want, key=lambda r: r["id"])


def test_origin_of_json_lines_and_parquet_rows(tmp_path):
    src = DATA / "jsonl" / "gsm8k_train_head400.jsonl"
    docs = _read([str(src)], "jsonl", text_field="question", split_bytes=20_000).to_pylist()
    raw = src.read_bytes()
    assert len(docs) == 400 and {d["origin_file"] for d in docs} == {str(src)}
    for d in docs:
        line = raw[d["origin_offset"]:d["origin_offset"] + d["origin_length"]]
        assert line.endswith(b"\n") and json.loads(line)["question"] == d["text"]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"text": [d["text"] for d in docs[:50]]}), path, row_group_size=7)
    rows = _read([str(path)], "parquet").to_pylist()
    file_rows = pq.read_table(path).column("text").to_pylist()
    assert [file_rows[r["origin_offset"]] for r in rows] == [r["text"] for r in rows] and len(rows) == 50
    assert {r["origin_length"] for r in rows} == {None}


# ---------------------------------------------------------------------------------------------
# reextract


def test_reextract_reads_only_the_survivors_ranges(crawl):
    html, kept = crawl
    sub = kept.take(list(range(3, kept.num_rows, 10)))  # ~10% of the kept documents, every file
    assert 4 <= sub.num_rows and len(set(sub.column("origin_file").to_pylist())) >= 3
    counted = _with(sub, origin_file=["counting://" + f for f in sub.column("origin_file").to_pylist()])
    CountingFS.reads.clear()
    res = Reextract(engine="trafilatura", format="markdown", max_gap=0).process(counted)
    assert res.reasons.to_pylist() == [None] * sub.num_rows
    ids = sub.column("id").to_pylist()
    assert res.table.column("text").to_pylist() == _expected(html, ids, engines=["trafilatura"], format="markdown")
    assert res.table.column("text").to_pylist() != sub.column("text").to_pylist()
    assert res.table.schema.field("text").metadata == {b"refinery.markup": b"markdown"}
    assert res.table.drop_columns(["text"]).equals(counted.drop_columns(["text"]))  # every other column kept
    # the reads are the survivors' members, nothing else: bytes read = their compressed lengths
    want = sorted((f, o, o + n) for f, o, n in zip(sub.column("origin_file").to_pylist(),
                                                  sub.column("origin_offset").to_pylist(),
                                                  sub.column("origin_length").to_pylist()))
    assert sorted((f, s, e) for f, s, e, _ in CountingFS.reads) == want
    assert sum(n for *_, n in CountingFS.reads) == sum(e - s for _, s, e in want)
    assert sum(n for *_, n in CountingFS.reads) < 0.25 * sum(p.stat().st_size for p in WARCS)
    # near ranges are joined: with a gap allowance every file's ranges become fewer reads
    CountingFS.reads.clear()
    again = Reextract(engine="trafilatura", format="markdown", max_gap=1 << 20).process(counted)
    assert again.table.column("text").equals(res.table.column("text"))
    assert len(CountingFS.reads) == len({f for f, *_ in want}) < len(want)


def test_plan_reads_joins_near_ranges():
    spans = [(500, 600), (0, 100), (150, 200), (10_000, 10_100), (590, 700)]
    assert plan_reads(spans, max_gap=60) == [(0, 200, [1, 2]), (500, 700, [0, 4]), (10_000, 10_100, [3])]
    assert plan_reads(spans, max_gap=0) == [(0, 100, [1]), (150, 200, [2]), (500, 700, [0, 4]), (10_000, 10_100, [3])]


def test_bad_and_missing_records_are_counted_rejections(crawl, tmp_path):
    html, kept = crawl
    src = WARCS[0]
    copy = tmp_path / src.name
    data = bytearray(src.read_bytes())
    rows = kept.filter(pc.equal(kept.column("origin_file").cast(pa.string()), str(src))).slice(0, 8)
    offs, lens = rows.column("origin_offset").to_pylist(), rows.column("origin_length").to_pylist()
    mid = offs[5] + lens[5] // 2
    data[mid:mid + 64] = bytes(64)  # zeros in the middle of the sixth record's deflate stream
    copy.write_bytes(bytes(data))
    d = zlib.decompressobj(31)
    d.decompress(bytes(data))
    warcinfo = len(data) - len(d.unused_data)  # the first member: the warcinfo record
    files = [str(copy)] * 8
    files[3], files[4] = str(tmp_path / "gone.warc.gz"), None
    offs2 = [offs[0] + 1, offs[2], len(data) - 10, offs[3], offs[4], offs[5], 0, offs[7]]
    lens2 = [lens[0], lens[2], 1000, lens[3], lens[4], lens[5], warcinfo, lens[7]]
    metas = rows.column("meta").to_pylist()
    metas[6] = None  # no record id to check: what is at offset 0 is taken
    bad = _with(rows, origin_file=files, origin_offset=offs2, origin_length=lens2, meta=metas)
    res = Reextract(engine="trafilatura").process(bad)
    assert res.reasons.to_pylist() == [
        "reextract:corrupt_record",  # one byte late: no gzip member, no WARC record
        "reextract:record_mismatch",  # another document's record at the offset
        "reextract:missing_record",  # the range runs past the end of the file
        "reextract:missing_file",
        "reextract:no_origin",
        "reextract:corrupt_record",  # the member does not inflate
        "reextract:not_response",  # the warcinfo record
        None,
    ]
    texts = res.table.column("text").to_pylist()
    assert texts[:7] == rows.column("text").to_pylist()[:7]  # rejected rows keep their first text
    assert texts[7] == _expected(html, [rows.column("id")[7].as_py()], engines=["trafilatura"])[0]
    with pytest.raises(ValueError, match="origin_file, origin_offset, origin_length"):
        Reextract().process(rows.drop_columns(list(ORIGIN_COLUMNS)))


def test_records_without_a_length_are_found_by_reading_forward(crawl, tmp_path):
    # an uncompressed WARC and a WARC that is one gzip stream: no record owns a member, so the
    # reader gives no length and reextract looks for the WARC-Record-ID from the offset on
    html, kept = crawl
    src = WARCS[0]
    raw = gzip.decompress(src.read_bytes())
    plain, single = tmp_path / "plain.warc", tmp_path / "single.warc.gz"
    plain.write_bytes(raw)
    single.write_bytes(gzip.compress(raw))
    by_rid = {json.loads(m)["warc_record_id"]: i for i, m in zip(kept.column("id").to_pylist(),
                                                                  kept.column("meta").to_pylist())}
    for path in (plain, single):
        docs = Extract().process(_read([str(path)]))
        docs = docs.table.filter(pc.is_null(docs.reasons))
        assert docs.column("origin_length").null_count == docs.num_rows > 5
        sub = docs.take([1, 3, 4])
        ids = [by_rid[json.loads(m)["warc_record_id"]] for m in sub.column("meta").to_pylist()]  # the .gz's ids
        res = Reextract(engine="trafilatura").process(sub)
        assert res.reasons.to_pylist() == [None] * 3
        assert res.table.column("text").to_pylist() == _expected(html, ids, engines=["trafilatura"])
    # one gzip stream: every record is at offset 0, found in one forward pass that stops when the
    # last one wanted came by
    metas = _read([str(single)]).column("meta").to_pylist()
    wanted = [Wanted(str(single), 0, None, json.loads(m)["warc_record_id"]) for m in metas[:3]]
    pages, stats = read_records(wanted)
    assert [p.reason for p in pages] == [None] * 3 and stats.reads == 1
    assert stats.bytes_read < 0.7 * single.stat().st_size
    missing = read_records([Wanted(str(single), 0, None, "<urn:uuid:not-there>")])[0]
    assert missing[0].reason == "missing_record"


def test_reextract_on_s3(s3, crawl):  # noqa: F811 (the fixture)
    html, _ = crawl
    url = f"s3://{BUCKET}/data/warc/{WARCS[1].name}"
    first = Extract().process(_read([url]))
    kept = first.table.filter(pc.is_null(first.reasons))
    assert set(kept.column("origin_file").to_pylist()) == {url}
    local = {r["id"]: (r["origin_offset"], r["origin_length"]) for r in html.to_pylist()}
    assert [(r["origin_offset"], r["origin_length"]) for r in kept.to_pylist()] == [local[i] for i in
                                                                                   kept.column("id").to_pylist()]
    sub = kept.take([0, 2, 5])
    bad = _with(kept.take([1, 3]), origin_file=[f"s3://{BUCKET}/data/warc/gone.warc.gz", url],
                origin_offset=[kept.column("origin_offset")[1].as_py(), kept.column("origin_offset")[3].as_py() + 3])
    res = Reextract(engine="trafilatura", format="markdown").process(pa.concat_tables([sub, bad]))
    assert res.reasons.to_pylist() == [None] * 3 + ["reextract:missing_file", "reextract:corrupt_record"]
    assert res.table.column("text").to_pylist()[:3] == _expected(html, sub.column("id").to_pylist(),
                                                                 engines=["trafilatura"], format="markdown")


def test_pipeline_example_and_its_second_pass_over_a_run(ray_session, tmp_path, in_repo, crawl):
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag
    from curation.pipeline.rundir import RunDir

    html, _ = crawl
    first = parse_dag(yaml.safe_load((REPO / "pipelines/reextract.yaml").read_text()), "reextract.yaml", str(REPO))
    run_dag(first, tmp_path / "first", workers=2, quiet=True)
    spec = yaml.safe_load((REPO / "pipelines/reextract-run.yaml").read_text())
    spec["inputs"]["kept"]["run"] = str(tmp_path / "first")
    run_dag(parse_dag(spec, "reextract-run.yaml", str(REPO)), tmp_path / "second", workers=2, quiet=True)

    con = RunDir(tmp_path / "first").connect(["fineweb", "top", "again"])
    n_filtered = con.execute("select count(*) from fineweb").fetchone()[0]
    top = con.execute("select id from top order by id").fetchall()
    again = con.execute("select id, text from again order by id").fetchall()
    assert 0 < len(top) < 0.3 * n_filtered and [i for i, _ in again] == [i for (i,) in top]
    assert [t for _, t in again] == _expected(html, [i for i, _ in again], engines=["trafilatura"], format="markdown")
    second = RunDir(tmp_path / "second").connect(["again"])
    route = second.execute("select id, text from again order by id").fetchall()
    assert [i for i, _ in route] == [i for (i,) in top]
    assert [t for _, t in route] == _expected(html, [i for i, _ in route], engines=["resiliparse", "trafilatura"],
                                              policy="route", format="markdown")
