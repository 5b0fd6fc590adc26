"""Reading a crawl through its columnar index (issue 63): ``format: cc_index`` selects records by
SQL over an index in Common Crawl's schema (``curation/io/cc_select.py``, the where checked
against the index's columns and pushed into the scan) and reads only their byte ranges
(``curation/io/cc_index.py``); ``refinery index cc`` builds such an index from WARCs
(``curation/io/warc_index.py``); ``refinery plan`` prints what a DAG will read and cost. On the
real WARCs of tests/data/warc and the index built from them, tests/data/cc_index (the S3 half:
tests/test_cc_index_s3.py)."""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import yaml
from fastwarc.warc import ArchiveIterator, WarcRecordType

from conftest import DATA, REPO
from curation.io.cc_select import DOC_COLUMNS, scan
from curation.io.inputs import InputError, InputSpec, plan_index, plan_input
from curation.io.read import read_shard
from curation.io.sql_where import implied_ranges

WARCS = sorted((DATA / "warc").glob("*.warc.gz"))
INDEX = DATA / "cc_index"
NARROW = "content_languages LIKE 'zho%' OR url_host_registered_domain = 'github.io'"


def index_spec(paths: list[str] | None = None, where: str | None = NARROW, root: str = str(DATA / "warc"),
               **kw) -> InputSpec:
    return InputSpec(format="cc_index", paths=paths or [str(INDEX / "*.parquet")], where=where, warc_root=root,
                     source="web", **kw)


def read_all(spec: InputSpec, name: str = "crawl") -> tuple[pa.Table, pa.Table, int, list]:
    """(documents, rejections, bytes read, shards) of an input read shard by shard."""
    shards = plan_input(name, spec)
    docs, rejects, read = [], [], 0
    for sh in shards:
        res = read_shard(sh, spec)
        d, r = res.tables()
        docs.append(d)
        rejects.append(r)
        read += res.bytes_read
    return pa.concat_tables(docs), pa.concat_tables(rejects), read, shards


@pytest.fixture(scope="module")
def full() -> pa.Table:
    """Every document of a full scan of the WARCs (the reference)."""
    spec = InputSpec(format="warc", paths=[str(p) for p in WARCS], source="web")
    return pa.concat_tables([read_shard(sh, spec).tables()[0] for sh in plan_input("crawl", spec)])


def same_as_full_scan(docs: pa.Table, full: pa.Table) -> None:
    """``docs`` (an index input's) are the full scan's documents of the same records, column for
    column, plus the index's columns."""
    assert docs.num_rows > 0
    ids = docs.column("id").to_pylist()
    assert len(set(ids)) == len(ids)
    ref = full.filter(pc.is_in(full.column("id"), pa.array(ids))).sort_by("id")
    got = docs.drop_columns(list(DOC_COLUMNS)).sort_by("id")
    assert ref.num_rows == got.num_rows
    assert got.schema == ref.schema
    for c in ref.column_names:
        assert got.column(c).to_pylist() == ref.column(c).to_pylist(), c


# ---------------------------------------------------------------------------------------------
# the index


def test_the_committed_index_is_the_builders_and_points_at_every_record(tmp_path, full):
    from curation.io.warc_index import build_index

    rep = build_index([str(p) for p in WARCS], str(tmp_path / "idx"), root=str(DATA / "warc"))
    fresh = ds.dataset(str(tmp_path / "idx"), format="parquet").to_table()
    committed = ds.dataset(str(INDEX), format="parquet").to_table()
    key = [("warc_filename", "ascending"), ("warc_record_offset", "ascending")]
    assert fresh.sort_by(key).equals(committed.sort_by(key))
    # one row per response record, at its gzip member, as the WARC reader records it
    assert rep["rows"] == committed.num_rows == full.num_rows == 54
    assert rep["skipped"] == {"warcinfo": 4, "request": 55, "metadata": 19, "resource": 4}
    rows = {(r["warc_filename"], r["warc_record_offset"]): r for r in committed.to_pylist()}
    for d in full.to_pylist():
        rel = d["id"].split("/", 1)[1].split("#")[0]
        r = rows[(rel, d["origin_offset"])]
        assert (r["warc_record_length"], r["url"]) == (d["origin_length"], d["url"])
    by_file = {}
    for r in committed.to_pylist():
        by_file.setdefault(r["warc_filename"], []).append((r["content_languages"] or "").split(",")[0])
    assert set(by_file["dolma_sample-0001.warc.gz"]) == {"eng"}
    assert by_file["resiliparse_warcfile.warc.gz"].count("zho") >= 5  # the Chinese spam pages
    github = [r for r in committed.to_pylist() if r["url_host_registered_domain"] == "github.io"]
    assert len(github) == 10 and all(r["url_host_private_domain"].endswith(".github.io") for r in github)
    # row groups cover host ranges: rows sorted by the SURT-like key
    t = pq.read_table(INDEX / "dolma_sample-0000.parquet")
    assert t.column("url_surtkey").to_pylist() == sorted(t.column("url_surtkey").to_pylist())
    # a rerun indexes nothing again
    again = build_index([str(p) for p in WARCS], str(tmp_path / "idx"), root=str(DATA / "warc"))
    assert all(f["done_before"] for f in again["files"]) and again["rows"] == 54


