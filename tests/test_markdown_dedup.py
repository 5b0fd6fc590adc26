"""Markdown through dedup (issue #53 item 3): the text field's mark (``refinery.markup``) survives
every writer and every stage that rewrites the text, and a later run over the shards sees it;
exact and near dedup key a Markdown page by its plain view (``markup.plain_view``), so
two copies that differ only in markup are duplicates, as their text extractions are, while the
stored text stays the Markdown. Unmarked text is keyed as it always was."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from curation.dedup.exact import duplicate_keys, text_keys
from curation.dedup.minhash import jaccard, shingle_sets
from curation.io.artifacts import read_partition
from curation.io.shards import replace_column
from curation.stages import exact_dedup, minhash_dedup
from curation.stages.exact_dedup import ExactDedup, KeysJob, apply_task, keys_task
from curation.stages.minhash_dedup import MinHashDedup, SignatureJob, Verify, signature_task
from curation.extract.engines import extract_page
from curation.text.markup import MARKUP_KEY
from curation.text.markup import markup_of, plain_view
from curation.text.state import TextState

MD_FIELD = pa.field("text", pa.string(), metadata={MARKUP_KEY: b"markdown"})

_WORDS = ("river town bridge market grain tools cloth children swim water mill summer school church reading "
          "writing travelers inn bread soup valley farmer harvest autumn winter snow road cart horse baker").split()


def _lines(seed: int, n: int = 24) -> list[str]:
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(_WORDS, 7)) for _ in range(n)]


def _copies(seed: int) -> tuple[str, str]:
    """One page twice: dense Markdown (heading, bullets with bold, a table, a numbered list) and
    the same words and lines without markup (what its text extraction holds)."""
    lines = _lines(seed)
    md = ("## Title of the page\n\n" + "\n".join(f"- **{ln.split()[0]}** {' '.join(ln.split()[1:])}" for ln in lines[:12])
          + "\n\n| name | value |\n| --- | --- |\n| alpha | one |\n\n"
          + "\n".join(f"{i + 1}. {ln}" for i, ln in enumerate(lines[12:])))
    plain = "Title of the page\n\n" + "\n".join(lines[:12]) + "\n\nname\tvalue\n\nalpha\tone\n\n" + "\n".join(lines[12:])
    return md, plain


def _shard(path: Path, texts: list[str], marked: bool) -> str:
    field = MD_FIELD if marked else pa.field("text", pa.string())
    schema = pa.schema([pa.field("id", pa.string()), field])
    pq.write_table(pa.Table.from_arrays([pa.array([f"d{i}" for i in range(len(texts))]), pa.array(texts)],
                                        schema=schema), path)
    return str(path)


def _keys(tmp_path: Path, path: str, level: str, name: str) -> pa.Table:
    """The stage's phase 1 (keys of the shard) read back from every partition."""
    stage = ExactDedup(level=level, partitions=2)
    out = str(tmp_path / f"{name}.parquet")
    keys_task(KeysJob((path,), 0, out, level, 2, 0, stage.header()))
    return pa.concat_tables([read_partition(out, p, stage.header()) for p in range(2)])


def _duplicate_rows(keys: pa.Table) -> set[tuple[int, int]]:
    dup = duplicate_keys(keys)
    return set(zip(keys.column("row").to_numpy()[dup].tolist(), keys.column("para").to_numpy()[dup].tolist()))


def test_the_plain_view_is_the_markup_free_copy():
    md, plain = _copies(1)
    assert plain_view(pa.array([md]))[0].as_py().split() == plain.split()  # same words, same order
    assert md.count("\n") == plain_view(pa.array([md]))[0].as_py().count("\n")  # line for line


@pytest.mark.parametrize("marked", [True, False], ids=["markdown", "text"])
def test_exact_document_keys_on_the_plain_view(tmp_path, marked):
    md, plain = _copies(1)
    other, _ = _copies(2)
    path = _shard(tmp_path / "up.parquet", [md, plain, other], marked)
    keys = _keys(tmp_path, path, "document", "keys")
    if marked:  # the copy in plain Markdown is a duplicate of the one with markup
        assert _duplicate_rows(keys) == {(1, -1)}
    else:  # unmarked: keyed on the stored text, as before (the markup tells them apart)
        assert _duplicate_rows(keys) == set()
        _, _, h, h2 = text_keys(pa.array([md, plain, other]), "document", 0)
        order = np.argsort(keys.column("row").to_numpy())
        assert (keys.column("hash").to_numpy()[order] == h).all() and (keys.column("hash2").to_numpy()[order] == h2).all()


