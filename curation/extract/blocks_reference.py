"""The reference for ``blocks.page_blocks``: the block walk as first written, one Python object
per element (``_Node``) and per block (``_Block``), each block's features gathered in a Python
loop. Tests hold the production walk's texts, features, groups and tables equal to this on the
WCXB fixture pages (the shipped model was trained on these features)."""

from __future__ import annotations

import re
from collections import Counter

import numpy as np

from curation.extract.blocks import (BLOCK_KINDS, BLOCK_TAGS, DISPLAY_NONE, HEADINGS, HIDDEN_BIT, KIND_OF, SKIP_TAGS,
                                     TAG_BITS, WORD_BITS, Page, feature_matrix, swallowed)
from curation.extract.page_signals import page_signals

_TOKEN = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")


_BITS_CACHE: dict[str, int] = {}


def _class_bits(attrs) -> int:
    s = (attrs.get("class") or "") + " " + (attrs.get("id") or "")
    if len(s) < 2:
        return 0
    bits = _BITS_CACHE.get(s)
    if bits is None:  # class names repeat within a page and across a site's pages
        bits = 0
        toks = [t.lower() for t in _TOKEN.findall(s)]
        for t in toks:
            bits |= WORD_BITS.get(t, 0)
        for a, b in zip(toks, toks[1:]):
            bits |= WORD_BITS.get(a + "-" + b, 0)
        if len(_BITS_CACHE) > 50_000:
            _BITS_CACHE.clear()
        _BITS_CACHE[s] = bits
    return bits


class _Node:
    """One element on the walk's stack: its subtree's words and link words, its context bits."""

    __slots__ = ("el", "tag", "words", "link_words", "kw_self", "kw_anc", "tag_ctx", "depth", "block", "parent",
                 "link", "cls", "table")

    def __init__(self, el, tag, kw_self, kw_anc, tag_ctx, depth, block, parent, link):
        self.el, self.tag = el, tag
        self.words = 0
        self.link_words = 0
        self.kw_self, self.kw_anc, self.tag_ctx, self.depth = kw_self, kw_anc, tag_ctx, depth
        self.block = block  # the _Block this element's own text goes to
        self.parent = parent
        self.link = link  # inside an <a> (below the block)
        self.cls = ""  # a block's class attribute (blocks alike: a grid's cards, a thread's posts)
        self.table = parent.table if parent is not None else None  # the nearest <table> (this one if it is)


class _Block:
    __slots__ = ("node", "pieces", "words", "link_words", "links", "words_before", "heading_above")

    def __init__(self, node, words_before, heading_above):
        self.node = node
        self.pieces: list[str] = []
        self.words = 0
        self.link_words = 0
        self.links = 0
        self.words_before = words_before
        self.heading_above = heading_above


def page_blocks(html: str) -> Page:
    """The reference path whole: the parse as first written, then ``walk``."""
    from lxml import etree

    parser = etree.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True)
    try:
        root = etree.fromstring(html.encode("utf-8", "surrogatepass"), parser=parser)
    except (etree.ParserError, etree.XMLSyntaxError, ValueError):
        return Page()
    return Page() if root is None else walk(root)


def walk(root) -> Page:
    from lxml import etree

    body = root.find("body")
    top = body if body is not None else root
    blocks: list[_Block] = []
    stack: list[_Node] = []
    words_total = 0
    heading_words = 0  # words of the last heading seen (a block under a heading)
    counts: Counter = Counter()  # blocks per tag
    h1_before = -1  # words before the first <h1> (-1: none)
    scripts: list = []  # the <script> elements passed, and the itemtype values read (page_signals)
    itemtypes: list[str] = []
    walker = etree.iterwalk(top, events=("start", "end"))
    for event, el in walker:
        tag = el.tag
        if not isinstance(tag, str):  # a comment or entity that survived the parser
            if event == "start":
                walker.skip_subtree()
            continue
        if event == "start":
            if tag in SKIP_TAGS and not (tag == "button" and swallowed(el)):
                if tag == "script":
                    scripts.append(el)
                walker.skip_subtree()  # its "end" still comes: its tail goes to the parent's block there
                if not stack:
                    break
                stack.append(_Node(el, "#skip", 0, 0, 0, stack[-1].depth + 1, stack[-1].block, stack[-1], False))
                continue
            parent = stack[-1] if stack else None
            kw, hidden, cls = _attributes(el)
            itemtype = el.get("itemtype")
            if itemtype is not None:
                itemtypes.append(itemtype)
            if parent is not None:
                kw_anc = parent.kw_anc | parent.kw_self
                ctx = parent.tag_ctx | TAG_BITS.get(tag, 0)
                depth = parent.depth + 1
            else:
                kw_anc, ctx, depth = 0, TAG_BITS.get(tag, 0), 0
            if hidden:
                ctx |= HIDDEN_BIT
            if tag in BLOCK_TAGS or parent is None:
                blk = _Block(None, words_total, heading_words)
                node = _Node(el, tag, kw, kw_anc, ctx, depth, blk, parent, False)
                if tag == "table":
                    node.table = node
                if cls is not None:
                    node.cls = cls
                blk.node = node
                blocks.append(blk)
                if tag == "h1" and h1_before < 0:
                    h1_before = words_total
                counts[tag] += 1
            else:
                # links are shallow: a link's words are link words up to the block around it
                node = _Node(el, tag, kw, kw_anc, ctx, depth, parent.block, parent, parent.link or tag == "a")
                if tag == "a":
                    parent.block.links += 1
                elif tag == "br":
                    parent.block.pieces.append("\n")
            stack.append(node)
            text = el.text
            if text:
                words_total += _add(node, text)
        else:
            node = stack.pop()
            if stack:
                top = stack[-1]
                top.words += node.words
                top.link_words += node.link_words
                tail = el.tail
                if tail:
                    words_total += _add(top, tail)
            if node.tag in HEADINGS:
                heading_words = node.block.words
    return _page(blocks, root, scripts, itemtypes, words_total, counts["li"], sum(counts[h] for h in HEADINGS),
                 counts["form"], counts["article"], min(counts["main"], 1), h1_before)


