"""A page as blocks, and what the page says about each: the input of the main-content decision.

One lxml parse, one walk of the tree (``iterwalk``: start/end events, in C). A *block* is a
block-level element's own text: its text, its inline children's text and the tails of its
children (a nested block is a block of its own). Per block: its words, the words inside links,
its tag, its depth and the class/id words of it and of its ancestors (as bits); per element the
words and link words of its subtree, so a block also knows how much text, and how much link
text, its parent and grandparents hold.

The walk itself only collects each element's tag, parent, text, tail and attributes; the sums
over the tree and the class/id words are compiled (``block_kernel``), the per-block columns
numpy over all blocks at once. ``blocks_reference`` is the same walk in plain Python (one
object per element), kept for the tests: the shipped model was trained on its features.

``page_blocks(html)`` returns a ``Page`` (blocks, their features as one float32 matrix, and the
pruned-tree hooks ``format: markdown`` needs); ``FEATURES`` names the matrix's columns.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from curation.extract import block_kernel as bk
from curation.extract.page_signals import PAGE_SIGNALS, page_signals

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
WORD_BITS: dict[str, int] = {}
for _i, (_n, _alts) in enumerate(KEYWORDS):
    for _w in _alts.split("|"):
        WORD_BITS[_w] = WORD_BITS.get(_w, 0) | (1 << _i)
#: context from tags, beside the keyword bits: (name, tags)
TAG_CONTEXT = (
    ("in_nav", "nav"), ("in_header", "header"), ("in_footer", "footer"), ("in_aside", "aside"),
    ("in_form", "form"), ("in_main", "main"), ("in_article", "article"), ("in_li", "li"),
    ("in_table", "table"), ("in_heading", "h1 h2 h3 h4 h5 h6"), ("in_blockquote", "blockquote"),
    ("in_pre", "pre code"), ("in_dl", "dl"), ("in_label", "label"),
)
TAG_BITS = {}
for _i, (_n, _tags) in enumerate(TAG_CONTEXT):
    for _t in _tags.split():
        TAG_BITS[_t] = TAG_BITS.get(_t, 0) | (1 << _i)
HIDDEN_BIT = 1 << len(TAG_CONTEXT)
DISPLAY_NONE = re.compile(r"display\s*:\s*none|visibility\s*:\s*hidden")
#: a block's own tag, one-hot
BLOCK_KINDS = ("p", "div", "li", "td", "h", "pre", "dd", "blockquote", "section", "other")
KIND_OF = {"p": 0, "div": 1, "li": 2, "td": 3, "th": 3, **{h: 4 for h in HEADINGS}, "pre": 5, "dd": 6, "dt": 6,
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
    *PAGE_SIGNALS,
)
_N_NUM, _N_KIND, _N_KW, _N_TAG = len(_NUMERIC), len(BLOCK_KINDS), len(KEYWORDS), len(TAG_CONTEXT) + 1


def _fnv1a(word: str) -> int:
    """The FNV-1a hash ``block_kernel.class_bits`` takes of a lower-case word."""
    h = 14695981039346656037
    for c in word.encode():
        h = ((h ^ c) * 1099511628211) & 0xFFFF_FFFF_FFFF_FFFF
    return h


def _vocabulary() -> tuple:
    """``block_kernel.class_bits``'s tables: the keyword words (and the halves of those written
    with one "-", which match as two neighbouring tokens) by hash, spelled out, with their bits."""
    words = {w: b for w, b in WORD_BITS.items() if "-" not in w}
    halves = [w.split("-") for w in WORD_BITS if w.count("-") == 1]  # "table-of-contents" never matches
    for a, b in halves:
        words.setdefault(a, 0)
        words.setdefault(b, 0)
    names = sorted(words)
    assert all(w.isascii() and w.isalpha() and w.islower() for w in names)
    spelled = np.zeros((len(names), max(map(len, names))), np.uint8)
    for i, w in enumerate(names):
        spelled[i, :len(w)] = np.frombuffer(w.encode(), np.uint8)
    lengths = np.array([len(w) for w in names], np.int64)
    slots = np.full(1024, -1, np.int64)  # open addressing, a quarter full
    for i, w in enumerate(names):
        at = _fnv1a(w) % len(slots)
        while slots[at] >= 0:
            at = (at + 1) % len(slots)
        slots[at] = i
    index = {w: i for i, w in enumerate(names)}
    pairs = np.array([(index[a], index[b], WORD_BITS[f"{a}-{b}"]) for a, b in halves], np.int64).reshape(-1, 3)
    return slots, spelled, lengths, np.array([words[w] for w in names], np.int64), pairs


_VOCABULARY = _vocabulary()


def _bits_of(keys: list[str]) -> np.ndarray:
    """The keyword bits of each element's ``class + " " + id`` (``block_kernel.class_bits``)."""
    chars = np.frombuffer("".join(keys).encode("ascii", "replace"), np.uint8)  # tokens are ASCII
    return bk.class_bits(chars, np.fromiter(map(len, keys), np.int64, len(keys)), *_VOCABULARY)


