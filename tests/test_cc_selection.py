"""A ``format: cc_index`` selection at snapshot scale (issue 63): the driver streams the selected
records into selection files (``curation/io/cc_selection.py``) and keeps only per-WARC-file
figures and the shards' row ranges; each task reads its own rows back. A rerun with the same
index reuses the selection; a rebuilt index under the same paths is another input (its
``index_stamp`` in the params hash), so nothing made from the old one resumes."""

from __future__ import annotations

import os
import random

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import DATA, REPO
from curation.io.cc_selection import SCHEMA, Selection, SelectionWriter, load, read_slice
from curation.io.inputs import InputSpec, plan_index

INDEX = DATA / "cc_index"


def _records(n: int, seed: int) -> list[dict]:
    """``n`` index rows over a few WARC files, sorted by (file, offset, ...), some (file, offset)
    named twice; lengths from 0 to 5,000 bytes."""
    rng = random.Random(seed)
    rows = [{"warc_filename": f"crawl/w-{rng.randrange(7):02d}.warc.gz", "warc_record_offset": rng.randrange(2_000),
             "warc_record_length": rng.randrange(5_001), "url": f"https://x/{rng.randrange(10**6)}",
             "content_languages": rng.choice(["eng", "swe", None]), "content_mime_detected": "text/html"}
            for _ in range(n)]
    return sorted(rows, key=lambda r: tuple((v is None, v) for v in r.values()))


def _reference(rows: list[dict], split: int) -> tuple[list[dict], dict, list[tuple]]:
    """The selection record by record, as the driver once cut it in memory: one row per
    (file, offset), the first; a shard closing at the record that brings it to ``split``."""
    kept, seen = [], set()
    for r in rows:
        if (r["warc_filename"], r["warc_record_offset"]) not in seen:
            seen.add((r["warc_filename"], r["warc_record_offset"]))
            kept.append(r)
    files: dict[str, tuple[int, int]] = {}
    shards, lo, held = [], 0, 0
    for i, r in enumerate(kept):
        n, b = files.get(r["warc_filename"], (0, 0))
        files[r["warc_filename"]] = (n + 1, b + r["warc_record_length"])
        held += r["warc_record_length"]
        if held >= split or i == len(kept) - 1:
            shards.append((lo, i + 1, held, kept[lo]["warc_filename"]))
            lo, held = i + 1, 0
    return kept, files, shards


