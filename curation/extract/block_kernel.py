"""The block walk's arithmetic, compiled: ``blocks`` collects each element's tag, parent, class
and id, text and tail in document order (the only Python per element); here ``walk_events``
replays the walk's start and end events from the parents (an element ends when the next one's
parent is not it), summing words into blocks and subtrees as the walk did; ``class_bits`` finds
the keyword words of class and id strings; ``word_counts``, ``block_texts``, ``text_counts`` and
``title_overlap`` read the page's text as code points (whitespace as ``str.split``'s).

Pieces: a block's text is its pieces joined in event order; a piece is an element's text
(``ref = i``), an element's tail (``ref = n + i``, given to its parent's block) or a ``<br>``
(``ref = 2 * n``).

The loops call no function that takes an array: numba counts references of every array a call
passes, which costs more than a token or a piece.
"""

from __future__ import annotations

import numpy as np
from numba import njit

#: columns of the per-tag property table (``blocks.TAG_PROPS``)
IS_BLOCK, IS_SKIP, TAG_BIT, IS_A, IS_BR, IS_TABLE, HEADING, H1, COUNT = range(9)
#: ``COUNT``'s values: which page total a block of this tag adds to
N_LI, N_HEADING, N_FORM, N_ARTICLE, HAS_MAIN = 1, 2, 3, 4, 5


@njit(cache=True, nogil=True)
def walk_events(parent, code, kw_self, hidden, text_words, tail_words, props, hidden_bit):  # pragma: no cover
    """Per element (index in document order): subtree words and link words, depth, ancestors'
    class bits, tag context bits, nearest table (-1: none). Per block (in the order
    they start): element, words, link words, links, pieces, words before it, words of the
    heading above it. The pieces' refs in event order with their blocks, and the page totals
    (words, li, headings, forms, articles, main, words before the first h1 or -1)."""
    n = len(parent)
    words = np.zeros(n, np.int64)
    link_words = np.zeros(n, np.int64)
    block = np.zeros(n, np.int64)
    link = np.zeros(n, np.bool_)
    depth = np.zeros(n, np.int64)
    kw_anc = np.zeros(n, np.int64)
    ctx = np.zeros(n, np.int64)
    table = np.full(n, -1, np.int64)
    bl = np.zeros((n, 7), np.int64)  # element, words, link words, links, pieces, words before, heading above
    piece_ref = np.empty(3 * n, np.int64)
    piece_block = np.empty(3 * n, np.int64)
    totals = np.zeros(7, np.int64)
    totals[6] = -1
    stack = np.empty(n + 1, np.int64)
    i, sp, nb, k, heading_words = 0, 0, 0, 0, 0
    while True:
        if sp > 0 and (i == n or stack[sp - 1] != parent[i]):  # an end event: element j's tail
            sp -= 1
            j = stack[sp]
            node, ref, w = parent[j], n + j, -1
            if node >= 0:
                words[node] += words[j]
                link_words[node] += link_words[j]
                w = tail_words[j]
            if props[code[j], HEADING]:
                heading_words = bl[block[j], 1]
        elif i < n:  # a start event: element i's text
            p, c = parent[i], code[i]
            node, ref, w = i, i, text_words[i]
            stack[sp] = i
            sp += 1
            i += 1
            if p >= 0:
                depth[node] = depth[p] + 1
                table[node] = table[p]
            if props[c, IS_SKIP]:
                block[node] = block[p]
                continue
            if p >= 0:
                kw_anc[node] = kw_anc[p] | kw_self[p]
                ctx[node] = ctx[p] | props[c, TAG_BIT]
            else:
                ctx[node] = props[c, TAG_BIT]
            if hidden[node]:
                ctx[node] |= hidden_bit
            if props[c, IS_BLOCK] or p < 0:
                nb = _start_block(node, c, nb, props, block, table, bl, totals, heading_words)
            else:
                b = block[p]
                block[node] = b
                link[node] = link[p] or props[c, IS_A] != 0
                if props[c, IS_A]:
                    bl[b, 3] += 1
                elif props[c, IS_BR]:
                    piece_ref[k] = 2 * n
                    piece_block[k] = b
                    k += 1
                    bl[b, 4] += 1
        else:
            break
        if node >= 0 and w >= 0:  # the text, or tail, of w words into node's block and subtree
            b = block[node]
            piece_ref[k] = ref
            piece_block[k] = b
            k += 1
            bl[b, 4] += 1
            bl[b, 1] += w
            words[node] += w
            if link[node]:
                bl[b, 2] += w
                link_words[node] += w
            totals[0] += w
    return words, link_words, depth, kw_anc, ctx, table, bl[:nb], piece_ref[:k], piece_block[:k], totals