#: per tag: a small code, and per code what the walk needs to know of the tag
#: (``block_kernel``'s columns); code 0 is any other inline tag
_CODED = sorted(BLOCK_TAGS | set(TAG_BITS) | {"a", "br"})
TAG_CODE = {t: i + 1 for i, t in enumerate([*_CODED, *sorted(SKIP_TAGS)])}
TAG_PROPS = np.zeros((len(TAG_CODE) + 1, 9), np.int64)
_KIND_CODE = np.full(len(TAG_CODE) + 1, len(BLOCK_KINDS) - 1, np.int64)
_COUNTS = {"li": bk.N_LI, **{h: bk.N_HEADING for h in HEADINGS}, "form": bk.N_FORM, "article": bk.N_ARTICLE,
           "main": bk.HAS_MAIN}
for _t, _c in TAG_CODE.items():
    TAG_PROPS[_c] = (_t in BLOCK_TAGS, _t in SKIP_TAGS, TAG_BITS.get(_t, 0), _t == "a", _t == "br", _t == "table",
                     _t in HEADINGS, _t == "h1", _COUNTS.get(_t, 0))
    _KIND_CODE[_c] = KIND_OF.get(_t, len(BLOCK_KINDS) - 1)
assert not SKIP_TAGS & set(_CODED)


@dataclass
class Page:
    """A parsed page: its text blocks in document order, their features, and the tree."""

    texts: list[str] = field(default_factory=list)
    features: np.ndarray = field(default_factory=lambda: np.zeros((0, len(FEATURES)), np.float32))
    elements: list = field(default_factory=list)  # each block's element (pruning)
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
        # no table of id attributes: nothing here looks an element up by its id
        _PARSER = etree.HTMLParser(encoding="utf-8", remove_comments=True, remove_pis=True, collect_ids=False)
    return _PARSER


def page_blocks(html: str) -> Page:
    """Walk ``html`` once: its blocks and their features (module docstring)."""
    root = parse(html)
    if root is None:
        return Page()
    return walk(root)


def walk(root) -> Page:
    body = root.find("body")
    top = body if body is not None else root
    if top.tag in SKIP_TAGS:
        return Page(root=root)
    scripts: list = []
    itemtypes: list[str] = []
    return _page(root, _collect(top, scripts, itemtypes), scripts, itemtypes)