def test_where_is_checked_against_the_index_columns_before_the_run():
    from curation.pipeline.dag import DagError, parse_dag

    with pytest.raises(InputError, match=r"inputs\.crawl\.where: where: 'content_language' is not a column of the "
                                         r"index .*; it has: url_surtkey, url, .*content_languages"):
        plan_index("crawl", index_spec(where="content_language LIKE 'zho%'"))
    with pytest.raises(InputError, match=r"inputs\.crawl\.where: .*Conversion Error"):
        plan_index("crawl", index_spec(where="fetch_status = 'two hundred'"))

    def dag(**inp) -> dict:
        spec = {"format": "cc_index", "paths": [str(INDEX / "*.parquet")], "warc_root": "x", "source": "web", **inp}
        return {"name": "t", "inputs": {"crawl": spec}, "stages": {"extract": {"type": "extract"}}}

    # the select sandbox: columns only, refused when the DAG is validated
    for hostile in ["(SELECT count(*) FROM read_text('/etc/hostname')) > 0", "true) AS k FROM rows, read_text('x') --"]:
        with pytest.raises(DagError, match=r"inputs\.crawl: Value error, where: "):
            parse_dag(dag(where=hostile))
    with pytest.raises(DagError, match="give warc_root"):
        parse_dag(dag(warc_root=None))
    with pytest.raises(DagError, match="where and warc_root belong to format: cc_index"):
        parse_dag({"name": "t", "inputs": {"c": {"format": "warc", "paths": ["x"], "source": "web", "where": "true"}}})
    # a select below sees the index's columns; the other inputs' hashes do not change
    d = parse_dag({**dag(where="true"), "stages": {"extract": {"type": "extract"},
                                                   "zh": {"type": "select", "where": "content_languages = 'zho'"}}})
    assert {"content_languages", "content_mime_detected", "html"} <= d.columns("crawl")
    plain = InputSpec(format="warc", paths=["x"], source="web").model_dump(mode="json")
    assert not {"where", "warc_root", "max_gap"} & set(plain)


def test_implied_ranges_of_prefix_matches():
    assert implied_ranges("content_languages LIKE 'swe%' AND fetch_status = 200") == [
        "(\"content_languages\" >= 'swe' AND \"content_languages\" < 'swf')"]
    assert implied_ranges("starts_with(url, 'https://a') OR url LIKE 'http://b_%'") == [
        "((\"url\" >= 'https://a' AND \"url\" < 'https://b') OR (\"url\" >= 'http://b' AND \"url\" < 'http://c'))"]
    for none in ["content_languages NOT LIKE 'swe%'", "content_languages ILIKE 'swe%'", "content_languages LIKE '%swe%'",
                 "content_languages LIKE 'swe%' OR fetch_status = 200", "content_languages = 'swe'"]:
        assert implied_ranges(none) == [], none


