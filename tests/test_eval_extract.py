"""`refinery eval extract` (issue #53): the measures of curation/extract/scores.py on hand-made
pages (each can fail: lost indentation, lines out of order, a flattened table, a dropped heading),
the gold-set loaders on the committed fixtures (tests/data/extract, see its README), the command
end to end on those fixtures with two engines, and --ab on a tiny run made from tests/data/warc."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from conftest import DATA
from curation.cli import app
from curation.extract import gold as eg
from curation.pipeline.evaluate import EvalError
from curation.pipeline.evaluate_extract import parse_engine_spec, stage_pages
from curation.extract import scores as xe

EXTRACT = DATA / "extract"
GOLD_FIXTURES = EXTRACT / "gold"  # laid out as the shared data folder (html/...)

GOLD = """<html><body><h2>Install</h2><ul><li>fast</li><li>small</li></ul>
<pre>def f(x):
    if x:
        return 1
</pre>
<table><tr><th>name</th><th>size</th></tr><tr><td>alpha</td><td>10</td></tr></table></body></html>"""
EXACT_MD = ("## Install\n\n- fast\n- small\n\n```\ndef f(x):\n    if x:\n        return 1\n```\n\n"
            "| name | size |\n| --- | --- |\n| alpha | 10 |")


def test_exact_output_keeps_everything():
    st = xe.gold_structure(GOLD)
    assert st.code == [["def f(x):", "    if x:", "        return 1"]] and st.rows == [["name", "size"], ["alpha", "10"]]
    assert st.headings == ["Install"] and st.items == ["fast", "small"] and st.docs_like
    got = xe.structure_kept(EXACT_MD, st)
    assert got == {"code_lines": (3, 3), "table_rows": (2, 2), "headings": (1, 1), "list_items": (2, 2)}
    plain = "Install\nfast\nsmall\ndef f(x):\n    if x:\n        return 1\nname\tsize\nalpha\t10"  # resiliparse's text
    assert xe.structure_kept(plain, st) == got
    assert xe.word_prf("a b c", "a b c") == (1.0, 1.0, 1.0)


def test_lost_indentation_order_flattened_table_and_missing_heading_score_lower():
    st = xe.gold_structure(GOLD)
    flat = "Install fast small\ndef f(x):\nif x:\nreturn 1\nname\nsize\nalpha\n10"
    got = xe.structure_kept(flat, st)
    assert got["code_lines"] == (1, 3)  # only the unindented line survives as written
    assert got["table_rows"] == (0, 2)  # cells on lines of their own are not rows
    assert got["headings"] == (0, 1) and got["list_items"] == (0, 2)
    # the whole block shifted (e.g. inside a list) keeps its relative indentation: kept
    assert xe.code_lines_kept(["  - item", "", "      def f(x):", "          if x:", "              return 1"],
                              st.code[0]) == 3
    # one line's indentation changed relative to the others: that line is lost
    assert xe.code_lines_kept(["def f(x):", "  if x:", "        return 1"], st.code[0]) == 2
    # lines out of order: the in-order part is kept
    assert xe.code_lines_kept(["        return 1", "def f(x):", "    if x:"], st.code[0]) == 2
    # a row's cells on one line but in another order, or run into each other's words, are not the row
    assert xe.structure_kept("size name\n10 alpha", st)["table_rows"] == (0, 2)
    assert xe.structure_kept("xname size\nalpha 10", st)["table_rows"] == (1, 2)


def test_code_blocks_broken_by_br_and_nested_list_items():
    st = xe.gold_structure("<body><pre><code><span>a = 1</span><br/>  b = 2<br>c</code></pre>"
                           "<ul><li>one<ul><li>inner</li></ul></li><li><p>para</p></li></ul></body>")
    assert st.code == [["a = 1", "  b = 2", "c"]]
    assert st.items == ["inner"]  # items holding lists or blocks are not one line


def test_word_prf_and_snippets():
    p, r, f = xe.word_prf("a b x y", "a b c d")
    assert p == r == f == 0.5
    assert xe.word_prf("a a b", "a b b b") == (2 / 3, 2 / 4, pytest.approx(2 * (2 / 3) * 0.5 / (2 / 3 + 0.5)))
    assert xe.word_prf("", "a") == (0.0, 0.0, 0.0)
    assert xe.snippet_rates("Hello  world. Footer", ["Hello world.", " "], ["Impressum", "Footer"]) == (1, 1, 1, 2)


def test_page_language_and_kind():
    assert xe.page_language('<html lang="de-AT"><body>x') == "de"
    assert xe.page_language("<html><body>x", "en-US") == "en" and xe.page_language("<html>") == "?"
    assert xe.page_kind("aeb", None) == "article" and xe.page_kind("trafilatura", None) == "other"
    assert xe.page_kind("readability", xe.gold_structure(GOLD)) == "docs-like"


def test_ab_figures_and_most_different():
    figs = xe.ab_figures({"a": ["one two three", "", "x y"], "b": ["one two three", "four", ""]})
    assert figs["engines"]["a"]["words"] == 5 and figs["engines"]["a"]["empty_pages"] == 1
    b = figs["engines"]["b"]
    assert b["one_empty_pages"] == 2 and b["mean_disagreement"] == pytest.approx(2 / 3)
    assert xe.most_different(["one two three", "", "x y"], ["one two three", "four", ""], 5) == [(2, 1.0), (1, 1.0)]


def test_engine_specs():
    assert parse_engine_spec("resiliparse") == {"engines": ("resiliparse",)}
    assert parse_engine_spec("resiliparse:markdown") == {"engines": ("resiliparse",), "format": "markdown"}
    assert parse_engine_spec("policy:route") == {"engines": ("resiliparse", "trafilatura"), "policy": "route"}
    assert parse_engine_spec("trafilatura+resiliparse:union:markdown") == {
        "engines": ("trafilatura", "resiliparse"), "policy": "union", "format": "markdown"}
    assert parse_engine_spec("resiliparse+trafilatura")["policy"] == "first"
    for bad, why in [("resiliparse:html", "neither a format"), ("jusText", "unknown engine"),
                     ("policy", "needs one of"), ("resiliparse:text:markdown", "two formats")]:
        with pytest.raises(EvalError, match=why):
            parse_engine_spec(bad)


# -- loaders on the committed fixtures -----------------------------------------------------------


def test_loaders_on_fixtures():
    aeb = eg.aeb(EXTRACT / "aeb_pages.tar.xz", EXTRACT / "aeb_ground_truth.json.gz")
    assert len(aeb) == 24 and all(p.text and p.html and p.url for p in aeb)
    traf = eg.load("trafilatura", GOLD_FIXTURES)
    assert len(traf) == 10 and all(p.with_ and p.url for p in traf) and sum(len(p.without) for p in traf) > 10
    rd = eg.load("readability", GOLD_FIXTURES)
    assert len(rd) == 10 and all(p.gold_html for p in rd)
    assert {p.name for p in rd} >= {"001", "keep-tabular-data", "v8-blog"}
    assert {xe.page_language(p.html, p.lang) for p in rd} == {"en", "de", "?"}  # metadata lang, else <html lang>
    assert sum(xe.gold_structure(p.gold_html).docs_like for p in rd) == 6


def test_loader_errors(tmp_path, monkeypatch):
    monkeypatch.setenv("REFINERY_DATA", str(tmp_path / "nowhere"))
    with pytest.raises(eg.GoldSetError, match="REFINERY_DATA"):
        eg.load("aeb")
    (tmp_path / "html").mkdir()
    with pytest.raises(eg.GoldSetError, match="ground-truth.json.gz: gold set file not found"):
        eg.load("aeb", tmp_path)
    with pytest.raises(eg.GoldSetError, match="neither one of"):
        eg.load("nosuchset")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"html": "<p>x</p>", "gold": "x"}\n{"html": "<p>y</p>"}\n')
    with pytest.raises(eg.GoldSetError, match=r"bad.jsonl:2: .*'html' and 'gold'"):
        eg.load(str(bad))
    bad.write_text("not json\n")
    with pytest.raises(eg.GoldSetError, match="bad.jsonl:1: not JSON"):
        eg.load(str(bad))


# -- the command end to end -----------------------------------------------------------------------


@pytest.fixture()
def fixture_data(tmp_path, monkeypatch):
    """A data folder laid out as the shared one, holding the repository's small gold sets."""
    html = tmp_path / "data" / "html"
    html.mkdir(parents=True)
    for f in (GOLD_FIXTURES / "html").iterdir():
        os.symlink(f, html / f.name)
    os.symlink(EXTRACT / "aeb_pages.tar.xz", html / "article_extraction_benchmark_pages.tar.xz")
    os.symlink(EXTRACT / "aeb_ground_truth.json.gz", html / "article_extraction_benchmark_ground-truth.json.gz")
    monkeypatch.setenv("REFINERY_DATA", str(tmp_path / "data"))
    return tmp_path