def _collect(top, scripts: list, itemtypes: list[str]) -> tuple:
    """One ``iterwalk`` over ``top``: per element in document order its element, tag code, parent,
    text, tail, class/id string, class attribute and hidden flag (skipped subtrees: the element
    alone, its text not read); the ``<script>`` elements it passes and the ``itemtype`` values it
    reads are added to ``scripts`` and ``itemtypes`` (``page_signals``)."""
    from lxml import etree

    rows = []
    add = rows.append
    stack = [-1]
    push, pop = stack.append, stack.pop
    code_of = TAG_CODE.get
    first_skip = len(_CODED) + 1
    script_code, button_code = TAG_CODE["script"], TAG_CODE["button"]
    walker = etree.iterwalk(top, events=("start", "end"))
    i = -1
    for event, el in walker:
        if event == "end":
            pop()
            continue
        tag = el.tag
        code = code_of(tag, 0)
        if code == button_code and swallowed(el):
            code = 0  # walked as an inline element
        if code >= first_skip or not code and not isinstance(tag, str):  # skipped, or a comment or entity
            walker.skip_subtree()  # its "end" still comes: its tail goes to the parent's block then
            if code:
                i += 1
                add((el, code, stack[-1], "", el.tail or "", "", "", False))
                if code == script_code:
                    scripts.append(el)
            push(i if code else -2)
            continue
        i += 1
        items = el.items()  # one C call; a loop over them costs less than a dict
        if items:
            cls = ident = style = None
            hidden = False
            for k, v in items:  # the parser keeps one attribute of a name
                if k == "class":
                    cls = v
                elif k == "id":
                    ident = v
                elif k == "style":
                    style = v
                elif k == "itemtype":
                    itemtypes.append(v)
                elif k == "hidden" or k == "aria-hidden" and v == "true":
                    # hidden is a signal, not a verdict: streamed pages (Next.js) put their
                    # content in a hidden <div> the script swaps in
                    hidden = True
            if style is not None and not hidden and "none" in style and DISPLAY_NONE.search(style) is not None:
                hidden = True
            add((el, code, stack[-1], el.text or "", el.tail or "",
                 "" if cls is None and ident is None else (cls or "") + " " + (ident or ""), cls or "", hidden))
        else:
            add((el, code, stack[-1], el.text or "", el.tail or "", "", "", False))
        push(i)
    return tuple(zip(*rows))


