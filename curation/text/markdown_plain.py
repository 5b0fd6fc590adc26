"""Markdown -> a plain view for measuring: the words and lines ``format: markdown`` keeps, without
its markup, so filters, langid and dedup judge a Markdown document as they judge its text.

Line-preserving (one plain line per Markdown line: a markup-only line becomes empty), so line
and paragraph signals count the same lines. Whole-array Arrow regex kernels, no per-document
Python: heading marks, list bullets and numbers, blockquote marks, code fences, table separator
rows, table pipes (cells joined by a tab, as resiliparse's text joins them), emphasis marks,
math dollars and backslash escapes."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

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
