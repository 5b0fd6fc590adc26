r"""How well an extraction keeps a page's text and its structure, against gold: the measures
``refinery eval extract`` reports. No Ray, no run directory, no files: strings in, numbers out.

Every measure is computed per page and summed (or averaged) over a group of pages: a gold set,
a page type, a language.

- **Word P/R/F1** (``word_prf``): bags of whitespace tokens of the output and of the gold text,
  multiset intersection ``tp``; P = tp / |output|, R = tp / |gold|, F1 their harmonic mean (0 when
  both are 0); per page, then averaged over the pages (the article-extraction benchmark's scoring
  as ``tests/test_extract.py`` states it). WCXB's pages are scored its way (``scoring="wcxb"``):
  the words are lowercased ``\w+`` tokens, and a page with no gold words scores 1 only when
  nothing is extracted (its ``evaluate.py``; 21 of the 1,497 dev pages). Markdown output is scored on its plain view (markup
  stripped, ``curation.text.markup``), so ``#``, ``|`` and ``-`` are not counted as words.
  The gold text: the set's gold body, or the text of the gold HTML (``Structure.text``).
- **Snippets** (``snippet_rates``, the trafilatura set): ``with`` = share of the must-have
  snippets found in the output, ``without`` = share of the boilerplate snippets absent from it;
  both whitespace-normalised substring tests, summed over the pages (snippets, not pages, count).
  **Segment P/R/F1** is trafilatura's own benchmark score over the same counts: a must-have
  snippet found is a true positive, one missing a false negative, a boilerplate snippet found a
  false positive (its ``tests/comparison.py``).
- **Structure** (``structure_kept``; gold with HTML structure, e.g. Mozilla readability's
  ``expected.html``), each a share of the gold's items kept, summed over the pages:

  - *code lines*: the non-blank lines of each gold ``<pre>`` block as rendered (``<br>`` and
    ``<p>``/``<div>`` inside it break lines; tabs expanded to 4, trailing blanks dropped, the
    block dedented as a whole). A block's lines are matched in order to
    output lines with the same content and the same indentation relative to the block: one
    shift ``d`` per block (output indent = gold indent + d, the ``d`` keeping the most lines),
    each gold line matched greedily to the next output line after the previous match. A line
    whose indentation was lost, or that comes out of order, is not kept.
  - *table rows*: each gold ``<tr>`` with >= 2 non-empty ``<td>``/``<th>`` cells (rows holding
    a nested table left out). Kept when one output line holds all its cells, in order, each
    starting at a word boundary (Markdown ``|`` borders read as blanks). A table flattened to
    one cell per line keeps none.
  - *headings*: each non-empty gold ``<h1>``-``<h6>`` text, kept when it is a whole output line
    (``#`` marks, emphasis and blanks ignored).
  - *list items*: each gold ``<li>`` without nested lists or block children (``p``, ``div``,
    ``pre``, ``table``, ``br``), non-empty and under 300 characters, kept when it is a whole
    output line (bullets or numbers ignored).
- **Page type** (``page_kind``): the set's own label where it has one (WCXB's seven), else ``docs-like`` when the gold main content has a ``<pre>`` or a
  ``<table>`` row as above; ``article`` for the article sets (the article-extraction benchmark,
  Mozilla readability's pages otherwise); ``other`` for the rest (sets without gold HTML).
- **Language** (``page_language``): the gold's metadata ``lang`` when the set has one, else the
  page's ``<html lang>``; its primary subtag, lowercase (``?`` when unknown).
- **A/B** (``ab_figures``): for one set of pages extracted by several engines, each engine's
  characters and words (plain view for Markdown), the share of pages where it is empty, and per
  page the words' disagreement ``1 - F1(engine A's words, engine B's words)``.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

#: the structure kinds ``structure_kept`` counts, in report order
STRUCTURE_KINDS = ("code_lines", "table_rows", "headings", "list_items")
#: page types (``page_kind``)
PAGE_KINDS = ("article", "forum", "product", "collection", "listing", "documentation", "service", "docs-like",
              "other")
#: sets whose pages are articles (``page_kind``)
ARTICLE_SETS = ("aeb", "readability")

_BULLET = re.compile(r"^\s*(?:[-*+•·◦▪]|\d{1,9}[.)]|#{1,6})\s+")
_LINK = re.compile(r"!?\[([^\]]*)\]\([^)]*\)")
_ESCAPE = re.compile(r"\\([\\`*_{}\[\]()#+\-.!|$])")
_EMPH = re.compile(r"\*\*|__|`")


_WCXB_WORD = re.compile(r"\w+")


def tokens(text: str, scoring: str = "whitespace") -> list[str]:
    """The words word F1 counts: whitespace tokens, or WCXB's lowercased ``\\w+``."""
    return _WCXB_WORD.findall(text.lower()) if scoring == "wcxb" else text.split()


