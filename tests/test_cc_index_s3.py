"""``format: cc_index`` on object storage (issue 63): the index and the WARCs on the S3 test server
(moto, tests/test_s3.py), the selected documents and their texts equal to a full scan's of the
same WARCs there, every request counted (each goes through s3fs's one request method), and the
bad index rows counted rejections on S3 too (a range past the object's end is a 416 there)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from conftest import DATA
from curation.io.inputs import InputSpec, plan_index, plan_input
from curation.io.read import read_shard
from curation.stages.extract import Extract
from test_cc_index import NARROW, _bad_index, read_all, same_as_full_scan
from test_s3 import BUCKET, s3  # noqa: F401 (the S3 server fixture)

WARCS = sorted((DATA / "warc").glob("*.warc.gz"))


@pytest.fixture()
def requests(monkeypatch):
    """Every S3 request s3fs makes from this process, as (method, key)."""
    import s3fs

    seen: list[tuple[str, str]] = []
    real = s3fs.S3FileSystem._call_s3

    async def counted(self, method, *args, **kwargs):
        seen.append((getattr(method, "__name__", str(method)), kwargs.get("Key", kwargs.get("Prefix", ""))))
        return await real(self, method, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counted)
    return seen


def _texts(docs: pa.Table) -> list[str | None]:
    res = Extract().process(docs.sort_by("id"))
    return res.table.column("text").to_pylist()


def test_an_index_selection_on_s3_equals_the_full_scan_there(s3, requests, tmp_path):  # noqa: F811
    fs = s3["fs"]
    for f in sorted((DATA / "cc_index").glob("*.parquet")):
        fs.put_file(str(f), f"{BUCKET}/data/cc_index/{f.name}")
    warc_root = f"s3://{BUCKET}/data/warc"
    full_spec = InputSpec(format="warc", paths=[f"{warc_root}/*.warc.gz"], source="web")
    full = pa.concat_tables([read_shard(sh, full_spec).tables()[0] for sh in plan_input("crawl", full_spec)])
    assert full.num_rows == 54 and set(full.column("origin_file").to_pylist()) == {f"{warc_root}/{p.name}" for p in WARCS}

    figures = {}
    for label, where in (("narrow", NARROW), ("english", "content_languages LIKE 'eng%'")):
        spec = InputSpec(format="cc_index", paths=[f"s3://{BUCKET}/data/cc_index/*.parquet"], where=where,
                         warc_root=warc_root + "/", source="web")
        requests.clear()
        plan = plan_index("crawl", spec)
        index_requests = len(requests)
        requests.clear()
        docs, rejects, read = [], [], 0
        for sh in plan.shards:
            res = read_shard(sh, spec)
            docs.append(res.tables()[0])
            rejects.append(res.tables()[1])
            read += res.bytes_read
        docs, rejects = pa.concat_tables(docs), pa.concat_tables(rejects)
        warc_gets = [k for m, k in requests if "get_object" in m.lower() and k.startswith("data/warc/")]
        assert rejects.num_rows == 0 and docs.num_rows == plan.records
        same_as_full_scan(docs, full)
        ids = docs.column("id").to_pylist()
        assert _texts(docs.drop_columns(["content_languages", "content_mime_detected"])) == \
            _texts(full.filter(pc.is_in(full.column("id"), pa.array(ids))))
        # grouped, sorted, near ranges joined: a request per joined range, not per record
        assert len(warc_gets) == len(requests) <= len({i.split("#")[0] for i in ids}) * 3 < docs.num_rows
        figures[label] = (docs.num_rows, index_requests, len(requests), len(warc_gets), read, read / docs.num_rows)
    print("\nS3: selection -> documents, requests to select (index), requests to read (all WARC GETs), bytes read")
    for label, f in figures.items():
        print(f"  {label}: {f[0]} documents, {f[1]} index requests, {f[2]} reading requests ({f[3]} WARC GETs), "
              f"{f[4]:,} bytes = {f[5]:,.0f} bytes a document")
    assert figures["narrow"][4] < 0.4 * sum(p.stat().st_size for p in WARCS)


def test_bad_index_rows_on_s3_are_counted_rejections(s3, tmp_path, requests):  # noqa: F811
    path, want = _bad_index(tmp_path)
    s3["fs"].put_file(str(path), f"{BUCKET}/bad/index.parquet")
    warc_root = f"s3://{BUCKET}/data/warc"
    spec = InputSpec(format="cc_index", paths=[f"s3://{BUCKET}/bad/index.parquet"], warc_root=warc_root, source="web",
                     where="content_languages LIKE 'bad-%' OR starts_with(url, 'https://maria-antoniak')")
    docs, rejects, _, _ = read_all(spec)
    assert sorted(rejects.column("reason").to_pylist()) == sorted(want.values())
    assert docs.num_rows == 6 and all("maria-antoniak" in u for u in docs.column("url").to_pylist())
    assert set(docs.column("origin_file").to_pylist()) == {f"{warc_root}/dolma_sample-0000.warc.gz"}


def test_a_selection_in_a_run_directory_on_s3_is_read_back_by_its_tasks(s3, requests, tmp_path):  # noqa: F811
    """The selection files below an S3 run directory: written by the planner, each task reads
    its own rows with a few requests (the file's footer, its row groups), a rerun reuses them."""
    fs = s3["fs"]
    for f in sorted((DATA / "cc_index").glob("*.parquet")):
        fs.put_file(str(f), f"{BUCKET}/sel/cc_index/{f.name}")
    warc_root = f"s3://{BUCKET}/data/warc"
    for p in WARCS:
        fs.put_file(str(p), f"{BUCKET}/data/warc/{p.name}")
    spec = InputSpec(format="cc_index", paths=[f"s3://{BUCKET}/sel/cc_index/*.parquet"], where="content_languages LIKE 'eng%'",
                     warc_root=warc_root, source="web", split_bytes=100_000)
    work = f"s3://{BUCKET}/run/crawl/_work/h"
    plan = plan_index("crawl", spec, work_dir=work)
    assert not plan.scan.reused and len(plan.shards) > 1
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(f"{BUCKET}/run/crawl/_work/h")) == ["_selection.json",
                                                                                     "part-00000.parquet"]
    full_spec = InputSpec(format="warc", paths=[f"{warc_root}/*.warc.gz"], source="web")
    full = pa.concat_tables([read_shard(sh, full_spec).tables()[0] for sh in plan_input("crawl", full_spec)])
    docs, counts = [], []
    for sh in plan.shards:
        requests.clear()
        docs.append(read_shard(sh, spec).tables()[0])
        selection = [k for _, k in requests if k.startswith("run/")]
        assert 1 <= len(selection) <= 4, selection  # the part file's size, footer and row group, not the whole run
        counts.append((len(selection), len(requests) - len(selection), docs[-1].num_rows))
    print("\nS3 run directory: per task (selection requests, WARC requests, documents):", counts)
    docs = pa.concat_tables(docs)
    assert docs.num_rows == plan.records == 38
    same_as_full_scan(docs, full)
    again = plan_index("crawl", spec, work_dir=work)
    assert again.scan.reused and [s.selection for s in again.shards] == [s.selection for s in plan.shards]
