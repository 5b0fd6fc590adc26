"""Markdown -> a plain view for measuring: the words and lines ``format: markdown`` keeps, without
its markup, so filters, langid and dedup judge a Markdown document as they judge its text.

Line-preserving (one plain line per Markdown line: a markup-only line becomes empty), so line
and paragraph signals count the same lines. The rules (``_RULES``, RE2 patterns): heading marks,
list bullets and numbers, blockquote marks, code fences, table separator rows, table pipes
(cells joined by a tab, as resiliparse's text joins them), emphasis marks, math dollars and
backslash escapes. ``plain_view`` runs them as compiled scans (``plain_kernel``, ~3x faster);
``plain_view_by_rules`` runs the patterns themselves through Arrow, the reference.

What a text column is written in is its field's metadata (``extraction.MARKUP_KEY``, set by
``extract``; the writers keep the field): ``markup_of`` reads it and ``plain_texts`` gives the
view to measure or key, so dedup hashes a Markdown page as it hashes its text extraction."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.text.arrow import text_bytes
from curation.text.extraction import MARKUP_KEY
from curation.text.segments import replace_regex_where

# (bytes, rules): each group's rules applied in order, only to the texts holding one of its
# bytes (none of its rules can match elsewhere). A regex pass over every text costs ~40 ms per
# 12 MB, as does Arrow's match_substring; a numpy byte scan ~5 ms, and most pages have no tables,
# code, quotes or math. () = every text.
# (?m): ^ and $ are line starts and ends
_RULES: tuple[tuple[tuple[bytes, ...], tuple[tuple[str, str], ...]], ...] = (
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


#: bit of each mark byte in ``_marks_held``'s per-text flags
_MARK_BITS = {m: 1 << i for i, m in enumerate(sorted({m for marks, _ in _RULES for m in marks}))}
_LUT = np.zeros(256, dtype=np.uint16)
for _m, _bit in _MARK_BITS.items():
    _LUT[_m[0]] = _bit


def _marks_held(texts: pa.Array) -> np.ndarray:
    """Per text, the OR of ``_MARK_BITS`` of the mark bytes it holds: one pass over the bytes.
    Taken once, before any rule: rules only remove characters (or put back what they
    captured), so a text without a mark never gains one."""
    data, off, _, _ = text_bytes(texts)
    flags = np.zeros(len(texts), dtype=np.uint16)
    if len(data) == 0:
        return flags
    per_byte = _LUT[data]
    starts = off[:-1]
    nonempty = starts < off[1:]
    flags[nonempty] = np.bitwise_or.reduceat(per_byte, starts[nonempty])
    return flags


def plain_view(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Markdown texts -> their plain view (same length, nulls kept; see module docstring): the
    rules of ``_RULES`` run by the compiled scans of ``plain_kernel`` (``plain_view_by_rules``,
    the regex chain, is the reference they are tested against, and ~10x slower)."""
    from curation.text.plain_kernel import plain_bytes

    out = _one_string_array(texts)
    data, off, _, _ = text_bytes(out)
    pdata, poff = plain_bytes(data, off)
    view = pa.Array.from_buffers(pa.string(), len(out), [None, pa.py_buffer(poff.astype(np.int32)),
                                                         pa.py_buffer(pdata)])
    return pc.if_else(out.is_valid(), view, pa.scalar(None, pa.string())) if out.null_count else view


def _one_string_array(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    out = texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts
    return out.cast(pa.string()) if out.type == pa.large_string() else out


def plain_view_by_rules(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``plain_view`` by the rules themselves: each group's RE2 patterns through Arrow, in order,
    on the texts holding one of its bytes. The reference ``plain_view`` is held equal to."""
    out = _one_string_array(texts)
    held = _marks_held(out)
    every = np.ones(len(out), dtype=bool)
    for marks, rules in _RULES:
        out = replace_regex_where(out, (held & sum(_MARK_BITS[m] for m in marks)) != 0 if marks else every, rules)
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