@njit(cache=True, nogil=True)
def _start_block(i, c, nb, props, block, table, bl, totals, heading_words):  # pragma: no cover
    block[i] = nb
    if props[c, IS_TABLE]:
        table[i] = i
    bl[nb, 0] = i
    bl[nb, 5] = totals[0]
    bl[nb, 6] = heading_words
    if props[c, H1] and totals[6] < 0:
        totals[6] = totals[0]
    if props[c, COUNT]:
        totals[props[c, COUNT]] += 1
    return nb + 1


@njit(cache=True, nogil=True)
def text_counts(chars, lengths):  # pragma: no cover
    """Per text (``chars``: the texts' code points end to end, ``lengths``: theirs): commas,
    periods, and ASCII digits among its first 200 characters."""
    n = len(lengths)
    out = np.zeros((n, 3), np.int64)
    at = 0
    for b in range(n):
        for j in range(lengths[b]):
            ch = chars[at + j]
            if ch == 44:
                out[b, 0] += 1
            elif ch == 46:
                out[b, 1] += 1
            elif 48 <= ch <= 57 and j < 200:
                out[b, 2] += 1
        at += lengths[b]
    return out


_FNV_OFFSET, _FNV_PRIME = np.uint64(14695981039346656037), np.uint64(1099511628211)


@njit(cache=True, nogil=True)
def class_bits(chars, lengths, slots, spelled, word_lengths, word_bits, pairs):  # pragma: no cover
    """Per class/id string (``chars``: the strings end to end, one byte a character, non-ASCII as
    ``?``): the OR of ``word_bits`` of its tokens and of each two neighbouring tokens' ``pairs``
    row (first word, second word, bits). A token is what ``[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+``
    matches, lower-cased; it is looked up by its FNV-1a hash in ``slots`` (open addressing, a power
    of two long) and spelled out against ``spelled``. One loop, no calls: a call that takes an
    array costs more than a token here."""
    out = np.zeros(len(lengths), np.int64)
    mask = np.uint64(len(slots) - 1)
    at = 0
    for k in range(len(lengths)):
        end = at + lengths[k]
        bits, prev, i = 0, -1, at
        while i < end:
            c = chars[i]
            e = i + 1
            if 65 <= c <= 90:
                if e < end and 97 <= chars[e] <= 122:
                    while e < end and 97 <= chars[e] <= 122:
                        e += 1
                else:
                    while e < end and 65 <= chars[e] <= 90:
                        e += 1
                    if e < end and 97 <= chars[e] <= 122:
                        e -= 1  # the last capital starts the next token ("HTMLParser": HTML, Parser)
            elif 97 <= c <= 122:
                while e < end and 97 <= chars[e] <= 122:
                    e += 1
            elif 48 <= c <= 57:
                while e < end and 48 <= chars[e] <= 57:
                    e += 1
                prev, i = -1, e  # a digit run: no keyword
                continue
            else:
                i += 1
                continue
            w = -1
            h = _FNV_OFFSET
            for j in range(i, e):
                h = (h ^ np.uint64(chars[j] | 32)) * _FNV_PRIME
            slot = h & mask
            while slots[slot] >= 0:
                cand = slots[slot]
                if word_lengths[cand] == e - i:
                    j = 0
                    while j < e - i and spelled[cand, j] == chars[i + j] | 32:
                        j += 1
                    if j == e - i:
                        w = cand
                        break
                slot = (slot + np.uint64(1)) & mask
            if w >= 0:
                bits |= word_bits[w]
                if prev >= 0:
                    for p in range(len(pairs)):
                        if pairs[p, 0] == prev and pairs[p, 1] == w:
                            bits |= pairs[p, 2]
            prev, i = w, e
        out[k] = bits
        at = end
    return out


