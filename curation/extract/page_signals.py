"""What a page says about its own kind: the page-level columns of the block features.

A product grid is main content on a category page and boilerplate under a product; a run of short
link blocks is a thread's replies or a menu. Block features alone cannot tell which page they are
on, so every block also carries what the whole page declares:

- its schema.org types (JSON-LD ``@type`` and microdata ``itemtype``: Product, ItemList,
  DiscussionForumPosting, Article, TechArticle, Service ...), grouped by page kind;
- its ``og:type`` (product, article, website);
- the words of its own address (``<link rel=canonical>`` or ``og:url``: ``/products/``,
  ``/collections/``, ``/thread/``, ``/docs/`` ...), its depth, digits, query;
- how many prices and add-to-cart phrases its visible text holds.

The declarations come from the walk (the ``<script>`` elements it passes and the ``itemtype``
attributes it reads anyway) and the ``<head>``'s children, the address and ``og:type`` from the
``<head>``, the prices and cart phrases by ``str.count`` over the blocks' lower-cased text (the
walk lower-cases it once, for the title overlap too): no regex or ``str.find`` over a whole page
and no second walk of the tree (measured on WCXB's pages: those cost a quarter of the walk,
0.5-1.4 ms a page; these, a few hundredths of a millisecond).
"""

from __future__ import annotations

import re
from urllib.parse import urlparse

import numpy as np

#: schema.org types by page kind (lower-case; a page may declare several)
SCHEMA_KINDS = (
    ("schema_product", "product productgroup offer aggregateoffer individualproduct productmodel"),
    ("schema_list", "itemlist collectionpage offercatalog searchresultspage listitem"),
    ("schema_forum", "discussionforumposting qapage question answer comment socialmediaposting"),
    ("schema_article", "article newsarticle blogposting reportagenewsarticle report analysisnewsarticle "
                       "opinionnewsarticle liveblogposting scholarlyarticle"),
    ("schema_docs", "techarticle apireference softwaresourcecode howto softwareapplication"),
    ("schema_service", "service localbusiness professionalservice organization corporation store restaurant "
                       "medicalbusiness legalservice financialservice homeandconstructionbusiness"),
    ("schema_faq", "faqpage"),
    ("schema_review", "review aggregaterating rating"),
    ("schema_breadcrumb", "breadcrumblist"),
    ("schema_other", "event jobposting recipe course movie book person"),
)
#: words of the page's address by page kind
ADDRESS_KINDS = (
    ("url_product", "product products p dp item itm sku pd buy shop"),
    ("url_collection", "collections collection category categories c cat catalog browse department dept shop-all "
                       "all s search"),
    ("url_forum", "forum forums t thread threads topic topics community discussion discussions questions q comments "
                  "viewtopic showthread r board boards"),
    ("url_docs", "docs doc documentation api reference guide guides manual learn tutorial tutorials wiki help "
                 "support kb developer developers sdk"),
    ("url_article", "blog blogs news article articles post posts story stories insights magazine journal press"),
    ("url_service", "services service solutions about contact pricing company industries treatments "
                    "practice-areas"),
    ("url_listing", "jobs events listings listing directory results locations stores people team careers"),
)
PAGE_SIGNALS: tuple[str, ...] = (
    *(n for n, _ in SCHEMA_KINDS), *(n for n, _ in ADDRESS_KINDS),
    "og_product", "og_article", "og_website", "url_depth", "url_digits", "url_root", "url_query",
    "log_prices", "log_carts",
)

_SCHEMA_OF = {t: i for i, (_, types) in enumerate(SCHEMA_KINDS) for t in types.split()}
_ADDRESS = [re.compile(r"(?<![a-z0-9])(?:" + "|".join(map(re.escape, words.split())) + r")(?![a-z0-9])")
            for _, words in ADDRESS_KINDS]
_LD_TYPE = re.compile(r'"@type"\s*:\s*(\[[^\]]*\]|"[^"]*")')
_QUOTED = re.compile(r'"([^"]*)"')
_DIGITS = re.compile(r"\d{4,}")
#: a price: a currency sign (counted, not parsed: the text of a grid holds dozens)
CURRENCY = "$€£¥"
#: the add-to-cart phrases of a shop's buttons and links, lower-case
CART = ("add to cart", "add to bag", "add to basket", "add-to-cart", "in den warenkorb", "ajouter au panier")


def _schema_bits(scripts: list, itemtypes: list[str], out: np.ndarray) -> None:
    """Set the ``SCHEMA_KINDS`` columns of the types declared by the JSON-LD among ``scripts``
    (``<script>`` elements) and by ``itemtypes`` (microdata attribute values)."""
    names = [t.rstrip("/") for v in itemtypes for t in v.split()]
    for script in scripts:
        if script.text and (script.get("type") or "").strip().lower() == "application/ld+json":
            names += [t for m in _LD_TYPE.finditer(script.text) for t in _QUOTED.findall(m.group(1))]
    for t in names:
        k = _SCHEMA_OF.get(t.rsplit("/", 1)[-1].lower())
        if k is not None:
            out[k] = 1


def _head(head) -> tuple[str, str]:
    """The page's own address and its ``og:type`` ('' when it names none)."""
    url = og = ""
    if head is None:
        return url, og
    for el in head:
        tag = el.tag
        if tag == "link" and not url and "canonical" in (el.get("rel") or "").lower().split():
            url = el.get("href") or ""
        elif tag == "meta":
            prop = (el.get("property") or el.get("name") or "").lower()
            if prop == "og:url" and not url:
                url = el.get("content") or ""
            elif prop == "og:type":
                og = (el.get("content") or "").strip().lower()
    return url, og


def page_signals(root, low: str, scripts: list, itemtypes: list[str]) -> np.ndarray:
    """``PAGE_SIGNALS`` of a parsed page (``root``) whose blocks' texts, joined by newlines and
    lower-cased, are ``low``; ``scripts``, the ``<script>`` elements the walk passed, and ``itemtypes``, the
    ``itemtype`` values it read (the ``<head>``'s own are looked up here)."""
    out = np.zeros(len(PAGE_SIGNALS), np.float32)
    if root is None:
        return out
    head = root.find("head")
    if head is not None:
        scripts = [*scripts, *head.iterchildren("script")]
    _schema_bits(scripts, itemtypes, out)
    url, og = _head(head)
    o = len(SCHEMA_KINDS)
    try:
        parts = urlparse(url.strip())
    except ValueError:  # a malformed address (an unclosed IPv6 bracket) names no path
        parts = urlparse("")
    path = parts.path.lower()
    for j, pattern in enumerate(_ADDRESS):
        out[o + j] = pattern.search(path) is not None
    o += len(ADDRESS_KINDS)
    segments = [s for s in path.split("/") if s]
    out[o:o + 9] = ("product" in og, "article" in og, og == "website", len(segments),
                    _DIGITS.search(path) is not None, not segments and bool(url), bool(parts.query),
                    np.log1p(sum(map(low.count, CURRENCY))), np.log1p(sum(map(low.count, CART))))
    return out
