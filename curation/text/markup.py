"""Markdown -> a plain view for measuring: the words and lines ``format: markdown`` keeps, without
its markup, so filters, langid and dedup judge a Markdown document as they judge its text.

Line-preserving (one plain line per Markdown line: a markup-only line becomes empty), so line
and paragraph signals count the same lines. The rules (``RULES``, RE2 patterns): heading marks,
list bullets and numbers, blockquote marks, code fences, table separator rows, table pipes
(cells joined by a tab, as resiliparse's text joins them), emphasis marks, math dollars and
backslash escapes. ``plain_view`` runs them as compiled scans (``markup_kernel``, ~3x faster);
``markup_reference.plain_view_by_rules`` runs the patterns themselves through Arrow, the
reference the tests hold it equal to.

What a text column is written in is its field's metadata (``MARKUP_KEY``, set by
``extract``; the writers keep the field): ``markup_of`` reads it and ``plain_texts`` gives the
view to measure or key, so dedup hashes a Markdown page as it hashes its text extraction."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.text.arrow import text_bytes

#: the text field's metadata key saying what ``extract`` wrote it in (``markup_of`` reads it)
MARKUP_KEY = b"refinery.markup"

# (bytes, rules): each group's rules applied in order, only to the texts holding one of its
# bytes (none of its rules can match elsewhere). A regex pass over every text costs ~40 ms per
# 12 MB, as does Arrow's match_substring; a numpy byte scan ~5 ms, and most pages have no tables,
# code, quotes or math. () = every text.
# (?m): ^ and $ are line starts and ends
RULES: tuple[tuple[tuple[bytes, ...], tuple[tuple[str, str], ...]], ...] = (
    ((b"`", b"~"), ((r"(?m)^[ \t]*(?:```|~~~)[^\n]*$", ""),)),              # code fences
    ((b"|",), (
        (r"(?m)^\|(?:[ \t]*:?-{3,}:?[ \t]*\|)+[ \t]*$", ""),                 # table separator rows
        (r"(?m)^\|[ \t]?", ""),                                              # a row's first pipe
        (r"(?m)[ \t]?\|[ \t]*$", ""),                                        # a row's last pipe
        (r"[ \t]\|[ \t]", "\t"),                                             # cell borders
    )),
    ((b"#",), ((r"(?m)^#{1,6}[ \t]+", ""),)),                                   # headings
    ((b">",), ((r"(?m)^(?:[ \t]*>)+[ \t]?", ""),)),                             # blockquotes
    ((), ((r"(?m)^([ \t]*)(?:[-*+]|\d{1,9}[.)])[ \t]+", "\\1"),)),           # list bullets / numbers
    ((b"*", b"_"), ((r"\*\*|__", ""),)),                                       # strong marks
    ((b"*",), ((r"(\w)\*|\*(\w)", "\\1\\2"),)),                               # emphasis marks (not 5 * 3)
    ((b"$",), (
        (r"\$\$", ""),                                                        # display math
        (r"(\S)\$(\s|$)|\$([^\s\d$])", "\\1\\2\\3"),                          # inline math (not $5)
    )),
    ((b"\\",), ((r"\\([\\|`*_{}\[\]()#+\-.!$])", "\\1"),)),                  # backslash escapes
)


def plain_view(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Markdown texts -> their plain view (same length, nulls kept; see module docstring): the
    rules of ``RULES`` run by the compiled scans of ``markup_kernel`` (``markup_reference``'s
    regex chain is the reference they are tested against, and ~10x slower)."""
    from curation.text.markup_kernel import plain_bytes

    out = one_string_array(texts)
    data, off, _, _ = text_bytes(out)
    pdata, poff = plain_bytes(data, off)
    view = pa.Array.from_buffers(pa.string(), len(out), [None, pa.py_buffer(poff.astype(np.int32)),
                                                         pa.py_buffer(pdata)])
    return pc.if_else(out.is_valid(), view, pa.scalar(None, pa.string())) if out.null_count else view


def one_string_array(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    out = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    return out.cast(pa.string()) if out.type == pa.large_string() else out


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
