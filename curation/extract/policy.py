"""Combining several extraction engines on one page: ``first``, ``longest``, ``union``, ``route``.

``route`` runs the second (slower) engine only on pages whose cheap facts say it wins: the
first engine kept little of a page that has much text (resiliparse's main-content mode drops
lists, loose text and whole regions that trafilatura keeps). Tables are no reason to route:
``format: markdown`` writes them itself, and trafilatura's ``format: text`` leaves them out
(routing table pages to it took the gold set's table rows from 0.81 to 0.04). The facts are a
length and a tag-stripped word count of the raw HTML: no parse."""

from __future__ import annotations

import re
from typing import Callable, Sequence

_WORD = re.compile(r"\w+")
_TAG = re.compile(r"<[^>]*>")
#: the first engine's text under this share of the page's visible-ish characters: ask the second
ROUTE_MIN_SHARE = 0.10
ROUTE_MIN_CHARS = 400


def _blocks(text: str, format: str) -> list[str]:
    # Markdown: blank-line blocks (a table or code block stays whole); text: one line a paragraph
    parts = text.split("\n\n") if format == "markdown" else text.split("\n")
    return [p for p in parts if p.strip()]


def _key(block: str) -> str:
    return " ".join(_WORD.findall(block.lower()))


def union(texts: Sequence[str], format: str) -> str:
    """The first text's blocks, then each other text's blocks the ones before lack, each placed
    after the last block the texts share (no duplicates; the first text's order). A block whose
    words already occur, in order, in the merged text counts as shared: engines group blocks
    differently (one engine's code block and table can be another's one block)."""
    merged = _blocks(texts[0], format)
    keys = [_key(b) for b in merged]
    for other in texts[1:]:
        whole = " " + " ".join(keys) + " "
        anchor = -1  # insert position: after the last shared block seen so far
        for block in _blocks(other, format):
            k = _key(block)
            if not k:
                continue
            if k in keys:
                anchor = keys.index(k)
                continue
            if f" {k} " in whole:
                continue
            anchor += 1
            merged.insert(anchor, block)
            keys.insert(anchor, k)
    return ("\n\n" if format == "markdown" else "\n").join(merged)


def route_second(html: str, first: str, format: str) -> bool:
    """Whether ``route`` should run the second engine on this page (cheap facts, see module)."""
    if len(first) >= ROUTE_MIN_CHARS:
        return False
    body = html.find("<body")
    words = len(_TAG.sub(" ", html[body if body >= 0 else 0:]).split())  # visible words, roughly
    return words * 6 * ROUTE_MIN_SHARE > len(first)  # ~6 characters a word


def combine(html: str, fns: Sequence[Callable[[str], str]], policy: str, format: str) -> str:
    """Apply ``policy`` to the engines ``fns`` on one page (see ``extraction.extract_page``)."""
    if policy == "first":
        for fn in fns:
            text = fn(html)
            if text.strip():
                return text
        return ""
    if policy == "longest":
        return max((fn(html) for fn in fns), key=len)
    if policy == "union":
        return union([fn(html) for fn in fns], format)
    if policy == "route":
        first = fns[0](html)
        if route_second(html, first, format):
            second = fns[1](html)
            return second if len(second.strip()) > 0 else first
        return first
    raise ValueError(f"unknown extraction policy {policy!r}")
