"""English words, split as spaCy's rule tokenizer does (what datatrove's
``split_into_words`` uses for English), for a whole batch at once, with per-word measurements.

``split_words`` -> ``Words``: the words of every text as byte spans of the UTF-8 text, with
characters, symbol/letter/punctuation flags and a 64-bit id per word, each measured on first
use; ``sentence_counts`` is spaCy's ``sentencizer`` over them; ``count_py_words`` counts
``str.split()`` words. There is no Python loop per word: numpy over the bytes of all texts and
compiled loops (``curation.text.kernels``).

The pieces it stands on, one concern each:

- ``chars``: the character sets and what each class bit means; ``classes``: the class bits of
  every code point and byte (per-process tables);
- ``special_cases``: spaCy's exceptions as data; ``keys``: 16-byte packed keys to find them;
- ``rules_reference``: the rules as numpy expressions, the reference for the compiled ones;
- ``arrow``: Arrow <-> numpy helpers; ``segments``: lines, paragraphs and repeated parts;
  ``counts``: the Gopher counters.

N-gram repetition over the word ids is compiled code, in ``curation.text.repetition``.
"""

from __future__ import annotations

import functools

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.text import kernels, rule_kernels
from curation.text.arrow import byte_spans, code_point_spans, mask, text_bytes, to_numpy
from curation.text.chars import PY_WHITESPACE, URL_RE
from curation.text.classes import byte_classes, code_point_flags, unit_rows
from curation.text.keys import find_keys, key_sieve, key_table
from curation.text.rules_reference import rule_token_starts
from curation.text.segments import PerDoc
from curation.text.special_cases import SPECIAL_CASES, cut_mask

# ---------------------------------------------------------------------------------------------
# Word splitting (spaCy's English rule tokenizer, vectorised)
# ---------------------------------------------------------------------------------------------
#
# spaCy splits text on whitespace, then for each chunk repeatedly strips one prefix (opening
# punctuation, quotes, currency, symbols) and one suffix (closing punctuation, quotes, "'s",
# a period after a lowercase letter or a digit, a unit after a number), stopping at special
# cases (abbreviations such as "Mr.", contractions such as "don't" -> "do n't"); what is left
# is kept whole if it looks like a URL, else cut at infixes (hyphens and slashes between
# letters, "..." inside a word, ...).
#
# One compiled pass (``kernels.scan_chunks``) finds the chunks and sorts them. Most are plain
# words (no punctuation or symbol): one word each. Chunks that are a plain core (any script)
# with one ASCII affix character at either end ("word," "(word)" "Straße.") are decided from
# the neighbouring characters' classes. In
# both, a unit after a number at the end of the core ("5kg", "25$") is split off. Only the rest
# go through the full rules, decoded to code points, compiled one chunk at a time
# (``rule_kernels.rule_starts``): a table gives each character its classes, the prefix run of a
# chunk is its leading stretch of prefix characters, the suffix run its trailing stretch of
# suffix characters, infixes are conditions on a character and its neighbours. Stripping a
# whole run at once gives spaCy's words. The array version of the same rules
# (``rule_token_starts``, every rule a numpy expression) is the reference: with
# ``split_words(..., reference=True)`` every chunk goes through it, and the tests compare the
# two on real pages and fuzzed text. Special cases are then applied at byte level, as spaCy's
# special-case matcher does after affixes and units are split (merge the words a special
# string was cut into wherever they touch, cut one-word special cases), comparing 16-byte
# packed keys of candidate spans with the special strings.


def _compiled_rule_starts(cp: np.ndarray):
    """``rule_token_starts`` by the compiled rules (``rule_kernels.rule_starts``); the array
    version stays as the reference the tests hold this to."""
    starts, istarts, core_s, core_e, url_cand = rule_kernels.rule_starts(cp, code_point_flags(cp), *unit_rows(bytes_=False))
    cand = np.flatnonzero(url_cand)
    if len(cand):
        url = mask(pc.match_substring_regex(code_point_spans(cp, core_s[cand], core_e[cand]), URL_RE))
        for c in cand[url].tolist():  # a core that looks like a URL keeps its infixes
            istarts[core_s[c]:core_e[c]] = False
    # the word starts, and the cores that are one whole word (no word starts before its end)
    return rule_kernels.rule_words(starts, istarts, core_s, core_e, cp)