def word_prf(pred: str, gold: str, scoring: str = "whitespace") -> tuple[float, float, float]:
    """Bag-of-words precision, recall, F1 of one page (see module docstring). WCXB scores a page
    whose gold has no words 1 when the output has none either, else 0 (its ``evaluate.py``)."""
    p, g = Counter(tokens(pred, scoring)), Counter(tokens(gold, scoring))
    if scoring == "wcxb" and not g:
        return (1.0, 1.0, 1.0) if not p else (0.0, 0.0, 0.0)
    tp = sum((p & g).values())
    prec, rec = tp / max(sum(p.values()), 1), tp / max(sum(g.values()), 1)
    return prec, rec, (2 * prec * rec / (prec + rec) if prec + rec else 0.0)


def _norm(s: str) -> str:
    return " ".join(s.split())


def snippet_rates(out: str, with_: Sequence[str], without: Sequence[str]) -> tuple[int, int, int, int]:
    """(must-have found, must-have, boilerplate absent, boilerplate) of one page."""
    o = _norm(out)
    w = [n for n in (_norm(s) for s in with_) if n]
    wo = [n for n in (_norm(s) for s in without) if n]
    return sum(s in o for s in w), len(w), sum(s not in o for s in wo), len(wo)


@dataclass
class Structure:
    """What a gold page's main content holds (from its HTML)."""

    code: list[list[str]] = field(default_factory=list)  # <pre> blocks: dedented non-blank lines
    rows: list[list[str]] = field(default_factory=list)  # <tr> cells
    headings: list[str] = field(default_factory=list)
    items: list[str] = field(default_factory=list)  # <li> texts
    text: str = ""  # the gold's plain text (for word F1)

    @property
    def docs_like(self) -> bool:
        return bool(self.code or self.rows)


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def code_block_lines(text: str) -> list[str]:
    """A ``<pre>`` block's text -> its non-blank lines, tabs expanded, dedented as a block."""
    lines = [ln.expandtabs(4).rstrip() for ln in text.split("\n")]
    lines = [ln for ln in lines if ln.strip()]
    if not lines:
        return []
    cut = min(_indent(ln) for ln in lines)
    return [ln[cut:] for ln in lines]


_BLOCK_CHILDREN = "p, div, pre, table, br, ul, ol"
_PRE_BREAK = re.compile(r"<br\s*/?>|</?(?:p|div)\b[^>]*>", re.I)


def _pre_text(pre) -> str:
    """A ``<pre>``'s text as rendered: ``<br>`` and block boundaries inside it break lines."""
    from resiliparse.parse.html import HTMLTree

    html = pre.html
    if not _PRE_BREAK.search(html):
        return pre.text
    inner = HTMLTree.parse(f"<html><body>{_PRE_BREAK.sub(chr(10), html)}</body></html>")
    return inner.body.text if inner.body is not None else pre.text


def gold_structure(gold_html: str) -> Structure:
    """The structure of a gold main content given as HTML (see module docstring)."""
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(gold_html)
    st = Structure(text=extract_plain_text(tree, main_content=False, alt_texts=False))
    root = tree.body or tree.document
    if root is None:
        return st
    for pre in root.query_selector_all("pre"):
        lines = code_block_lines(_pre_text(pre))
        if lines:
            st.code.append(lines)
    for tr in root.query_selector_all("tr"):
        if tr.query_selector("table") is not None:
            continue
        cells = [c for c in (_norm(c.text) for c in tr.child_nodes if c.tag in ("td", "th")) if c]
        if len(cells) >= 2:
            st.rows.append(cells)
    st.headings = [h for h in (_norm(e.text) for e in root.query_selector_all("h1, h2, h3, h4, h5, h6")) if h]
    for li in root.query_selector_all("li"):
        if li.query_selector(_BLOCK_CHILDREN) is not None:
            continue
        t = _norm(li.text)
        if t and len(t) < 300:
            st.items.append(t)
    return st


def _flat(line: str) -> str:
    """An output line as plain words: Markdown borders, links, emphasis and escapes dropped."""
    line = _ESCAPE.sub(r"\1", _EMPH.sub("", _LINK.sub(r"\1", line)))
    return _norm(line.replace("|", " "))


