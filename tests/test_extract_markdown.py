"""extract format: markdown (headings, lists, fenced code, tables, math), its plain view for the
filters, and the multi-engine policies (issue #53 items 2-4)."""

from __future__ import annotations

import lzma
import textwrap

import pyarrow as pa
import pytest

from conftest import DATA
from curation.extract import engines
from curation.stages import extract as ex
from curation.extract import policy as engine_policy
from curation.extract.engines import extract_page
from curation.text.markup import plain_view
from curation.text.state import TextState

FIX = DATA / "extract"
PROSE = "<p>" + "This paragraph is the main text of the page and it is long enough to count. " * 3 + "</p>"


def _page(body: str) -> str:
    return f"<html><head><title>t</title></head><body><nav><a href='/'>Home</a></nav><article>{PROSE}{body}{PROSE}</article></body></html>"


def _fixture(name: str) -> str:
    return lzma.decompress((FIX / name).read_bytes()).decode("utf-8")


def test_table_kept_as_rows():
    html = _page("<table><tr><th>Name</th><th>Value</th></tr><tr><td>alpha</td><td>1 | 2</td></tr>"
                 "<tr><td>beta</td><td>3</td></tr></table>")
    md = extract_page(html, format="markdown")
    assert "| Name | Value |\n| --- | --- |\n| alpha | 1 \\| 2 |\n| beta | 3 |" in md
    # the table sits between the two paragraphs, where the page has it
    assert md.index("main text") < md.index("| Name") < md.rindex("main text")
    assert "| alpha" not in extract_page(html, format="text")  # text keeps no rows


def test_layout_table_not_written_as_rows():
    html = _page("<table><tr><td><table><tr><td>a</td><td>b</td></tr><tr><td>c</td><td>d</td></tr></table></td>"
                 "<td>x</td></tr><tr><td>y</td><td>z</td></tr></table>")
    from curation.extract.markdown import _mark, _table_markdown

    parts: list[str] = []
    out = _mark(html, parts, 0)[0]
    assert parts == ["| a | b |\n| --- | --- |\n| c | d |"]  # the inner data table only
    assert "<table><tr><td><p>" in out and "<td>y</td>" in out  # the outer (layout) table stays
    assert _table_markdown("<table><tr><td>a</td><td>b</td></tr></table>") is None  # one row
    assert _table_markdown("<table><tr><td>a</td></tr><tr><td>b</td></tr></table>") is None  # one column
    assert _table_markdown("<table><tr><td>a</td><td>b</td></tr><tr><td><form></form></td><td>d</td></tr></table>") is None
    assert _mark("</table><TABLE><TR><TD>a<TD>b<TR><TD>c<TD>d</TABLE>", parts, 0)[0].startswith("</table><p>")
    assert "| y | z |" not in extract_page(html, format="markdown")


def test_code_fenced_with_indentation():
    code = "def f(x):\n    if x < 2:\n        return [x * 2]\n    return None"
    md = extract_page(_page(f"<pre><code>{code.replace('<', '&lt;')}</code></pre>"), format="markdown")
    assert f"```\n{code}\n```" in md  # no escaping of * or < inside code, indentation kept


def test_math_as_tex():
    html = _page('<p>Inline <math><semantics><mi>x</mi><annotation encoding="application/x-tex">x_i^2</annotation>'
                 '</semantics></math> and <script type="math/tex">a*b</script> and '
                 '<span class="katex"><span class="katex-mathml"><math><semantics><mi>y</mi>'
                 '<annotation encoding="application/x-tex">\\frac{1}{y}</annotation></semantics></math></span>'
                 '<span class="katex-html">1/y rendered</span></span> end of a long enough sentence here.</p>'
                 '<script type="math/tex; mode=display">\\sum_i a_i</script>'
                 '<math display="block" alttext="E=mc^2"><mi>E</mi></math>')
    md = extract_page(html, format="markdown")
    assert "Inline $x_i^2$ and $a*b$ and $\\frac{1}{y}$ end" in md
    assert "rendered" not in md  # KaTeX's visual copy is not the text
    assert "\n$$\\sum_i a_i$$\n" in md and "$$E=mc^2$$" in md


