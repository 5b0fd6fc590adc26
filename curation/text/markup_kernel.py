"""Compiled (numba) loop under ``markup.plain_view``: the Markdown -> plain view rules
over each text's bytes, the line rules in one pass over its lines (a line holding no mark is
copied whole), each text-wide rule from one of its bytes to the next.

The rules are ``markup.RULES`` (RE2 patterns, applied in order through Arrow): that
regex chain is the reference, and ``tests/test_extract_markdown.py`` holds the two equal on
real pages and on random markup. It cost ~120 us a page (a dozen RE2 passes, ~50 MB/s), paid
again by every stage that measures or keys a Markdown batch (repetition, FineWeb after C4's
line cut, exact and near dedup): most of what ``format: markdown`` added to the filter chain
(``bench_scale.py --side-by-side --formats text,markdown``); this costs ~40 us. Each pass here is a leftmost,
non-overlapping scan, as RE2's global replace is; RE2's ``\\w``, ``\\d`` and ``\\s`` are ASCII
classes, so bytes decide, except where a rule consumes any character (``\\S``, ``[^\\s\\d$]``):
those step over whole UTF-8 characters, as RE2 does.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_NL, _SP, _TAB, _PIPE, _HASH, _GT = 10, 32, 9, 124, 35, 62
_DASH, _COLON, _STAR, _PLUS, _UNDER, _DOLLAR, _BSL = 45, 58, 42, 43, 95, 36, 92
_BACKTICK, _TILDE, _DOT, _RPAREN = 96, 126, 46, 41


@njit(cache=True, nogil=True)
def _blank(c):  # [ \t]
    return c == _SP or c == _TAB


@njit(cache=True, nogil=True)
def _space(c):  # RE2's \s: [\t\n\f\r ]
    return c == _SP or c == _TAB or c == _NL or c == 12 or c == 13


@njit(cache=True, nogil=True)
def _digit(c):
    return 48 <= c <= 57


@njit(cache=True, nogil=True)
def _word(c):  # RE2's \w: [0-9A-Za-z_]
    return 48 <= c <= 57 or 65 <= c <= 90 or 97 <= c <= 122 or c == _UNDER


@njit(cache=True, nogil=True)
def _char_len(c):  # bytes of the UTF-8 character led by c (1 for a stray continuation byte)
    if c < 0xC0:
        return 1
    if c < 0xE0:
        return 2
    if c < 0xF0:
        return 3
    return 4


@njit(cache=True, nogil=True)
def _copy(a, s, e, b, m):
    """a[s:e] -> b[m:]; returns the new end in b"""
    if e > s:
        b[m:m + e - s] = a[s:e]
        return m + e - s
    return m


#: bytes that start a line rule (after the line's blanks): fences, table rows, headings, quotes,
#: bullets and numbers; a line holding none of them and no "|" is copied as it is
_LINE_MARK = np.zeros(256, np.bool_)
for _c in b"`~|#>-*+0123456789":
    _LINE_MARK[_c] = True
#: the bytes the text-wide rules need: 1 "*", 2 "_", 4 "$", 8 "\\"
_TEXT_MARK = np.zeros(256, np.uint8)
_TEXT_MARK[_STAR], _TEXT_MARK[_UNDER], _TEXT_MARK[_DOLLAR], _TEXT_MARK[_BSL] = 1, 2, 4, 8


@njit(cache=True, nogil=True)
def _cut(x, L, cs, ce):
    """Remove x[cs:ce] from the line x[:L] in place; the new length."""
    if ce <= cs:
        return L
    k = cs
    for i in range(ce, L):
        x[k] = x[i]
        k += 1
    return k


@njit(cache=True, nogil=True)
def _line_rules(x, L):
    """The line rules, in ``RULES``' order, on one line x[:L] in place; the new length. Each
    is line-local (none reaches past a newline), so rule by rule over a line is rule by rule
    over the text."""
    for rule in range(4):  # fences, separator rows, a row's first pipe, a row's last pipe
        cs, ce = _line_cut(x, 0, L, rule)
        L = _cut(x, L, cs, ce)
    k = 0  # cell borders: [ \t]\|[ \t] -> \t
    i = 0
    while i < L:
        if i + 2 < L and _blank(x[i]) and x[i + 1] == _PIPE and _blank(x[i + 2]):
            x[k] = _TAB
            i += 3
        else:
            x[k] = x[i]
            i += 1
        k += 1
    L = k
    for rule in range(4, 7):  # headings, blockquotes, list bullets / numbers
        cs, ce = _line_cut(x, 0, L, rule)
        L = _cut(x, L, cs, ce)
    return L


@njit(cache=True, nogil=True)
def _lines(a, n, b, line, line_mark, text_mark):
    """a[:n] -> b, each line through ``_line_rules`` when it may need one (``line``: scratch as
    long as the longest line); returns (bytes written, the text-wide rules' byte flags)."""
    m = 0
    s = 0
    flags = 0
    while s <= n:
        e = s
        pipe = False
        while e < n:
            c = a[e]
            if c == _NL:
                break
            pipe = pipe or c == _PIPE
            flags |= text_mark[c]
            e += 1
        j = s
        while j < e and _blank(a[j]):
            j += 1
        if pipe or (j < e and line_mark[a[j]]):
            L = e - s
            line[:L] = a[s:e]
            L = _line_rules(line, L)
            b[m:m + L] = line[:L]
            m += L
        else:
            b[m:m + e - s] = a[s:e]
            m += e - s
        if e < n:
            b[m] = _NL
            m += 1
        s = e + 1
    return m, flags


@njit(cache=True, nogil=True)
def _line_cut(a, s, e, rule):
    """The part [cut_s, cut_e) of the line a[s:e] that ``rule`` removes (cut_s == cut_e: none)."""
    if rule == 0:  # code fences: ^[ \t]*(?:```|~~~)[^\n]*$ -> ""
        j = s
        while j < e and _blank(a[j]):
            j += 1
        if j + 3 <= e and ((a[j] == _BACKTICK and a[j + 1] == _BACKTICK and a[j + 2] == _BACKTICK)
                           or (a[j] == _TILDE and a[j + 1] == _TILDE and a[j + 2] == _TILDE)):
            return s, e
        return s, s
    if rule == 1:  # table separator rows: ^\|(?:[ \t]*:?-{3,}:?[ \t]*\|)+[ \t]*$ -> ""
        if s >= e or a[s] != _PIPE:
            return s, s
        pos = s + 1
        groups = 0
        while True:
            p = pos
            while p < e and _blank(a[p]):
                p += 1
            if p < e and a[p] == _COLON:
                p += 1
            d = p
            while p < e and a[p] == _DASH:
                p += 1
            if p - d < 3:
                break
            if p < e and a[p] == _COLON:
                p += 1
            while p < e and _blank(a[p]):
                p += 1
            if p >= e or a[p] != _PIPE:
                break
            pos = p + 1
            groups += 1
        if groups == 0:
            return s, s
        while pos < e and _blank(a[pos]):
            pos += 1
        return (s, e) if pos == e else (s, s)
    if rule == 2:  # a row's first pipe: ^\|[ \t]? -> ""
        if s < e and a[s] == _PIPE:
            return s, (s + 2 if s + 1 < e and _blank(a[s + 1]) else s + 1)
        return s, s
    if rule == 3:  # a row's last pipe: [ \t]?\|[ \t]*$ -> "" (the last pipe with only blanks after it)
        j = e
        while j > s and _blank(a[j - 1]):
            j -= 1
        if j > s and a[j - 1] == _PIPE:
            q = j - 1
            return (q - 1 if q > s and _blank(a[q - 1]) else q), e
        return s, s
    if rule == 4:  # headings: ^#{1,6}[ \t]+ -> ""
        j = s
        while j < e and a[j] == _HASH:
            j += 1
        if 1 <= j - s <= 6 and j < e and _blank(a[j]):
            while j < e and _blank(a[j]):
                j += 1
            return s, j
        return s, s
    if rule == 5:  # blockquotes: ^(?:[ \t]*>)+[ \t]? -> ""
        pos = s
        quotes = 0
        while True:
            p = pos
            while p < e and _blank(a[p]):
                p += 1
            if p < e and a[p] == _GT:
                pos = p + 1
                quotes += 1
            else:
                break
        if quotes == 0:
            return s, s
        if pos < e and _blank(a[pos]):
            pos += 1
        return s, pos
    # rule 6, list bullets and numbers: ^([ \t]*)(?:[-*+]|\d{1,9}[.)])[ \t]+ -> \1
    j = s
    while j < e and _blank(a[j]):
        j += 1
    p = j
    if p < e and (a[p] == _DASH or a[p] == _STAR or a[p] == _PLUS):
        p += 1
    else:
        while p < e and _digit(a[p]):
            p += 1
        if p == j or p - j > 9 or p >= e or not (a[p] == _DOT or a[p] == _RPAREN):
            return s, s
        p += 1
    if p >= e or not _blank(a[p]):
        return j, j
    while p < e and _blank(a[p]):
        p += 1
    return j, p


# The text-wide rules below go from one byte their patterns need to the next (``_find``), copying
# what lies between in one move: ``i`` is where the text not yet consumed by a match starts, so a
# match never reaches back into the one before it (RE2's non-overlapping global replace).


@njit(cache=True, nogil=True)
def _find(a, k, n, x, y):
    """The first position >= k holding byte x or y (n: none)."""
    while k < n and a[k] != x and a[k] != y:
        k += 1
    return k


@njit(cache=True, nogil=True)
def _drop(a, i, k, e, b, m):
    """A match [.., e) whose only removed byte is the mark at k: a[i:k] and a[k+1:e] -> b[m:]
    (the text before it and what it captured); returns the new end in b."""
    return _copy(a, k + 1, e, b, _copy(a, i, k, b, m))


@njit(cache=True, nogil=True)
def _pairs(a, n, b, x, y):
    """xx|yy -> "" (strong marks: ** and __; display math: $$ with x == y == $)"""
    m = i = 0
    k = _find(a, 0, n, x, y)
    while k < n:
        if k + 1 < n and a[k + 1] == a[k]:
            m = _copy(a, i, k, b, m)
            i = k = k + 2
        else:
            k += 1
        k = _find(a, k, n, x, y)
    return _copy(a, i, n, b, m)


@njit(cache=True, nogil=True)
def _emphasis(a, n, b):
    r"""(\w)\*|\*(\w) -> \1\2: at each "*", the word character before it (not consumed), else
    the one after it"""
    m = i = 0
    k = _find(a, 0, n, _STAR, _STAR)
    while k < n:
        if k - 1 >= i and _word(a[k - 1]):
            m = _drop(a, i, k, k + 1, b, m)
            i = k = k + 1
        elif k + 1 < n and _word(a[k + 1]):
            m = _drop(a, i, k, k + 2, b, m)
            i = k = k + 2
        else:
            k += 1
        k = _find(a, k, n, _STAR, _STAR)
    return _copy(a, i, n, b, m)


@njit(cache=True, nogil=True)
def _inline_math(a, n, b):
    r"""(\S)\$(\s|$)|\$([^\s\d$]) -> \1\2\3 (``$`` outside (?m): the text's end): at each "$",
    the character before it (whole, not consumed) and a space or the end after it; else the
    character after it"""
    m = i = 0
    k = _find(a, 0, n, _DOLLAR, _DOLLAR)
    while k < n:
        # the character before: its last byte decides (\S; a byte of a longer character is no
        # space) and lies in the text not consumed iff the whole character does (i sits
        # between characters)
        if k - 1 >= i and not _space(a[k - 1]) and (k + 1 == n or _space(a[k + 1])):
            e = min(k + 2, n)
        elif k + 1 < n and not _space(a[k + 1]) and not _digit(a[k + 1]) and a[k + 1] != _DOLLAR:
            e = min(k + 1 + _char_len(a[k + 1]), n)
        else:
            k = _find(a, k + 1, n, _DOLLAR, _DOLLAR)
            continue
        m = _drop(a, i, k, e, b, m)
        i = e
        k = _find(a, e, n, _DOLLAR, _DOLLAR)
    return _copy(a, i, n, b, m)


@njit(cache=True, nogil=True)
def _escaped(c):  # [\\|`*_{}\[\]()#+\-.!$]
    return (c == _BSL or c == _PIPE or c == _BACKTICK or c == _STAR or c == _UNDER or c == 123 or c == 125
            or c == 91 or c == 93 or c == 40 or c == 41 or c == _HASH or c == _PLUS or c == _DASH or c == _DOT
            or c == 33 or c == _DOLLAR)


@njit(cache=True, nogil=True)
def _escapes(a, n, b):
    r"""\\([\\|`*_{}\[\]()#+\-.!$]) -> \1"""
    m = i = 0
    k = _find(a, 0, n, _BSL, _BSL)
    while k < n:
        if k + 1 < n and _escaped(a[k + 1]):
            m = _drop(a, i, k, k + 2, b, m)
            i = k = k + 2
        else:
            k += 1
        k = _find(a, k, n, _BSL, _BSL)
    return _copy(a, i, n, b, m)


@njit(cache=True, nogil=True)
def _plain_one(a, n, b, line, line_mark, text_mark):
    """One text a[:n] -> its plain view in a[:m] (b, line: scratch); returns m. The rules in
    ``markup.RULES``' order (each sees the one before's output); a text-wide rule runs
    only on a text holding its byte (none of them makes one)."""
    m, flags = _lines(a, n, b, line, line_mark, text_mark)
    src, dst = b, a
    at_a = False  # where the text is now
    if flags & 3:  # strong marks
        m = _pairs(src, m, dst, _STAR, _UNDER)
        src, dst, at_a = dst, src, not at_a
    if flags & 1:  # emphasis marks
        m = _emphasis(src, m, dst)
        src, dst, at_a = dst, src, not at_a
    if flags & 4:  # display, then inline math (two passes: back in src)
        m = _pairs(src, m, dst, _DOLLAR, _DOLLAR)
        m = _inline_math(dst, m, src)
    if flags & 8:  # backslash escapes
        m = _escapes(src, m, dst)
        src, dst, at_a = dst, src, not at_a
    if not at_a:
        a[:m] = src[:m]
    return m


@njit(cache=True, nogil=True)
def _plain_bytes(data, off, line_mark, text_mark):
    n_texts = len(off) - 1
    out = np.empty(max(len(data), 1), np.uint8)
    out_off = np.zeros(n_texts + 1, np.int64)
    longest = 1
    for t in range(n_texts):
        longest = max(longest, off[t + 1] - off[t])
    a = np.empty(longest, np.uint8)
    b = np.empty(longest, np.uint8)
    line = np.empty(longest, np.uint8)
    m_all = 0
    for t in range(n_texts):
        n = off[t + 1] - off[t]
        a[:n] = data[off[t]:off[t + 1]]
        m = _plain_one(a, n, b, line, line_mark, text_mark)
        out[m_all:m_all + m] = a[:m]
        m_all += m
        out_off[t + 1] = m_all
    return out[:m_all], out_off


def plain_bytes(data: np.ndarray, off: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Texts (``data[off[i]:off[i+1]]``, UTF-8) -> (their plain views' bytes, offsets)."""
    return _plain_bytes(data, off, _LINE_MARK, _TEXT_MARK)