def code_lines_kept(out_lines: Sequence[str], block: Sequence[str]) -> int:
    """How many of a gold code block's lines ``out_lines`` keeps in order with their relative
    indentation (module docstring: one shift per block, greedy in-order matching)."""
    lines = [ln.expandtabs(4).rstrip() for ln in out_lines]
    where: dict[str, list[int]] = {}
    for i, ln in enumerate(lines):
        if ln:
            where.setdefault(ln.lstrip(" "), []).append(i)
    shifts = Counter(_indent(lines[i]) - _indent(g) for g in block for i in where.get(g.lstrip(" "), ()))
    best = 0
    for d, _ in shifts.most_common(8):  # the shifts most pairs agree on (one is the block's)
        kept, last = 0, -1
        for g in block:
            cand = where.get(g.lstrip(" "), [])
            k = bisect_right(cand, last)
            while k < len(cand) and _indent(lines[cand[k]]) != _indent(g) + d:
                k += 1
            if k < len(cand):
                kept, last = kept + 1, cand[k]
        best = max(best, kept)
    return best


def structure_kept(out: str, st: Structure) -> dict[str, tuple[int, int]]:
    """Per structure kind (``STRUCTURE_KINDS``): (kept, in the gold) for one page's output."""
    lines = out.split("\n")
    code = sum(code_lines_kept(lines, b) for b in st.code), sum(len(b) for b in st.code)
    flat = [_flat(ln) for ln in lines]
    joined = "\n".join(flat)
    rows = 0
    for cells in st.rows:
        if all(c in joined for c in cells):  # cheap test before the per-line pattern
            pat = re.compile(r".*?".join(r"(?<!\w)" + re.escape(c) for c in cells))
            rows += any(pat.search(ln) for ln in flat)
    bare = {_norm(_BULLET.sub("", f)) for f in flat} | {_flat(_BULLET.sub("", ln)) for ln in lines}
    return {"code_lines": code, "table_rows": (rows, len(st.rows)),
            "headings": (sum(h in bare for h in st.headings), len(st.headings)),
            "list_items": (sum(i in bare for i in st.items), len(st.items))}


_LANG = re.compile(r"<html[^>]*?\slang\s*=\s*[\"']?([A-Za-z]{2,3})\b", re.I)


def page_language(html: str, gold_lang: str | None = None) -> str:
    """The page's language: the gold's when known, else ``<html lang>``; ``?`` when neither."""
    if gold_lang and re.match(r"[A-Za-z]{2,3}\b", gold_lang):
        return re.split(r"[-_]", gold_lang)[0].lower()
    m = _LANG.search(html[:20000])
    return m.group(1).lower() if m else "?"


def page_kind(gold_set: str, st: Structure | None, label: str | None = None) -> str:
    """The set's label, else ``docs-like``, ``article`` or ``other`` (module docstring)."""
    if label:
        return label
    if st is not None and st.docs_like:
        return "docs-like"
    return "article" if gold_set in ARTICLE_SETS else "other"


# -- summing pages -----------------------------------------------------------------------------


@dataclass
class PageScore:
    """One page's measures for one engine (``None``: not measurable on this page's gold)."""

    prf: tuple[float, float, float] | None = None
    empty: bool = False  # no output word on a page whose gold has words
    snippets: tuple[int, int, int, int] | None = None
    structure: dict[str, tuple[int, int]] | None = None


def score_page(out: str, words: str, gold_text: str | None, st: Structure | None,
               with_: Sequence[str] = (), without: Sequence[str] = (), scoring: str = "whitespace") -> PageScore:
    """Score one output: ``out`` as extracted (structure), ``words`` its plain view (words,
    snippets)."""
    return PageScore(prf=word_prf(words, gold_text, scoring) if gold_text is not None else None,
                     empty=gold_text is not None and not tokens(words, scoring) and bool(tokens(gold_text, scoring)),
                     snippets=snippet_rates(words, with_, without) if (with_ or without) else None,
                     structure=structure_kept(out, st) if st is not None else None)


def segment_prf(with_found: int, with_total: int, without_absent: int, without_total: int) -> dict:
    """trafilatura's benchmark score over snippets (module docstring): ``seg_p``, ``seg_r``,
    ``seg_f1`` (None where the pages have no snippets)."""
    tp, fn, fp = with_found, with_total - with_found, without_total - without_absent
    if not with_total and not without_total:
        return {"seg_p": None, "seg_r": None, "seg_f1": None}
    p, r = tp / max(tp + fp, 1), tp / max(tp + fn, 1)
    return {"seg_p": p, "seg_r": r, "seg_f1": 2 * p * r / (p + r) if p + r else 0.0}


