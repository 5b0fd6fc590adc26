"""Resiliparse main content as Markdown: headings, lists, fenced code, tables, math.

Resiliparse's ``preserve_formatting='minimal_html'`` keeps headings, paragraphs, lists and
``<pre>`` at plain-text speed; html-to-markdown (Rust) turns that into Markdown. Two things it
loses get a pass first:

- data tables (innermost tables of >= 2 rows of >= 2 cells, no form): main-content mode
  flattens or drops them, so each is written as Markdown rows and the table is replaced, in the
  HTML string, by a placeholder paragraph, which keeps the table's place and is dropped with it
  when its region is not main content (a sidebar's table goes with the sidebar);
- math (pages with its markers only: a DOM parse, the tree then extracted): MathML (its TeX annotation or ``alttext``), MathJax ``<script type="math/tex">``
  (``mode=display``: a block) and KaTeX (its ``application/x-tex`` annotation), as ``$…$`` /
  ``$$…$$``; a placeholder too, so no converter escapes the TeX.

Placeholders are private-use characters around a number: they survive both converters verbatim
and never occur in the pages' own text in practice (a page that has them just keeps them)."""

from __future__ import annotations

import re

_OPEN, _CLOSE = "\ue000", "\ue001"
_PLACEHOLDER = re.compile(f"{_OPEN}([TMD])(\\d+){_CLOSE}")
_WS = re.compile(r"\s+")
_MIN_ROWS, _MIN_CELLS = 2, 2


def _options(**extra):
    """html-to-markdown's options, made once: its Python ``convert`` rebuilds the Rust options
    object on every call (~0.5 ms, 10% of a page's extraction), so the Rust converter is called
    directly with these."""
    import html_to_markdown as h2m
    from html_to_markdown.api import _to_rust_conversion_options

    return _to_rust_conversion_options(h2m.ConversionOptions(
        heading_style="atx", bullets="-", code_block_style="backticks", escape_asterisks=False,
        escape_underscores=False, escape_misc=False, escape_ascii=False, autolinks=False,
        extract_metadata=False, compact_tables=True, **extra))


#: inline tags written as their text in table cells, as resiliparse writes the rest of the page
#: (no links, images, emphasis or code marks: a row's cells are its words)
_CELL_INLINE = ("a", "img", "b", "strong", "i", "em", "code", "tt", "kbd", "samp", "var", "sup", "sub", "small",
                "big", "font", "span", "u", "s", "strike", "del", "ins", "mark", "abbr", "cite", "q", "time")
_OPTS = None
_TABLE_OPTS = None


def _opts():
    global _OPTS
    if _OPTS is None:
        _OPTS = _options()
    return _OPTS


def _table_opts():
    global _TABLE_OPTS
    if _TABLE_OPTS is None:
        _TABLE_OPTS = _options(strip_tags=list(_CELL_INLINE), skip_images=True)
    return _TABLE_OPTS


#: does the page need a pass: a table (``<table``, ``<TABLE``) or math (MathML and KaTeX's
#: ``<math``, MathJax's ``<script type="math/tex">``). One regex, tried at each ``<``, costs about
#: one ``str.find``; the three finds it replaces ("<table", "<TABLE", "math", each a full scan of
#: most pages) were 6% of a page's extraction.
_GATE = re.compile(r"<(?:table|TABLE|math|script[^>]*math/tex|SCRIPT[^>]*math/tex)")
#: the marks themselves, from the gate's first one on: table tags, any case (group 1: "/" on a
#: closing tag; group 2: set on table tags), and math markers as the gate finds them
_MARKS = re.compile(r"<(?:(/?)((?i:table))\b[^>]*>|math|script[^>]*math/tex|SCRIPT[^>]*math/tex)")
_FORM = re.compile(r"<form\b", re.IGNORECASE)
_TR = re.compile(r"<tr\b", re.IGNORECASE)


def _table_markdown(table_html: str) -> str | None:
    """One table's HTML (no table inside) as Markdown rows when it is a data table (>= 2 rows
    of >= 2 cells, no form), else None (a layout table). html-to-markdown writes the rows."""
    from html_to_markdown._html_to_markdown import convert

    if len(_TR.findall(table_html)) < _MIN_ROWS or _FORM.search(table_html):
        return None
    md = convert(html=table_html, options=_table_opts(), visitor=None).content.strip()
    rows = [ln for ln in md.split("\n") if ln.startswith("|")]
    # header, separator, then rows: at least _MIN_ROWS rows of >= _MIN_CELLS cells
    if len(rows) < _MIN_ROWS + 1 or rows[0].count(" | ") < _MIN_CELLS - 1:
        return None
    return "\n".join(rows)