class Words(PerDoc):
    """The words of a batch of texts, as byte spans of the UTF-8 text, with the per-word
    measurements the filters use (each computed on first use, for the whole batch).

    ``offsets[d]:offsets[d + 1]`` index the words of text ``d``.
    """

    def __init__(self, doc, offsets, start, end, b, cls, buf, base):
        if doc is not None:  # else made from the offsets on first use (few readers need it)
            self.doc = doc
        self.offsets = offsets
        self.start = start
        self.end = end
        self._b = b
        if cls is not None:
            self._cls = cls
        self._buf = buf
        self._base = base

    #: measurements a subset (``take_docs``) reads from the words it was taken from, on first
    #: use: the filters after the first read few of them (FineWeb and C4 only the counts)
    _INHERITED = ("_cls", "lengths", "symbol", "alpha", "punct", "ender", "hash")

    @functools.cached_property
    def doc(self) -> np.ndarray:
        """The text of every word."""
        return np.repeat(np.arange(len(self.offsets) - 1, dtype=np.int64), np.diff(self.offsets))

    @functools.cached_property
    def _cls(self) -> np.ndarray:
        got = self._inherit("_cls")
        return byte_classes(self._b) if got is None else got

    def _inherit(self, name: str) -> np.ndarray | None:
        """``name`` of these words from the words they were split as (``take_docs``), if
        those measured it; None otherwise."""
        root = self.__dict__.get("_root")
        if root is None or name not in root.__dict__:
            return None
        if name == "_cls":  # per byte: the texts' byte ranges move
            return kernels.gather_ranges(root._cls, root._doff[self._root_docs], np.diff(self._doff))
        return root.__dict__[name][self._root_idx]

    def take_docs(self, docs: np.ndarray, b, doff, buf, base) -> Words:
        """The words of some of these texts, for a batch holding exactly those texts (same
        bytes, other positions): spans are moved; measurements already made are kept,
        read on first use from the words as first split (a subset of a subset links to
        those too, so one generation is kept alive, not a chain)."""
        docs = np.ascontiguousarray(docs, np.int64)
        offsets, idx, start, end = kernels.take_word_spans(self.offsets, self.start, self.end, self._doff, docs,
                                                           np.ascontiguousarray(doff, np.int64))
        out = Words(None, offsets, start, end, b, None, buf, base)
        out._doff = doff
        root = self.__dict__.get("_root")
        if root is None:
            out._root, out._root_idx, out._root_docs = self, idx, docs
        else:
            out._root, out._root_idx, out._root_docs = root, self._root_idx[idx], self._root_docs[docs]
            for name in self._INHERITED:  # measured here, not in the root: moved now
                if name in self.__dict__ and name not in root.__dict__:
                    out.__dict__[name] = (kernels.gather_ranges(self._cls, self._doff[docs], np.diff(doff))
                                          if name == "_cls" else self.__dict__[name][idx])
        return out

    @functools.cached_property
    def byte_lengths(self) -> np.ndarray:
        return self.end - self.start

    def _measured(self, name: str) -> np.ndarray:
        """``lengths``, ``symbol``, ``alpha``, ``punct``, ``ender`` and ``hash`` come from one
        compiled pass over the words' bytes; whichever is asked first measures all six
        (unless the words these were taken from did)."""
        got = self._inherit(name)
        if got is not None:
            self.__dict__[name] = got
            return got
        chars, symbol, alpha, punct, ender, keys = kernels.word_measures_and_keys(
            self._b, self._cls, self.start, self.end)
        for key, value in (("lengths", chars), ("symbol", symbol), ("alpha", alpha), ("punct", punct),
                           ("ender", ender), ("hash", keys)):
            self.__dict__.setdefault(key, value)
        return self.__dict__[name]

    @functools.cached_property
    def lengths(self) -> np.ndarray:
        """Characters per word (what ``len`` counts)."""
        return self._measured("lengths")

    @functools.cached_property
    def symbol(self) -> np.ndarray:
        """Only characters from datatrove's PUNCTUATION_SET."""
        return self._measured("symbol")

    @functools.cached_property
    def alpha(self) -> np.ndarray:
        """Has a letter (``str.isalpha`` on some character)."""
        return self._measured("alpha")

    @functools.cached_property
    def punct(self) -> np.ndarray:
        """Only Unicode punctuation characters (spaCy's ``is_punct``)."""
        return self._measured("punct")

    @functools.cached_property
    def ender(self) -> np.ndarray:
        """One sentence-ending character (the marks spaCy's sentencizer splits after)."""
        return self._measured("ender")

    @functools.cached_property
    def hash(self) -> np.ndarray:
        """64-bit id per word: equal words, equal ids (the bytes packed up to 16, then hashed
        8 at a time: ``kernels.word_measures_and_keys``)."""
        return self._measured("hash")

    def match(self, values: list[str]) -> np.ndarray:
        """Per word: index of the equal string in ``values``, -1 if none."""
        out = np.full(len(self.start), -1, dtype=np.int64)
        short = [i for i, v in enumerate(values) if len(v.encode()) <= 16]
        if short:
            words = [values[i] for i in short]
            keys, order = key_table(words)
            # every word: the compiled probe passes over those of more than 16 bytes itself
            at, hit = kernels.find_keys(self._b, self.start, self.byte_lengths, keys, order.astype(np.int64),
                                        key_sieve(words))
            out[at] = np.array(short)[hit]
        long = [i for i, v in enumerate(values) if len(v.encode()) > 16]
        if long:
            cand = np.flatnonzero(self.byte_lengths > 16)
            idx = pc.index_in(byte_spans(self._buf, self._base, self.start[cand], self.end[cand]),
                              value_set=pa.array([values[i] for i in long], pa.string()))
            found = to_numpy(pc.fill_null(idx, -1)).astype(np.int64)
            out[cand] = np.where(found >= 0, np.array(long)[np.maximum(found, 0)], out[cand])
        return out

    def values(self) -> pa.Array:
        """The words themselves, as an Arrow string array (for inspection and tests)."""
        return byte_spans(self._buf, self._base, self.start, self.end)