@pytest.mark.parametrize("batch", [1, 5, 37, 10_000])
def test_selection_files_hold_the_records_and_each_shard_reads_its_own(tmp_path, batch):
    rows = _records(3_000, seed=batch)
    kept, files, shards = _reference(rows, split=20_000)
    t = pa.Table.from_pylist(rows, schema=SCHEMA)
    # small files and row groups: shards span row groups and files
    sel = Selection(str(tmp_path), "k", part_rows=64, group_rows=16)
    w = SelectionWriter(sel, 20_000)
    for at in range(0, t.num_rows, batch):
        w.add(t.slice(at, batch).to_batches()[0] if batch < 40 else t.slice(at, batch))
    w.close()
    assert sel.shards == shards and sel.files == files and sel.rows == len(kept)
    assert sel.duplicates == len(rows) - len(kept) > 0 and sel.bytes == sum(b for _, b in files.values())
    parts = -(-len(kept) // 64)
    assert sorted(p.name for p in tmp_path.glob("part-*.parquet")) == [f"part-{i:05d}.parquet" for i in range(parts)]
    assert all(pq.ParquetFile(p).metadata.num_row_groups == 4 for p in sorted(tmp_path.glob("part-*"))[:-1])
    got = [r for lo, hi, _, _ in sel.shards for r in read_slice(sel.slice(lo, hi, "root")).to_pylist()]
    assert got == kept
    # the summary written last is the selection, under its key only
    again = load(str(tmp_path), "k")
    assert again is not None and again.reused and (again.shards, again.files) == (sel.shards, sel.files)
    assert load(str(tmp_path), "another index") is None


def _spec(index: str, where: str | None) -> InputSpec:
    return InputSpec(format="cc_index", paths=[index], where=where, warc_root=str(DATA / "warc"), source="web",
                     split_bytes=100_000)


def _write_index(path, where_lang: str) -> None:
    t = ds.dataset(str(INDEX), format="parquet").to_table()
    keep = [r["content_languages"] is not None and r["content_languages"].startswith(where_lang) for r in t.to_pylist()]
    pq.write_table(t.filter(pa.array(keep)), path)


def test_a_selection_is_reused_until_the_index_is_rebuilt(tmp_path):
    index = tmp_path / "index.parquet"
    _write_index(index, "zho")
    work = str(tmp_path / "work")
    first = plan_index("crawl", _spec(str(index), None), work_dir=work)
    assert not first.scan.reused and first.records == 7 and first.scan.bytes_read > 0
    second = plan_index("crawl", _spec(str(index), None), work_dir=work)
    assert second.scan.reused and second.records == 7 and [s.selection for s in second.shards] == \
        [s.selection for s in first.shards]
    # another where is another selection
    assert not plan_index("crawl", _spec(str(index), "true"), work_dir=work).scan.reused
    # the index rebuilt under the same path: selected again
    _write_index(index, "eng")
    os.utime(index, ns=(os.stat(index).st_atime_ns, os.stat(index).st_mtime_ns + 10**9))
    rebuilt = plan_index("crawl", _spec(str(index), None), work_dir=work)
    assert not rebuilt.scan.reused and rebuilt.records == 38
    # a plan's figures are counted without writing rows
    counted = plan_index("crawl", _spec(str(index), None), rows=False)
    assert counted.scan.dir is None and counted.files == rebuilt.files and len(counted.shards) == len(rebuilt.shards)


def test_a_run_over_a_rebuilt_index_resumes_nothing_of_the_old_one(ray_session, tmp_path, in_repo):
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag
    from curation.pipeline.rundir import RunDir

    index = tmp_path / "index.parquet"
    spec = yaml.safe_load((REPO / "pipelines/cc-index.yaml").read_text())
    spec["inputs"]["crawl"].update(paths=[str(index)], where=None)
    out = tmp_path / "run"

    def run() -> tuple[set[str], set[str]]:
        assert run_dag(parse_dag(spec, "cc.yaml", str(REPO)), out, workers=2, quiet=True)["state"] == "done"
        rd = RunDir(out)
        ids = {r[0] for r in rd.connect(["extract"]).execute("select id from extract").fetchall()}
        return ids, {p.name for p in (out / "crawl" / "_work").iterdir()}

    _write_index(index, "zho")
    zh, work_zh = run()
    _write_index(index, "eng")  # rebuilt in place: other records, the same path
    en, work_en = run()
    assert len(zh) == 7 and len(en) > 30 and not zh & en
    assert len(work_zh) == len(work_en) == 1 and work_zh != work_en  # the old selection removed
    stamp = yaml.safe_load((out / "dag.yaml").read_text())["inputs"]["crawl"]["index_stamp"]
    assert stamp and work_en == {RunDir(out).load_dag().hashes()["crawl"]}
    # the same index again: everything resumes
    assert run() == (en, work_en)


def test_the_plan_names_the_predicates_no_row_group_statistics_can_skip_by(tmp_path, in_repo):
    import pyarrow.compute as pc

    from curation.io.cc_select import scan
    from curation.io.sql_where import unpushed
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.estimate import estimate

    where = ("fetch_status = 200 AND lower(url_host_tld) = 'io' AND url_host_tld IN ('io', 'org') "
             "AND regexp_matches(url, 'github') AND url_path LIKE '/%' AND content_languages NOT LIKE 'x%' "
             "AND fetch_status <> 404")
    assert unpushed(where) == ["(lower(url_host_tld) = 'io')", "regexp_matches(url, 'github')",
                               "(content_languages NOT LIKE 'x%')", "(fetch_status != 404)"]
    assert unpushed("url_host_tld = 'io' OR url_host_tld LIKE 'org%'") == []
    assert unpushed("url_host_tld = 'io' OR fetch_status = 200") == ["((url_host_tld = 'io') OR (fetch_status = 200))"]
    spec = yaml.safe_load((REPO / "pipelines/cc-index.yaml").read_text())
    spec["inputs"]["crawl"]["where"] = where
    est = estimate(parse_dag(spec, "cc.yaml", str(REPO)))["inputs"]["crawl"]
    assert est["index"]["not_pushed"] == unpushed(where) and est["records"] == 10
    # and it is so: on 100 copies of the index in row groups by host, the plain comparison
    # skips row groups, the same test through lower() reads them all
    t = ds.dataset(str(INDEX), format="parquet").to_table()
    big = pa.concat_tables([t.set_column(t.schema.get_field_index("url"), "url",
                                         pc.binary_join_element_wise(t["url"], f"#{i}", "")) for i in range(100)])
    pq.write_table(big.sort_by("url_surtkey"), tmp_path / "by-host.parquet", row_group_size=500)
    files = [str(tmp_path / "by-host.parquet")]
    plain, lowered = scan(files, "url_host_tld = 'io'"), scan(files, "lower(url_host_tld) = 'io'")
    footers = scan(files, "url_host_tld = '~none~'").bytes_read  # what a scan keeping no row group reads
    assert plain.rows == lowered.rows == 10
    assert plain.bytes_read - footers < 0.3 * (lowered.bytes_read - footers)


def test_index_rows_without_a_file_or_offset_are_counted_rejections(tmp_path):
    from curation.io.inputs import plan_input
    from curation.io.read import read_shard

    t = ds.dataset(str(INDEX), format="parquet").to_table()
    rows = [r for r in t.to_pylist() if r["warc_filename"] == "dolma_sample-0000.warc.gz"]
    bad = [{**rows[0], "warc_filename": None}, {**rows[1], "warc_record_offset": None},
           {**rows[2], "warc_record_length": None}]
    pq.write_table(pa.Table.from_pylist(rows[3:] + bad, schema=t.schema), tmp_path / "index.parquet")
    spec = _spec(str(tmp_path / "index.parquet"), None)
    got = [read_shard(sh, spec).tables() for sh in plan_input("crawl", spec)]
    docs, rejects = pa.concat_tables([d for d, _ in got]), pa.concat_tables([r for _, r in got])
    assert docs.num_rows == len(rows) - 3
    assert sorted(rejects.column("reason").to_pylist()) == ["read:bad_warc_filename", "read:corrupt_record",
                                                            "read:corrupt_record"]