def _mark(html: str, out: list[str], begin: int) -> tuple[str, bool]:
    """``html`` with each innermost data table replaced by a placeholder paragraph (its Markdown
    appended to ``out``), and whether it has math markers: one scan of ``_MARKS`` from ``begin``.
    On the string, not the DOM: tables are paired by their tags, where walking resiliparse's node
    lists made a Python object per node (3x the page's extraction on the bench WARC's table-heavy
    pages)."""
    pieces: list[str] = []
    pos = 0
    math = False
    stack: list[tuple[int, bool]] = []  # (start of an open table, whether a table opened inside it)
    for m in _MARKS.finditer(html, begin):
        if m.group(2) is None:  # a math marker
            math = True
            continue
        if not m.group(1):
            if stack:
                stack[-1] = (stack[-1][0], True)
            stack.append((m.start(), False))
            continue
        if not stack:  # a stray </table>
            continue
        start, nested = stack.pop()
        if nested or start < pos:  # a table holding a table is layout; never cut into a replaced part
            continue
        md = _table_markdown(html[start:m.end()])
        if md is not None:
            out.append(md)
            pieces += [html[pos:start], f"<p>{_OPEN}T{len(out) - 1}{_CLOSE}</p>"]
            pos = m.end()
    return ("".join(pieces) + html[pos:] if pieces else html), math


def _tex_of_math(node) -> str:
    ann = node.query_selector('annotation[encoding="application/x-tex"]')
    if ann is not None and ann.text.strip():
        return ann.text.strip()
    alt = node.getattr("alttext") if hasattr(node, "getattr") else None
    if alt is None:
        alt = node["alttext"] if node.hasattr("alttext") else None
    return (alt or _WS.sub(" ", node.text)).strip()


def _replace(tree, node, kind: str, idx: int, block: bool) -> None:
    new = tree.create_element("p" if block else "span")
    new.append_child(tree.create_text_node(f"{_OPEN}{kind}{idx}{_CLOSE}"))
    node.parent.replace_child(new, node)


def _mark_math(tree, html: str, out: list[str]) -> None:
    """Replace math in ``tree`` by placeholders, its ``$…$`` appended to ``out``. Each selector
    walks the whole tree, so it runs only when its marker occurs in ``html``."""
    body = tree.body
    if body is None:
        return
    low = html.lower() if "<MATH" in html else html  # the rare upper-case page
    # KaTeX first: its <math> copy sits inside it beside the rendered HTML
    for node in body.query_selector_all(".katex") if "katex" in html else ():
        if node.parent is None:
            continue
        tex = _tex_of_math(node)
        display = node.parent.hasattr("class") and "katex-display" in node.parent["class"]
        if tex:
            out.append(f"$${tex}$$" if display else f"${tex}$")
            _replace(tree, node, "D" if display else "M", len(out) - 1, display)
    for node in body.query_selector_all("math") if "<math" in low else ():
        tex = _tex_of_math(node)
        if tex and node.parent is not None:
            display = node.hasattr("display") and node["display"] == "block"
            out.append(f"$${tex}$$" if display else f"${tex}$")
            _replace(tree, node, "D" if display else "M", len(out) - 1, display)
    for node in body.query_selector_all('script[type^="math/tex"]') if "math/tex" in html else ():
        tex = node.text.strip()
        if tex and node.parent is not None:
            display = "mode=display" in node["type"]
            out.append(f"$${tex}$$" if display else f"${tex}$")
            _replace(tree, node, "D" if display else "M", len(out) - 1, display)


def resiliparse_markdown(html: str, options: dict) -> str:
    """One decoded page -> its main content as Markdown (see module docstring); ``options``: the
    main-content options of ``extract_plain_text`` the text format uses (so both formats keep the
    same content)."""
    from html_to_markdown._html_to_markdown import convert
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    parts: list[str] = []
    page = html
    # one scan: most pages have neither table nor math and go straight on
    first = _GATE.search(html)
    if first is not None:
        page, math = _mark(html, parts, first.start())
        if math:  # MathML, MathJax's math/tex and KaTeX's katex-mathml: a parse to edit them
            page = HTMLTree.parse(page)
            _mark_math(page, html, parts)
    minimal = extract_plain_text(page, preserve_formatting="minimal_html", **options)
    md = convert(html=minimal, options=_opts(), visitor=None).content
    if parts:
        md = _PLACEHOLDER.sub(lambda m: parts[int(m.group(2))], md)
    return md.strip()
