"""Compiled (numba) loops under ``curation.text.words``' word splitter.

Each replaces a chain of numpy passes over every byte or word where a profile showed the
passes cost more than the work (``tests/benchmarks/bench_pipeline.py``): matching spans
against special-case keys touched ~10 arrays per word to reject almost all of them; here a
word costs one table probe. Semantics are those of the numpy code they replaced, which the
filter tests pin against spaCy's and datatrove's outputs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from curation.hashing import splitmix64_one
from curation.text.counts import space_width
from curation.text.chars import (BYTE_DIGIT, BYTE_DOT_AFTER, BYTE_LETTER, BYTE_LOWER, BYTE_NEEDS_RULES, BYTE_PREFIX, BYTE_PUNCTUATION, BYTE_SPACE, BYTE_SUFFIX, BYTE_TERMINAL, BYTE_UNICODE_PUNCT, BYTE_UPPER)

# The class bits (``curation.text.chars``: what each one means) are module constants here,
# so numba compiles them in.

#: splitmix64 of one uint64 (``curation.hashing``), compiled
mix64 = njit(cache=True, nogil=True)(splitmix64_one)


@njit(cache=True, nogil=True)
def short_key(b, s, n):
    """64-bit key of the bytes ``b[s:s+n]`` (n <= 16): the bytes, little-endian in two words,
    mixed with the length (``keys.py_short_key`` of one span)."""
    lo = np.uint64(0)
    hi = np.uint64(0)
    for k in range(min(n, 8)):
        lo |= np.uint64(b[s + k]) << np.uint64(8 * k)
    for k in range(8, n):
        hi |= np.uint64(b[s + k]) << np.uint64(8 * (k - 8))
    return mix64(lo ^ mix64(hi + np.uint64(n)))


@njit(cache=True, nogil=True)
def find_keys(b, start, n_bytes, sorted_keys, order, sieve):
    """Spans ``b[start:start+n]`` equal to one of the keys: (span indices, key indices).

    ``sieve`` (per first and last byte, a bit per length and per second byte) rules out almost
    every span before its key is computed; the key is then looked up by binary search."""
    m = len(start)
    idx = np.empty(m, np.int64)
    hit = np.empty(m, np.int64)
    found = 0
    for i in range(m):
        s = start[i]
        n = n_bytes[i]
        # the sieve read here: a call per span with the arrays as arguments (their reference
        # counts) cost 3x; ``_sieved`` takes only numbers
        if 0 < n <= 16 and _sieved(sieve[(np.int64(b[s]) << 8) | np.int64(b[s + n - 1])], n,
                                   np.int64(b[s + 1]) if n > 1 else 0):
            j = _lookup(b, s, n, sorted_keys)
            if j >= 0:
                idx[found] = i
                hit[found] = order[j]
                found += 1
    return idx[:found], hit[:found]


@njit(cache=True, nogil=True)
def _sieved(bits, n, second):
    """Whether a sieve entry (``keys.key_sieve``) may hold a span of ``n`` bytes whose second
    byte is ``second`` (0 for one byte): it has a key of that length and one with that second
    byte (mod 15)."""
    return ((bits >> np.uint32(n)) & (bits >> np.uint32(17 + second % 15)) & np.uint32(1)) != 0


@njit(cache=True, nogil=True)
def _lookup(b, s, n, sorted_keys):
    """Index in ``sorted_keys`` of the key of ``b[s:s+n]`` (n <= 16), -1 if it is not there."""
    key = short_key(b, s, n)
    j = np.searchsorted(sorted_keys, key)
    if j < len(sorted_keys) and sorted_keys[j] == key:
        return j
    return -1


@njit(cache=True, nogil=True)
def special_case_cuts(b, tok_start, tok_end, whole, ks, keys, key_lo, cuts, sieves,
                      one_keys, one_cuts, one_sieve):
    """The special-case replacements of ``words._apply_special_cases`` in one pass per table:
    (first word, words merged, cut offsets, cut owners) for ``replace_spans``.

    Multi-word tables (``ks`` descending; table q's keys are ``keys[key_lo[q]:key_lo[q+1]]``,
    sorted, with the cut masks in ``cuts`` beside them): k words that touch, at most 16
    bytes, none of whose ends an earlier (longer) match took; of two overlapping matches of
    one table the later wins. Then the one-word table on whole cores whose word no match
    took (``whole``: the indices of the words that are whole cores, ascending). A word costs
    a look at its touching-run length; only runs are probed (the numpy version built k
    boolean arrays over every word per table: a third of the word split)."""
    m = len(tok_start)
    # words from here on that touch, this one included; then the words that start a run of
    # two or more (branch-free: a touch is data, about one word in ten)
    run = np.ones(max(m, 1), np.int32)
    at = np.empty(max(m, 1), np.int64)
    n_at = 0
    for i in range(m - 2, -1, -1):
        run[i] = np.int32(1) + run[i + 1] * np.int32(tok_end[i] == tok_start[i + 1])
        at[n_at] = i
        n_at += run[i] > 1
    at[:n_at] = at[:n_at][::-1].copy()
    multi = n_at
    taken = np.zeros(max(m, 1), np.bool_)
    # replacements: at most one per word (a match's first word is one no other match took)
    rt = np.empty(m, np.int64)
    rk = np.empty(m, np.int64)
    ra = np.empty(m, np.int64)
    rcut = np.empty(m, np.uint64)
    R = 0
    found_t = np.empty(max(multi, 1), np.int64)
    found_j = np.empty(max(multi, 1), np.int64)
    for q in range(len(ks)):
        k = ks[q]
        tab = keys[key_lo[q]:key_lo[q + 1]]
        f = 0
        for x in range(n_at):
            t = at[x]
            if run[t] < k:
                continue
            a = tok_start[t]
            n = tok_end[t + k - 1] - a
            if n > 16 or taken[t] or taken[t + k - 1]:
                continue
            if not _sieved(sieves[q, (np.int64(b[a]) << 8) | np.int64(b[a + n - 1])], n, np.int64(b[a + 1])):
                continue
            j = _lookup(b, a, n, tab)
            if j >= 0:
                found_t[f] = t
                found_j[f] = key_lo[q] + j
                f += 1
        for x in range(f):
            t = found_t[x]
            if x + 1 < f and found_t[x + 1] <= t + k - 1:  # overlaps the next match
                continue
            rt[R], rk[R], ra[R], rcut[R] = t, k, tok_start[t], cuts[found_j[x]]
            R += 1
        for x in range(R):
            if rk[x] == k:
                for y in range(k):
                    taken[rt[x] + y] = True
    for x in range(len(whole)):
        t = whole[x]
        a = tok_start[t]
        n = tok_end[t] - a
        if not (0 < n <= 16 and _sieved(one_sieve[(np.int64(b[a]) << 8) | np.int64(b[a + n - 1])], n,
                                        np.int64(b[a + 1]) if n > 1 else 0)):
            continue
        j = _lookup(b, a, n, one_keys)
        if j < 0 or taken[t]:
            continue
        rt[R], rk[R], ra[R], rcut[R] = t, 1, a, one_cuts[j]
        R += 1
    n_cut = 0
    for r in range(R):
        for off in range(1, 64):
            n_cut += (rcut[r] >> np.uint64(off)) & np.uint64(1)
    cut_at = np.empty(n_cut, np.int64)
    cut_owner = np.empty(n_cut, np.int64)
    w = 0
    for r in range(R):  # by owner, then offset: what replace_spans reads
        for off in range(1, 64):
            if (rcut[r] >> np.uint64(off)) & np.uint64(1):
                cut_at[w] = ra[r] + off
                cut_owner[w] = r
                w += 1
    return rt[:R].copy(), rk[:R].copy(), cut_at, cut_owner


@njit(cache=True, nogil=True)
def is_unit(x, a, n, unit_rows, unit_len):
    """Whether ``x[a:a+n]`` (code points or bytes) is one of the units (rows of
    ``unit_rows`` in the same encoding, ``unit_len`` long)."""
    for u in range(len(unit_len)):
        if unit_len[u] != n:
            continue
        same = True
        for k in range(n):
            if x[a + k] != unit_rows[u, k]:
                same = False
                break
        if same:
            return True
    return False


@njit(cache=True, nogil=True)
def scan_chunks(b, cls, doff, unit_b, unit_n, cap):
    """Whitespace-separated chunks of every text (``doff``: text byte offsets), and how the
    quick rules cut them.

    A chunk without a rule character is one word (kind 0), and so is a chunk of one
    character. A chunk whose only rule characters are one ASCII character at either end
    ("word," "(word" "(mot)" "Straße.") is decided from the neighbouring characters' classes
    (kind 1), and so is a chunk of letters with one hyphen or apostrophe inside ("far-flung",
    kind 3: no whole core; "Here’s", "l’homme"). In kinds 0 and 1, a unit after a number at
    the end of the core ("5kg", "25$"; rows of ``unit_b``, ``unit_n`` bytes long) is split
    off. The rest take the full rules (kind 2).

    Returns per chunk: start, end, kind, core start, core end (before a unit) and where the
    suffix starts (the unit, if any, runs from the core end to there; in kind 3 the hyphen
    takes the unit's place). A quick chunk's words are the non-empty spans among prefix,
    core, unit and suffix.
    """
    # Room for ``cap`` chunks; more returns n_quick = -1 and the caller calls again with
    # ``chunk_bound``. A counting pass over every byte first cost a sixth of this kernel, and
    # growing the arrays inside the loop made it 4x slower (web text has a chunk per ~6 bytes).
    c_start = np.empty(cap, np.int64)
    c_end = np.empty(cap, np.int64)
    kind = np.empty(cap, np.int8)
    core_s = np.empty(cap, np.int64)
    core_e = np.empty(cap, np.int64)
    suf_s = np.empty(cap, np.int64)
    k = 0
    n_quick = 0  # words of the quick chunks (``word_spans`` sizes its output from it)
    for d in range(len(doff) - 1):
        i = doff[d]
        end = doff[d + 1]
        while i < end:
            if (cls[i] & BYTE_SPACE) != 0:
                i += 1
                continue
            if k == cap:
                return c_start, c_end, kind, core_s, core_e, suf_s, -1
            s = i
            any_cls = 0
            while i < end:
                x = cls[i]
                if (x & BYTE_SPACE) != 0:
                    break
                any_cls |= x
                i += 1
            e = i
            c_start[k] = s
            c_end[k] = e
            kind[k] = 0
            cs = s
            ce = e
            sf = -1
            if (any_cls & BYTE_NEEDS_RULES) != 0:
                kind[k] = 2
                lead = b[s]
                w0 = 1 if lead < 0x80 else (4 if lead >= 0xF0 else (3 if lead >= 0xE0 else 2))  # first character's bytes
                if e - s == w0:
                    kind[k] = 0  # a single character ("-", "—", "&") is one word
                # Non-ASCII letters in the core are fine: a multi-byte character flags all its
                # bytes, so one rule character at an end is as many rule bytes as it has, and
                # the neighbour classes below are of whole characters (every byte of a
                # character carries its class).
                elif e - s >= 2:
                    n_rb = 0
                    for j in range(s, e):
                        if (cls[j] & BYTE_NEEDS_RULES) != 0:
                            n_rb += 1
                    # where the last character starts: one rule character at an end may be a
                    # multi-byte one (“word „Wort Stadt“ «mot»: an eighth of the chunks that
                    # took the full rules on the long bench pages)
                    x = e - 1
                    while x > s and (b[x] & 0xC0) == 0x80:
                        x -= 1
                    # (not "°": "°C." cuts its dot by the degree rule, which reads the "°")
                    first = (cls[s] & BYTE_NEEDS_RULES) != 0 and not (lead == 0xC2 and b[s + 1] == 0xB0)
                    last = (cls[e - 1] & BYTE_NEEDS_RULES) != 0
                    at_start = n_rb == w0 and first
                    at_end = n_rb == e - x and last
                    both = n_rb == w0 + e - x and first and last and x > s + w0
                    if at_start or at_end or both:
                        kind[k] = 1
                        # "+" before a digit stays on the number
                        if (at_start or both) and (cls[s] & BYTE_PREFIX) != 0 and not (
                                b[s] == 0x2B and 0x30 <= b[s + 1] <= 0x39):
                            cs = s + w0
                        if at_end or both:
                            pc_ = cls[x - 1]
                            p = x - 1  # where the character before the suffix starts
                            while p > cs and (b[p] & 0xC0) == 0x80:
                                p -= 1
                            two_upper = (pc_ & BYTE_UPPER) != 0 and p - 1 >= cs and (cls[p - 1] & BYTE_UPPER) != 0
                            dot = b[x] == 0x2E and ((pc_ & (BYTE_LOWER | BYTE_DIGIT | BYTE_DOT_AFTER)) != 0 or two_upper)
                            plus = b[x] == 0x2B and (pc_ & BYTE_DIGIT) != 0
                            if (cls[x] & BYTE_SUFFIX) != 0 or dot or plus:
                                ce = x
                if kind[k] == 2 and (any_cls & BYTE_DIGIT) == 0:
                    # One rule character inside letters: a hyphen between letters is an infix
                    # ("far-flung": three words, none a whole core; kind 3); an apostrophe
                    # before a final s/S starts a suffix ("Here’s": two words), any other
                    # apostrophe is part of the word ("l’homme"). Digits go to the full
                    # rules (units, number infixes).
                    h = -1
                    n_r = 0
                    for j in range(s, e):
                        if (cls[j] & BYTE_NEEDS_RULES) != 0:
                            if h < 0:
                                h = j
                            n_r += 1
                    if h > s:
                        if (n_r == 1 and b[h] == 0x2D and h + 1 < e and (cls[h - 1] & BYTE_LETTER) != 0
                                and (cls[h + 1] & BYTE_LETTER) != 0):
                            kind[k] = 3
                            ce = h
                            sf = h + 1
                        elif (n_r == 1 and b[h] == 0x27) or (
                                n_r == 3 and b[h] == 0xE2 and b[h + 1] == 0x80 and b[h + 2] == 0x99):
                            after = h + (1 if n_r == 1 else 3)
                            if after == e - 1 and (b[after] == 0x73 or b[after] == 0x53):
                                kind[k] = 1
                                ce = h
                            elif after < e:
                                kind[k] = 0
            suf_s[k] = ce if sf < 0 else sf
            if kind[k] != 2 and (any_cls & BYTE_DIGIT) != 0:
                # the core's last digit, if the rest of the core could be a unit
                lo = max(cs, ce - unit_b.shape[1] - 1)
                j = ce - 1
                while j >= lo and (cls[j] & BYTE_DIGIT) == 0:
                    j -= 1
                if lo <= j < ce - 1 and is_unit(b, j + 1, ce - j - 1, unit_b, unit_n):
                    ce = j + 1
            core_s[k] = cs
            core_e[k] = ce
            if kind[k] != 2:
                n_quick += 1 + (cs > s) + (suf_s[k] > ce) + (suf_s[k] < e)
            k += 1
    return c_start[:k], c_end[:k], kind[:k], core_s[:k], core_e[:k], suf_s[:k], n_quick


def chunk_bound(n_bytes: int, n_texts: int) -> int:
    """The most chunks ``n_bytes`` of ``n_texts`` texts can hold: one non-space byte each,
    a space between two in a text."""
    return (n_bytes + 1) // 2 + n_texts


@njit(cache=True, nogil=True)
def word_spans(c_start, c_end, kind, core_s, core_e, suf_s, slow_tok, n_quick, slow_whole):
    """Word spans of all chunks: a quick chunk's non-empty pieces (prefix, core, unit,
    suffix), a kind 2 chunk's words from each of its starts in ``slow_tok`` (sorted, what
    the full rules found) to the next or the chunk end. ``n_quick``: the quick chunks' words
    (``scan_chunks`` counts them), -1 to count them here.

    Also returns the words that are a whole core (what one-word special cases apply to), in
    order: the core of a kind 0 or 1 chunk, and a kind 2 chunk's word starting at one of
    ``slow_whole`` (sorted starts of the whole cores the full rules found; such a word is
    the core: no word starts inside it). (Gathering the cores into arrays of their own and
    finding each matching core's word again by binary search was a tenth of the split.)"""
    n = len(c_start)
    total = len(slow_tok) + n_quick
    if n_quick < 0:
        total = len(slow_tok)
        for k in range(n):
            if kind[k] != 2:
                total += 1 + (core_s[k] > c_start[k]) + (suf_s[k] > core_e[k]) + (suf_s[k] < c_end[k])
    out_s = np.empty(total, np.int64)
    out_e = np.empty(total, np.int64)
    whole = np.empty(n + len(slow_whole), np.int64)
    n_whole = 0
    w = 0
    p = 0
    q = 0
    for k in range(n):
        s = c_start[k]
        e = c_end[k]
        if kind[k] == 2:
            first = w
            while p < len(slow_tok) and slow_tok[p] < e:
                if w > first:
                    out_e[w - 1] = slow_tok[p]
                t = slow_tok[p]
                out_s[w] = t
                while q < len(slow_whole) and slow_whole[q] < t:
                    q += 1
                if q < len(slow_whole) and slow_whole[q] == t:
                    whole[n_whole] = w
                    n_whole += 1
                w += 1
                p += 1
            if w > first:
                out_e[w - 1] = e
            continue
        if core_s[k] > s:
            out_s[w] = s
            out_e[w] = core_s[k]
            w += 1
        out_s[w] = core_s[k]
        out_e[w] = core_e[k]
        if kind[k] <= 1:
            whole[n_whole] = w
            n_whole += 1
        w += 1
        if suf_s[k] > core_e[k]:
            out_s[w] = core_e[k]
            out_e[w] = suf_s[k]
            w += 1
        if suf_s[k] < e:
            out_s[w] = suf_s[k]
            out_e[w] = e
            w += 1
    return out_s, out_e, whole[:n_whole]


@njit(cache=True, nogil=True)
def word_measures_and_keys(b, cls, start, end):
    """Per span ``[start, end)`` of UTF-8 bytes, in one pass: characters (bytes that are not
    continuation bytes); whether all bytes carry ``BYTE_PUNCTUATION``, some byte
    ``BYTE_LETTER``, all bytes ``BYTE_UNICODE_PUNCT``; whether it is one character that
    ends a sentence (``BYTE_TERMINAL``); and a 64-bit id of its bytes: ``short_key`` when
    it has at most 16, else that key of its first 16 folded with each further 8 bytes and
    its length (Arrow dictionary-encoding the longer words per batch cost a tenth of the
    word split). The filters read all of them: one pass for the measures and one for the
    keys cost a third more."""
    m = len(start)
    chars = np.zeros(m, np.int64)
    symbol = np.zeros(m, np.bool_)
    alpha = np.zeros(m, np.bool_)
    punct = np.zeros(m, np.bool_)
    ender = np.zeros(m, np.bool_)
    keys = np.empty(m, np.uint64)
    for i in range(m):
        s = start[i]
        n = end[i] - s
        c = 0
        all_ = 0xFFFF
        any_ = 0
        lo = np.uint64(0)
        hi = np.uint64(0)
        key = np.uint64(0)
        w = np.uint64(0)
        for k in range(n):
            x = b[s + k]
            if (x & 0xC0) != 0x80:
                c += 1
            all_ &= cls[s + k]
            any_ |= cls[s + k]
            if k < 8:
                lo |= np.uint64(x) << np.uint64(8 * k)
            elif k < 16:
                hi |= np.uint64(x) << np.uint64(8 * (k - 8))
            else:  # past 16 bytes: the key of the first 16, then 8 bytes at a time into it
                if k == 16:
                    key = mix64(lo ^ mix64(hi + np.uint64(16)))
                w |= np.uint64(x) << np.uint64(8 * (k & 7))
                if (k & 7) == 7 or k == n - 1:
                    key = mix64(key ^ w)
                    w = np.uint64(0)
        key = mix64(lo ^ mix64(hi + np.uint64(n))) if n <= 16 else mix64(key + np.uint64(n))
        chars[i] = c
        symbol[i] = (all_ & BYTE_PUNCTUATION) != 0
        alpha[i] = (any_ & BYTE_LETTER) != 0
        punct[i] = (all_ & BYTE_UNICODE_PUNCT) != 0
        ender[i] = c == 1 and (cls[s] & BYTE_TERMINAL) != 0
        keys[i] = key
    return chars, symbol, alpha, punct, ender, keys


@njit(cache=True, nogil=True)
def _room(missing, n_missing):
    """``missing`` with room for one more code point after its first ``n_missing``."""
    if n_missing < len(missing):
        return missing
    grown = np.empty(max(16, 2 * n_missing), np.int64)
    grown[:n_missing] = missing[:n_missing]
    return grown


@njit(cache=True, nogil=True)
def byte_classes(b, ascii_class, cp_class, cp_known):
    """Class bits of every byte: ASCII from ``ascii_class`` (256 entries, 0 for bytes >= 0x80),
    every byte of a multi-byte character from ``cp_class`` of its code point. Returns
    (classes, code points not yet in ``cp_known``, where each of those characters starts);
    the caller classifies them and fills their bytes in (``fill_byte_classes``).

    One table lookup per byte (a loop LLVM vectorises), then the non-ASCII characters, found
    by a loop that skips ASCII 8 bytes at a time (a word of ``b`` with no high bit), then a
    byte at a time to the next word: x1.12-1.16 on the long bench pages against a byte at a
    time. (Scanning 32-byte blocks and then every byte of a block holding one, a third of the
    blocks of web text, cost twice as much.)"""
    n = len(b)
    out = np.empty(n, np.uint16)
    for i in range(n):
        out[i] = ascii_class[b[i]]
    missing = np.empty(0, np.int64)
    missing_at = np.empty(0, np.int64)
    n_missing = 0
    n8 = n // 8
    words = b[:n8 * 8].view(np.uint64)  # words at multiples of 8 bytes from b's start
    high = np.uint64(0x8080808080808080)
    i = 0
    while i < n:
        if (i & 7) == 0:
            j = i >> 3
            while j < n8 and (words[j] & high) == 0:
                j += 1
            i = max(i, j << 3)
        while i < n and b[i] < 0x80:
            i += 1
            if (i & 7) == 0:
                break
        if i >= n:
            break
        if b[i] < 0x80:  # an ASCII word boundary reached: back to the words
            continue
        c = b[i]
        if c >= 0xF0:
            nb, cp = 4, np.int64(c & 0x07)
        elif c >= 0xE0:
            nb, cp = 3, np.int64(c & 0x0F)
        elif c >= 0xC0:
            nb, cp = 2, np.int64(c & 0x1F)
        else:  # a stray continuation byte (not in valid UTF-8)
            out[i] = 0
            i += 1
            continue
        nb = min(nb, n - i)
        for k in range(1, nb):
            cp = (cp << 6) | (b[i + k] & 0x3F)
        cp = min(cp, len(cp_known) - 1)
        v = np.uint16(0)
        if cp_known[cp]:
            v = cp_class[cp]
        else:
            missing = _room(missing, n_missing)
            missing_at = _room(missing_at, n_missing)
            missing[n_missing] = cp
            missing_at[n_missing] = i
            n_missing += 1
        for k in range(nb):
            out[i + k] = v
        i += nb
    return out, missing[:n_missing], missing_at[:n_missing]


@njit(cache=True, nogil=True)
def fill_byte_classes(out, b, missing, missing_at, cp_class):
    """Every byte of the characters ``byte_classes`` could not class (code points
    ``missing``, starting at ``missing_at``) set to ``cp_class`` of its code point, now
    known. (Looking the whole batch up again cost a second ``byte_classes`` on two batches
    in five of the long-page bench, where CJK pages keep bringing new characters.)"""
    n = len(b)
    for j in range(len(missing)):
        i = missing_at[j]
        c = b[i]
        nb = 4 if c >= 0xF0 else (3 if c >= 0xE0 else 2)
        v = cp_class[missing[j]]
        for k in range(min(nb, n - i)):
            out[i + k] = v


@njit(cache=True, nogil=True)
def code_point_classes(cp, table, known):
    """``table[c]`` for every code point, and the code points not yet ``known`` (the caller
    classifies those and calls again)."""
    out = np.empty(len(cp), table.dtype)
    missing = np.empty(0, np.int64)
    n_missing = 0
    for i in range(len(cp)):
        c = min(np.int64(cp[i]), len(known) - 1)
        if known[c]:
            out[i] = table[c]
        else:
            missing = _room(missing, n_missing)
            missing[n_missing] = c
            n_missing += 1
    return out, missing[:n_missing]


@njit(cache=True, nogil=True)
def replace_spans(tok_start, tok_end, t, k, cut_at, cut_owner):
    """Word spans after replacements: replacement r turns words ``t[r] .. t[r]+k[r]-1`` into
    the pieces of their joint span cut at its ``cut_at`` offsets (``cut_owner`` == r, sorted
    by owner then offset). Words a merge absorbs vanish; of two replacements at one word the
    later wins.

    The replacements in word order (a handful per document), the words between them copied
    as runs: a loop testing every word for a replacement cost 12 ns a word (per-word marker
    arrays three more passes over every word)."""
    m = len(tok_start)
    R = len(t)
    lo = np.zeros(R + 1, np.int64)
    for j in range(len(cut_owner)):
        lo[cut_owner[j] + 1] += 1
    for r in range(R):
        lo[r + 1] += lo[r]
    order = np.argsort(t, kind="mergesort")  # stable: at one word, the later replacement last
    out_s = np.empty(m + len(cut_at), np.int64)  # a replacement adds its cuts, absorbs >= 0 words
    out_e = np.empty(m + len(cut_at), np.int64)
    w = 0
    p = 0
    nxt = 0  # the first word not yet looked at
    cover = -1  # the last word absorbed by a replacement seen so far
    while p < R:
        i = t[order[p]]
        a = max(nxt, cover + 1)  # the words before it, but those a merge absorbed
        if i > a:
            out_s[w:w + i - a] = tok_start[a:i]
            out_e[w:w + i - a] = tok_end[a:i]
            w += i - a
        r = -1
        reach = cover
        while p < R and t[order[p]] == i:  # of several at this word, the last
            r = order[p]
            reach = max(reach, i + k[r] - 1)
            p += 1
        a = tok_start[i]
        for j in range(lo[r], lo[r + 1]):
            out_s[w] = a
            out_e[w] = cut_at[j]
            a = cut_at[j]
            w += 1
        out_s[w] = a
        out_e[w] = tok_end[i + k[r] - 1]
        w += 1
        cover = reach
        nxt = i + 1
    a = max(nxt, cover + 1)
    if m > a:
        out_s[w:w + m - a] = tok_start[a:m]
        out_e[w:w + m - a] = tok_end[a:m]
        w += m - a
    return out_s[:w], out_e[:w]


@njit(cache=True, nogil=True)
def gather_ranges(src, starts, lengths):
    """``src[starts[i]:starts[i] + lengths[i]]`` for every i, concatenated."""
    total = 0
    for i in range(len(starts)):
        total += lengths[i]
    out = np.empty(total, src.dtype)
    w = 0
    for i in range(len(starts)):
        s = starts[i]
        for j in range(lengths[i]):
            out[w + j] = src[s + j]
        w += lengths[i]
    return out


@njit(cache=True, nogil=True)
def take_word_spans(offsets, start, end, old_doff, docs, new_doff):
    """The words of texts ``docs`` moved to a batch holding just those texts, in one pass
    (``Words.take_docs``): (word offsets per taken text, index of each word among the old
    ones, new starts, new ends). Text ``docs[j]``'s bytes start at ``new_doff[j]`` there.
    Seven numpy passes (repeat, arange, cumsum, two gathers, two shifts) did this before."""
    n = len(docs)
    out_off = np.empty(n + 1, np.int64)
    out_off[0] = 0
    for j in range(n):
        d = docs[j]
        out_off[j + 1] = out_off[j] + offsets[d + 1] - offsets[d]
    total = out_off[n]
    idx = np.empty(total, np.int64)
    s_out = np.empty(total, np.int64)
    e_out = np.empty(total, np.int64)
    w = 0
    for j in range(n):
        d = docs[j]
        shift = new_doff[j] - old_doff[d]
        for i in range(offsets[d], offsets[d + 1]):
            idx[w] = i
            s_out[w] = start[i] + shift
            e_out[w] = end[i] + shift
            w += 1
    return out_off, idx, s_out, e_out


@njit(cache=True, nogil=True)
def join_spans(b, start, end, sep):
    """The byte spans ``b[start[i]:end[i]]`` joined by the byte ``sep``."""
    total = len(start) - 1 if len(start) else 0
    for i in range(len(start)):
        total += end[i] - start[i]
    out = np.empty(max(total, 0), np.uint8)
    w = 0
    for i in range(len(start)):
        if i:
            out[w] = sep
            w += 1
        for j in range(start[i], end[i]):
            out[w] = b[j]
            w += 1
    return out


@njit(cache=True, nogil=True)
def char_text_bytes(cp, start):
    """For code points of spans joined by newlines (span i began at byte ``start[i]`` of the
    text): the text byte of every char position, and of the end (``len(cp)``); a newline's
    position maps to the end of its span."""
    out = np.empty(len(cp) + 1, np.int64)
    j = 0
    pos = start[0] if len(start) else 0
    for i in range(len(cp)):
        out[i] = pos
        c = cp[i]
        if c == 0x0A:
            j += 1
            pos = start[j]
        elif c < 0x80:
            pos += 1
        elif c < 0x800:
            pos += 2
        elif c < 0x10000:
            pos += 3
        else:
            pos += 4
    out[len(cp)] = pos
    return out


@njit(cache=True, nogil=True)
def split_word_counts(b, doff, kind):
    """``len(t.split())`` of every text ``b[doff[d]:doff[d + 1]]`` (UTF-8): runs of
    characters that are not Python whitespace. ``kind`` per byte: 0 part of a word, 1 an
    ASCII whitespace byte, 2 a byte that may lead a multi-byte whitespace character (U+0085,
    U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000: ``space_after``
    decides).
    One pass with a tight loop over each word's bytes, no per-byte class array (C4 counts
    the words of most lines of every page it reads)."""
    n_docs = len(doff) - 1
    out = np.zeros(n_docs, np.int64)
    for d in range(n_docs):
        i = doff[d]
        e = doff[d + 1]
        inword = False
        c = 0
        while i < e:
            w = space_width(b, i, e, kind)
            if w:
                inword = False
                i += w
                continue
            if not inword:
                c += 1
                inword = True
            i += 1
            while i < e and kind[b[i]] == 0:
                i += 1
        out[d] = c
    return out