def test_a_markdown_page_keys_as_its_text_extraction():
    """The same page extracted as Markdown and as text gets one document key (heading marks and
    table pipes are not words), and a copy of it whose HTML has no heading or table too."""
    sentences = ["The river town grew slowly around its old stone bridge over many quiet years.",
                 "A small school opened near the church and taught reading, writing and sums to all.",
                 "Travelers wrote that the inn served the best bread and soup in the whole valley."]
    rich = ("<html><body><article><h2>The history of the river town.</h2>"
            f"<p>{sentences[0]}</p><p>{sentences[1]}</p><table><tr><th>Year</th><th>Event</th></tr>"
            "<tr><td>1850</td><td>The mill was built.</td></tr><tr><td>1872</td><td>The school opened.</td></tr></table>"
            f"<p>{sentences[2]}</p></article></body></html>")
    flat = ("<html><body><article><p>The history of the river town.</p>" + "".join(f"<p>{s}</p>" for s in sentences[:2])
            + "<p>Year Event</p><p>1850 The mill was built.</p><p>1872 The school opened.</p>"
            + f"<p>{sentences[2]}</p></article></body></html>")
    md = extract_page(rich, format="markdown")
    assert md.startswith("## The history") and "| 1850 | The mill was built. |" in md
    texts = pa.array([md, extract_page(rich, format="text"), extract_page(flat, format="markdown")])
    plain_keys = text_keys(plain_view(texts), "document", 0)[2]
    assert len(set(plain_keys.tolist())) == 1
    assert text_keys(texts, "document", 0)[2][0] != plain_keys[0]  # the raw Markdown is another key


@pytest.mark.parametrize("marked", [True, False], ids=["markdown", "text"])
def test_paragraph_level_removes_markdown_lines_by_their_plain_keys(tmp_path, marked):
    """Paragraph keys of the plain view name the Markdown lines removed: a paragraph seen earlier
    with other markup goes, code fences and table separator rows (no text, no key) stay, and a
    page left with markup only is dropped as empty."""
    shared = "the shared paragraph says the same words in every copy"
    docs = [f"# Page one\n\n**the shared paragraph** says the same words in every copy\n\n```\nx = 1\n```\n"
            "| a | b |\n| --- | --- |\n| c | d |",
            f"Page two starts here\n\n- {shared}\n\n```\ny = 2\n```\n| e | f |\n| --- | --- |\n| g | h |",
            f"```\n{shared}\n```"]
    path = _shard(tmp_path / "up.parquet", docs, marked)
    keys = _keys(tmp_path, path, "paragraph", "pkeys")
    dups = _duplicate_rows(keys)
    rows = sorted(dups)
    table = pa.table({"row": pa.array([r for r, _ in rows], pa.int32()), "para": pa.array([p for _, p in rows], pa.int32())})
    kept, rejected, n = apply_task("exact", path, table, "paragraph")
    assert n == 3
    if not marked:  # the raw lines differ in markup: only markup is shared (fences, separator rows)
        assert {docs[r].split("\n")[p] for r, p in dups} == {"```", "| --- | --- |"}
        return
    assert dups == {(1, 2), (2, 1)}  # "- shared..." of page two, the fenced line of page three
    assert kept.column("text").to_pylist() == [
        docs[0], "Page two starts here\n\n\n```\ny = 2\n```\n| e | f |\n| --- | --- |\n| g | h |"]
    assert rejected.column("reason").to_pylist() == [exact_dedup.REASON_EMPTY]  # "```\n```" holds no text
    assert markup_of(kept.schema.field("text")) == "markdown"  # the rewritten text keeps its mark
    assert kept.column("dup_paragraphs").to_pylist() == [0, 1]


def _signature_buckets(tmp_path: Path, path: str, name: str) -> tuple[pa.Table, MinHashDedup]:
    stage = MinHashDedup(partitions=2)
    b, r = stage.band_rows()
    out = str(tmp_path / f"{name}.parquet")
    signature_task(SignatureJob((path,), 0, None, out, stage.hasher(), b, r, 2, stage.header()))
    return pa.concat_tables([read_partition(out, p, stage.header()) for p in range(2)]), stage


def _bands_shared(buckets: pa.Table, u: int, v: int) -> int:
    rows = {}
    for band, bucket, doc in zip(*(buckets.column(c).to_pylist() for c in ("band", "bucket", "doc"))):
        rows.setdefault(doc, set()).add((band, bucket))
    return len(rows[u] & rows[v])