def test_eval_extract_command_on_the_fixture_sets(fixture_data):
    out = fixture_data / "rep.json"
    res = CliRunner().invoke(app, ["eval", "extract", "--gold", "aeb,trafilatura,readability", "--engines",
                                   "resiliparse,trafilatura", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "word F1" in res.output and "structure kept" in res.output
    rep = json.loads(out.read_text())
    assert rep["sets"] == {"aeb": 24, "trafilatura": 10, "readability": 10}
    assert rep["page_types"] == {"article": 28, "docs-like": 6, "other": 10}
    r, t = rep["engines"]["resiliparse"], rep["engines"]["trafilatura"]
    # measured on these pages (resiliparse 2.0.1, trafilatura 2.3.1): aeb F1 0.910 / 0.948
    assert 0.89 <= r["sets"]["aeb"]["f1"] < t["sets"]["aeb"]["f1"] <= 0.97
    assert r["sets"]["trafilatura"]["with"] == 1.0 and t["sets"]["trafilatura"]["with"] < 1.0
    assert r["sets"]["trafilatura"]["f1"] is None  # snippets only: no gold text
    # trafilatura's text format leaves tables out; resiliparse keeps rows on lines
    assert r["sets"]["readability"]["table_rows"] > 0.5 and t["sets"]["readability"]["table_rows"] == 0.0
    assert r["sets"]["readability"]["code_lines"] >= 0.9
    assert r["docs_per_cpu_s"] > t["docs_per_cpu_s"] > 0 and r["errors"] == t["errors"] == 0
    assert {"en", "de"} <= set(r["languages"]) and r["page_types"]["docs-like"]["pages"] == 6
    assert len(r["worst_f1"]) == 10 and r["worst_f1"][0]["f1"] <= r["worst_f1"][-1]["f1"]
    bad = CliRunner().invoke(app, ["eval", "extract", "--gold", "aeb", "--engines", "resiliparse:html"])
    assert bad.exit_code != 0 and "neither a format" in bad.output


def test_eval_extract_user_jsonl_markdown_is_scored_on_its_words(tmp_path):
    import lzma

    rows = []
    for name in ("mozilla_001", "mozilla_keep_tabular_data"):
        src = lzma.decompress((EXTRACT / f"{name}_source.html.xz").read_bytes()).decode()
        gold = lzma.decompress((EXTRACT / f"{name}_expected.html.xz").read_bytes()).decode()
        rows.append(json.dumps({"id": name, "html": src, "gold": gold}))
    (tmp_path / "gold.jsonl").write_text("\n".join(rows) + "\n")
    out = tmp_path / "rep.json"
    res = CliRunner().invoke(app, ["eval", "extract", "--gold", str(tmp_path / "gold.jsonl"), "--engines",
                                   "resiliparse,resiliparse:markdown", "--json", str(out), "--workers", "2"])
    assert res.exit_code == 0, res.output
    rep = json.loads(out.read_text())
    text, md = (rep["engines"][e]["sets"]["gold.jsonl"] for e in ("resiliparse", "resiliparse:markdown"))
    assert text["pages"] == md["pages"] == 2
    assert md["f1"] > 0.8 and abs(md["f1"] - text["f1"]) < 0.05  # markup is not counted as words
    assert md["table_rows"] >= max(0.9, text["table_rows"]) and md["code_lines"] >= 0.98


def _origins(run: Path, docs: list[dict]) -> list[dict]:
    import duckdb

    rows = duckdb.sql(f"select id, origin_file, origin_offset, origin_length from '{run}/extract/*.parquet'").fetchall()
    by_id = {r[0]: dict(origin_file=r[1], origin_offset=r[2], origin_length=r[3]) for r in rows}
    return [by_id[d["id"]] for d in docs]


def test_eval_extract_ab_on_a_tiny_run(tmp_path, ray_session):
    """--ab re-reads each kept document's WARC record (a ranged read of its gzip member): the
    resiliparse column must equal the text the run's own resiliparse stage kept, page for page."""
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.evaluate import run_reports
    from curation.pipeline.executor import run_dag
    from curation.pipeline.rundir import RunDir

    dag = parse_dag({"name": "ab", "inputs": {"crawl": {"format": "warc", "source": "web",
                                                         "paths": [str(DATA / "warc" / "dolma_sample-0000.warc.gz")]}},
                     "stages": {"extract": {"type": "extract", "input": "crawl"}}, "output": "extract"})
    run = tmp_path / "run"
    run_dag(dag, run, workers=1, quiet=True)
    res = CliRunner().invoke(app, ["eval", "extract", "--ab", str(run / "extract"), "--engines",
                                   "resiliparse,trafilatura", "--sample", "3"])
    assert res.exit_code == 0, res.output
    rep = json.loads((run / "extract" / "_eval_extract.json").read_text())
    e = rep["engines"]
    assert rep["documents"] == rep["pages"] > 10 and rep["not_found_again"] == 0
    assert e["resiliparse"]["words"] == e["as run"]["words"] and e["as run"]["mean_disagreement"] == 0.0
    assert 0 < e["trafilatura"]["words_vs_first"] < 1 and e["trafilatura"]["mean_disagreement"] > 0.05
    assert len(rep["most_different"]) == 3
    assert rep["reread"]["by_origin"] == rep["documents"] and 0 < rep["reread"]["origin_bytes_read"] < 214006
    # a run made before documents carried their origin: the same records found by id
    docs = [{"id": m["id"]} for m in rep["most_different"]]
    by_origin = [{"id": m["id"], **r} for m, r in zip(rep["most_different"], _origins(run, docs))]
    assert stage_pages(dag, "crawl", docs)[0] == stage_pages(dag, "crawl", by_origin)[0]
    assert stage_pages(dag, "crawl", docs)[1] == {"by_origin": 0, "by_id": 3, "files_read_whole": 0,
                                                  "origin_bytes_read": None}  # each its own member
    sample = (run / "extract" / "_eval_extract_sample.md").read_text()
    assert all(f"## {m['url']}" in sample for m in rep["most_different"])
    listed = [r for r in run_reports(RunDir(run)) if r["kind"] == "extract"]
    assert listed and listed[0]["target"] == "RUN/extract" and listed[0]["headline"][0]["name"] == "resiliparse: words/page"
    bad = CliRunner().invoke(app, ["eval", "extract", "--ab", str(tmp_path / "nope" / "extract")])
    assert bad.exit_code != 0


def test_wcxb_scoring_is_the_benchmarks():
    """WCXB's evaluate.py: lowercased \\w+ words as bags (counts clipped); a page whose gold has no
    words scores 1 only when the output has none either."""
    assert xe.word_prf("Hello, WORLD! hello", "hello world", "wcxb") == (2 / 3, 1.0, 0.8)
    assert xe.word_prf("Hello, WORLD!", "hello world")[2] == 0.0  # whitespace tokens: "Hello," != "hello"
    assert xe.word_prf("", "", "wcxb") == (1.0, 1.0, 1.0)
    assert xe.word_prf("menu", "  ", "wcxb") == (0.0, 0.0, 0.0)
    s = xe.score_page("", "", "some gold words", None, scoring="wcxb")
    assert s.empty and s.prf == (0.0, 0.0, 0.0)
    assert not xe.score_page("", "", "", None, scoring="wcxb").empty  # no main content: nothing to lose


def test_segment_prf_is_trafilaturas():
    # 3 of 4 must-have snippets found (tp 3, fn 1), 1 of 2 boilerplate snippets found (fp 1)
    got = xe.segment_prf(3, 4, 1, 2)
    assert got["seg_p"] == 0.75 and got["seg_r"] == 0.75 and abs(got["seg_f1"] - 0.75) < 1e-12
    assert xe.segment_prf(0, 0, 0, 0) == {"seg_p": None, "seg_r": None, "seg_f1": None}
    t = xe.Tally()
    t.add(xe.score_page("keep this. drop that", "keep this. drop that", None, None, ["keep this"], ["drop that"]))
    assert t.summary()["seg_p"] == 0.5 and t.summary()["seg_r"] == 1.0


def test_wcxb_gold_set_fixture():
    pages = eg.load("wcxb", GOLD_FIXTURES)
    assert len(pages) == 14 and all(p.scoring == "wcxb" and p.text and p.url and p.gold_markdown for p in pages)
    assert sorted({p.page_type for p in pages}) == ["article", "collection", "documentation", "forum", "listing",
                                                    "product", "service"]  # "category" read as collection
    assert all(p.with_ or p.without for p in pages)


def test_eval_extract_reports_wcxb_per_page_type(tmp_path):
    out = tmp_path / "r.json"
    env = {"REFINERY_DATA": str(GOLD_FIXTURES)}
    r = CliRunner().invoke(app, ["eval", "extract", "--gold", "wcxb", "--engines", "resiliparse", "--out", str(out)],
                           env=env)
    assert r.exit_code == 0, r.output
    rep = json.loads(out.read_text())
    e = rep["engines"]["resiliparse"]
    assert set(e["page_types"]) == {f"wcxb:{k}" for k in ("article", "forum", "product", "collection", "listing",
                                                          "documentation", "service")}
    assert all(v["pages"] == 2 and 0 <= v["f1"] <= 1 for v in e["page_types"].values())
    assert e["sets"]["wcxb"]["seg_f1"] is not None and isinstance(e["empty_pages"], list)
    assert {"type", "precision", "recall"} <= set(e["worst_f1"][0])
