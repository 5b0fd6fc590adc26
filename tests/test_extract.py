"""HTML -> main text (curation/stages/extract.py) on real pages: extraction quality against gold
article bodies, the Extract stage on real WARC records, charsets, and the per-document timeout.

Quality metric (issue #2): bag of whitespace tokens with multiset intersection,
P = |pred & gold| / |pred|, R = |pred & gold| / |gold|, F1 per page, averaged over pages.
Figures for all 181 pages and for engine options: tests/benchmarks/bench_extract.py.
"""

from __future__ import annotations

import lzma
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from fastwarc.warc import ArchiveIterator, WarcRecordType

from conftest import DATA
from curation.io.inputs import InputSpec, plan_input
from curation.io.read import read_shard
from curation.formats.documents import DOC_SCHEMA, HTML_SCHEMA
from curation.extract import gold as extract_gold
from curation.extract import engines
from curation.stages import extract as ex
from curation.extract.scores import word_prf

EXTRACT = DATA / "extract"
SHARED = extract_gold.shared_data()
ENGINES = ["resiliparse", "trafilatura"]
DEFAULT = ex.Extract().engine  # the one-engine shorthand, resolved ("resiliparse")

#: resiliparse options recommended for extract.py (bench_extract.py section 1): user comments and
#: post meta (bylines, dates) are not main text, list bullets are not words.
RECOMMENDED = dict(main_content=True, alt_texts=False, comments=False, post_meta=False, list_bullets=False)


def _recommended(html: str) -> str:
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(html, **RECOMMENDED)


#: per-page bag-of-whitespace-token P/R/F1 (the article-extraction benchmark's scoring as this
#: project states it; ``refinery eval extract`` reports the same)
prf = word_prf


def mean_prf(fn, htmls: dict[str, str], gold: dict[str, str]) -> tuple[float, float, float]:
    rows = [prf(fn(htmls[k]) or "", g) for k, g in gold.items()]
    return tuple(sum(r[i] for r in rows) / len(rows) for i in range(3))