@pytest.mark.parametrize("marked", [True, False], ids=["markdown", "text"])
def test_minhash_shingles_the_plain_view(tmp_path, marked):
    md, plain = _copies(3)
    other, _ = _copies(4)
    path = _shard(tmp_path / "up.parquet", [md, other, plain], marked)
    buckets, stage = _signature_buckets(tmp_path, path, "buckets")
    bands, _ = stage.band_rows()
    raw = jaccard(*shingle_sets(pa.array([md, plain]), stage.ngram))
    assert raw < stage.threshold  # the markup alone keeps the raw copies apart
    spec = Verify((path,), (0,), stage.ngram, stage.threshold)
    verified = minhash_dedup._verify(np.array([0, 0]), np.array([2, 1]), spec).tolist()
    if marked:  # one signature: the copies meet in every band, and verify at Jaccard 1
        assert _bands_shared(buckets, 0, 2) == bands and verified == [True, False]
    else:
        assert _bands_shared(buckets, 0, 2) < bands and verified == [False, False]
    assert _bands_shared(buckets, 0, 1) == 0


def test_signatures_of_a_union_mixing_marked_and_unmarked_shards(tmp_path):
    """A block of a union's shards: batches are joined only under one mark (the text shard's
    raw Markdown-looking text is not stripped, the Markdown shard's is)."""
    md, plain = _copies(5)
    a = _shard(tmp_path / "a.parquet", [md], marked=False)
    b = _shard(tmp_path / "b.parquet", [plain], marked=True)
    c = _shard(tmp_path / "c.parquet", [md], marked=True)
    stage = MinHashDedup(partitions=2)
    bands, rows = stage.band_rows()
    out = str(tmp_path / "buckets.parquet")
    signature_task(SignatureJob((a, b, c), 0, None, out, stage.hasher(), bands, rows, 2, stage.header()))
    buckets = pa.concat_tables([read_partition(out, p, stage.header()) for p in range(2)])
    assert _bands_shared(buckets, 1, 2) == bands and _bands_shared(buckets, 0, 1) < bands


def test_rewriting_stages_keep_the_mark():
    """A stage that writes its text back (C4's kept lines, PII, normalize, a rejected row's
    payload made null) keeps the field, and the state it hands on says Markdown."""
    from curation.stages.c4_quality import C4QualityFilter
    from curation.stages.normalize import Normalize
    from curation.stages.pii import PiiScrub

    texts = ["# A heading of the page.\nThe first sentence is long enough. Mail me at a@example.com now.\n- item",
             "Only a short line"]
    batch = pa.Table.from_arrays([pa.array(["1", "2"]), pa.array(texts)],
                                 schema=pa.schema([pa.field("id", pa.string()), MD_FIELD]))
    for stage in (C4QualityFilter(min_num_sentences=1), PiiScrub(), Normalize()):
        res = stage.run_batch(batch, None)
        assert markup_of(res.table.schema.field("text")) == "markdown", stage
        assert res.text is None or res.text.markup == "markdown", stage
    bare = replace_column(batch, "text", pa.array(["x", "y"]))
    assert bare.schema.field("text").metadata == MD_FIELD.metadata
    assert replace_column(batch, "new", pa.array([1, 2])).column_names == ["id", "text", "new"]


# ---------------------------------------------------------------------------------------------
# a run: extract (markdown) -> filters -> exact -> minhash, and a second run over it


def _warc(path: Path, pages: list[str]) -> str:
    """A gzipped WARC of HTML responses, one member per record."""
    with open(path, "wb") as f:
        for i, html in enumerate(pages):
            body = html.encode()
            http = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n" + \
                f"Content-Length: {len(body)}\r\n\r\n".encode() + body
            head = (f"WARC/1.0\r\nWARC-Type: response\r\nWARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-{i:012d}>\r\n"
                    f"WARC-Date: 2024-01-01T00:00:00Z\r\nWARC-Target-URI: http://example.org/page{i}\r\n"
                    f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(http)}\r\n\r\n").encode()
            f.write(gzip.compress(head + http + b"\r\n\r\n"))
    return str(path)


_TOWN = ["The river town grew slowly around its old stone bridge over many quiet years.",
         "Farmers brought grain to the market every week and traded it for tools and cloth.",
         "A small school opened near the church and taught reading, writing and sums to all.",
         "Travelers wrote that the inn served the best bread and soup in the whole valley."]
_OTHER = ["The harbour city traded salt and fish with ships that came from far away islands.",
          "Sailors mended their nets on the long wooden pier while gulls circled above them.",
          "Merchants built tall houses of red brick along the canal that ran through the centre.",
          "In winter the storms kept the boats in port and the taverns were full every night."]