def _page(root, cols: tuple, scripts: list, itemtypes: list[str]) -> Page:
    els, codes, parents, texts, tails, keys, classes, hidden = cols
    n = len(els)
    code = np.array(codes, np.int64)
    parent = np.array(parents, np.int64)
    kw = _bits_of(keys)
    # every text and tail, end to end: their words now, the blocks' texts after the walk
    strings = (*texts, *tails)
    chars = _code_points("".join(strings))
    lengths = np.fromiter(map(len, strings), np.int64, 2 * n)
    words = bk.word_counts(chars, lengths)
    (sub_words, sub_link, depth, kw_anc, ctx, table, bl, refs, piece_block,
     totals) = bk.walk_events(parent, code, kw, np.array(hidden, np.bool_), words[:n], words[n:], TAG_PROPS,
                              HIDDEN_BIT)
    keep = bl[:, 1] > 0
    kept = np.flatnonzero(keep)
    e = bl[kept, 0]  # the kept blocks' elements
    page = Page(root=root, elements=[els[i] for i in e.tolist()])
    if not len(kept):
        return page
    # a copy of the pieces column: one compiled type (a column of one row would be contiguous)
    text_chars, ends = bk.block_texts(chars, lengths, refs[np.argsort(piece_block, kind="stable")],
                                      np.ascontiguousarray(bl[:, 4]), keep)
    joined = text_chars.tobytes().decode("utf-32-le", "surrogatepass")
    starts = np.concatenate([[0], ends[:-1]])
    page.texts = [joined[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
    kind_cls = list(zip(code[e].tolist(), [classes[i] for i in e.tolist()]))
    alike = Counter(kind_cls)
    r = np.empty((len(kept), 24), np.float64)
    r[:, [0, 1, 3, 4, 6, 20]] = bl[kept][:, [1, 2, 3, 4, 5, 6]]
    r[:, 5] = depth[e]
    low = "\n".join(page.texts).lower()  # the title overlap and the page signals read it
    r[:, [2, 7, 8, 9, 10, 11, 12, 13, 21]] = _text_columns(page.texts, text_chars, ends - starts,
                                                           _title_words(root), low)
    ups = (parent[e],)
    ups += (np.where(ups[0] >= 0, parent[ups[0]], -1),)
    ups += (np.where(ups[1] >= 0, parent[ups[1]], -1),)
    for c, p in zip((14, 16, 18), ups):
        r[:, c] = np.where(p >= 0, sub_words[p], -1)
        r[:, c + 1] = np.where(p >= 0, sub_link[p], 0)
    r[:, 22] = [alike[k] for k in kind_cls]
    r[:, 23] = _KIND_CODE[code[e]]
    bits = np.column_stack([kw[e], kw_anc[e], ctx[e]])
    page.features = feature_matrix(r, bits, totals, page_signals(root, low, scripts, itemtypes))
    page.groups = np.column_stack(ups)
    page.cells = np.where(table[e] >= 0, table[e] + 1, 0)
    return page


_SENTENCE_END = frozenset('.!?:;"”。')


def _text_columns(texts: list[str], chars: np.ndarray, lengths: np.ndarray, title: frozenset[str],
                  low: str) -> np.ndarray:
    """Per block text (``chars``: their code points end to end, ``lengths``: theirs; ``low``: the
    texts joined by newlines, lower-cased): characters,
    ends a sentence, commas, periods, digits and characters among its first 200, starts
    upper-case, other blocks with the same text, and its first 30 words' share of ``title``'s
    words (a product's name, a thread's subject)."""
    n = len(texts)
    out = np.zeros((n, 9), np.float64)
    out[:, 0] = lengths
    out[:, 1] = [t[-1] in _SENTENCE_END for t in texts]
    out[:, 2:5] = bk.text_counts(chars, lengths)
    out[:, 5] = np.minimum(lengths, 200)
    out[:, 6] = [t[0].isupper() for t in texts]
    seen = Counter(texts)
    out[:, 7] = [seen[t] - 1 for t in texts]
    if title:
        out[:, 8] = _title_overlap(texts, lengths, title, low)
    return out


def _title_overlap(texts: list[str], lengths: np.ndarray, title: frozenset[str], low: str | None = None) -> np.ndarray:
    """Share of each block's first 30 words, lower-cased, that are words of the page's <title>.
    Lower-cased all at once, one "\\n" between two texts (an end of text to ``str.lower``'s final
    sigma; ``low``, when the caller has it); where lower-casing changed a length, a text at a time."""
    if low is None:
        low = "\n".join(texts).lower()
    if len(low) != lengths.sum() + len(texts) - 1:
        return np.array([sum(map(title.__contains__, ws)) / len(ws)
                         for ws in [t.lower().split(None, 30)[:30] for t in texts]])
    words = sorted(title)
    return bk.title_overlap(_code_points(low), lengths, _code_points("".join(words)),
                            np.fromiter(map(len, words), np.int64, len(words)))


def _code_points(s: str) -> np.ndarray:
    return np.frombuffer(s.encode("utf-32-le", "surrogatepass"), np.uint32)


def _title_words(root) -> frozenset[str]:
    t = root.find("head/title")
    text = t.text if t is not None else None
    return frozenset(w for w in (text or "").lower().split() if len(w) > 2)


def feature_matrix(r: np.ndarray, bits: np.ndarray, totals: np.ndarray, signals: np.ndarray) -> np.ndarray:
    """The feature matrix (``FEATURES``) from the blocks' raw columns (``_page``: words, link
    words, characters, links, pieces, depth, words before, sentence end, commas, periods, digits
    and characters of the first 200, upper-case start, repeats, parent's / grandparent's /
    great-grandparent's words and link words, heading above, title overlap, blocks alike, kind),
    their class, ancestors' class and tag-context bits, the page totals (``block_kernel``) and what
    the page says of its kind (``page_signals``), the same in every row."""
    words_total, n_li, n_heading, n_forms, n_articles, has_main, h1_before = totals.tolist()
    n = len(r)
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
    x[:, 30] = min(has_main, 1)
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
    x[:, o + _N_TAG:] = signals
    return x


def prune(page: Page, keep: np.ndarray) -> None:
    """Drop from ``page.root`` the own text of every block not in ``keep`` (a bool per block); a
    block's nested blocks are judged on their own."""
    for el, k in zip(page.elements, keep):
        if not k:
            _drop_own_text(el)


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


#: a <button> holding block elements and more text than this is the rest of the page, nested into
#: an unclosed button by libxml2's parser (an HTML5 parser closes it; seen on whole publishers'
#: sites, Dotdash Meredith's): walked as an inline element, not skipped with its page
SWALLOWED_CHARS = 1000


def swallowed(el) -> bool:
    """Whether the skipped element ``el`` (a <button>) holds a page (``SWALLOWED_CHARS``)."""
    return _holds_block(el) and len(el.xpath("string()")) > SWALLOWED_CHARS


def _holds_block(el) -> bool:
    for d in el.iterdescendants():
        if isinstance(d.tag, str) and d.tag in BLOCK_TAGS:
            return True
    return False