def test_headings_and_lists():
    html = ("<html><body><article><h1>Main title</h1>" + PROSE + "<h2>Section two</h2>" + PROSE + "</article></body></html>")
    md = extract_page(html, format="markdown")
    assert md.startswith("# Main title") and "\n## Section two\n" in md
    # lists: resiliparse's main-content mode keeps a list only where it judges it content; what it
    # keeps is written as Markdown items (trafilatura keeps them as such too)
    lst = _page("<ul><li>first item of the list</li><li>second item of the list</li></ul>")
    assert "- first item of the list\n- second item of the list" in extract_page(lst, engines=["trafilatura"],
                                                                                 format="markdown")


def test_real_page_code_blocks_kept():
    """mozilla readability 001: every line of the expected content's 4 code blocks, with its
    indentation, comes out as a line of the Markdown, fenced."""
    from resiliparse.parse.html import HTMLTree

    md = extract_page(_fixture("mozilla_001_source.html.xz"), format="markdown")
    tree = HTMLTree.parse(_fixture("mozilla_001_expected.html.xz"))
    lines = set(md.split("\n"))
    gold = [ln.rstrip() for pre in tree.body.query_selector_all("pre") for ln in textwrap.dedent(pre.text).split("\n")
            if ln.strip()]
    assert len(gold) >= 10
    assert sum(ln in lines for ln in gold) / len(gold) >= 0.98
    assert md.count("```") >= 8


def test_real_page_table_rows_kept():
    """mozilla readability keep-tabular-data: the expected content's table (a header row of 8
    stages, then one row a task, image cells) comes out as Markdown rows, one line a row."""
    md = extract_page(_fixture("mozilla_keep_tabular_data_source.html.xz"), format="markdown")
    expected = _fixture("mozilla_keep_tabular_data_expected.html.xz")
    n_rows = expected.count("<tr")
    md_rows = [ln for ln in md.split("\n") if ln.startswith("| ") and ln.endswith(" |")]
    assert n_rows >= 20 and len(md_rows) >= 0.9 * n_rows, (len(md_rows), n_rows)
    assert any(ln.startswith("|  | General UX | UX draft | UX review |") for ln in md_rows)
    assert any(ln.startswith("| Load map |") for ln in md_rows)


def test_plain_view_strips_markup_line_for_line():
    md = ("# Title\n\nSome **bold** and *em*, 5 * 3 = 15, $x^2$ costs $5.\n\n- item one\n2. item two\n\n"
          "```\ncode  line\n```\n\n| a | b |\n| --- | --- |\n| 1 | 2 \\| 3 |\n> quoted")
    (plain,) = plain_view(pa.array([md])).to_pylist()
    assert plain == ("Title\n\nSome bold and em, 5 * 3 = 15, x^2 costs $5.\n\nitem one\nitem two\n\n"
                     "\ncode  line\n\n\na\tb\n\n1\t2 | 3\nquoted")
    assert plain.count("\n") == md.count("\n")
    assert plain_view(pa.chunked_array([["a"], [None]])).to_pylist() == ["a", None]


def test_plain_view_gated_by_marks_equals_every_rule_on_every_text():
    """``plain_view`` (the compiled scans, each text-wide rule run only on texts holding its
    byte) and ``plain_view_by_rules`` (each group of rules only on the texts holding its mark
    bytes): the same output as every rule on every text, whatever the mix (texts with one mark,
    several, none, empty, null) and on a slice (an array whose offsets do not start at 0)."""
    from curation.text.markup_reference import plain_view_by_rules

    import pyarrow.compute as pc

    from curation.text.markup import RULES

    docs = ["# Title\n\nplain words", "| a | b |\n| --- | --- |\n| 1 | 2 |", "no marks at all", "",
            None, "```\n  code\n```", "> quote with **bold** and $x$", "a \\* b, c_d, ~~~ 5 * 3",
            "- item\n1. one\n# not a heading# \n#also not", "x|y and $5 and __u__"] * 3
    every = pa.array(docs)
    for _, rules in RULES:  # the reference: no gate
        for pattern, replacement in rules:
            every = pc.replace_substring_regex(every, pattern, replacement)
    for view in (plain_view, plain_view_by_rules):
        assert view(pa.array(docs)).to_pylist() == every.to_pylist()
        sliced = pa.array(["# skip me"] + docs)[1:]
        assert view(sliced).to_pylist() == every.to_pylist()


