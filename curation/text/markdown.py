"""Resiliparse main content as Markdown: headings, lists, fenced code, tables, math.

Resiliparse's ``preserve_formatting='minimal_html'`` keeps headings, paragraphs, lists and
``<pre>`` at plain-text speed; html-to-markdown (Rust) turns that into Markdown. Two things it
loses get a DOM pass first, on the same parsed tree (one parse per page):

- data tables (>= 2 rows of >= 2 cells, no nested table or form): main-content mode flattens
  or drops them, so each is written as Markdown rows and the table is replaced by a placeholder
  paragraph, which keeps the table's place and is dropped with it when its region is not main
  content (a sidebar's table goes with the sidebar);
- math: MathML (its TeX annotation or ``alttext``), MathJax ``<script type="math/tex">``
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


def _options():
    import html_to_markdown as h2m

    return h2m.ConversionOptions(heading_style="atx", bullets="-", code_block_style="backticks",
                                 escape_asterisks=False, escape_underscores=False, escape_misc=False,
                                 escape_ascii=False, autolinks=False, extract_metadata=False)


_OPTS = None


def _cell(node) -> str:
    return _WS.sub(" ", node.text).strip().replace("|", "\\|")


def _table_rows(table) -> list[list[str]] | None:
    """The table's rows of cells when it is a data table, else None (layout table)."""
    if table.query_selector("table, form") is not None:
        return None
    rows = []
    for tr in table.query_selector_all("tr"):
        cells = [_cell(c) for c in tr.child_nodes if c.tag in ("td", "th")]
        if any(cells):
            rows.append(cells)
    if sum(len(r) >= _MIN_CELLS for r in rows) < _MIN_ROWS:
        return None
    return rows


def table_markdown(rows: list[list[str]]) -> str:
    """Rows of cells -> Markdown table lines (the first row as header, padded to the widest row)."""
    width = max(len(r) for r in rows)
    lines = ["| " + " | ".join(r + [""] * (width - len(r))) + " |" for r in rows]
    lines.insert(1, "|" + " --- |" * width)
    return "\n".join(lines)


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


def _mark(tree, html: str) -> list[str]:
    """Replace data tables and math in ``tree`` by placeholders; returns their Markdown. Each
    selector walks the whole tree, so it runs only when its tag name occurs in ``html``."""
    out: list[str] = []
    body = tree.body
    if body is None:
        return out
    low = html.lower() if "<TABLE" in html or "<MATH" in html else html
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
    # judged before any is replaced: a table holding a data table stays a layout table
    tables = body.query_selector_all("table") if "<table" in low else ()
    for table, rows in [(t, _table_rows(t)) for t in tables][::-1]:  # innermost first
        if rows is not None and table.parent is not None:
            out.append(table_markdown(rows))
            _replace(tree, table, "T", len(out) - 1, True)
    return out


def resiliparse_markdown(html: str) -> str:
    """One decoded page -> its main content as Markdown (see module docstring)."""
    global _OPTS
    import html_to_markdown as h2m
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    from curation.text.extraction import RESILIPARSE_OPTIONS

    tree = HTMLTree.parse(html)
    parts = _mark(tree, html)
    minimal = extract_plain_text(tree, preserve_formatting="minimal_html", **RESILIPARSE_OPTIONS)
    if _OPTS is None:
        _OPTS = _options()
    md = h2m.convert(minimal, _OPTS).content
    if parts:
        md = _PLACEHOLDER.sub(lambda m: parts[int(m.group(2))], md)
    return md.strip()
