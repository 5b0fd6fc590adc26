"""Byte-range splitting of input files: a file cut into parts is read exactly once in total.

Each part reads only the records that start in its byte range (gzip members of a WARC, lines
of a JSONL file, row groups of a Parquet file); the union of the parts is the whole-file read,
record for record, and the bytes the parts take from storage add up to about the file's size.
Bad input (garbage between members, truncated members, a lying Content-Length, a file that is
one gzip stream) is reported once and loses nothing, whichever way the file is cut.
"""

from __future__ import annotations

import gzip
import json
import logging
import re
import tracemalloc
import zlib
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from curation.io import ranges
from curation.io.inputs import InputShard, InputSpec, plan_input
from curation.io.read import iter_read, read_shard
from conftest import DATA

CC_WARC = DATA / "warc/resiliparse_warcfile.warc.gz"  # real Common Crawl, one gzip member per record
WARCS = sorted((DATA / "warc").glob("*.warc.gz"))


class _Counted:
    """A file object that counts what is read through it (independently of the readers)."""

    def __init__(self, f, counter: list[int]):
        self.f, self.counter = f, counter

    def read(self, n=-1):
        b = self.f.read(n)
        self.counter[0] += len(b)
        return b

    def readinto(self, b):
        n = self.f.readinto(b) or 0
        self.counter[0] += n
        return n

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.fixture()
def counted(monkeypatch):
    """``counter[0]``: bytes read from storage by every reader since the last reset."""
    counter = [0]
    real = ranges.open_raw
    monkeypatch.setattr(ranges, "open_raw", lambda path: _Counted(real(path), counter))
    return counter


def _members(data: bytes) -> list[tuple[int, int]]:
    """(start, end) of every gzip member of ``data``."""
    out, pos = [], 0
    while pos < len(data):
        d = zlib.decompressobj(31)
        d.decompress(data[pos:])
        end = len(data) - len(d.unused_data)
        out.append((pos, end))
        pos = end
    return out


def _read_all(fmt: str, path, counter=None, **kw):
    """Read every shard of ``path``: (docs, rejects, shards, bytes read by each shard)."""
    spec = InputSpec(format=fmt, paths=[str(path)], source="web", **kw)
    docs, rejects, per_shard = [], [], []
    shards = plan_input("in", spec)
    for shard in shards:
        before = counter[0] if counter else 0
        d, r = read_shard(shard, spec).tables()
        docs += d.to_pylist()
        rejects += r.to_pylist()
        per_shard.append(counter[0] - before if counter else 0)
    return docs, rejects, shards, per_shard