def _random_markup(n: int, seed: int) -> list[str]:
    """Texts strung from the rules' marks and their near misses (7 "#", 10 digits, "$5", "\\|"),
    blanks, line breaks (\r and \f too) and 2-4 byte UTF-8 characters, 0-30 pieces each."""
    import random

    rng = random.Random(seed)
    pieces = ["#", "##", "######", "#######", " ", "  ", "\t", "\n", "\n\n", "\r", "\f", "|", " | ", "|---|",
              "---", ":---:", "-", "*", "**", "***", "_", "__", "+", "1.", "12)", "123456789.", "1234567890.",
              ">", "> ", " >", "$", "$$", "$5", "\\", "\\|", "\\*", "\\a", "```", "~~~", "``", "`", "a", "word",
              "é", "中", "😀", ".", ")", ":", "x*y", "$x$", "é$ "]
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 30))) for _ in range(n)]


def test_plain_view_compiled_equals_the_rules_on_random_markup():
    """The compiled scans against the regex chain they replace (the reference), on 20,000
    random texts of marks: same bytes, text for text. Leftmost, non-overlapping matches and
    whole UTF-8 characters where a rule consumes any character are what this pins (a scan that
    stepped bytewise through "é$ " removed the "$")."""
    from curation.text.markup_reference import plain_view_by_rules

    texts = pa.array(_random_markup(20_000, seed=53) + [None, ""])
    got, want = plain_view(texts).to_pylist(), plain_view_by_rules(texts).to_pylist()
    bad = [(t, g, w) for t, g, w in zip(texts.to_pylist(), got, want) if g != w]
    assert not bad, bad[:5]


def test_plain_view_compiled_equals_the_rules_on_real_pages():
    """... and on the Markdown of real pages: the article-extraction benchmark's pages kept in
    the repo and the two Mozilla pages (tables, code)."""
    from curation.extract import gold as extract_gold
    from curation.text.markup_reference import plain_view_by_rules

    pages = [p.html for p in extract_gold.aeb(FIX / "aeb_pages.tar.xz", FIX / "aeb_ground_truth.json.gz")]
    pages += [_fixture("mozilla_001_source.html.xz"), _fixture("mozilla_keep_tabular_data_source.html.xz")]
    md = pa.array([extract_page(h, format="markdown") for h in pages])
    assert sum("|" in t or "#" in t for t in md.to_pylist()) >= 10  # marks to strip
    assert plain_view(md).equals(plain_view_by_rules(md))


def test_text_state_plain():
    md = pa.array(["# Head\n\n- one **two**", "plain"])
    st = TextState(md, markup="markdown")
    assert st.plain.to_pylist() == ["Head\n\none two", "plain"]
    assert st.take([1, 0]).plain.to_pylist() == ["plain", "Head\n\none two"]
    assert TextState(md).plain is TextState(md).texts or TextState(md).plain.equals(md)  # text: itself
    with pytest.raises(ValueError, match="markup"):
        TextState(md, markup="html")


def test_plain_view_signals_match_text_format():
    """On a real page, the plain view of the Markdown has the words of format: text, so the
    word-based filter signals (Gopher's, FineWeb's) see the same document."""
    from curation.stages.gopher_quality import GopherQualityFilter

    html = _fixture("mozilla_001_source.html.xz")
    text, md = extract_page(html), extract_page(html, format="markdown")
    plain = plain_view(pa.array([md])).to_pylist()[0]
    assert "```" in md and "```" not in plain
    assert sorted(plain.split()) == sorted(text.split())
    g = GopherQualityFilter()
    sig_text = g.run_batch(pa.table({"text": [text]})).table
    sig_plain = g.run_batch(pa.table({"text": [plain]})).table
    for col in ("gopher_n_words", "gopher_mean_word_length", "gopher_symbol_word_ratio"):
        if col in sig_text.column_names:
            assert sig_text.column(col).to_pylist() == pytest.approx(sig_plain.column(col).to_pylist(), rel=0.02), col


