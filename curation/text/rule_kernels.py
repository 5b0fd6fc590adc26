"""Compiled (numba) spaCy tokenizer rules over code points: the slow path of
``curation.text.words``' word splitter, for the chunks the byte scan (``kernels.scan_chunks``)
could not settle (prefixes, suffixes, infixes, URLs, special cases). Semantics are spaCy's rule
order; ``curation/text/rules_reference.py`` is the array reference they are tested against."""

from __future__ import annotations

import numpy as np
from numba import njit

from curation.text.chars import (ALPHA, DEGREE_LETTER, DIGIT, DOT_AFTER, HYPHEN, INFIX_SYMBOL, LOWER, OPERATOR,
                                 OTHER_SYMBOL, PREFIX, PUNCT, QUOTE, SUFFIX, UPPER)
from curation.text.kernels import is_unit


@njit(cache=True, nogil=True)
def _s_after_apostrophe(cp, i, s):
    """Whether ``cp[i]`` is the "s"/"S" of "'s" / "’s" (chunk from ``s``)."""
    return (cp[i] == 0x73 or cp[i] == 0x53) and i > s and (cp[i - 1] == 0x27 or cp[i - 1] == 0x2019)


@njit(cache=True, nogil=True)
def rule_starts(cp, f, unit_cp, unit_len):
    """spaCy's English rules over chunks of code points joined by newlines (``f``: each code
    point's class bits), one chunk at a time: the same word starts as the array version
    ``rules_reference.rule_token_starts``, which is the reference the tests compare this with.

    Per chunk: the prefix run (leading prefix characters), the suffix run (trailing suffix
    characters, each judged by the characters before it), a unit split off after a number
    at the end of the core, then infixes inside the core. Returns (starts, infix starts,
    core start and end per chunk, chunks whose infixes wait on the URL check): a core that
    looks like a URL is not cut, and that check is a regex the caller runs.
    """
    N = len(cp)
    n_chunks = 1
    for i in range(N):
        if cp[i] == 0x0A:
            n_chunks += 1
    starts = np.zeros(N, np.bool_)
    istarts = np.zeros(N, np.bool_)
    multi = np.zeros(N, np.bool_)
    tok = np.zeros(N, np.bool_)
    irun = np.zeros(N, np.bool_)
    core_s = np.empty(n_chunks, np.int64)
    core_e = np.empty(n_chunks, np.int64)
    url_cand = np.zeros(n_chunks, np.bool_)
    s = 0
    for c in range(n_chunks):
        e = s
        while e < N and cp[e] != 0x0A:
            e += 1
        # Dot runs: ".." and longer are one token wherever they are.
        i = s
        while i < e:
            if cp[i] == 0x2E:
                j = i
                while j < e and cp[j] == 0x2E:
                    j += 1
                for k in range(i, j):
                    multi[k] = j - i >= 2
                i = j
            else:
                i += 1
        # Prefix run ("+" only before a non-digit).
        p = s
        while p < e:
            nf = f[p + 1] if p + 1 < e else 0
            if not (((f[p] & PREFIX) != 0 and not (cp[p] == 0x2B and (nf & DIGIT) != 0)) or multi[p]):
                break
            p += 1
        # Suffix run, from the right; a character's context is the characters before it.
        q = e
        while q > p:
            i = q - 1
            x = cp[i]
            pf = f[i - 1] if i > s else 0
            p2f = f[i - 2] if i - 2 >= s else 0
            p2cp = cp[i - 2] if i - 2 >= s else 0
            ctx_dot = x == 0x2E and not multi[i] and (
                (pf & (DIGIT | LOWER | DOT_AFTER | PUNCT | QUOTE)) != 0
                or ((pf & UPPER) != 0 and (p2f & UPPER) != 0)
                or ((pf & DEGREE_LETTER) != 0 and p2cp == 0xB0))
            s_of_apos = _s_after_apostrophe(cp, i, s)
            if not ((f[i] & SUFFIX) != 0 or multi[i] or s_of_apos or ctx_dot
                    or (x == 0x2B and (pf & DIGIT) != 0)):
                break
            q -= 1
        if e > s:
            starts[s] = True
        for i in range(s, p):
            if not (cp[i] == 0x2E and i > s and cp[i - 1] == 0x2E):
                starts[i] = True
        if s < p < e:
            starts[p] = True  # the core starts after the prefixes
        # Suffix starts: not inside a dot run, not the "s" of "'s"; "……" pairs from the right.
        i = q
        while i < e:
            x = cp[i]
            if x == 0x2026:
                j = i
                while j < e and cp[j] == 0x2026:
                    j += 1
                for k in range(i, j):
                    if k == i or (j - 1 - k) % 2 == 1:
                        starts[k] = True
                i = j
                continue
            cont_dot = x == 0x2E and i > s and cp[i - 1] == 0x2E
            s_of_apos = _s_after_apostrophe(cp, i, s)
            if not cont_dot and not s_of_apos:
                starts[i] = True
            i += 1
        cs, ce = p, q
        # A number followed by a unit or currency at the end of the core splits it off.
        if ce > cs:
            ld = -1
            for i in range(ce - 1, max(cs, ce - 5) - 1, -1):
                if (f[i] & DIGIT) != 0:
                    ld = i
                    break
            if ld >= 0 and ld < ce - 1 and is_unit(cp, ld + 1, ce - ld - 1, unit_cp, unit_len):
                starts[ld + 1] = True
                ce = ld + 1
        core_s[c] = cs
        core_e[c] = ce
        # Infixes inside the core (lookarounds see only the core).
        any_tok = False
        any_dot = False
        for i in range(cs, ce):
            x = cp[i]
            fi = f[i]
            pic = i > cs
            nic = i < ce - 1
            pf = f[i - 1] if pic else 0
            nf = f[i + 1] if nic else 0
            ncp = cp[i + 1] if nic else 0
            right_a = nic and (nf & ALPHA) != 0
            left_an = pic and (pf & (ALPHA | DIGIT)) != 0
            t = (fi & OTHER_SYMBOL) != 0 or x == 0x2026
            t = t or ((fi & OPERATOR) != 0 and pic and (pf & DIGIT) != 0 and nic
                      and ((nf & DIGIT) != 0 or ncp == 0x2D))
            t = t or (x == 0x2E and not multi[i] and pic and (pf & (LOWER | QUOTE)) != 0 and nic
                      and (nf & (UPPER | QUOTE)) != 0)
            t = t or (x == 0x2C and pic and (pf & ALPHA) != 0 and right_a)
            t = t or ((fi & INFIX_SYMBOL) != 0 and left_an and right_a)
            tok[i] = t
            irun[i] = multi[i]
            any_dot = any_dot or x == 0x2E
        # Hyphen runs between a letter/digit and a letter: "-", "--", "---", "—", "——", "–", "~".
        i = cs
        while i < ce:
            if (f[i] & HYPHEN) == 0:
                i += 1
                continue
            j = i
            while j < ce and cp[j] == cp[i]:
                j += 1
            x = cp[i]
            max_len = 3 if x == 0x2D else (2 if x == 0x2014 else 1)
            left_an = i > cs and (f[i - 1] & (ALPHA | DIGIT)) != 0
            right_a = j < ce and (f[j] & ALPHA) != 0
            if j - i <= max_len and left_an and right_a:
                for k in range(i, j):
                    irun[k] = True
            i = j
        for i in range(cs, ce):
            if not (tok[i] or irun[i]):
                continue
            any_tok = True
            if not (irun[i] and i > cs and irun[i - 1] and cp[i - 1] == cp[i]):
                istarts[i] = True
            goes_on = irun[i] and i + 1 < ce and irun[i + 1] and cp[i + 1] == cp[i]
            if not goes_on and i + 1 < ce:
                istarts[i + 1] = True
        url_cand[c] = any_tok and any_dot
        for i in range(cs, ce):
            tok[i] = False
            irun[i] = False
        s = e + 1
    return starts, istarts, core_s, core_e, url_cand


