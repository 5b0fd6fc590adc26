"""Markdown -> a plain view for measuring: the words and lines ``format: markdown`` keeps, without
its markup, so filters, langid and dedup judge a Markdown document as they judge its text.

Line-preserving (one plain line per Markdown line: a markup-only line becomes empty), so line
and paragraph signals count the same lines. Whole-array Arrow regex kernels, no per-document
Python: heading marks, list bullets and numbers, blockquote marks, code fences, table separator
rows, table pipes (cells joined by a tab, as resiliparse's text joins them), emphasis marks,
math dollars and backslash escapes.

What a text column is written in is its field's metadata (``extraction.MARKUP_KEY``, set by
``extract``; the writers keep the field): ``markup_of`` reads it and ``plain_texts`` gives the
view to measure or key, so dedup hashes a Markdown page as it hashes its text extraction."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from curation.text.extraction import MARKUP_KEY

# (pattern, replacement), applied in order; (?m): ^ and $ are line starts and ends
_RULES: tuple[tuple[str, str], ...] = (
    (r"(?m)^[ \t]*(?:```|~~~)[^\n]*$", ""),                       # code fences
    (r"(?m)^\|(?:[ \t]*:?-{3,}:?[ \t]*\|)+[ \t]*$", ""),          # table separator rows
    (r"(?m)^\|[ \t]?", ""),                                       # a row's first pipe
    (r"(?m)[ \t]?\|[ \t]*$", ""),                                 # a row's last pipe
    (r"[ \t]\|[ \t]", "\t"),                                      # cell borders
    (r"(?m)^#{1,6}[ \t]+", ""),                                   # headings
    (r"(?m)^(?:[ \t]*>)+[ \t]?", ""),                             # blockquotes
    (r"(?m)^([ \t]*)(?:[-*+]|\d{1,9}[.)])[ \t]+", "\\1"),         # list bullets / numbers
    (r"\*\*|__", ""),                                             # strong marks
    (r"(\w)\*|\*(\w)", "\\1\\2"),                                   # emphasis marks (not 5 * 3)
    (r"\$\$", ""),                                                 # display math
    (r"(\S)\$(\s|$)|\$([^\s\d$])", "\\1\\2\\3"),                      # inline math (not $5)
    (r"\\([\\|`*_{}\[\]()#+\-.!$])", "\\1"),                      # backslash escapes
)


def plain_view(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Markdown texts -> their plain view (same length, nulls kept; see module docstring)."""
    out = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    if out.type == pa.large_string():
        out = out.cast(pa.string())
    for pattern, repl in _RULES:
        out = pc.replace_substring_regex(out, pattern=pattern, replacement=repl)
    return out


def markup_of(field: pa.Field) -> str:
    """What a text field's values are written in: ``"markdown"`` where its metadata says so
    (``extract``'s ``format``), else ``"text"``."""
    return (field.metadata or {}).get(MARKUP_KEY, b"text").decode()


def plain_texts(texts: pa.Array | pa.ChunkedArray, markup: str) -> pa.Array | pa.ChunkedArray:
    """The texts as measured and keyed: their ``plain_view`` when ``markup`` is Markdown, the
    texts themselves (not copied) when they are plain."""
    if markup == "text":
        return texts
    if markup != "markdown":
        raise ValueError(f"markup {markup!r}: 'text' or 'markdown'")
    return plain_view(texts)