# -- engines and policies -------------------------------------------------------------------

def _fake_engines(monkeypatch, a: str, b: str) -> list[str]:
    calls: list[str] = []
    monkeypatch.setitem(engines.ENGINES, "resiliparse", lambda h: calls.append("r") or a)
    monkeypatch.setitem(engines.ENGINES, "trafilatura", lambda h: calls.append("t") or b)
    return calls


def test_policies_on_a_page_where_engines_differ():
    html = _page("<ul><li>first item of the list here</li><li>second item of the list here</li></ul>")
    kw = dict(engines=["resiliparse", "trafilatura"], format="text")
    r, t = extract_page(html), extract_page(html, engines=["trafilatura"])
    assert "first item" in t and "first item" not in r  # the engines differ on this page
    assert extract_page(html, policy="first", **kw) == r
    assert extract_page(html, policy="longest", **kw) == max(r, t, key=len)
    union = extract_page(html, policy="union", **kw)
    assert "first item" in union and union.count("main text of the page") == r.count("main text of the page")


def test_union_order_and_no_duplicates():
    u = engine_policy.union(["A one\nB two\nC three", "A one\nX new\nC three\nB two"], "text")
    assert u.split("\n") == ["A one", "X new", "B two", "C three"]
    assert engine_policy.union(["a b c d", "b c"], "text") == "a b c d"  # contained: shared


def test_route_runs_second_engine_only_where_it_wins(monkeypatch):
    from curation.extract import engines as extraction

    calls = []
    monkeypatch.setitem(extraction.ENGINES, "trafilatura", lambda h: calls.append(1) or "second engine text")
    kw = dict(engines=["resiliparse", "trafilatura"], policy="route")
    plain = _page("")
    assert extract_page(plain, **kw) == extract_page(plain) and calls == []  # resiliparse kept the text
    # a page whose text resiliparse's main-content mode drops (a long list): the second engine runs
    items = "".join(f"<li>item number {i} of a long list of things on this page</li>" for i in range(40))
    lost = f"<html><body><ul>{items}</ul></body></html>"
    assert len(extract_page(lost)) < engine_policy.ROUTE_MIN_CHARS
    assert extract_page(lost, **kw) == "second engine text" and calls == [1]
    # tables are no reason (format: markdown writes them; trafilatura's text leaves them out)
    table = _page("<table>" + "<tr><td>a</td><td>b</td></tr>" * 5 + "</table>")
    assert extract_page(table, **kw) != "second engine text" and calls == [1]


def test_bad_names_raise():
    for kw in (dict(format="html"), dict(policy="vote"), dict(engines=["lynx"]), dict(engines=[])):
        with pytest.raises(ValueError):
            extract_page("<p>x</p>", **kw)


def test_stage_params():
    assert ex.Extract().engines == ["resiliparse"] and ex.Extract().engine == "resiliparse"
    assert ex.Extract(engine="trafilatura").engines == ["trafilatura"]
    s = ex.Extract(engines=["trafilatura", "resiliparse"], policy="route", format="markdown")
    assert s.engine == "trafilatura"
    with pytest.raises(ValueError, match="not both"):
        ex.Extract(engine="resiliparse", engines=["trafilatura"])
    with pytest.raises(ValueError):
        ex.Extract(format="html")


def test_stage_markdown_batch():
    html = _page("<table><tr><th>k</th><th>v</th></tr><tr><td>a</td><td>1</td></tr></table>").encode()
    batch = pa.table({"id": ["1", "2"], "text": ["", ""], "html": [html, b""], "charset": [None, None]})
    res = ex.Extract(format="markdown", engines=["resiliparse", "trafilatura"], policy="first").process(batch)
    texts = res.table.column("text").to_pylist()
    assert "| k | v |" in texts[0] and res.reasons.to_pylist() == [None, "extract:empty_html"]
    assert "html" not in res.table.column_names


