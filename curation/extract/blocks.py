"""A page as blocks, and what the page says about each: the input of the main-content decision.

One lxml parse, one walk of the tree (``iterwalk``: start/end events, in C). A *block* is a
block-level element's own text: its text, its inline children's text and the tails of its
children (a nested block is a block of its own). Per block the walk records its words, the
words inside links, its tag, its depth and the class/id words of it and of its ancestors (one
regex per element, as bits); per element it sums the words and link words of its subtree, so a
block also knows how much text, and how much link text, its parent and grandparents hold.

``page_blocks(html)`` returns a ``Page`` (blocks, their features as one float32 matrix, and the
pruned-tree hooks ``format: markdown`` needs); ``FEATURES`` names the matrix's columns.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

#: elements that start a block (their own text is one block)
BLOCK_TAGS = frozenset(
    "p div li td th h1 h2 h3 h4 h5 h6 pre blockquote article section main header footer nav aside ul ol dl dt dd "
    "table tr tbody thead tfoot caption form fieldset figure figcaption address center details summary body html "
    "dialog menu hgroup legend noscript".split())
#: elements whose subtree is never text
SKIP_TAGS = frozenset("script style template svg iframe head select option textarea object embed canvas map "
                      "video audio picture source math button input".split())
HEADINGS = frozenset("h1 h2 h3 h4 h5 h6".split())

#: class/id words, each a bit: (name, regex alternatives). Boilerplate first, then content words.
KEYWORDS = (
    ("nav", r"nav|navbar|navigation|menu|menus|submenu|dropdown|megamenu"),
    ("footer", r"footer|foot|bottom|colophon"),
    ("header", r"header|masthead|topbar|top-bar|branding|logo"),
    ("sidebar", r"sidebar|side|aside|rail|widget|widgets|secondary"),
    ("comment", r"comment|comments|disqus|respond|discussion"),
    ("share", r"share|sharing|social|facebook|twitter|follow|addthis|sharethis"),
    ("related", r"related|recommend|recommended|more|popular|trending|recirc|also|suggest"),
    ("breadcrumb", r"breadcrumb|breadcrumbs|crumb|crumbs"),
    ("ad", r"ad|ads|advert|advertisement|sponsor|sponsored|promo|promotion|banner|dfp|gpt"),
    ("cookie", r"cookie|cookies|consent|gdpr|privacy|notice"),
    ("subscribe", r"subscribe|subscription|newsletter|signup|sign-up|cta|optin"),
    ("login", r"login|signin|account|user|register|auth"),
    ("search", r"search|filter|filters|facet|facets|sort|sorting"),
    ("tags", r"tag|tags|category|categories|taxonomy|label|labels"),
    ("meta", r"meta|byline|author|date|time|timestamp|published|info|detail|details"),
    ("hidden", r"hidden|hide|sr-only|visually-hidden|screen-reader|offscreen|invisible|collapse"),
    ("modal", r"modal|popup|overlay|dialog|lightbox|toast|drawer"),
    ("pager", r"pagination|pager|pages|paging|next|prev|previous"),
    ("skip", r"skip|jump|toc|table-of-contents"),
    ("copyright", r"copyright|legal|disclaimer|terms"),
    ("content", r"content|contents|main|primary|body|text|prose|copy|rte|richtext|wysiwyg"),
    ("article", r"article|post|entry|story|blog|news|hentry|single"),
    ("product", r"product|pdp|description|desc|spec|specs|specification|specifications|price|feature|features"),
    ("review", r"review|reviews|rating|ratings|testimonial"),
    ("forum", r"thread|topic|message|messages|reply|replies|postbody|post-body|forum|question|answer|answers"),
    ("listing", r"list|listing|listings|item|items|card|cards|result|results|grid|tile|tiles|collection|catalog"),
    ("docs", r"doc|docs|documentation|markdown|md|rst|api|reference|manual|guide|section"),
    ("title", r"title|headline|heading|name"),
)
#: word -> its keyword bits (a word may be in two groups); "sr-only"-like words are looked up as
#: two neighbouring tokens joined by "-"
_WORD_BITS: dict[str, int] = {}
for _i, (_n, _alts) in enumerate(KEYWORDS):
    for _w in _alts.split("|"):
        _WORD_BITS[_w] = _WORD_BITS.get(_w, 0) | (1 << _i)
#: class/id tokens: lowercase runs, camelCase humps (CSS modules' "SiteNav_menu__x7"), digit runs
_TOKEN = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
#: context from tags, beside the keyword bits: (name, tags)
TAG_CONTEXT = (
    ("in_nav", "nav"), ("in_header", "header"), ("in_footer", "footer"), ("in_aside", "aside"),
    ("in_form", "form"), ("in_main", "main"), ("in_article", "article"), ("in_li", "li"),
    ("in_table", "table"), ("in_heading", "h1 h2 h3 h4 h5 h6"), ("in_blockquote", "blockquote"),
    ("in_pre", "pre code"), ("in_dl", "dl"), ("in_label", "label"),
)
_TAG_BIT = {}
for _i, (_n, _tags) in enumerate(TAG_CONTEXT):
    for _t in _tags.split():
        _TAG_BIT[_t] = _TAG_BIT.get(_t, 0) | (1 << _i)
_HIDDEN_BIT = 1 << len(TAG_CONTEXT)
_DISPLAY_NONE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden")
#: a block's own tag, one-hot
BLOCK_KINDS = ("p", "div", "li", "td", "h", "pre", "dd", "blockquote", "section", "other")
_KIND_OF = {"p": 0, "div": 1, "li": 2, "td": 3, "th": 3, **{h: 4 for h in HEADINGS}, "pre": 5, "dd": 6, "dt": 6,
            "blockquote": 7, "section": 8, "article": 8, "main": 8}

_NUMERIC = (
    "words", "log_words", "chars_per_word", "link_words_share", "links", "pieces", "depth", "position",
    "words_before_share", "words_share_of_page", "sentence_end", "commas_per_word", "periods_per_word",
    "digits_share", "upper_start", "repeats",
    "parent_words", "parent_link_share", "grand_words", "grand_link_share", "great_words", "great_link_share",
    "prev_words", "prev_link_share", "next_words", "next_link_share",
    "page_words", "page_link_share", "page_blocks", "page_li_share", "page_has_main", "page_articles",
    "page_headings", "page_forms", "heading_above_words",
    "after_h1", "h1_distance", "title_overlap", "same_class_blocks",
)
FEATURES: tuple[str, ...] = (
    *_NUMERIC,
    *(f"kind_{k}" for k in BLOCK_KINDS),
    *(f"self_{n}" for n, _ in KEYWORDS),
    *(f"anc_{n}" for n, _ in KEYWORDS),
    *(n for n, _ in TAG_CONTEXT), "in_hidden",
)
_N_NUM, _N_KIND, _N_KW, _N_TAG = len(_NUMERIC), len(BLOCK_KINDS), len(KEYWORDS), len(TAG_CONTEXT) + 1


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
            bits |= _WORD_BITS.get(t, 0)
        for a, b in zip(toks, toks[1:]):
            bits |= _WORD_BITS.get(a + "-" + b, 0)
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


@dataclass
class Page:
    """A parsed page: its text blocks in document order, their features, and the tree."""

    texts: list[str] = field(default_factory=list)
    features: np.ndarray = field(default_factory=lambda: np.zeros((0, len(FEATURES)), np.float32))
    blocks: list = field(default_factory=list)  # the _Block objects (pruning)
    #: per block, ids of its parent, grandparent and great-grandparent element (blocks that
    #: share one are siblings or cousins: the second pass pools their first-pass scores)
    groups: np.ndarray = field(default_factory=lambda: np.zeros((0, 3), np.int64))
    #: per block, an id of the nearest table it is in (0: none); a data table is kept or
    #: dropped whole (``main_content.whole_tables``)
    cells: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    root: object = None


def parse(html: str):
    """``html`` -> an lxml root (None when lxml finds no document)."""
    from lxml import etree

    try:
        return etree.fromstring(html.encode("utf-8", "surrogatepass"), parser=_parser())
    except (etree.ParserError, etree.XMLSyntaxError, ValueError):
        return None


_PARSER = None


def _parser():
    global _PARSER
    if _PARSER is None:
        from lxml import etree

        # lxml.etree's parser, not lxml.html's: no Python element-class lookup per element
        _PARSER = etree.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True)
    return _PARSER


def page_blocks(html: str) -> Page:
    """Walk ``html`` once: its blocks and their features (module docstring)."""
    root = parse(html)
    if root is None:
        return Page()
    return walk(root)


def walk(root) -> Page:
    from lxml import etree

    body = root.find("body")
    top = body if body is not None else root
    blocks: list[_Block] = []
    stack: list[_Node] = []
    words_total = 0
    heading_words = 0  # words of the last heading seen (a block under a heading)
    n_li = n_heading = n_forms = n_articles = 0
    has_main = 0
    h1_before = -1  # words before the first <h1> (-1: none)
    walker = etree.iterwalk(top, events=("start", "end"))
    for event, el in walker:
        tag = el.tag
        if not isinstance(tag, str):  # a comment or entity that survived the parser
            if event == "start":
                walker.skip_subtree()
            continue
        if event == "start":
            if tag in SKIP_TAGS:
                walker.skip_subtree()  # its "end" still comes: its tail goes to the parent's block there
                if not stack:
                    break
                stack.append(_Node(el, "#skip", 0, 0, 0, stack[-1].depth + 1, stack[-1].block, stack[-1], False))
                continue
            parent = stack[-1] if stack else None
            items = el.items()  # one C call; most elements have no attribute
            kw = 0
            hidden = False
            attrs = None
            if items:
                attrs = dict(items)
                if "class" in attrs or "id" in attrs:
                    kw = _class_bits(attrs)
                # hidden is a signal, not a verdict: streamed pages (Next.js) put their content
                # in a hidden <div> the script swaps in
                style = attrs.get("style")
                hidden = "hidden" in attrs or attrs.get("aria-hidden") == "true" or \
                    (style is not None and "none" in style and _DISPLAY_NONE.search(style) is not None)
            if parent is not None:
                kw_anc = parent.kw_anc | parent.kw_self
                ctx = parent.tag_ctx | _TAG_BIT.get(tag, 0)
                depth = parent.depth + 1
            else:
                kw_anc, ctx, depth = 0, _TAG_BIT.get(tag, 0), 0
            if hidden:
                ctx |= _HIDDEN_BIT
            if tag in BLOCK_TAGS or parent is None:
                blk = _Block(None, words_total, heading_words)
                node = _Node(el, tag, kw, kw_anc, ctx, depth, blk, parent, False)
                if tag == "table":
                    node.table = node
                if attrs is not None:
                    node.cls = attrs.get("class") or ""
                blk.node = node
                blocks.append(blk)
                if tag == "h1" and h1_before < 0:
                    h1_before = words_total
                if tag == "li":
                    n_li += 1
                elif tag in HEADINGS:
                    n_heading += 1
                elif tag == "form":
                    n_forms += 1
                elif tag == "article":
                    n_articles += 1
                elif tag == "main":
                    has_main = 1
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
    return _page(blocks, root, words_total, n_li, n_heading, n_forms, n_articles, has_main, h1_before)


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


def _page(blocks: list[_Block], root, words_total: int, n_li: int, n_heading: int, n_forms: int,
          n_articles: int, has_main: int, h1_before: int) -> Page:
    kept = [b for b in blocks if b.words > 0]
    n = len(kept)
    page = Page(root=root, blocks=kept)
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
                    _KIND_OF.get(node.tag, len(BLOCK_KINDS) - 1), node.kw_self, node.kw_anc, node.tag_ctx))
        ids.append((id(p1), id(p2), id(p3)))
        cells.append(id(node.table) if node.table is not None else 0)
    r = np.array(raw, np.float64)
    bits = np.array([row[-3:] for row in raw], np.int64)
    w, lw = r[:, 0], r[:, 1]
    x = np.zeros((n, len(FEATURES)), np.float32)
    tw = max(words_total, 1)
    x[:, 0] = w
    x[:, 1] = np.log1p(w)
    x[:, 2] = r[:, 2] / w
    x[:, 3] = lw / w
    x[:, 4] = r[:, 3]
    x[:, 5] = r[:, 4]
    x[:, 6] = r[:, 5]
    x[:, 7] = np.arange(n) / n
    x[:, 8] = r[:, 6] / tw
    x[:, 9] = w / tw
    x[:, 10] = r[:, 7]
    x[:, 11] = r[:, 8] / w
    x[:, 12] = r[:, 9] / w
    x[:, 13] = r[:, 10] / r[:, 11]
    x[:, 14] = r[:, 12]
    x[:, 15] = r[:, 13]
    for j, c in ((16, 14), (18, 16), (20, 18)):
        has = r[:, c] >= 0
        x[:, j] = np.where(has, np.log1p(np.maximum(r[:, c], 0)), 0)
        x[:, j + 1] = np.where(has, r[:, c + 1] / np.maximum(r[:, c], 1), 0)
    x[1:, 22] = np.log1p(w[:-1])
    x[1:, 23] = (lw / w)[:-1]
    x[:-1, 24] = np.log1p(w[1:])
    x[:-1, 25] = (lw / w)[1:]
    x[:, 26] = np.log1p(words_total)
    x[:, 27] = lw.sum() / tw
    x[:, 28] = np.log1p(n)
    x[:, 29] = n_li / n
    x[:, 30] = has_main
    x[:, 31] = min(n_articles, 20)
    x[:, 32] = min(n_heading, 50)
    x[:, 33] = min(n_forms, 20)
    x[:, 34] = np.log1p(r[:, 20])
    if h1_before >= 0:
        x[:, 35] = r[:, 6] >= h1_before
        x[:, 36] = (r[:, 6] - h1_before) / tw
    x[:, 37] = r[:, 21]
    x[:, 38] = np.log1p(r[:, 22])
    o = _N_NUM
    x[np.arange(n), o + r[:, 23].astype(np.int64)] = 1
    o += _N_KIND
    shifts = np.arange(_N_KW)
    x[:, o:o + _N_KW] = (bits[:, 0:1] >> shifts) & 1
    o += _N_KW
    x[:, o:o + _N_KW] = (bits[:, 1:2] >> shifts) & 1
    o += _N_KW
    x[:, o:o + _N_TAG] = (bits[:, 2:3] >> np.arange(_N_TAG)) & 1
    page.texts = texts
    page.features = x
    page.groups = np.array(ids, np.int64)
    page.cells = np.array(cells, np.int64)
    return page


def prune(page: Page, keep: np.ndarray) -> None:
    """Drop from ``page.root`` the own text of every block not in ``keep`` (a bool per block); a
    block's nested blocks are judged on their own."""
    for b, k in zip(page.blocks, keep):
        if not k:
            _drop_own_text(b.node.el)


def _drop_own_text(el) -> None:
    """``el``'s text, its inline children (with their tails) and the tails of its block
    children; an inline child holding a block loses only its own text, the same way."""
    el.text = None
    for child in list(el):
        tag = child.tag if isinstance(child.tag, str) else ""
        if tag in BLOCK_TAGS:
            child.tail = None
        elif _holds_block(child):
            _drop_own_text(child)
            child.tail = None
        else:
            el.remove(child)  # lxml drops the child's tail with it


def _holds_block(el) -> bool:
    for d in el.iterdescendants():
        if isinstance(d.tag, str) and d.tag in BLOCK_TAGS:
            return True
    return False
