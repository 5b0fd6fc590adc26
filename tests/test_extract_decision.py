"""The blocks engine's page-level signals (``page_signals``), its per-page keep rule
(``keep_blocks``: the kept set that maximizes expected word F1, against a plain reference) and
its repeats kept once (``once``)."""

from __future__ import annotations

from itertools import product

import numpy as np
import pytest

from curation.extract.blocks import FEATURES, page_blocks
from curation.extract.main_content import keep_blocks, once
from curation.extract.page_signals import PAGE_SIGNALS

PRODUCT = """<html><head><title>Wool Runner</title>
<link rel="canonical" href="https://shop.example.com/products/wool-runner-2?color=grey">
<meta property="og:type" content="product">
<script type="application/ld+json">{"@context": "https://schema.org", "@type": ["Product", "Thing"],
 "offers": {"@type": "Offer", "price": "110"}}</script></head><body>
<div itemscope itemtype="https://schema.org/BreadcrumbList"><a href="/">Home</a></div>
<h1>Wool Runner</h1><p>Soft merino wool and a sugarcane sole, $110.00 or 4 payments of $27.50.</p>
<button>Add to cart</button><p>Add to Bag</p></body></html>"""


def _signals(html: str) -> dict[str, float]:
    page = page_blocks(html)
    row = page.features[0, len(FEATURES) - len(PAGE_SIGNALS):]
    # every block carries the same page-level columns
    assert (page.features[:, len(FEATURES) - len(PAGE_SIGNALS):] == row).all()
    return dict(zip(PAGE_SIGNALS, row.tolist()))


def test_a_product_page_says_what_it_is():
    s = _signals(PRODUCT)
    assert s["schema_product"] == 1 and s["schema_breadcrumb"] == 1 and s["schema_article"] == 0
    assert s["og_product"] == 1 and s["og_article"] == 0 and s["og_website"] == 0
    assert s["url_product"] == 1 and s["url_collection"] == 0 and s["url_forum"] == 0
    assert s["url_depth"] == 2 and s["url_query"] == 1 and s["url_root"] == 0 and s["url_digits"] == 0
    # "$110.00" and "$27.50" in the text; the button's text is never a block, "Add to Bag" is
    assert s["log_prices"] == pytest.approx(np.log1p(2)) and s["log_carts"] == pytest.approx(np.log1p(1))


def test_a_thread_a_doc_and_a_page_that_names_nothing():
    thread = ("<html><head><meta property='og:url' content='https://forum.example.org/t/owls-at-night/12345'>"
              "<meta property='og:type' content='website'></head><body><article itemscope "
              "itemtype='http://schema.org/DiscussionForumPosting'><p>Owls hunt at night.</p></article></body></html>")
    s = _signals(thread)
    assert s["schema_forum"] == 1 and s["url_forum"] == 1 and s["og_website"] == 1 and s["url_digits"] == 1
    docs = ("<html><head><link rel='canonical' href='/docs/api/reference/'></head><body>"
            "<script type='application/ld+json'>{\"@type\": \"TechArticle\"}</script>"
            "<p>Call it twice.</p></body></html>")
    s = _signals(docs)
    assert s["schema_docs"] == 1 and s["url_docs"] == 1 and s["url_depth"] == 3 and s["schema_article"] == 0
    bare = "<html><body><p>Nothing about itself, not even a head.</p></body></html>"
    assert not any(_signals(bare).values())
    # an address urllib cannot split, and JSON-LD that is not JSON, read as naming nothing
    odd = ("<html><head><link rel='canonical' href='http://[::1/products/x'><script type='application/ld+json'>"
           "{\"@type\": </script></head><body><p>Still a page.</p></body></html>")
    s = _signals(odd)
    assert s["url_product"] == 0 and s["schema_product"] == 0


def _expected_f1(keep: np.ndarray, p: np.ndarray, w: np.ndarray) -> float:
    return 2 * (p * w)[keep].sum() / max(w[keep].sum() + (p * w).sum(), 1e-9)


