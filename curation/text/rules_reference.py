"""spaCy's English tokenizer rules as numpy array expressions: the reference the compiled rules
(``rule_kernels.rule_starts``) are held to. ``split_words(..., reference=True)`` sends every chunk
through ``rule_token_starts``; the filter tests compare the two on real pages and fuzzed text."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc

from curation.text.arrow import code_point_spans, mask
from curation.text.chars import (
    ALPHA, DEGREE_LETTER, DIGIT, DOT_AFTER, HYPHEN, INFIX_SYMBOL, LOWER, OPERATOR, OTHER_SYMBOL, PREFIX, PUNCT, QUOTE,
    SUFFIX, UNIT_STRINGS, UPPER, URL_RE,
)
from curation.text.classes import code_point_flags

def prev(a: np.ndarray, first: np.ndarray, fill=0) -> np.ndarray:
    """Value of the previous character, ``fill`` at chunk starts (``first``)."""
    out = np.empty_like(a)
    out[0] = fill
    out[1:] = a[:-1]
    out[first] = fill
    return out


def next_(a: np.ndarray, last: np.ndarray, fill=0) -> np.ndarray:
    """Value of the next character, ``fill`` at chunk ends (``last``)."""
    out = np.empty_like(a)
    out[-1] = fill
    out[:-1] = a[1:]
    out[last] = fill
    return out


def rule_token_starts(cp: np.ndarray):
    """Word starts (char positions) for chunks joined by single newlines, by spaCy's rules,
    and the spans of the words that are a whole core (all that is left of a chunk after
    stripping prefixes and suffixes)."""
    N = len(cp)
    f = code_point_flags(cp)
    sep = cp == 0x0A
    nonws = ~sep
    c_start = np.concatenate(([0], np.flatnonzero(sep) + 1))
    c_end = np.concatenate((np.flatnonzero(sep), [N]))
    n_chunks = len(c_start)
    first = np.zeros(N, dtype=bool)
    first[c_start[c_start < N]] = True
    last = np.zeros(N, dtype=bool)
    last[c_end - 1] = True
    chunk_id = np.cumsum(sep, dtype=np.int32)
    pf = prev(f, first)
    nf = next_(f, last)
    pcp = prev(cp, first)

    # Dot runs: ".." and longer are one token (prefix, suffix or infix), "." is context-bound.
    dot = cp == 0x2E
    cont_dot = dot & (pcp == 0x2E)  # a dot continuing a run
    dot_idx = np.flatnonzero(dot)
    multi = np.zeros(N, dtype=bool)
    if len(dot_idx):
        run = np.cumsum(~cont_dot[dot_idx])
        multi[dot_idx] = np.bincount(run)[run] >= 2
    single_dot = dot & ~multi
    plus = cp == 0x2B

    # Prefix run: the leading stretch of prefix characters ("+" only before a non-digit).
    elig_p = (((f & PREFIX) != 0) & ~(plus & ((nf & DIGIT) != 0))) | multi
    bad = nonws & ~elig_p
    cum = np.cumsum(bad, dtype=np.int32)
    in_pre = nonws & (cum == (cum - bad)[c_start][chunk_id])

    # Suffix run: the trailing stretch of suffix characters (their context is the characters
    # before, still there when spaCy strips from the right).
    apos = (cp == 0x27) | (cp == 0x2019)
    s_of_apos = ((cp == 0x73) | (cp == 0x53)) & prev(apos, first, False)
    p2f = prev(pf, first)
    ctx_dot = single_dot & (
        ((pf & (DIGIT | LOWER | DOT_AFTER | PUNCT | QUOTE)) != 0)
        | (((pf & UPPER) != 0) & ((p2f & UPPER) != 0))
        | (((pf & DEGREE_LETTER) != 0) & (prev(pcp, first) == 0xB0))
    )
    elig_s = (((f & SUFFIX) != 0) | multi | s_of_apos | ctx_dot
              | (plus & ((pf & DIGIT) != 0)))
    bad = nonws & ~elig_s
    cum = np.cumsum(bad, dtype=np.int32)
    in_suf = nonws & ~in_pre & ((cum[c_end - 1][chunk_id] - cum + bad) == 0)

    pre_len = np.bincount(chunk_id[in_pre], minlength=n_chunks)
    suf_len = np.bincount(chunk_id[in_suf], minlength=n_chunks)
    core_start = c_start + pre_len
    core_end = c_end - suf_len

    starts = first.copy()
    starts |= in_pre & ~cont_dot
    starts |= nonws & ~in_pre & prev(in_pre, first, False)  # the core starts after the prefixes
    suf_start = in_suf & ~cont_dot & ~s_of_apos
    # Suffix "……" (two ellipsis characters) is one token, paired from the right.
    ell = np.flatnonzero(in_suf & (cp == 0x2026))
    if len(ell) > 1:
        run_start = np.ones(len(ell), dtype=bool)
        run_start[1:] = ell[1:] != ell[:-1] + 1
        run = np.cumsum(run_start) - 1
        j = np.arange(len(ell)) - np.flatnonzero(run_start)[run]  # position in its run
        from_right = np.bincount(run)[run] - 1 - j
        suf_start[ell[(j > 0) & (from_right % 2 == 0)]] = False
    starts |= suf_start

    # A number followed by a unit or currency ("5kg", "10%", "3$") splits off the unit.
    digit = (f & DIGIT) != 0
    d_idx = np.flatnonzero(digit)
    has_core = core_end > core_start
    if len(d_idx) and has_core.any():
        cand = np.flatnonzero(has_core)
        j = np.searchsorted(d_idx, core_end[cand]) - 1
        ld = np.where(j >= 0, d_idx[np.maximum(j, 0)], -1)
        ok = (ld >= core_start[cand]) & (ld < core_end[cand] - 1) & (core_end[cand] - ld - 1 <= 4)
        cand, ld = cand[ok], ld[ok]
        if len(cand):
            tails = code_point_spans(cp, ld + 1, core_end[cand])
            is_unit = mask(pc.is_in(tails, value_set=UNIT_STRINGS))
            unit_pos = ld[is_unit] + 1
            starts[unit_pos] = True
            core_end[cand[is_unit]] = unit_pos

    # Infixes inside the core (lookarounds see only the core, as in spaCy).
    in_core = nonws & ~in_pre & ~in_suf
    in_core &= np.arange(N) < core_end[chunk_id]
    pic = prev(in_core, first, False)
    nic = next_(in_core, last, False)
    ncp = next_(cp, last)
    infix = in_core & (((f & OTHER_SYMBOL) != 0) | (cp == 0x2026))
    infix_run = in_core & multi
    left_an = pic & ((pf & (ALPHA | DIGIT)) != 0)
    right_a = nic & ((nf & ALPHA) != 0)
    infix |= in_core & ((f & OPERATOR) != 0) & pic & ((pf & DIGIT) != 0) & nic & (
        ((nf & DIGIT) != 0) | (ncp == 0x2D))
    infix |= single_dot & in_core & pic & ((pf & (LOWER | QUOTE)) != 0) & nic & ((nf & (UPPER | QUOTE)) != 0)
    infix |= in_core & (cp == 0x2C) & pic & ((pf & ALPHA) != 0) & right_a
    infix |= in_core & ((f & INFIX_SYMBOL) != 0) & left_an & right_a
    # Hyphens between a letter/digit and a letter: "-", "--", "---", "—", "——", "–", "~".
    h_idx = np.flatnonzero(in_core & ((f & HYPHEN) != 0))
    if len(h_idx):
        h_cp = cp[h_idx]
        run_start = np.ones(len(h_idx), dtype=bool)
        run_start[1:] = (h_idx[1:] != h_idx[:-1] + 1) | (h_cp[1:] != h_cp[:-1])
        rid = np.cumsum(run_start) - 1
        r_first = h_idx[run_start]
        r_len = np.bincount(rid)
        r_cp = h_cp[run_start]
        max_len = np.where(r_cp == 0x2D, 3, np.where(r_cp == 0x2014, 2, 1))
        ok = (r_len <= max_len) & left_an[r_first] & right_a[r_first + r_len - 1]
        infix_run[h_idx[ok[rid]]] = True
    infix_tok = infix | infix_run
    if infix_tok.any():
        # A core that looks like a URL is not cut.
        cand = np.unique(chunk_id[infix_tok])
        cand = cand[np.bincount(chunk_id[in_core & dot], minlength=n_chunks)[cand] > 0]
        if len(cand):
            url = mask(pc.match_substring_regex(
                code_point_spans(cp, core_start[cand], core_end[cand]), URL_RE))
            if url.any():
                bad_chunk = np.zeros(n_chunks, dtype=bool)
                bad_chunk[cand[url]] = True
                keep = ~bad_chunk[chunk_id]
                infix_tok &= keep
                infix_run &= keep
        # Token starts: at each infix (a run starts once) and right after it.
        run_cont = infix_run & prev(infix_run, first, False) & (pcp == cp)
        starts |= infix_tok & ~run_cont
        run_goes_on = infix_run & next_(infix_run, last, False) & (ncp == cp)
        after = np.flatnonzero(infix_tok & ~run_goes_on) + 1
        after = after[after < N]
        starts[after[in_core[after]]] = True

    tok = np.flatnonzero(starts & nonws)
    # Words that are a whole core (candidates for the one-word special cases).
    nxt = np.empty_like(tok)
    nxt[:-1] = tok[1:]
    nxt[-1:] = N
    c = chunk_id[tok]
    whole_core = (tok == core_start[c]) & (np.minimum(nxt, c_end[c]) == core_end[c])
    return tok, tok[whole_core], core_end[c[whole_core]]