def split_words(texts: pa.Array, special_cases: bool = True, reference: bool = False) -> Words:
    """English words of every text, split like spaCy's rule tokenizer (whitespace dropped).

    This reproduces ``datatrove.utils.text.split_into_words(text, "en")`` (spaCy's
    ``blank("en")`` tokenizer) up to rare special cases. Every call splits: to split a batch
    once and hand the words to the next stage, use ``curation.text.state.TextState``.
    ``reference``: every chunk through the array version of the full rules, no compiled
    quick paths (the tests compare the two; same words, several times slower).
    """
    n_docs = len(texts)
    b, doff, buf, base = text_bytes(texts)
    B = len(b)
    z = np.zeros(0, np.int64)
    if B == 0:
        # byte_classes' own (empty) array: the measures' kernel sees the type it was compiled for
        words = Words(z, np.zeros(n_docs + 1, np.int64), z, z, b, byte_classes(b), buf, base)
    else:
        words = _split_words(b, doff, buf, base, special_cases, reference)
    words._doff = doff
    return words


def _split_words(b, doff, buf, base, special_cases: bool, reference: bool = False) -> Words:
    cls = byte_classes(b)
    # Chunks, and how the quick rules cut plain ones, "word," "(word)", "far-flung", "Here’s" (compiled).
    units = unit_rows(bytes_=True)
    # room for a chunk per 4 bytes (web text has one per ~6); text denser than that, again
    out = kernels.scan_chunks(b, cls, doff, *units, len(b) // 4 + len(doff) + 16)
    if out[-1] < 0:
        out = kernels.scan_chunks(b, cls, doff, *units, kernels.chunk_bound(len(b), len(doff) - 1))
    c_start, c_end, kind, core_s, core_e, suf_s, n_quick = out
    if reference:  # every chunk by the array rules: what the tests hold the quick paths to
        kind[:] = 2
        n_quick = -1
    slow = np.flatnonzero(kind == 2)
    tok = slow_whole = np.zeros(0, np.int64)
    if len(slow):  # the full rules for the rest, on code points
        tok, slow_whole = _rule_chunks(b, c_start[slow], c_end[slow], reference)
    # ``whole``: the words that are a whole core (what is left of a chunk after its affixes
    # and a unit): one-word special cases apply to them. (Kind 3, "far-flung", has none: the
    # infix cut it.)
    tok_start, tok_end, whole = kernels.word_spans(c_start, c_end, kind, core_s, core_e, suf_s, tok, n_quick,
                                                   slow_whole)
    if special_cases:
        apply = _apply_special_cases_arrays if reference else _apply_special_cases
        tok_start, tok_end = apply(b, tok_start, tok_end, whole)
    offsets = np.searchsorted(tok_start, doff).astype(np.int64)
    offsets[-1] = len(tok_start)
    return Words(None, offsets, tok_start, tok_end, b, cls, buf, base)


def _rule_chunks(b: np.ndarray, cs: np.ndarray, ce: np.ndarray, reference: bool = False):
    """Run the full rules on some chunks (byte spans): word starts and whole-core starts
    (each such core is one word), in bytes of ``b`` (``reference``: by the array version of
    the rules)."""
    # Their bytes joined by newlines, decoded to code points.
    joined = kernels.join_spans(b, cs, ce, 0x0A)
    cp = np.frombuffer(joined.tobytes().decode("utf-8").encode("utf-32-le"), dtype=np.uint32)
    tok, core_a, core_b = (rule_token_starts if reference else _compiled_rule_starts)(cp)
    at = kernels.char_text_bytes(cp, cs)  # char position in the joined chunks -> byte in the text
    return at[tok], at[core_a]


def _apply_special_cases(b, tok_start, tok_end, whole):
    """Special cases, at byte level; returns the new word spans (compiled:
    ``kernels.special_case_cuts``; ``_apply_special_cases_arrays`` is the same in numpy, the
    tests' reference)."""
    ks, keys, key_lo, cuts, sieves = _special_table_arrays()
    one_keys, one_order, one_cuts, one_sieve = _one_word_split_keys()
    t, k, cut_at, cut_owner = kernels.special_case_cuts(
        b, tok_start, tok_end, whole, ks, keys, key_lo, cuts, sieves, one_keys, one_cuts[one_order], one_sieve)
    if not len(t):
        return tok_start, tok_end
    return kernels.replace_spans(tok_start, tok_end, t, k, cut_at, cut_owner)


def _apply_special_cases_arrays(b, tok_start, tok_end, whole):
    """Special cases, at byte level; returns the new word spans.

    - A special string the rules cut into k > 1 words ("Mr." -> "Mr" "."; ":)" -> ":" ")")
      is merged wherever those words follow each other without space (spaCy's special-case
      matcher; longer matches first, of equal ones the later), then cut as it says.
    - A special string the rules leave whole ("don't", "cannot", "10am") is cut as it says
      when it is a whole core.

    Each change replaces k consecutive words by the pieces of their span; the result is
    assembled with one ``np.repeat`` (no per-word work).
    """
    m = len(tok_start)
    taken = np.zeros(m, dtype=bool)
    rep_t, rep_k, rep_off, rep_owner = [], [], [], []  # replaced words and new piece starts

    def replace(t: np.ndarray, k: int, a: np.ndarray, cuts: np.ndarray) -> None:
        base = sum(len(x) for x in rep_t)
        rep_t.append(t)
        rep_k.append(np.full(len(t), k, dtype=np.int64))
        taken[np.repeat(t, k) + np.tile(np.arange(k), len(t))] = True
        for off in range(1, 64):  # one step per byte offset, not per word
            on = ((cuts >> np.uint64(off)) & np.uint64(1)).astype(bool)
            if on.any():
                rep_off.append(a[on] + off)
                rep_owner.append(base + np.flatnonzero(on))

    if m > 1:
        tables = _special_tables()
        adj = tok_end[:-1] == tok_start[1:]
        chains = {1: np.ones(m, dtype=bool)}
        for k in range(2, max(tables) + 1):  # chains[k][t]: words t..t+k-1 touch
            chains[k] = chains[k - 1][:-1] & adj[k - 2:]
        for k in sorted((k for k in tables if k > 1), reverse=True):  # longest first
            t = np.flatnonzero(chains[k])
            a, e = tok_start[t], tok_end[t + k - 1]
            ok = (e - a <= 16) & ~taken[t] & ~taken[t + k - 1]
            t, a, e = t[ok], a[ok], e[ok]
            keys, order, cuts, sieve = tables[k]
            t, hit = find_keys(b, a, e - a, keys, order, sieve, t)
            if not len(t):
                continue
            if len(t) > 1:
                # Overlapping matches of the same length: the later one wins.
                clash = np.zeros(len(t), dtype=bool)
                clash[:-1] = t[1:] <= t[:-1] + k - 1
                t, hit = t[~clash], hit[~clash]
            replace(t, k, tok_start[t], cuts[hit])
    # One-word special cases on whole cores.
    keys, order, cuts, sieve = _one_word_split_keys()
    a = tok_start[whole]
    t, hit = find_keys(b, a, tok_end[whole] - a, keys, order, sieve, whole)
    ok = ~taken[t]
    replace(t[ok], 1, tok_start[t[ok]], cuts[hit[ok]])
    t = np.concatenate(rep_t) if rep_t else np.zeros(0, np.int64)
    if not len(t):
        return tok_start, tok_end
    k = np.concatenate(rep_k)
    off = np.concatenate(rep_off) if rep_off else np.zeros(0, np.int64)
    owner = np.concatenate(rep_owner) if rep_owner else np.zeros(0, np.int64)
    order = np.lexsort((off, owner))
    return kernels.replace_spans(tok_start, tok_end, t, k, off[order], owner[order])


@functools.lru_cache(maxsize=1)
def _special_tables() -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Special cases of at most 16 bytes grouped by how many words the rules alone cut them
    into: packed keys, their order and byte cut masks."""
    keys = [k for k in SPECIAL_CASES if len(k.encode()) <= 16]
    # cut by the array rules, not the quick paths: the tables then say what the rules make of
    # each key, and a quick path that cut a key otherwise ("°C.") shows against them
    words = split_words(pa.array(keys, pa.string()), special_cases=False, reference=True)
    out = {}
    for k in np.unique(words.counts):
        sel = [keys[i] for i in np.flatnonzero(words.counts == k)]
        table, order = key_table(sel)
        cuts = np.array([cut_mask(len(w[:c].encode()) for c in SPECIAL_CASES[w]) for w in sel],
                        dtype=np.uint64)
        out[int(k)] = (table, order, cuts, key_sieve(sel))
    return out


@functools.lru_cache(maxsize=1)
def _special_table_arrays():
    """``_special_tables``' multi-word tables for the compiled matcher, longest first: their
    word counts, sorted keys joined (table q from ``key_lo[q]``), each key's cut mask beside
    it, and one sieve per table."""
    tables = _special_tables()
    ks = np.array(sorted((k for k in tables if k > 1), reverse=True), np.int64)
    keys = [tables[k][0] for k in ks]
    return (ks, np.concatenate(keys + [np.zeros(0, np.uint64)]),
            np.concatenate(([0], np.cumsum([len(x) for x in keys], dtype=np.int64))).astype(np.int64),
            np.concatenate([tables[k][2][tables[k][1]] for k in ks] + [np.zeros(0, np.uint64)]),
            np.stack([tables[k][3] for k in ks]) if len(ks) else np.zeros((0, 1 << 16), np.uint32))


@functools.lru_cache(maxsize=1)
def _one_word_split_keys() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Packed keys of the special cases the rules leave as one word but that split
    ("don't", "cannot", "10am"), with their cut positions in bytes."""
    words = [k for k in SPECIAL_CASES if len(k.encode()) <= 16]
    one = split_words(pa.array(words, pa.string()), special_cases=False, reference=True).counts == 1
    sel = [w for w, o in zip(words, one) if o and SPECIAL_CASES[w]]
    table, order = key_table(sel)
    cuts = np.array([cut_mask(len(w[:c].encode()) for c in SPECIAL_CASES[w]) for w in sel],
                    dtype=np.uint64)
    return table, order, cuts, key_sieve(sel)


def count_py_words(values: pa.Array) -> np.ndarray:
    """``len(s.split())`` for every string (one compiled pass over the bytes)."""
    b, doff, _, _ = text_bytes(values)
    if not len(b):
        return np.zeros(len(values), dtype=np.int64)
    return kernels.split_word_counts(b, doff, _SPLIT_BYTES)


#: per byte, for ``kernels.split_word_counts``: 1 ASCII Python whitespace (``str.split``), 2 a
#: byte that may lead a multi-byte whitespace character, 0 neither
_SPLIT_BYTES = np.array([1 if c < 0x80 and chr(c) in PY_WHITESPACE else 2 if c in (0xC2, 0xE1, 0xE2, 0xE3) else 0
                         for c in range(256)], dtype=np.uint8)


def sentence_counts(words: Words) -> np.ndarray:
    """spaCy ``sentencizer`` sentence count per text, over its words.

    A new sentence starts at the first word after a sentence-ending mark (".", "!", "?"
    and other scripts' marks) that is not itself punctuation; closing quotes and brackets
    after the mark do not end the wait.
    """
    return sentence_counts_of(words.counts, words.doc, words.ender, words.punct)


def sentence_counts_of(counts: np.ndarray, doc: np.ndarray, ender: np.ndarray, punct: np.ndarray) -> np.ndarray:
    """``sentence_counts`` from words given as arrays: words per text, each word's text (in
    order), and its ``ender`` / ``punct`` flags."""
    out = (counts > 0).astype(np.int64)
    if len(doc) == 0:
        return out
    # Drop punctuation that neither ends a sentence nor starts one; what remains alternates
    # between enders and ordinary words. A word right after an ender starts a sentence.
    keep = ender | ~punct
    doc = doc[keep]
    ender = ender[keep]
    starts = np.zeros(len(doc), dtype=bool)
    starts[1:] = ender[:-1] & ~ender[1:] & (doc[1:] == doc[:-1])
    return out + np.bincount(doc[starts], minlength=len(counts))