def _pages() -> list[str]:
    rich = ("<html><body><article><h2>The history of the river town.</h2>" + f"<p>{_TOWN[0]} {_TOWN[1]}</p>"
            + "<table><tr><th>Year</th><th>Event</th></tr><tr><td>1850</td><td>The mill was built by the river.</td></tr>"
            + "<tr><td>1872</td><td>The school opened its doors to all.</td></tr></table>"
            + f"<p>{_TOWN[2]} {_TOWN[3]}</p></article></body></html>")
    flat = ("<html><body><article><p>The history of the river town.</p>" + f"<p>{_TOWN[0]} {_TOWN[1]}</p>"
            + "<p>Year Event</p><p>1850 The mill was built by the river.</p><p>1872 The school opened its doors to all.</p>"
            + f"<p>{_TOWN[2]} {_TOWN[3]}</p></article></body></html>")
    other = ("<html><body><article><h2>The story of the harbour city.</h2>" + "".join(f"<p>{s}</p>" for s in _OTHER)
             + "</article></body></html>")
    return [rich, other, flat]


def _shards(run: Path, node: str) -> list[tuple[str, str]]:
    """(kept or rejected, path) of every committed file of ``node``."""
    from curation.pipeline.rundir import RunDir

    rd = RunDir(run)
    dag = rd.load_dag()
    out = []
    for e in rd.committed(node, dag.hashes()[node]).values():
        out += [(kind, rd.path(e[k])) for kind, k in (("kept", "file"), ("rejected", "rejected_file")) if e.get(k)]
    return out


def test_a_run_keeps_the_mark_and_dedups_markdown_by_its_plain_view(tmp_path, ray_session):
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag

    crawl = _warc(tmp_path / "crawl.warc.gz", _pages())
    stages = {"extract": {"type": "extract", "input": "crawl", "format": "markdown"},
              "gopher": {"type": "gopher_quality", "input": "extract", "min_doc_words": 20},
              "c4": {"type": "c4_quality", "input": "gopher", "min_num_sentences": 1},
              "exact": {"type": "exact_dedup", "input": "c4", "partitions": 2},
              "near": {"type": "minhash_dedup", "input": "exact", "partitions": 2}}
    dag = parse_dag({"name": "md", "inputs": {"crawl": {"format": "warc", "paths": [crawl], "source": "web"}},
                     "stages": stages, "output": "near", "rejected_text": "all"}, "md.yaml")
    first = tmp_path / "first"
    run_dag(dag, first, workers=2, quiet=True)
    for node in stages:  # every file holding text (gopher writes its signals only: c4 reads its rows)
        files = [p for _, p in _shards(first, node) if "text" in pq.read_schema(p).names]
        assert files or node == "gopher", node
        assert all(markup_of(pq.read_schema(p).field("text")) == "markdown" for p in files), node
    kept = pq.read_table([p for k, p in _shards(first, "c4") if k == "kept"][0])
    texts = kept.column("text").to_pylist()
    assert len(texts) == 3 and sum(t.startswith("## The history") for t in texts) == 1  # stored as Markdown
    rejected = [pq.read_table(p) for k, p in _shards(first, "exact") if k == "rejected"]
    assert [t.column("reason").to_pylist() for t in rejected] == [[exact_dedup.REASON_DUPLICATE]]
    assert "river town" in rejected[0].column("text")[0].as_py()  # one copy of the town page: markup apart
    assert sum(pq.read_metadata(p).num_rows for k, p in _shards(first, "near") if k == "kept") == 2

    second = parse_dag({"name": "md2", "inputs": {"docs": {"format": "run", "run": str(first), "stage": "near"}},
                        "stages": {"gopher2": {"type": "gopher_quality", "input": "docs", "min_doc_words": 20},
                                   "exact2": {"type": "exact_dedup", "input": "gopher2", "partitions": 2}},
                        "output": "exact2"}, "md2.yaml")
    run_dag(second, tmp_path / "second", workers=2, quiet=True)
    for node in ("gopher2", "exact2"):  # gopher2 writes whole rows: exact2 reads them
        files = [p for _, p in _shards(tmp_path / "second", node)]
        assert files and all(markup_of(pq.read_schema(p).field("text")) == "markdown" for p in files), node
        for p in files:  # what a stage of the second run is handed: Markdown, judged by its plain view
            assert TextState.of(pq.read_table(p)).markup == "markdown"