def _load_pages(tar_path: Path, gold_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    pages = extract_gold.aeb(tar_path, gold_path)
    return {p.name: p.html for p in pages}, {p.name: p.text for p in pages}


# ---------------------------------------------------------------------------------------------
# Quality against gold article bodies
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def aeb_small():
    """24 pages of the article-extraction benchmark kept in the repo (see data/extract/README.md)."""
    return _load_pages(EXTRACT / "aeb_pages.tar.xz", EXTRACT / "aeb_ground_truth.json.gz")


#: Measured on the 24 fixture pages (resiliparse 2.0.1 / trafilatura 2.3.1): F1 0.904 / 0.948,
#: recall 0.974 / 0.994. Floors sit a bit under.
F1_FLOOR = {"resiliparse": 0.88, "trafilatura": 0.92}


@pytest.mark.parametrize("engine", ENGINES)
def test_engine_quality_floor_on_fixture_pages(aeb_small, engine):
    htmls, gold = aeb_small
    p, r, f1 = mean_prf(engines.ENGINES[engine], htmls, gold)
    assert f1 >= F1_FLOOR[engine], (engine, p, r, f1)
    assert r >= 0.95, (engine, p, r, f1)


def test_recommended_resiliparse_settings_on_fixture_pages(aeb_small):
    htmls, gold = aeb_small
    _, _, f1_rec = mean_prf(_recommended, htmls, gold)
    _, _, f1_cur = mean_prf(engines.ENGINES["resiliparse"], htmls, gold)
    assert f1_rec >= 0.89  # measured 0.910
    assert f1_rec >= f1_cur - 0.005


def test_default_engine_gap_on_fixture_pages(aeb_small):
    """The 0.02 rule of issue #2 cannot be judged on 24 pages: per-page F1 spreads ~0.1, so the
    mean difference has a standard error of ~0.02-0.03 here (measured gap: 0.044 with extract.py's
    settings, 0.038 with the recommended ones). The rule is checked on all 181 pages below; this
    only guards against a large regression of the default engine."""
    htmls, gold = aeb_small
    other = next(e for e in ENGINES if e != DEFAULT)
    f1_default = mean_prf(engines.ENGINES[DEFAULT], htmls, gold)[2]
    f1_other = mean_prf(engines.ENGINES[other], htmls, gold)[2]
    assert f1_default >= f1_other - 0.06, (DEFAULT, f1_default, other, f1_other)


@pytest.fixture(scope="module")
def aeb_full():
    tar = SHARED / "html/article_extraction_benchmark_pages.tar.xz"
    gt = SHARED / "html/article_extraction_benchmark_ground-truth.json.gz"
    if not (tar.exists() and gt.exists()):
        pytest.skip(f"shared data not found under {SHARED} (set REFINERY_DATA)")
    htmls, gold = _load_pages(tar, gt)
    assert len(gold) == 181
    f1 = {e: mean_prf(engines.ENGINES[e], htmls, gold)[2] for e in ENGINES}
    f1["recommended"] = mean_prf(_recommended, htmls, gold)[2]
    return f1


@pytest.mark.slow
def test_recommended_resiliparse_within_002_of_trafilatura_on_181_pages(aeb_full):
    # measured: 0.935 vs 0.954
    assert aeb_full["recommended"] >= aeb_full["trafilatura"] - 0.02, aeb_full


@pytest.mark.slow
def test_default_engine_within_002_of_the_other_on_181_pages(aeb_full):
    other = next(e for e in ENGINES if e != DEFAULT)
    assert aeb_full[DEFAULT] >= aeb_full[other] - 0.02, aeb_full


# ---------------------------------------------------------------------------------------------
# The Extract stage on real WARC records
# ---------------------------------------------------------------------------------------------


def _read(path: Path) -> tuple[pa.Table, list[dict]]:
    spec = InputSpec(format="warc", paths=[str(path)], source="web")
    tables, rejects = [], []
    for shard in plan_input("in", spec):
        d, r = read_shard(shard, spec).tables()
        tables.append(d)
        rejects += r.to_pylist()
    return pa.concat_tables(tables), rejects


@pytest.fixture(scope="module")
def english_warc():
    """37 HTML responses of two wget crawls (academic / creativecommons / allenai pages, English)."""
    return pa.concat_tables([_read(DATA / f"warc/dolma_sample-000{i}.warc.gz")[0] for i in (0, 1)])


def _check_stage_output(batch: pa.Table, res) -> tuple[list, list]:
    out = res.table
    assert out.schema.names == DOC_SCHEMA.names  # html and charset are dropped, nothing else
    assert "html" not in out.column_names and "charset" not in out.column_names
    assert out.column("id").to_pylist() == batch.column("id").to_pylist()
    assert out.column("url").to_pylist() == batch.column("url").to_pylist()
    texts = out.column("text").to_pylist()
    reasons = res.reasons.to_pylist()
    assert len(reasons) == batch.num_rows
    for t, why in zip(texts, reasons):
        if why is None:
            assert t and t == t.strip()
        else:
            assert why.startswith("extract:")
            if why != "extract:no_text":
                assert t is None
    return texts, reasons


@pytest.mark.parametrize("engine", ENGINES)
def test_extract_stage_on_english_warc_records(english_warc, engine):
    batch = english_warc
    assert batch.num_rows == 37 and batch.schema == HTML_SCHEMA
    texts, reasons = _check_stage_output(batch, ex.Extract(engine=engine).process(batch))
    kept = [t for t, why in zip(texts, reasons) if why is None]
    # measured: resiliparse 37/37, trafilatura 35/37 (2 pages -> extract:no_text)
    assert len(kept) >= 0.9 * batch.num_rows
    assert set(reasons) <= {None, "extract:no_text"}
    # main text, not the page: no markup and no script left
    assert not any("<div" in t or "function(" in t for t in kept)
    urls = batch.column("url").to_pylist()
    about = texts[urls.index("https://www.semanticscholar.org/about")]
    assert "Semantic Scholar" in about


@pytest.mark.parametrize("engine", ENGINES)
def test_extract_stage_on_common_crawl_records(engine):
    """Real Common Crawl responses (zh/ru spam-like pages, some with an HTTP charset, some not)."""
    batch, _ = _read(DATA / "warc/resiliparse_warcfile.warc.gz")
    assert batch.num_rows == 16
    texts, reasons = _check_stage_output(batch, ex.Extract(engine=engine).process(batch))
    assert sum(r is None for r in reasons) >= 12  # measured: 16/16 resiliparse
    assert not any("\ufffd" in t for t in texts if t)


@pytest.mark.parametrize("engine", ENGINES)
def test_text_agrees_with_common_crawl_wet(engine):
    """whirlwind.warc.gz's page and Common Crawl's own WET text of it: our main text should be
    (nearly) a sub-bag of CC's full-page text. Measured: 0.97 (resiliparse), 1.0 (trafilatura)."""
    batch, _ = _read(DATA / "warc/whirlwind.warc.gz")
    res = ex.Extract(engine=engine).process(batch)
    (text,) = res.table.column("text").to_pylist()
    (wet,) = [r.reader.read().decode("utf-8") for r in ArchiveIterator(
        str(DATA / "wet/whirlwind.warc.wet.gz"), record_types=WarcRecordType.conversion, parse_http=False)]
    ours, cc = Counter(text.split()), Counter(wet.split())
    assert sum((ours & cc).values()) / sum(ours.values()) >= 0.9
    assert "Escopete" in text


def _batch(htmls: list[bytes | None], charsets: list[str | None] | None = None) -> pa.Table:
    n = len(htmls)
    return pa.Table.from_pydict({
        "id": [f"t#{i}" for i in range(n)], "text": [None] * n, "source": ["web"] * n,
        "url": [f"http://example.com/{i}" for i in range(n)], "meta": [None] * n,
        "origin_file": [None] * n, "origin_offset": [None] * n, "origin_length": [None] * n,  # hand-made pages
        "html": htmls, "charset": charsets or [None] * n}, schema=HTML_SCHEMA)


PAGE = (b"<html><head><title>t</title></head><body><nav><a href='/'>Home</a></nav><article><h1>A title</h1>"
        + b"".join(b"<p>This is sentence number %d of a reasonably long article body about nothing.</p>" % i
                   for i in range(12)) + b"</article><footer>Imprint</footer></body></html>")


@pytest.mark.parametrize("engine", ENGINES)
def test_reasons_for_pages_without_text(engine):
    blank = b"<html><head><title>x</title><script>var a = 1;</script></head><body><script>f()</script></body></html>"
    batch = _batch([PAGE, b"", None, blank])
    texts, reasons = _check_stage_output(batch, ex.Extract(engine=engine).process(batch))
    assert reasons == [None, "extract:empty_html", "extract:empty_html", "extract:no_text"]
    assert "sentence number 11" in texts[0] and texts[1:3] == [None, None]
    # min_chars: a real page with less text than asked for
    res = ex.Extract(engine=engine, min_chars=100_000).process(_batch([PAGE]))
    assert res.reasons.to_pylist() == ["extract:no_text"]


def test_stage_refuses_input_without_html():
    with pytest.raises(ValueError, match="html"):
        ex.Extract().process(pa.Table.from_pydict({"id": ["a"], "text": ["x"]}))


# ---------------------------------------------------------------------------------------------
# Charsets
# ---------------------------------------------------------------------------------------------

SJIS = (EXTRACT / "chardet_shift_jis_no_charset.html").read_bytes()
SJIS_PHRASE = "衆院議院運営委員会は９日午後の理事会で"


def _clueweb_record() -> tuple[bytes, str | None]:
    (rec,) = [(r.reader.read(), r.http_charset) for r in ArchiveIterator(
        str(EXTRACT / "clueweb09_ja_eucjp_one_record.warc.gz"), record_types=WarcRecordType.response,
        quirks_mode=True)]
    return rec


@pytest.mark.parametrize("engine", ENGINES)
def test_http_charset_windows_1251(engine):
    batch, _ = _read(DATA / "warc/resiliparse_warcfile.warc.gz")
    i = batch.column("url").to_pylist().index("http://01spb.ru/company/")
    row = batch.slice(i, 1)
    assert row.column("charset").to_pylist() == ["windows-1251"]
    (text,) = ex.Extract(engine=engine).process(row).table.column("text").to_pylist()
    assert "Стратегия пожарной безопасности" in text
    assert not re.search("[ÐÑ][\x80-\xbf]|\ufffd", text)  # no UTF-8-as-Latin-1 mojibake


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("charset", ["euc-jp", None], ids=["http-charset", "detected"])
def test_euc_jp_clueweb_page(engine, charset):
    html, http_charset = _clueweb_record()
    assert http_charset == "euc-jp"
    (text,) = ex.Extract(engine=engine).process(_batch([html], [charset])).table.column("text").to_pylist()
    assert "ヘッドポーター" in text and "\ufffd" not in text


@pytest.mark.parametrize("engine", ENGINES)
def test_shift_jis_without_any_declared_charset_is_detected(engine):
    assert SJIS_PHRASE in engines.decode_html(SJIS, None)
    (text,) = ex.Extract(engine=engine).process(_batch([SJIS])).table.column("text").to_pylist()
    assert SJIS_PHRASE in text


def test_unknown_charset_label_falls_back_to_detection():
    assert SJIS_PHRASE in engines.decode_html(SJIS, "x-no-such-charset")


def test_wrong_http_charset_falls_back_to_detection():
    assert SJIS_PHRASE in engines.decode_html(SJIS, "utf-8")


@pytest.mark.parametrize("charset", [None, "iso-8859-1"], ids=["no-charset", "wrong-latin1-header"])
def test_valid_utf8_page_is_not_turned_into_mojibake(charset):
    raw = lzma.decompress((EXTRACT / "aeb_utf8_detected_as_cp1252.html.xz").read_bytes())
    assert engines.decode_html(raw, charset) == raw.decode("utf-8")


def test_reader_parses_lf_only_http_headers():
    docs, rejects = _read(EXTRACT / "clueweb09_ja_eucjp_one_record.warc.gz")
    assert rejects == [] and docs.num_rows == 1
    assert docs.column("charset").to_pylist() == ["euc-jp"]


def test_reader_removes_chunked_transfer_encoding():
    docs, _ = _read(DATA / "warc/dolma_sample-0001.warc.gz")
    leaked = [h[:8] for h in docs.column("html").to_pylist() if re.match(rb"\s*[0-9a-fA-F]{1,8}\r?\n", h)]
    assert leaked == []


# ---------------------------------------------------------------------------------------------
# Per-document timeout
# ---------------------------------------------------------------------------------------------


def _slow_engine(kind: str):
    def fn(html: str) -> str:
        if "SLOW" in html:
            end = time.monotonic() + 10
            if kind == "busy":
                x = 0
                while time.monotonic() < end:  # pure Python, never returns to C for long
                    x += 1
            else:
                time.sleep(10)
        return "extracted " + html[-20:]
    return fn


@pytest.mark.parametrize("kind", ["busy", "sleep"])
def test_per_document_timeout(monkeypatch, kind):
    monkeypatch.setitem(engines.ENGINES, "trafilatura", _slow_engine(kind))
    batch = _batch([b"<p>first page</p>", b"<p>SLOW page</p>", b"<p>third page</p>"])
    t0 = time.monotonic()
    res = ex.Extract(engine="trafilatura", timeout_s=0.5).process(batch)
    elapsed = time.monotonic() - t0
    assert elapsed < 3, elapsed
    assert res.reasons.to_pylist() == [None, "extract:timeout", None]
    texts = res.table.column("text").to_pylist()
    assert texts[1] is None and "first page" in texts[0] and "third page" in texts[2]
    remaining = signal.getitimer(signal.ITIMER_REAL)[0]
    assert remaining == 0 or remaining > 1, remaining  # our 0.5 s alarm is not left armed


def test_timeout_keeps_an_outer_alarm():
    fired = []
    old = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    try:
        signal.setitimer(signal.ITIMER_REAL, 100)
        ex.Extract(timeout_s=0.5).process(_batch([PAGE]))
        remaining = signal.getitimer(signal.ITIMER_REAL)[0]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert 90 < remaining <= 100 and not fired


def test_stage_runs_off_the_main_thread():
    """SIGALRM is main-thread only: elsewhere a document is timed, not interrupted, and extraction works."""
    out = {}
    th = threading.Thread(target=lambda: out.setdefault("r", ex.Extract(timeout_s=0.5).process(_batch([PAGE]))))
    th.start()
    th.join(30)
    assert out["r"].reasons.to_pylist() == [None]


@pytest.mark.parametrize("engine", ["resiliparse", "trafilatura"])
def test_uninterruptible_documents_are_timed_without_signals(monkeypatch, engine):
    """resiliparse's C++ cannot be interrupted: a page over the limit is rejected when it
    returns, with no SIGALRM handler installed (it cost four signal calls a page); the same
    for a Python extractor off the main thread, where no signal arrives."""
    handlers = []

    def slow_engine(html: str) -> str:
        handlers.append(signal.getsignal(signal.SIGALRM))
        if "SLOW" in html:
            time.sleep(0.7)  # returns on its own, after the limit
        return "extracted " + html[-20:]

    monkeypatch.setitem(engines.ENGINES, engine, slow_engine)
    batch = _batch([b"<p>first page</p>", b"<p>SLOW page</p>", b"<p>third page</p>"])
    before = signal.getsignal(signal.SIGALRM)
    if engine == "resiliparse":
        res = ex.Extract(engine=engine, timeout_s=0.5).process(batch)
        assert handlers == [before] * 3  # no handler of ours was installed
    else:
        out = {}
        th = threading.Thread(target=lambda: out.setdefault("r", ex.Extract(engine=engine, timeout_s=0.5).process(batch)))
        th.start()
        th.join(30)
        res = out["r"]
    assert res.reasons.to_pylist() == [None, "extract:timeout", None]
    assert res.table.column("text").to_pylist()[1] is None
    remaining = signal.getitimer(signal.ITIMER_REAL)[0]
    assert signal.getsignal(signal.SIGALRM) == before and (remaining == 0 or remaining > 1)  # an outer alarm kept