@njit(cache=True, nogil=True)
def rule_words(starts, istarts, core_s, core_e, cp):
    """After ``rule_starts`` (and the URL check that clears some infix starts): the word
    starts (a start or an infix start), and each chunk's core that is one whole word, as
    (start, end): a non-empty core with no word starting inside it, ending where the chunk
    does or where a word starts. Chunks are the code points between newlines (0x0A).
    (Eight numpy passes over the code points did this: a third of the full rules' cost.)"""
    N = len(starts)
    n_tok = 0
    for i in range(N):
        n_tok += starts[i] | istarts[i]
    tok = np.empty(n_tok, np.int64)
    j = 0
    for i in range(N):
        if starts[i] | istarts[i]:
            tok[j] = i
            j += 1
    ws = np.empty(len(core_s), np.int64)
    we = np.empty(len(core_s), np.int64)
    n_w = 0
    nl = 0  # the first newline at or after the current core's end (N: none)
    for c in range(len(core_s)):
        a = core_s[c]
        e = core_e[c]
        if e <= a:
            continue
        if nl < e:
            nl = e
        while nl < N and cp[nl] != 0x0A:
            nl += 1
        inside = False
        for i in range(a + 1, e):
            if starts[i] | istarts[i]:
                inside = True
                break
        if not inside and (e == nl or starts[e] | istarts[e]):
            ws[n_w] = a
            we[n_w] = e
            n_w += 1
    return tok, ws[:n_w], we[:n_w]