@njit(cache=True, nogil=True)
def _is_space(c):  # pragma: no cover
    """``str.isspace`` of one code point (what ``str.split()`` splits at)."""
    if c <= 32:
        return c == 32 or 9 <= c <= 13 or 28 <= c <= 31
    if c < 133:
        return False
    return c == 133 or c == 160 or c == 5760 or 8192 <= c <= 8202 or c == 8232 or c == 8233 or c == 8239 or \
        c == 8287 or c == 12288


@njit(cache=True, nogil=True)
def word_counts(chars, lengths):  # pragma: no cover
    """``len(s.split())`` of each string (``chars``: code points end to end); -1 for an empty one."""
    out = np.full(len(lengths), -1, np.int64)
    at = 0
    for k in range(len(lengths)):
        if lengths[k]:
            w, space = 0, True
            for j in range(at, at + lengths[k]):
                s = _is_space(chars[j])
                if space and not s:
                    w += 1
                space = s
            out[k] = w
        at += lengths[k]
    return out


@njit(cache=True, nogil=True)
def block_texts(chars, lengths, refs, pieces, keep):  # pragma: no cover
    """The text of each kept block: its pieces (``refs`` in block order, ``pieces`` per block) run
    together, whitespace runs made one space, none at the ends (``" ".join("".join(p).split())``).
    A ref past the strings is a ``<br>``. The code points of all, end to end, and each one's end."""
    starts = np.zeros(len(lengths) + 1, np.int64)
    starts[1:] = np.cumsum(lengths)
    out = np.empty(len(chars) + len(refs), np.uint32)
    ends = np.empty(keep.sum(), np.int64)
    k, o, kb = 0, 0, 0
    for b in range(len(pieces)):
        if not keep[b]:
            k += pieces[b]
            continue
        begin, pending = o, False
        for _ in range(pieces[b]):
            r = refs[k]
            k += 1
            if r >= len(lengths):
                pending = o > begin
                continue
            for j in range(starts[r], starts[r + 1]):
                c = chars[j]
                if _is_space(c):
                    pending = o > begin
                else:
                    if pending:
                        out[o] = 32
                        o += 1
                        pending = False
                    out[o] = c
                    o += 1
        ends[kb] = o
        kb += 1
    return out[:o], ends


@njit(cache=True, nogil=True)
def title_overlap(chars, lengths, title, title_lengths):  # pragma: no cover
    """Per text (``chars``: lower-cased texts end to end, one separator between two): the share of
    its first 30 words (``str.split``'s) that are one of the ``title`` words (theirs end to end)."""
    title_starts = np.zeros(len(title_lengths) + 1, np.int64)
    title_starts[1:] = np.cumsum(title_lengths)
    out = np.zeros(len(lengths))
    at = 0
    for b in range(len(lengths)):
        j, end = at, at + lengths[b]
        words = hits = 0
        while j < end and words < 30:
            while j < end and _is_space(chars[j]):
                j += 1
            if j == end:
                break
            lo = j
            while j < end and not _is_space(chars[j]):
                j += 1
            words += 1
            for t in range(len(title_lengths)):
                if title_lengths[t] == j - lo:
                    s = title_starts[t]
                    k = 0
                    while k < j - lo and title[s + k] == chars[lo + k]:
                        k += 1
                    if k == j - lo:
                        hits += 1
                        break
        out[b] = hits / words
        at = end + 1
    return out