def _parts(path, fmt: str, nparts: int) -> list[InputShard]:
    """``nparts`` byte ranges of ``path`` made by hand (whatever the planner would decide)."""
    size = path.stat().st_size
    return [InputShard("in", f"in-{k:05d}", str(path), path.name, fmt, k, nparts, size,
                       size * k // nparts, size * (k + 1) // nparts) for k in range(nparts)]


def _read_parts(shards, fmt: str, **kw):
    spec = InputSpec(format=fmt, paths=[shards[0].path], source="web", **kw)
    docs, rejects = [], []
    for shard in shards:
        d, r = read_shard(shard, spec).tables()
        docs.append(d.to_pylist())
        rejects.append(r.to_pylist())
    return docs, rejects


@pytest.fixture(scope="module")
def cc_concat(tmp_path_factory):
    """All WARC samples one after the other: a valid gzip-per-record WARC of ~600 KB with
    records from 0.3 to 50 KB compressed (Common Crawl and wget crawls)."""
    p = tmp_path_factory.mktemp("warc") / "concat.warc.gz"
    p.write_bytes(b"".join(f.read_bytes() for f in WARCS))
    return p


# ---------------------------------------------------------------------------------------------
# WARC


@pytest.mark.parametrize("split_bytes", [4_000, 16_384, 50_000])
@pytest.mark.parametrize("which", ["cc", "concat"])
def test_warc_parts_union_is_the_whole_file_and_each_byte_is_read_about_once(which, split_bytes, cc_concat,
                                                                             counted):
    path = CC_WARC if which == "cc" else cc_concat
    data = path.read_bytes()
    whole, whole_rej, shards1, read1 = _read_all("warc", path, counted)
    assert len(shards1) == 1 and read1[0] == len(data)  # one shard reads the file once
    docs, rejects, shards, per_shard = _read_all("warc", path, counted, split_bytes=split_bytes)
    assert len(shards) == -(-len(data) // split_bytes) > 2
    assert [(s.start, s.end) for s in shards] == [(s.start, e.start) for s, e in zip(shards, shards[1:])] + [
        (shards[-1].start, len(data))]  # contiguous ranges
    ids = [d["id"] for d in docs]
    assert ids == [d["id"] for d in whole] and len(set(ids)) == len(ids) > 0
    assert [d["html"] for d in docs] == [d["html"] for d in whole]
    assert [(d["url"], d["meta"]) for d in docs] == [(d["url"], d["meta"]) for d in whole]
    assert rejects == whole_rej
    # ids are the offsets of the records' gzip members
    starts = {s for s, _ in _members(data)}
    assert all(int(i.rsplit("#", 1)[1]) in starts for i in ids)
    # bytes read: each part about its range; all together about the file
    biggest = max(e - s for s, e in _members(data))
    for shard, got in zip(shards, per_shard):
        assert got <= (shard.end - shard.start) + biggest + 2 * ranges.chunk_size(shard.start, shard.end), shard
    chunk = ranges.chunk_size(0, split_bytes)
    assert sum(per_shard) <= 1.1 * len(data) + len(shards) * (biggest + chunk)


def test_warc_parts_agree_on_record_starts_at_every_cut(cc_concat):
    """Cut the file at every member boundary, one byte either side of it and mid-member:
    whatever the cut, the two parts hold the whole file, once."""
    data = cc_concat.read_bytes()
    spec = InputSpec(format="warc", paths=[str(cc_concat)], source="web")
    whole = [d["id"] for d in read_shard(_parts(cc_concat, "warc", 1)[0], spec).tables()[0].to_pylist()]
    members = _members(data)
    cuts = sorted({c for s, e in members[1:40] for c in (s - 1, s, s + 1, (s + e) // 2)})
    for cut in cuts:
        a = replace(_parts(cc_concat, "warc", 1)[0], part=0, nparts=2, end=cut)
        b = replace(a, key="in-00001", part=1, start=cut, end=len(data))
        ids = [d["id"] for s in (a, b) for d in read_shard(s, spec).tables()[0].to_pylist()]
        assert ids == whole, cut


def test_wet_parts(tmp_path):
    """WET files have the same layout: conversion records, one gzip member each."""
    one = (DATA / "wet/whirlwind.warc.wet.gz").read_bytes()
    raw = next(r for r in (zlib.decompress(one[s:e], 31) for s, e in _members(one)) if b"WARC-Type: conversion" in r)
    head, body = raw.split(b"\r\n\r\n", 1)
    recs = []
    for i in range(30):  # the same page under 30 record ids and URLs (headers only: same length)
        h = head.replace(b"wiki/Escopete", b"wiki/Escopete_%02d" % i)
        h = re.sub(rb"(WARC-Record-ID: <urn:uuid:[0-9a-f-]{30})[0-9a-f]{2}", rb"\g<1>%02d" % i, h)
        recs.append(gzip.compress(h + b"\r\n\r\n" + body, mtime=0))
    path = tmp_path / "many.warc.wet.gz"
    path.write_bytes(b"".join(recs))
    whole, _, _, _ = _read_all("wet", path)
    docs, _, shards, _ = _read_all("wet", path, split_bytes=5_000)
    assert len(shards) > 5 and len(whole) == 30
    assert [(d["id"], d["text"], d["url"]) for d in docs] == [(d["id"], d["text"], d["url"]) for d in whole]


def test_single_gzip_stream_warc_is_read_by_one_part(tmp_path, caplog, counted):
    """A WARC compressed as one gzip stream cannot be entered in the middle: the planner
    finds out from the file's head and gives it one task (and says so); cut by hand anyway,
    the first part reads it all and the others find no record start in their range."""
    raw = gzip.decompress(CC_WARC.read_bytes())
    path = tmp_path / "single.warc.gz"
    path.write_bytes(gzip.compress(raw, mtime=0))
    size = path.stat().st_size
    ref, _, _, _ = _read_all("warc", CC_WARC)

    with caplog.at_level(logging.INFO, logger="curation.io.inputs"):
        docs, rejects, shards, per_shard = _read_all("warc", path, counted, split_bytes=10_000)
    assert len(shards) == 1 and "one gzip stream" in caplog.text and "single.warc.gz" in caplog.text
    assert per_shard[0] <= size + 64 * 1024  # the planner read the head only; the reader the file once
    assert [d["html"] for d in docs] == [d["html"] for d in ref] and not rejects
    # records inside the one member: MEMBER+OFFSET_IN_MEMBER, unique
    assert docs[0]["id"].endswith("#0+1428") and len({d["id"] for d in docs}) == len(docs)

    parts_docs, parts_rej = _read_parts(_parts(path, "warc", 6), "warc")
    assert [d["html"] for d in parts_docs[0]] == [d["html"] for d in ref]
    assert all(not d for d in parts_docs[1:]) and all(not r for r in parts_rej)


def test_uncompressed_warc_is_read_whole_with_stored_offsets(tmp_path, caplog):
    raw = gzip.decompress(CC_WARC.read_bytes())
    path = tmp_path / "plain.warc"
    path.write_bytes(raw)
    ref, _, _, _ = _read_all("warc", CC_WARC)
    with caplog.at_level(logging.INFO, logger="curation.io.inputs"):
        docs, rejects, shards, _ = _read_all("warc", path, split_bytes=50_000)
    assert len(shards) == 1 and "not gzip" in caplog.text
    assert [d["html"] for d in docs] == [d["html"] for d in ref] and not rejects
    for d in docs:
        off = int(d["id"].rsplit("#", 1)[1])
        assert raw[off:off + 5] == b"WARC/"


def _rebuild(members: list[bytes]) -> bytes:
    return b"".join(members)


@pytest.fixture(scope="module")
def cc_members():
    data = CC_WARC.read_bytes()
    return [data[s:e] for s, e in _members(data)]


def _response_index(members: list[bytes], k: int) -> int:
    """Index of the k-th response member."""
    hits = [i for i, m in enumerate(members) if b"WARC-Type: response" in zlib.decompress(m, 31)[:2000]]
    return hits[k]


def _check_split_equals_whole(path, split_bytes=6_000):
    whole, whole_rej, _, _ = _read_all("warc", path)
    docs, rejects, shards, _ = _read_all("warc", path, split_bytes=split_bytes)
    assert len(shards) > 3
    assert [(d["id"], d["html"]) for d in docs] == [(d["id"], d["html"]) for d in whole]
    assert sorted((r["reason"], r["offset"]) for r in rejects) == sorted((r["reason"], r["offset"]) for r in whole_rej)
    return whole, whole_rej


def test_garbage_between_members_is_reported_once_and_skipped(tmp_path, cc_members):
    ref, _, _, _ = _read_all("warc", CC_WARC)
    i = _response_index(cc_members, 5)
    junk = b"not a gzip member \x1f\x8b but almost\r\n" * 200
    path = tmp_path / "garbage.warc.gz"
    path.write_bytes(_rebuild(cc_members[:i] + [junk] + cc_members[i:]))
    docs, rejects = _check_split_equals_whole(path)
    assert [d["html"] for d in docs] == [d["html"] for d in ref]  # nothing lost
    (r,) = rejects
    assert r["reason"] == "read:corrupt_stream" and r["offset"] == sum(len(m) for m in cc_members[:i])
    assert f"skipped to the next record at {r['offset'] + len(junk)}" in r["detail"]


def test_truncated_member_loses_only_its_record(tmp_path, cc_members):
    ref, _, _, _ = _read_all("warc", CC_WARC)
    i = _response_index(cc_members, 7)
    cut = cc_members[i][: len(cc_members[i]) // 2]
    path = tmp_path / "cut.warc.gz"
    path.write_bytes(_rebuild(cc_members[:i] + [cut] + cc_members[i + 1:]))
    docs, rejects = _check_split_equals_whole(path)
    offset = sum(len(m) for m in cc_members[:i])
    # the cut record: whatever was decoded of it is kept (and reported), the rest is intact
    rest = [d["url"] for d in docs if not d["id"].endswith(f"#{offset}")]
    assert rest == [d["url"] for k, d in enumerate(ref) if k != 7]
    assert {r["offset"] for r in rejects} == {offset}
    assert "read:corrupt_stream" in {r["reason"] for r in rejects}


@pytest.mark.parametrize("delta", [+500, -500])
def test_content_length_that_lies_stays_inside_its_member(tmp_path, cc_members, delta):
    ref, _, _, _ = _read_all("warc", CC_WARC)
    i = _response_index(cc_members, 2)
    raw = zlib.decompress(cc_members[i], 31)
    cl = int(re.search(rb"Content-Length: (\d+)", raw).group(1))
    lie = gzip.compress(re.sub(rb"Content-Length: \d+", b"Content-Length: %d" % (cl + delta), raw, count=1), mtime=0)
    path = tmp_path / "lie.warc.gz"
    path.write_bytes(_rebuild(cc_members[:i] + [lie] + cc_members[i + 1:]))
    docs, rejects = _check_split_equals_whole(path, split_bytes=4_000)
    assert [d["url"] for d in docs] == [d["url"] for d in ref]  # nothing lost, neighbours intact
    assert [d["html"] for k, d in enumerate(docs) if k != 2] == [d["html"] for k, d in enumerate(ref) if k != 2]
    if delta > 0:  # the body is shorter than announced: kept, marked, reported
        assert [r["reason"] for r in rejects] == ["read:truncated_record"]
        assert json.loads(docs[2]["meta"])["truncated"] is True
    else:
        assert not rejects and len(docs[2]["html"]) == len(ref[2]["html"]) - 500


# ---------------------------------------------------------------------------------------------
# JSONL and Parquet


@pytest.fixture(scope="module")
def gsm8k_plain(tmp_path_factory):
    p = tmp_path_factory.mktemp("jsonl") / "gsm8k.jsonl"
    p.write_bytes(gzip.decompress((DATA / "jsonl/gsm8k_train_head400.jsonl.gz").read_bytes()))
    return p


@pytest.mark.parametrize("split_bytes", [1_000, 7_777, 60_000])
def test_jsonl_parts_union_is_the_whole_file(gsm8k_plain, split_bytes, counted):
    data = gsm8k_plain.read_bytes()
    whole, _, _, _ = _read_all("jsonl", gsm8k_plain, text_field="question")
    docs, rejects, shards, per_shard = _read_all("jsonl", gsm8k_plain, counted, text_field="question",
                                                 split_bytes=split_bytes)
    assert len(shards) == -(-len(data) // split_bytes) and not rejects
    assert [(d["id"], d["text"], d["meta"]) for d in docs] == [(d["id"], d["text"], d["meta"]) for d in whole]
    assert len({d["id"] for d in docs}) == 400
    line_starts = {0} | {i + 1 for i, c in enumerate(data) if c == 0x0A}
    assert all(int(d["id"].rsplit("#", 1)[1]) in line_starts for d in docs)
    longest = max(len(x) for x in data.splitlines(keepends=True))
    for shard, got in zip(shards, per_shard):
        assert got <= (shard.end - shard.start) + longest + 2 * ranges.chunk_size(shard.start, shard.end)
    assert sum(per_shard) <= 1.1 * len(data) + len(shards) * (longest + ranges.chunk_size(0, split_bytes))


def test_jsonl_cut_exactly_at_a_line_start_and_inside_a_line(gsm8k_plain):
    data = gsm8k_plain.read_bytes()
    spec = InputSpec(format="jsonl", paths=[str(gsm8k_plain)], source="m", text_field="question")
    base = _parts(gsm8k_plain, "jsonl", 1)[0]
    whole = [d["id"] for d in read_shard(base, spec).tables()[0].to_pylist()]
    first = data.index(b"\n") + 1
    for cut in (1, first - 1, first, first + 1, len(data) - 1):
        a, b = replace(base, end=cut), replace(base, start=cut)
        ids = [d["id"] for s in (a, b) for d in read_shard(s, spec).tables()[0].to_pylist()]
        assert ids == whole, cut


def test_compressed_jsonl_is_one_task_with_decompressed_offsets(caplog):
    path = DATA / "jsonl/gsm8k_train_head400.jsonl.gz"
    with caplog.at_level(logging.INFO, logger="curation.io.inputs"):
        docs, _, shards, _ = _read_all("jsonl", path, text_field="question", split_bytes=2_500)
    assert len(shards) == 1 and "read whole by one task" in caplog.text
    raw = gzip.decompress(path.read_bytes())
    for d in docs[:50]:
        off = int(d["id"].rsplit("#", 1)[1])
        assert json.loads(raw[off:raw.index(b"\n", off)])["question"] == d["text"]


def test_parquet_parts_take_contiguous_row_groups(tmp_path, counted):
    import random

    rng = random.Random(0)
    n = 6000
    t = pa.table({"text": [f"document {i} " + rng.randbytes(200 + i % 100).hex() for i in range(n)],
                  "url": [f"u{i}" for i in range(n)], "lang": ["en"] * n})
    path = tmp_path / "a.parquet"
    pq.write_table(t, path, row_group_size=250)  # 24 row groups, about 3.6 MB
    size = path.stat().st_size
    whole, _, _, _ = _read_all("parquet", path)
    docs, rejects, shards, per_shard = _read_all("parquet", path, counted, split_bytes=size // 7)
    assert len(shards) == -(-size // (size // 7)) >= 7 and not rejects
    assert [(d["id"], d["text"], d["url"], d["meta"]) for d in docs] == [(d["id"], d["text"], d["url"], d["meta"])
                                                                        for d in whole]
    assert [int(d["id"].rsplit("#", 1)[1]) for d in docs] == list(range(n))  # row index
    # contiguous row groups per part, parts in file order
    spec = InputSpec(format="parquet", paths=[str(path)], source="web")
    groups = [sorted({int(d["id"].rsplit("#", 1)[1]) // 250 for d in read_shard(s, spec).tables()[0].to_pylist()})
              for s in shards]
    flat = [g for gs in groups for g in gs]
    assert flat == list(range(24)) and all(gs == list(range(gs[0], gs[-1] + 1)) for gs in groups if gs)
    # each part reads its row groups and the footer (pyarrow reads the file's last 64 KiB for it)
    footer = pq.ParquetFile(path).metadata.serialized_size + 8
    assert sum(per_shard) <= 1.1 * size + len(shards) * max(footer, 64 * 1024)


# ---------------------------------------------------------------------------------------------
# streaming batches


@pytest.mark.parametrize("fmt, path, kw", [
    ("warc", CC_WARC, {}),
    ("jsonl", DATA / "jsonl/gsm8k_train_head400.jsonl.gz", {"text_field": "question"}),
])
def test_iter_read_batches_concatenate_to_read_shard(fmt, path, kw):
    spec = InputSpec(format=fmt, paths=[str(path)], source="web", **kw)
    (shard,) = plan_input("in", spec)
    docs, rejects = read_shard(shard, spec).tables()
    for rows, nbytes in ((3, None), (None, 50_000), (1, 1)):
        batches = list(iter_read(shard, spec, batch_rows=rows, batch_bytes=nbytes))
        assert len(batches) > 1
        tables = [b.tables() for b in batches]
        assert pa.concat_tables([d for d, _ in tables]).equals(docs)
        assert pa.concat_tables([r for _, r in tables]).equals(rejects)
        if rows:
            assert all(len(b) <= rows for b in batches)
        if nbytes:  # a batch closes after the record that crosses the bound
            biggest = max(len(x or b"") for x in docs.column("html" if fmt == "warc" else "text").to_pylist())
            assert all(b.held_bytes <= nbytes + biggest for b in batches)
        assert batches[-1].bytes_read == path.stat().st_size


def test_iter_read_empty_shard_yields_one_empty_batch(tmp_path):
    path = tmp_path / "single.warc.gz"
    path.write_bytes(gzip.compress(gzip.decompress(CC_WARC.read_bytes()), mtime=0))
    spec = InputSpec(format="warc", paths=[str(path)], source="web")
    (batch,) = list(iter_read(_parts(path, "warc", 4)[2], spec))
    d, r = batch.tables()
    assert d.num_rows == r.num_rows == 0 and "html" in d.column_names


def test_iter_read_holds_one_batch_not_the_shard(tmp_path):
    """A 5 MB WARC (the CC sample 40 times over) read in batches of 8 records: the reader's
    memory peak is a few batches, far below the shard's HTML."""
    path = tmp_path / "big.warc.gz"
    path.write_bytes(CC_WARC.read_bytes() * 40)
    spec = InputSpec(format="warc", paths=[str(path)], source="web")
    (shard,) = plan_input("in", spec)
    total = n = 0
    tracemalloc.start()
    try:
        for batch in iter_read(shard, spec, batch_rows=8):
            total += batch.held_bytes
            n += batch.num_docs
            del batch
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert n == 640 and total > 15e6
    assert peak < 4e6, peak