def test_table_cells_are_words_not_markup():
    html = _page('<table><tr><th>Name <a href="http://x.org/a">link</a></th><th>b <img src="i.png" alt="pic"></th></tr>'
                 "<tr><td><code>x_1</code> and <b>bold</b></td><td>2<sup>3</sup></td></tr></table>")
    md = extract_page(html, format="markdown")
    assert "| Name link | b |\n| --- | --- |\n| x_1 and bold | 23 |" in md


def test_chain_judges_markdown_by_its_plain_view():
    """The stages after extract measure a Markdown state's plain view: Gopher's and repetition's
    signals on the Markdown state equal those on format: text's plain page (code fences, table
    pipes and heading marks are not words or lines), and C4 cuts the Markdown's own lines."""
    from curation.stages.c4_quality import C4QualityFilter
    from curation.stages.gopher_quality import GopherQualityFilter
    from curation.stages.gopher_repetition import GopherRepetitionFilter

    html = _fixture("mozilla_001_source.html.xz")
    md = extract_page(html, format="markdown")
    plain = plain_view(pa.array([md]))
    for stage in (GopherQualityFilter(), GopherRepetitionFilter()):
        on_md = stage.run_batch(pa.table({"text": [md]}), TextState(pa.array([md]), markup="markdown")).table
        on_plain = stage.run_batch(pa.table({"text": plain}), TextState(plain)).table
        raw = stage.run_batch(pa.table({"text": [md]}), TextState(pa.array([md]))).table
        cols = [c for c in on_md.column_names if c != "text"]
        assert cols and all(on_md.column(c).to_pylist() == on_plain.column(c).to_pylist() for c in cols), stage
        assert any(on_md.column(c).to_pylist() != raw.column(c).to_pylist() for c in cols), stage  # markup moved them
    res = C4QualityFilter(filter_curly_bracket=False).process(pa.table({"text": [md]}), TextState(pa.array([md]), markup="markdown"))
    out = res.table.column("text")[0].as_py()
    assert res.text.markup == "markdown" and out and all(ln in md for ln in out.split("\n"))  # Markdown's own lines


def test_stage_marks_markdown_text_field():
    html = _page("<h2>Heading</h2>").encode()
    batch = pa.table({"id": ["1"], "text": [""], "html": [html], "charset": [None]})
    res = ex.Extract(format="markdown").process(batch)
    assert res.text is None  # no state handed on: the executor joins the small batches
    st = TextState.of(res.table)
    assert st.markup == "markdown" and st.plain.to_pylist()[0].startswith("This paragraph")
    joined = pa.concat_tables([res.table, res.table])  # the executor's join keeps the field
    assert TextState.of(joined).markup == "markdown"
    assert TextState.of(ex.Extract().process(batch).table).markup == "text"


def test_c4_judges_plain_lines_and_cuts_markdown_lines():
    from curation.stages.c4_quality import C4QualityFilter

    md = ("# A heading of the page.\n\nThe first sentence is here and long enough. **Bold** words end it.\n\n"
          "| name | value |\n| --- | --- |\n| a table row that ends with a period. | 2. |\n\n- a list item without an end")
    res = C4QualityFilter(min_num_sentences=1).process(pa.table({"text": [md]}), TextState(pa.array([md]), markup="markdown"))
    out = res.table.column("text")[0].as_py()
    # kept: whole Markdown lines whose plain view ends a sentence (a row's last pipe is no end)
    assert out == ("# A heading of the page.\nThe first sentence is here and long enough. **Bold** words end it.\n"
                   "| a table row that ends with a period. | 2. |")
    raw = C4QualityFilter(min_num_sentences=1).process(pa.table({"text": [md]}), TextState(pa.array([md]))).table
    assert "| a table row" not in raw.column("text")[0].as_py()  # judged raw, the row ends in "|"


def test_c4_markdown_ending_in_a_fence():
    from curation.stages.c4_quality import C4QualityFilter

    texts = ["A sentence that ends well.\n```\ncode();\n```", "Only prose here, ended.\n| a | b |\n| --- | --- |"]
    res = C4QualityFilter(min_num_sentences=1, filter_curly_bracket=False).process(
        pa.table({"text": texts}), TextState(pa.array(texts), markup="markdown"))
    assert res.table.column("text").to_pylist() == ["A sentence that ends well.", "Only prose here, ended."]