def test_keep_blocks_maximizes_expected_f1_over_every_subset():
    """The prefix by score is the best of all 2^n kept sets (the Dinkelbach argument), on random pages."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        p = rng.random(n)
        w = rng.integers(1, 60, n).astype(np.float64)
        best = max(_expected_f1(np.array(k, bool), p, w) for k in product([False, True], repeat=n))
        got = keep_blocks(p, w, floor=0.0)
        assert _expected_f1(got, p, w) == pytest.approx(best, rel=1e-12)
        # and it is a threshold on the score: no dropped block scores above a kept one
        if got.any() and (~got).any():
            assert p[got].min() >= p[~got].max()


def test_keep_blocks_adapts_its_threshold_and_respects_the_floor():
    w = np.array([100.0, 10, 10, 10])
    # one sure article: the uncertain blocks are left out
    assert keep_blocks(np.array([0.99, 0.4, 0.4, 0.4]), w, 0.2).tolist() == [True, False, False, False]
    # a page of uncertain blocks (a grid): kept, where a fixed 0.5 would keep nothing
    grid = np.array([0.45, 0.42, 0.4, 0.38])
    assert keep_blocks(grid, np.full(4, 10.0), 0.2).all()
    # under the floor nothing is kept, however the page looks
    assert not keep_blocks(np.array([0.15, 0.1]), np.array([10.0, 10.0]), 0.2).any()
    assert keep_blocks(np.zeros(0), np.zeros(0), 0.2).tolist() == []


def test_a_page_inside_an_unclosed_button_is_walked():
    """libxml2's parser nests the rest of a page into a <button> whose divs are left open (as on Dotdash
    Meredith's sites; an HTML5 parser closes them at ``</button>``):
    such a button is walked as an inline element, where a small button keeps being skipped."""
    from curation.extract import blocks_reference

    story = " ".join(["Growing up on a farm, I thought everyone had an acre or two to plant."] * 20)
    html = ("<html><head><title>Gardens</title></head><body><header><div class='menu'>"
            "<button class='menu-button'><div class='inner'><div></button></div></header>"
            f"<main><article><h1>How to start a garden</h1><p>{story}</p><p>Water it often.</p></article></main>"
            "<footer><button><div>Close</div></button><p>Copyright 2026</p></footer></body></html>")
    page = page_blocks(html)
    # the parser did nest the article into the button, and the walk found it there
    button = page.root.find(".//button")
    assert button.find(".//article") is not None
    assert any(t.startswith("Growing up on a farm") for t in page.texts) and "Water it often." in page.texts
    # a button holding a block but little text is still skipped: its "Close" is no block's text
    assert not any("Close" in t for t in page.texts)
    ref = blocks_reference.page_blocks(html)
    assert ref.texts == page.texts and np.array_equal(ref.features, page.features)


THREAD = """<html><body><h1>Which telescope first?</h1>
<div class="post"><p>I want a first telescope for the planets, under 500 dollars.</p></div>
<div class="post"><blockquote><p>I want a first telescope for the planets, under 500 dollars.</p></blockquote>
<p>A 6 inch Dobsonian: simple, and it shows Saturn's rings.</p></div>
<ul><li>Great answer, thank you.</li><li>Great answer, thank you.</li></ul>
<pre><code>}</code></pre><div><pre><code>}</code></pre></div>
<table><tr><td>true</td><td>Required</td></tr></table><div><table><tr><td>true</td></tr></table></div></body></html>"""


def test_a_text_the_page_repeats_is_kept_once():
    page = page_blocks(THREAD)
    kept = once(page.texts, np.ones(len(page.texts), np.bool_), page.features, page.groups)
    out = [t for t, k in zip(page.texts, kept) if k]
    # the reply's quote of the first post goes; siblings alike stay (a list's items), so do code lines
    assert out.count("I want a first telescope for the planets, under 500 dollars.") == 1
    assert out.count("Great answer, thank you.") == 2
    assert "A 6 inch Dobsonian: simple, and it shows Saturn's rings." in out
    assert out.count("}") == 2 and out.count("true") == 2
    # nothing kept, nothing to drop; a kept set's other blocks are untouched
    none = np.zeros(len(page.texts), np.bool_)
    assert not once(page.texts, none, page.features, page.groups).any()