def test_the_where_is_pushed_into_the_scan(tmp_path):
    """Row groups whose statistics exclude the where are not read: the index's rows 100 times
    (as a larger crawl's), one file sorted by host (as Common Crawl's is), one by language, in
    row groups of 500 rows."""
    t = ds.dataset(str(INDEX), format="parquet").to_table()
    copies = []
    for i in range(100):  # each copy its own URLs (the same records: one row each is selected)
        c = t
        for col in ("url", "url_surtkey", "url_path"):
            c = c.set_column(c.schema.get_field_index(col), col, pc.binary_join_element_wise(c[col], f"#{i:03d}", ""))
        copies.append(c)
    big = pa.concat_tables(copies)
    for order in ("url_surtkey", "content_languages"):
        pq.write_table(big.sort_by(order), tmp_path / f"by-{order}.parquet", row_group_size=500)
    by_host, by_lang = [str(tmp_path / "by-url_surtkey.parquet")], [str(tmp_path / "by-content_languages.parquet")]

    def data_bytes(files: list[str], where: str):  # less what a scan keeping no row group reads (footers)
        s = scan(files, where)
        return s, s.bytes_read - scan(files, "url_host_tld = '~none~' AND content_languages = '~none~'").bytes_read

    everything, all_bytes = data_bytes(by_host, "fetch_status = 200")
    io_tld, io_bytes = data_bytes(by_host, "url_host_tld = 'io'")
    github, github_bytes = data_bytes(by_host, "url_surtkey LIKE 'io,github,%'")
    # (one row per record: the copies are the same records)
    assert (everything.records.num_rows, io_tld.records.num_rows, github.records.num_rows) == (54, 10, 10)
    assert (everything.duplicates, github.duplicates) == (54 * 99, 10 * 99)
    assert io_bytes < 0.3 * all_bytes and github_bytes < 0.3 * all_bytes
    # a prefix match skips row groups through the range it implies; a match inside the value cannot
    zh, zh_bytes = data_bytes(by_lang, "content_languages LIKE 'zho%'")
    anywhere, anywhere_bytes = data_bytes(by_lang, "content_languages LIKE '%zho%'")
    assert zh.records.num_rows == 7 and anywhere.records.num_rows == 8
    assert zh_bytes < 0.5 * anywhere_bytes
    assert "\"content_languages\" >= 'zho'" in zh.query
    # the records come sorted by file and offset, one per (file, offset)
    doubled = pa.concat_tables([t, t.slice(0, 5)])
    pq.write_table(doubled, tmp_path / "doubled.parquet")
    d = scan([str(tmp_path / "doubled.parquet")], None)
    assert d.records.num_rows == 54 and d.duplicates == 5
    keys = list(zip(d.records["warc_filename"].to_pylist(), d.records["warc_record_offset"].to_pylist()))
    assert keys == sorted(keys)


# ---------------------------------------------------------------------------------------------
# the documents


@pytest.mark.parametrize("where,split", [(NARROW, None), ("content_languages LIKE 'eng%'", 40_000), (None, 1)],
                         ids=["zh-or-github", "english-in-shards", "everything-one-record-a-shard"])
def test_selected_documents_are_the_full_scans(full, where, split):
    spec = index_spec(where=where, **({"split_bytes": split} if split else {}))
    docs, rejects, read, shards = read_all(spec)
    assert rejects.num_rows == 0
    same_as_full_scan(docs, full)
    sel = plan_index("crawl", spec)
    assert docs.num_rows == sel.records == sum(r for r, _ in sel.files.values())
    # the index's own columns ride along
    idx = {(r["warc_filename"], r["warc_record_offset"]): r for r in
           ds.dataset(str(INDEX), format="parquet").to_table().to_pylist()}
    for d in docs.to_pylist():
        r = idx[(d["id"].split("/", 1)[1].split("#")[0], d["origin_offset"])]
        assert (d["content_languages"], d["content_mime_detected"]) == (r["content_languages"], r["content_mime_detected"])
    # tasks are cut by the bytes they read
    if split:
        assert len(shards) > 1 and all(s.end - s.start <= split + max(s.size for s in shards) for s in shards)
        assert sum(s.size for s in shards) == sel.bytes
    if where == NARROW:  # a narrow selection reads a fraction of the crawl
        assert read < 0.4 * sum(p.stat().st_size for p in WARCS)


def test_near_ranges_are_one_read(full):
    from curation.io.records import ReadStats, fetch_spans

    sel = plan_index("crawl", index_spec(where="content_languages LIKE 'eng%'")).scan.records
    rows = [r for r in sel.to_pylist() if r["warc_filename"] == "dolma_sample-0000.warc.gz"]
    spans = [(r["warc_record_offset"], r["warc_record_offset"] + r["warc_record_length"]) for r in rows]
    apart, joined = ReadStats(), ReadStats()
    fetch_spans(str(WARCS[0]), spans, apart, max_gap=0)
    fetch_spans(str(WARCS[0]), spans, joined)
    assert apart.reads == len(rows) > 10 and joined.reads < len(rows) / 3
    assert apart.bytes_read == sum(e - s for s, e in spans)