def _attributes(el) -> tuple[int, bool, str | None]:
    """An element's class/id keyword bits, its hidden flag and its class (None: no attribute)."""
    items = el.items()  # one C call; most elements have no attribute
    if not items:
        return 0, False, None
    attrs = dict(items)
    kw = _class_bits(attrs) if "class" in attrs or "id" in attrs else 0
    # hidden is a signal, not a verdict: streamed pages (Next.js) put their content in a hidden
    # <div> the script swaps in
    style = attrs.get("style")
    hidden = "hidden" in attrs or attrs.get("aria-hidden") == "true" or \
        (style is not None and "none" in style and DISPLAY_NONE.search(style) is not None)
    return kw, hidden, attrs.get("class") or ""


def _add(node: _Node, text: str) -> int:
    """``text`` (an element's text or a child's tail) into ``node``'s block and subtree counts."""
    block = node.block
    block.pieces.append(text)
    w = len(text.split())
    if w:
        block.words += w
        node.words += w
        if node.link:
            block.link_words += w
            node.link_words += w
    return w


_SENTENCE_END = frozenset('.!?:;"”。')


def _title_overlap(text: str, title: frozenset[str]) -> float:
    """Share of the block's first 30 words that are words of the page's <title> (a product's
    name, a thread's subject)."""
    if not title:
        return 0.0
    words = text.lower().split()[:30]
    return sum(w in title for w in words) / len(words)


def _title_words(root) -> frozenset[str]:
    t = root.find("head/title")
    text = t.text if t is not None else None
    return frozenset(w for w in (text or "").lower().split() if len(w) > 2)


def _page(blocks: list[_Block], root, scripts: list, itemtypes: list[str], words_total: int, n_li: int,
          n_heading: int, n_forms: int, n_articles: int, has_main: int, h1_before: int) -> Page:
    kept = [b for b in blocks if b.words > 0]
    n = len(kept)
    page = Page(root=root, elements=[b.node.el for b in kept])
    if not n:
        return page
    texts = [" ".join("".join(b.pieces).split()) for b in kept]
    seen: dict[str, int] = {}
    for t in texts:
        seen[t] = seen.get(t, 0) + 1
    # raw per-block values, gathered as Python numbers and turned into columns at once (a numpy
    # scalar write per value cost more than the walk)
    title = _title_words(root)
    alike: dict[tuple[str, str], int] = {}
    for b in kept:
        key = (b.node.tag, b.node.cls)
        alike[key] = alike.get(key, 0) + 1
    raw = []
    ids = []
    cells = []
    for b, t in zip(kept, texts):
        node = b.node
        p1 = node.parent
        p2 = p1.parent if p1 is not None else None
        p3 = p2.parent if p2 is not None else None
        head = t[:200]
        raw.append((b.words, b.link_words, len(t), b.links, len(b.pieces), node.depth, b.words_before,
                    t[-1] in _SENTENCE_END, t.count(","), t.count("."), sum(map(head.count, "0123456789")),
                    len(head), t[0].isupper(), seen[t] - 1,
                    p1.words if p1 is not None else -1, p1.link_words if p1 is not None else 0,
                    p2.words if p2 is not None else -1, p2.link_words if p2 is not None else 0,
                    p3.words if p3 is not None else -1, p3.link_words if p3 is not None else 0,
                    b.heading_above, _title_overlap(t, title), alike[(node.tag, node.cls)],
                    KIND_OF.get(node.tag, len(BLOCK_KINDS) - 1), node.kw_self, node.kw_anc, node.tag_ctx))
        ids.append((id(p1), id(p2), id(p3)))
        cells.append(id(node.table) if node.table is not None else 0)
    r = np.array(raw, np.float64)
    bits = np.array([row[-3:] for row in raw], np.int64)
    totals = np.array([words_total, n_li, n_heading, n_forms, n_articles, has_main, h1_before], np.int64)
    x = feature_matrix(r[:, :24], bits, totals, page_signals(root, "\n".join(texts).lower(), scripts, itemtypes))
    page.texts = texts
    page.features = x
    page.groups = np.array(ids, np.int64)
    page.cells = np.array(cells, np.int64)
    return page
