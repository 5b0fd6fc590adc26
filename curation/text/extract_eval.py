"""How well an extraction keeps a page's text and its structure, against gold: the measures
``refinery eval extract`` reports. No Ray, no run directory, no files: strings in, numbers out.

- **Word P/R/F1**: bag of whitespace tokens with multiset intersection, per page, averaged over
  pages (the article-extraction benchmark's scoring; ``tests/test_extract.py`` uses the same).
  Markdown output is scored on its plain view (markup stripped), so markup is not counted as words.
- **Snippets** (the trafilatura eval set): ``with`` = share of must-have snippets found in the
  output, ``without`` = share of boilerplate snippets absent from it (whitespace-normalised).
- **Structure** (gold with HTML structure: Mozilla readability's ``expected.html``):
  - code lines: each line of each gold ``<pre>`` block, dedented as a block (indentation relative
    to the block kept), found as a line of the output (or of the output dedented);
  - table rows: each gold ``<tr>`` of >= 2 non-empty cells whose cells all appear, in order, on
    one line of the output (``|`` separators ignored);
  - headings: each gold ``<h1>``-``<h6>`` text found as a whole line (``#`` marks ignored);
  - list items: each gold ``<li>`` text (one line) found as a whole line (bullets ignored).
"""

from __future__ import annotations

import re
import textwrap
from collections import Counter
from dataclasses import dataclass, field

_BULLET = re.compile(r"^\s*(?:[-*+•]|\d+[.)]|#{1,6})\s+")


def word_prf(pred: str, gold: str) -> tuple[float, float, float]:
    p, g = Counter(pred.split()), Counter(gold.split())
    tp = sum((p & g).values())
    prec, rec = tp / max(sum(p.values()), 1), tp / max(sum(g.values()), 1)
    return prec, rec, (2 * prec * rec / (prec + rec) if prec + rec else 0.0)


def _norm(s: str) -> str:
    return " ".join(s.split())


def snippet_rates(out: str, with_: list[str], without: list[str]) -> tuple[int, int, int, int]:
    """(must-have found, must-have, boilerplate absent, boilerplate)."""
    o = _norm(out)
    found = sum(_norm(s) in o for s in with_ if _norm(s))
    absent = sum(_norm(s) not in o for s in without if _norm(s))
    return found, sum(bool(_norm(s)) for s in with_), absent, sum(bool(_norm(s)) for s in without)


@dataclass
class Structure:
    """What a gold page's main content holds (from its HTML)."""

    code: list[list[str]] = field(default_factory=list)  # <pre> blocks, dedented lines
    rows: list[list[str]] = field(default_factory=list)  # <tr> cells
    headings: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)  # <li> texts (one-line ones)
    text: str = ""  # the gold's plain text (for word F1)

    @property
    def docs_like(self) -> bool:
        return bool(self.code or self.rows)


def gold_structure(gold_html: str) -> Structure:
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(gold_html)
    body = tree.body
    st = Structure(text=extract_plain_text(tree, main_content=False, alt_texts=False))
    if body is None:
        return st
    for pre in body.query_selector_all("pre"):
        lines = [ln.rstrip() for ln in textwrap.dedent(pre.text).split("\n") if ln.strip()]
        if lines:
            st.code.append(lines)
    for tr in body.query_selector_all("tr"):
        cells = [c for c in (_norm(c.text) for c in tr.child_nodes if c.tag in ("td", "th")) if c]
        if len(cells) >= 2:
            st.rows.append(cells)
    st.headings = [h for h in (_norm(e.text) for e in body.query_selector_all("h1, h2, h3, h4, h5, h6")) if h]
    st.items = [t for t in (_norm(e.text) for e in body.query_selector_all("li")) if t and len(t) < 300]
    return st


def structure_kept(out: str, st: Structure) -> dict[str, tuple[int, int]]:
    """Per structure kind: (kept, in the gold)."""
    lines = out.split("\n")
    exact = {ln.rstrip() for ln in lines} | set(textwrap.dedent(out).split("\n"))
    code = sum(ln in exact for block in st.code for ln in block), sum(len(b) for b in st.code)
    flat = [_norm(ln.replace("|", " ")) for ln in lines]
    rows = 0
    for cells in st.rows:
        pat = re.compile(r"(?:^|\s)" + r"\s.*?".join(re.escape(c) for c in cells))
        rows += any(pat.search(ln) for ln in flat)
    bare = {_norm(_BULLET.sub("", ln)) for ln in lines}
    return {"code_lines": code, "table_rows": (rows, len(st.rows)),
            "headings": (sum(h in bare for h in st.headings), len(st.headings)),
            "list_items": (sum(i in bare for i in st.items), len(st.items))}


_LANG = re.compile(r"<html[^>]*\slang\s*=\s*[\"']?([A-Za-z]{2,3})", re.I)


def page_language(html: str) -> str:
    m = _LANG.search(html[:5000])
    return m.group(1).lower() if m else "?"