def _bad_index(tmp_path: Path) -> tuple[Path, dict]:
    """The committed index plus one row of each kind of bad input (marked by their
    ``content_languages``), and what each must become."""
    t = ds.dataset(str(INDEX), format="parquet").to_table()
    src = WARCS[0]  # dolma_sample-0000.warc.gz
    data = src.read_bytes()
    with open(src, "rb") as f:
        request = next(r.stream_pos for r in ArchiveIterator(f, parse_http=False) if r.record_type == WarcRecordType.request)
    d = zlib.decompressobj(31)
    d.decompress(data[request:])
    request_len = len(data) - request - len(d.unused_data)  # the request record's whole gzip member
    rows = t.to_pylist()
    first = next(r for r in rows if r["warc_filename"] == src.name)
    # one record's row says another URL (the row is the record's only one: it is not read)
    other = next(r for r in rows if r["warc_filename"] == src.name and r["url"] != first["url"])
    good = [r for r in rows if r is not other]

    def row(marker: str, **kw) -> dict:
        return {**first, "content_languages": marker, **kw}

    bad = [
        row("bad-past-end", warc_record_offset=len(data) - 10, warc_record_length=1000),
        row("bad-beyond-end", warc_record_offset=len(data) + 5000, warc_record_length=1000),
        row("bad-request", warc_record_offset=request, warc_record_length=request_len),
        row("bad-missing", warc_filename="gone.warc.gz"),
        {**other, "content_languages": "bad-url", "url": first["url"]},
        row("bad-corrupt", warc_record_offset=first["warc_record_offset"] + 1),
        row("bad-filename", warc_filename="../warc/" + src.name),
    ]
    pq.write_table(pa.Table.from_pylist(good + bad, schema=t.schema), tmp_path / "bad-index.parquet")
    want = {"bad-past-end": "read:past_end", "bad-beyond-end": "read:past_end", "bad-request": "read:not_response",
            "bad-missing": "read:missing_file", "bad-url": "read:url_mismatch", "bad-corrupt": "read:corrupt_record",
            "bad-filename": "read:bad_warc_filename"}
    return tmp_path / "bad-index.parquet", want


def test_bad_index_rows_are_counted_rejections_and_nothing_else_is_lost(tmp_path, full):
    path, want = _bad_index(tmp_path)
    spec = index_spec([str(path)], where=None, max_gap=0)
    docs, rejects, _, _ = read_all(spec)
    same_as_full_scan(docs, full)
    assert docs.num_rows == 53  # every good record, the ones sharing a file with bad rows too
    got = sorted(rejects.column("reason").to_pylist())
    assert got == sorted(want.values())
    details = " | ".join(rejects.column("detail").to_pylist())
    for needle in ("gone.warc.gz", "a request record", "ends at", "the index says 'https://", "no gzip member",
                   "not a path below"):
        assert needle in details, needle
    # with near ranges joined, the bad ranges next to good ones change nothing
    docs2, rejects2, _, _ = read_all(index_spec([str(path)], where=None))
    assert docs2.sort_by("id").equals(docs.sort_by("id")) and sorted(rejects2.column("reason").to_pylist()) == got


# ---------------------------------------------------------------------------------------------
# runs, the plan, the CLI (one Ray session)


def _run(spec: dict, out: Path) -> dict:
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag

    state = run_dag(parse_dag(spec, f"{spec['name']}.yaml", str(REPO)), out, workers=2, quiet=True)
    assert state["state"] == "done"
    return state