def share(kept: int, total: int) -> float | None:
    return kept / total if total else None


@dataclass
class Tally:
    """Sums of ``PageScore`` over a group of pages."""

    pages: int = 0
    scored: int = 0  # pages with a gold text
    empty: int = 0  # scored pages whose output has no word (and whose gold has some)
    p: float = 0.0
    r: float = 0.0
    f1: float = 0.0
    counts: dict[str, list[int]] = field(default_factory=lambda: {k: [0, 0] for k in ("with", "without",
                                                                                        *STRUCTURE_KINDS)})

    def add(self, s: PageScore) -> None:
        self.pages += 1
        if s.prf is not None:
            self.scored += 1
            self.empty += s.empty
            self.p, self.r, self.f1 = self.p + s.prf[0], self.r + s.prf[1], self.f1 + s.prf[2]
        if s.snippets is not None:
            a, b, c, d = s.snippets
            self.counts["with"][0] += a
            self.counts["with"][1] += b
            self.counts["without"][0] += c
            self.counts["without"][1] += d
        for k, (kept, n) in (s.structure or {}).items():
            self.counts[k][0] += kept
            self.counts[k][1] += n

    def summary(self) -> dict:
        mean = (lambda x: x / self.scored) if self.scored else (lambda x: None)
        return {"pages": self.pages, "precision": mean(self.p), "recall": mean(self.r), "f1": mean(self.f1),
                "empty": self.empty, **segment_prf(*self.counts["with"], *self.counts["without"]),
                **{k: share(*v) for k, v in self.counts.items()}, "counts": {k: list(v) for k, v in self.counts.items()}}


# -- two engines on the same pages ---------------------------------------------------------------


def disagreement(a: str, b: str) -> float:
    """``1 - F1`` of two outputs' word bags: 0 the same words, 1 none in common (both empty: 0)."""
    if not a.split() and not b.split():
        return 0.0
    return 1.0 - word_prf(a, b)[2]


def ab_figures(words: dict[str, list[str]]) -> dict:
    """Per engine (``words``: engine -> each page's plain text, same pages in the same order):
    characters and words kept (total and per page), pages where it is empty; against the first
    engine, pages where exactly one of the two is empty and the mean disagreement."""
    names = list(words)
    n = len(next(iter(words.values()))) if words else 0
    out: dict = {"pages": n, "engines": {}}
    base = words[names[0]] if names else []
    for name in names:
        texts = words[name]
        wc = [len(t.split()) for t in texts]
        fig = {"chars": sum(len(t) for t in texts), "words": sum(wc),
               "words_per_page": round(sum(wc) / n, 1) if n else None, "empty_pages": sum(w == 0 for w in wc),
               "empty_share": share(sum(w == 0 for w in wc), n)}
        if name != names[0]:
            one_empty = sum((len(a.split()) == 0) != (w == 0) for a, w in zip(base, wc))
            fig["vs"] = names[0]
            fig["words_vs_first"] = share(sum(wc), sum(len(a.split()) for a in base))
            fig["one_empty_pages"] = one_empty
            fig["one_empty_share"] = share(one_empty, n)
            fig["mean_disagreement"] = (sum(disagreement(a, b) for a, b in zip(base, texts)) / n) if n else None
        out["engines"][name] = fig
    return out


def most_different(a: Sequence[str], b: Sequence[str], k: int) -> list[tuple[int, float]]:
    """The ``k`` pages whose two outputs disagree most: (index, disagreement), largest first
    (ties: the larger difference in words first)."""
    scored = [(i, disagreement(x, y), abs(len(x.split()) - len(y.split()))) for i, (x, y) in enumerate(zip(a, b))]
    scored.sort(key=lambda t: (-t[1], -t[2], t[0]))
    return [(i, d) for i, d, _ in scored[:k] if d > 0]


def side_by_side(left: str, right: str, width: int = 70, max_lines: int = 60) -> list[str]:
    """Two texts as two columns of ``width`` characters (wrapped), at most ``max_lines`` rows."""
    import textwrap
    from itertools import zip_longest

    def col(t: str) -> list[str]:
        out = []
        for ln in t.split("\n"):
            out += textwrap.wrap(ln, width) or [""]
        return out

    rows = [f"{a:<{width}} | {b}" for a, b in zip_longest(col(left), col(right), fillvalue="")]
    return rows[:max_lines] + ([f"{'[...]':<{width}} | [...]"] if len(rows) > max_lines else [])