def test_runs_over_the_index_equal_the_full_scan_run(ray_session, tmp_path, in_repo):
    from curation.pipeline.rundir import RunDir

    example = yaml.safe_load((REPO / "pipelines/cc-index.yaml").read_text())
    full_dag = json.loads(json.dumps(example))
    full_dag["name"] = "cc-index-full-scan"
    full_dag["inputs"]["crawl"] = {"format": "warc", "paths": ["tests/data/warc/*.warc.gz"], "source": "web"}
    _run(example, tmp_path / "index")
    _run(full_dag, tmp_path / "full")
    a, b = RunDir(tmp_path / "index"), RunDir(tmp_path / "full")
    sel = plan_index("crawl", index_spec(where=example["inputs"]["crawl"]["where"]))
    ids = sorted(r[0] for r in a.connect(["extract"]).execute("select id from extract").fetchall())
    assert len(ids) == sel.records == 38
    for stage in ("extract", "fineweb"):
        got = a.connect([stage]).execute(f"select * exclude (content_languages, content_mime_detected) from {stage} "
                                         "order by id").to_arrow_table()
        ref = b.connect([stage]).execute(f"select * from {stage} where id in (select unnest(?)) order by id",
                                         [ids]).to_arrow_table()
        assert got.num_rows == ref.num_rows > 0 and got.column_names == ref.column_names
        for c in got.column_names:
            assert got.column(c).to_pylist() == ref.column(c).to_pylist(), (stage, c)
    read_a = sum(e.get("bytes_read") or 0 for e in a.entries("crawl").values())
    read_b = sum(e.get("bytes_read") or 0 for e in b.entries("crawl").values())
    assert 0 < read_a < read_b

    # bad index rows in a run: counted rejections with their reasons, the run done
    path, want = _bad_index(tmp_path)
    bad = {"name": "bad", "inputs": {"crawl": {"format": "cc_index", "paths": [str(path)], "source": "web",
                                               "where": "content_languages LIKE 'bad-%' OR content_languages LIKE 'zho%'",
                                               "warc_root": "tests/data/warc"}},
           "stages": {"extract": {"type": "extract"}}, "output": "extract"}
    _run(bad, tmp_path / "bad")
    con = RunDir(tmp_path / "bad").connect()
    reasons = dict(con.execute("select reason, count(*) from rejected where stage = 'crawl' group by 1").fetchall())
    expect: dict[str, int] = {}
    for r in want.values():
        expect[r] = expect.get(r, 0) + 1
    assert reasons == expect
    assert con.execute("select count(*) from extract").fetchone()[0] == 7  # the Chinese pages, all of them
    assert con.execute("select count(*) from rejected where stage = 'crawl' and reason = 'read:past_end' "
                       "and id like 'crawl/dolma_sample-0000.warc.gz#%'").fetchone()[0] == 2


def test_refinery_plan_prints_what_the_run_will_read(tmp_path, in_repo):
    from typer.testing import CliRunner

    from curation.cli import app

    out = tmp_path / "plan.json"
    res = CliRunner().invoke(app, ["plan", "pipelines/cc-index.yaml", "--json", str(out), "--docs-per-core-s", "0.01"],
                             env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    est = json.loads(out.read_text())["inputs"]["crawl"]
    assert est["records"] == 38 and est["warc_files"] == 3
    assert sum(f["records"] for f in est["per_file"]) == 38 and sum(f["bytes"] for f in est["per_file"]) == est["bytes"]
    assert abs(est["core_hours"] - 38 / 0.01 / 3600) < 1e-9
    text = " ".join(res.output.split())
    assert "38 records" in text and "3 WARC files" in text and "1.06 core-hours" in text
    assert "dolma_sample-0001.warc.gz │ 15 │ 228,379" in text
    bad = tmp_path / "bad.yaml"
    spec = yaml.safe_load((REPO / "pipelines/cc-index.yaml").read_text())
    spec["inputs"]["crawl"]["where"] = "lang = 'en'"
    bad.write_text(yaml.safe_dump(spec))
    res = CliRunner().invoke(app, ["plan", str(bad)])
    assert res.exit_code == 2 and "'lang' is not a column of the index" in " ".join(res.output.split())


def test_refinery_index_cc_builds_an_index_a_dag_reads(tmp_path, in_repo, full):
    from typer.testing import CliRunner

    from curation.cli import app

    shutil.copytree(DATA / "warc", tmp_path / "crawl")
    res = CliRunner().invoke(app, ["index", "cc", str(tmp_path / "crawl" / "*.warc.gz"), "--out", str(tmp_path / "idx"),
                                   "--crawl", "TEST-CRAWL"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    assert "54 response records of 136" in " ".join(res.output.split())
    summary = json.loads((tmp_path / "idx" / "_index.json").read_text())
    assert summary["warc_root"] == str(tmp_path / "crawl") and summary["rows"] == 54
    spec = index_spec([str(tmp_path / "idx" / "*.parquet")], where="crawl = 'TEST-CRAWL' AND content_languages LIKE 'zho%'",
                      root=summary["warc_root"])
    docs, rejects, _, _ = read_all(spec)
    assert docs.num_rows == 7 and rejects.num_rows == 0
    assert {f.rsplit("/", 1)[0] for f in docs.column("origin_file").to_pylist()} == {str(tmp_path / "crawl")}
