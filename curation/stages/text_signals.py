"""Vectorised text measurements shared by the heuristic filters (``filters.py``).

Everything here works on a whole batch at once: pyarrow compute kernels (RE2 regexes, splits,
lengths, dictionary encoding) over all documents, then numpy over integer arrays. There is no
Python loop per word, line or n-gram; the only loops run over a handful of regex passes or
over ``log2`` levels of pointer doubling.

The pieces:

- ``Segments``: a batch of documents each cut into parts (lines, paragraphs, words), kept
  flat: one Arrow string array of all parts plus the document of each part.
- ``split_words``: an English word splitter that mimics spaCy's rule tokenizer (what datatrove's
  ``split_into_words`` uses for English): whitespace chunks, then prefixes, suffixes,
  special cases, URLs and infixes, all as RE2 passes over the chunks that need them.
- ``sentence_counts``: spaCy's ``sentencizer`` rule over those words.
- ``duplicate_stats``: per document, how many parts repeat an earlier part and their chars.
- ``NGramIndex``: n-gram statistics over word ids (top n-gram char share, chars in
  duplicated n-grams with datatrove's greedy skip semantics).
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# ---------------------------------------------------------------------------------------------
# Character sets
# ---------------------------------------------------------------------------------------------


def _expand(ranges: str) -> str:
    """``"a-c x"`` style spec -> the characters it names (code points as hex)."""
    out = []
    for item in ranges.split():
        lo, _, hi = item.partition("-")
        out.extend(chr(c) for c in range(int(lo, 16), int(hi or lo, 16) + 1))
    return "".join(out)


#: Sentence-ending marks across scripts (the set datatrove calls ``TERMINAL_PUNCTUATION``;
#: FineWeb's line-punctuation rule and our sentence splitter use it).
TERMINAL_PUNCTUATION: frozenset[str] = frozenset(
    _expand(
        "21 2e 3f 589 61d-61f 6d4 700-702 7f9 837 839 83d 83e 964 965 104a 104b 1362 1367 1368"
        " 166e 1735 1736 1803 1809 1944 1945 1aa8-1aab 1b5a 1b5b 1b5e 1b5f 1b7d 1b7e 1c3b 1c3c"
        " 1c7e 1c7f 203c 203d 2047-2049 2e2e 2e3c 2e53 2e54 3002 a4ff a60e a60f a6f3 a6f7 a876"
        " a877 a8ce a8cf a92f a9c8 a9c9 aa5d-aa5f aaf0 aaf1 abeb fe52 fe56 fe57 ff01 ff0e ff1f"
        " ff61 10a56 10a57 10f55-10f59 10f86-10f89 11047 11048 110be-110c1 11141-11143 111c5"
        " 111c6 111cd 111de 111df 11238 11239 1123b 1123c 112a9 1144b 1144c 115c2 115c3"
        " 115c9-115d7 11641 11642 1173c-1173e 11944 11946 11a42 11a43 11a9b 11a9c 11c41 11c42"
        " 11ef7 11ef8 11f43 11f44 16a6e 16a6f 16af5 16b37 16b38 16b44 16e98 1bc9f 1da88"
    )
)

#: Characters datatrove treats as punctuation when deciding that a word is a "symbol word":
#: ASCII and CJK punctuation, control characters (not tab/newline) and the terminal marks.
PUNCTUATION: frozenset[str] = frozenset(
    "!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_.\"}►»"
    + _expand("0-8 b-c d-1f 7f-9f")
) | TERMINAL_PUNCTUATION

#: What Python's ``str.isspace`` calls whitespace (``str.strip``/``str.split`` use it).
PY_WHITESPACE = _expand("9-d 1c-20 85 a0 1680 2000-200a 2028 2029 202f 205f 3000")


def re2_class(chars) -> str:
    """The characters as the body of an RE2 character class (every one escaped)."""
    return "".join(f"\\x{{{ord(c):x}}}" for c in sorted(set(chars)))


_WS = re2_class(PY_WHITESPACE)
_TERMINAL = re2_class(TERMINAL_PUNCTUATION)

# ---------------------------------------------------------------------------------------------
# Segments
# ---------------------------------------------------------------------------------------------


def text_column(batch: pa.Table, name: str = "text") -> pa.Array:
    """The text column as one string array with nulls replaced by ``""``."""
    col = batch.column(name)
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    return pc.fill_null(arr, "")


@dataclass
class Segments:
    """Parts of each document of a batch, flattened.

    ``values[offsets[d]:offsets[d + 1]]`` are the parts of document ``d`` in order;
    ``doc[i]`` is the document of part ``i``.
    """

    values: pa.Array
    doc: np.ndarray
    offsets: np.ndarray

    @classmethod
    def from_lists(cls, lists: pa.Array) -> Segments:
        counts = pc.fill_null(pc.list_value_length(lists), 0).to_numpy(zero_copy_only=False)
        return cls.from_counts(pc.list_flatten(lists), counts.astype(np.int64))

    @classmethod
    def from_counts(cls, values: pa.Array, counts: np.ndarray) -> Segments:
        offsets = np.zeros(len(counts) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        doc = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        return cls(values, doc, offsets)

    @property
    def n_docs(self) -> int:
        return len(self.offsets) - 1

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def lengths(self) -> np.ndarray:
        """Length of every part in code points (what Python's ``len`` counts)."""
        return _np(pc.utf8_length(self.values)).astype(np.int64)

    def per_doc_sum(self, per_part: np.ndarray) -> np.ndarray:
        return np.bincount(self.doc, weights=per_part, minlength=self.n_docs)

    def select(self, mask: np.ndarray) -> Segments:
        """Keep the parts where ``mask`` is true (documents keep their order)."""
        counts = np.bincount(self.doc[mask], minlength=self.n_docs)
        return Segments.from_counts(self.values.filter(pa.array(mask)), counts)

    def to_lists(self) -> pa.Array:
        """Back to one list of parts per document."""
        return pa.ListArray.from_arrays(pa.array(self.offsets.astype(np.int32)), self.values)


def _np(arr) -> np.ndarray:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return arr.to_numpy(zero_copy_only=False)


def _mask(arr) -> np.ndarray:
    """Boolean Arrow array -> numpy bool (null counts as false)."""
    return _np(pc.fill_null(arr, False)).astype(bool)


def safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` with 0 where the denominator is 0 (empty documents)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.zeros(np.broadcast(num, den).shape, dtype=np.float64)
    np.divide(num, den, out=out, where=den != 0)
    return out


def split_lines(texts: pa.Array) -> Segments:
    """``str.splitlines()`` for every text: all Unicode line breaks, no trailing empty line."""
    parts = pc.split_pattern_regex(
        texts, r"\r\n|[\n\r\x0b\x0c\x1c\x1d\x1e\x{85}\x{2028}\x{2029}]"
    )
    seg = Segments.from_lists(parts)
    # splitlines drops the empty piece after a final line break (and returns [] for "").
    last = seg.offsets[1:] - 1
    has_parts = seg.counts > 0
    last = last[has_parts]
    drop = np.zeros(len(seg.values), dtype=bool)
    drop[last] = _np(pc.binary_length(seg.values.take(pa.array(last)))) == 0
    return seg.select(~drop) if drop.any() else seg


def split_pattern(texts: pa.Array, pattern: str) -> Segments:
    """``re.split(pattern, text)`` for every text (leading/trailing empty parts kept)."""
    return Segments.from_lists(pc.split_pattern_regex(texts, pattern))


def strip(values: pa.Array) -> pa.Array:
    """``str.strip()`` (Python's whitespace definition)."""
    return pc.utf8_trim(values, characters=PY_WHITESPACE)


def count_py_words(values: pa.Array) -> np.ndarray:
    """``len(s.split())`` for every string."""
    return _np(pc.count_substring_regex(values, f"[^{_WS}]+")).astype(np.int64)


def ends_with_any(values: pa.Array, chars) -> np.ndarray:
    """Whether each string's last character is one of ``chars``."""
    return _mask(pc.match_substring_regex(values, f"[{re2_class(chars)}]$"))


def duplicate_stats(seg: Segments, lengths: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per document: parts equal to an earlier part of the same document, and their chars.

    The first occurrence of a part is not a duplicate; every later occurrence is.
    """
    n = seg.n_docs
    if len(seg.values) == 0:
        return np.zeros(n, np.int64), np.zeros(n, np.int64)
    ids = _np(pc.dictionary_encode(seg.values).indices).astype(np.int64)
    key = seg.doc * (int(ids.max()) + 1) + ids
    _, first = np.unique(key, return_index=True)
    dup = np.ones(len(key), dtype=bool)
    dup[first] = False
    if lengths is None:
        lengths = seg.lengths()
    dup_count = np.bincount(seg.doc[dup], minlength=n)
    dup_chars = np.bincount(seg.doc[dup], weights=lengths[dup], minlength=n).astype(np.int64)
    return dup_count, dup_chars


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
# Most chunks are plain words (letters and digits only): they are one word each, found with
# a few byte comparisons over the UTF-8 text. Only chunks holding punctuation or symbols go
# through the rules, decoded to code points, where every rule is an array expression: a
# lookup table gives each character its classes, the prefix run of a chunk is the leading
# stretch of prefix characters, the suffix run the trailing stretch of suffix characters,
# infixes are conditions on a character and its neighbours, and special cases are found by
# comparing polynomial hashes of candidate spans with the hashes of the special strings.
# Stripping a whole run at once gives spaCy's tokens except where a special case hides inside
# a run; we check the spans spaCy's loop meets first (the chunk, then the core with two, one
# or none of its suffix tokens). Words are then Arrow slices of the text; dictionary encoding
# gives each distinct word an id, and word properties are computed once per distinct word.

_QUOTES = "'\"”“`‘´’‚,„»«「」『』（）〔〕【】《》〈〉〈〉⟦⟧"
_PUNCT = "…,:;!?¿؟¡()[]{}<>_#*&。？！，、；：～·।،۔؛٪"
_CURRENCY = "$£€¥฿₽﷼₴" + _expand("20a0-20bf")
_UNITS = (
    "km km² km³ m m² m³ dm dm² dm³ cm cm² cm³ mm mm² mm³ ha µm nm yd in ft kg g mg µg t lb oz "
    "m/s km/h kmh mph hPa Pa mbar mb MB kb KB gb GB tb TB T G M K % км км² км³ м м² м³ дм дм² "
    "дм³ см см² см³ мм мм² мм³ нм кг г мг м/с км/ч кПа Па мбар Кб КБ кб Мб МБ мб Гб ГБ гб Тб "
    "ТБ тб"
).split()
_URL_RE = (
    r"^(?:[\w+.\-][\w+.\-]+://)?(?:[^\s@]+(?::\S*)?@)?"
    r"(?:[0-9][0-9]?[0-9]?(?:\.[0-9][0-9]?[0-9]?){3}|"
    r"(?:(?:[A-Za-z0-9\x{a1}-\x{ffff}][A-Za-z0-9\x{a1}-\x{ffff}_\-]*)?"
    r"[A-Za-z0-9\x{a1}-\x{ffff}]\.)+\p{Ll}\p{Ll}+)(?::[0-9][0-9]+)?(?:[/?#]\S*)?$"
)

# Character classes, one bit each.
(_WSB, _PRE, _SUF, _DIG, _LOW, _UPP, _ALP, _QUO, _PCT, _DOTX, _SO, _ISYM, _FCK, _HYP, _DOP,
 _RULE, _SPC) = (1 << i for i in range(17))


def _char_flags(c: str) -> int:
    cat = unicodedata.category(c)
    so = cat == "So"
    f = (
        _WSB * c.isspace()
        | _PRE * (so or c in "§%=—–+" + _PUNCT + _QUOTES + _CURRENCY)
        | _SUF * (so or c in _PUNCT + _QUOTES + "—–")
        | _DIG * ("0" <= c <= "9")
        | _LOW * (cat in ("Ll", "Lo"))
        | _UPP * (cat in ("Lu", "Lo"))
        | _ALP * c.isalpha()
        | _QUO * (c in _QUOTES)
        | _PCT * (c in _PUNCT)
        | _DOTX * (c in "%²-+|")
        | _SO * so
        | _ISYM * (c in ":<>=/")
        | _FCK * (c in "FfCcKk")
        | _HYP * (c in "-–—~")
        | _DOP * (c in "+-*^")
    )
    # Characters any rule looks at (a chunk without them is one word, unless it is a number
    # with a unit or a contraction, both checked per distinct word).
    if (f & (_PRE | _SUF | _QUO | _PCT | _SO | _ISYM | _HYP | _DOP)) or c in ".'’":
        f |= _RULE
    if c in _SPECIAL_CHARS:
        f |= _SPC
    return f


@functools.lru_cache(maxsize=1)
def _bmp_flags() -> np.ndarray:
    return np.array([_char_flags(chr(c)) for c in range(0x10000)], dtype=np.uint32)


def _flags(cp: np.ndarray) -> np.ndarray:
    table = _bmp_flags()
    astral = cp >= 0x10000
    if not astral.any():
        return table[cp]
    f = table[np.where(astral, 0, cp)]
    # Few distinct characters live outside the BMP (emoji mostly): classify each once.
    uniq, inv = np.unique(cp[astral], return_inverse=True)
    f[astral] = np.array([_char_flags(chr(int(c))) for c in uniq], dtype=np.uint32)[inv]
    return f


def _special_cases() -> dict[str, tuple[int, ...]]:
    """English special cases: chunk -> positions where its later tokens start.

    Abbreviations keep their period (``()``), contractions split off their clitic
    ("don't" -> "do n't" is ``(2,)``), a few emoticons and fixed forms stay whole.
    """
    out: dict[str, tuple[int, ...]] = {}

    def add(word: str, tokens: str) -> None:
        cuts, pos = [], 0
        for tok in tokens.split(" ")[:-1]:
            pos += len(tok)
            cuts.append(pos)
        out[word] = tuple(cuts)

    def both_cases(word: str, tokens: str) -> None:
        add(word, tokens)
        add(word[:1].upper() + word[1:], tokens[:1].upper() + tokens[1:])

    abbreviations = (
        "Adm. Ak. Ala. Apr. Ariz. Ark. Aug. Bros. Calif. Co. Colo. Conn. Corp. D.C. Dec. Del. "
        "Dr. E.G. E.g. Feb. Fla. Ga. Gen. Gov. I.E. I.e. Ia. Id. Ill. Inc. Ind. Jan. Jr. Jul. "
        "Jun. Kan. Kans. Ky. La. Ltd. Mar. Mass. Md. Messrs. Mich. Minn. Miss. Mo. Mont. Mr. "
        "Mrs. Ms. Mt. N.C. N.D. N.H. N.J. N.M. N.Y. Neb. Nebr. Nev. Nov. Oct. Okla. Ore. Pa. "
        "Ph.D. Prof. Rep. Rev. S.C. Sen. Sep. Sept. St. Tenn. Va. Wash. Wis. a.m. p.m. co. "
        "e.g. i.e. vs. v.s. ä. ö. ü. °C. °F. °K. °c. °f. °k. and/or w/o C++ 'bout 'cause "
        "'cos 'coz 'cuz 'em 'nuff ol' ol’ :) :( :-) :-( :)) :(( :D :P :p :-D :-P :-p ;) ;-) ;D "
        "=) =( =D 8) 8-) 8D :/ :-/ :o :O :-o :-O :| :-| :* :-* :] :-] :3 <3 </3 <33 ^_^ ^__^ "
        "-_- o_O O_o o.O O.o O.O o.o xD XD ._. ' '' (: ): (; (-: )-: (= XDD xDD :') :'( :’) :’("
    ).split()
    for word in abbreviations:
        add(word, word)
    for letter in "abcdefghijklmnopqrstuvwxyz":
        add(letter + ".", letter + ".")
    for hour in range(1, 13):
        for half in ("am", "pm"):
            add(f"{hour}{half}", f"{hour} {half}")
            add(f"{hour}{half[0]}.m.", f"{hour} {half[0]}.m.")
    for apos in ("'", "’"):
        for clitic in ("s", "d", "ll", "re", "S"):
            add(apos + clitic, apos + clitic)
    for word in ("’", "’’", "‘s", "‘S"):
        add(word, word)
    clitics = {
        "i": "m d ll ve", "you": "d ll re ve", "he": "d ll s", "she": "d ll s", "it": "d ll s",
        "we": "d ll re ve", "they": "d ll re ve", "there": "d ll re s ve", "this": "d ll s",
        "that": "d ll s", "these": "d ll re ve", "those": "d ll re ve", "who": "d ll re s ve",
        "what": "d ll re s ve", "when": "d ll re s ve", "where": "d ll re s ve",
        "why": "d ll re s ve", "how": "d ll re s ve",
    }
    # Without an apostrophe spaCy only splits forms that are not ordinary words.
    real_words = {"its", "ill", "well", "shell", "were", "hell", "whod", "shed"}
    for pron, cls in clitics.items():
        for cl in cls.split():
            for apos in ("'", "’"):
                both_cases(f"{pron}{apos}{cl}", f"{pron} {apos}{cl}")
            if pron + cl not in real_words:
                both_cases(pron + cl, f"{pron} {cl}")
        if "d" in cls.split():
            for apos in ("'", "’"):
                both_cases(f"{pron}{apos}d{apos}ve", f"{pron} {apos}d {apos}ve")
            both_cases(f"{pron}dve", f"{pron} d ve")
        if "ll" in cls.split():
            both_cases(f"{pron}llve", f"{pron} ll ve")
    for i_form in ("I'm", "I’m", "Im", "I'd", "I’d", "I'll", "I’ll", "I've", "I’ve", "Id", "Ive"):
        add(i_form, "I " + i_form[1:])
    add("Ima", "I m a")
    add("ima", "i m a")
    for verb in ("ai are ca could dare did does do had has have is may might must need ought "
                 "sha should was were wo would").split():
        for apos in ("'", "’"):
            both_cases(f"{verb}n{apos}t", f"{verb} n{apos}t")
            both_cases(f"{verb}n{apos}t{apos}ve", f"{verb} n{apos}t {apos}ve")
        both_cases(f"{verb}nt", f"{verb} nt")
        both_cases(f"{verb}ntve", f"{verb} nt ve")
    for modal in ("could", "might", "must", "should", "would"):
        for apos in ("'", "’"):
            both_cases(f"{modal}{apos}ve", f"{modal} {apos}ve")
        both_cases(f"{modal}ve", f"{modal} ve")
    for word, tokens in (("cannot", "can not"), ("gonna", "gon na"), ("gotta", "got ta"),
                         ("let's", "let 's"), ("let’s", "let ’s"), ("y'all", "y' all"),
                         ("y’all", "y’ all"), ("yall", "y all"), ("ma'am", "ma'am"),
                         ("ma’am", "ma’am"), ("o'clock", "o'clock"), ("o’clock", "o’clock"),
                         ("c'mon", "c'm on"), ("c’mon", "c’m on"), ("ain't", "ai n't"),
                         ("doin'", "doin'"), ("goin'", "goin'"), ("havin'", "havin'"),
                         ("nothin'", "nothin'"), ("somethin'", "somethin'"), ("lovin'", "lovin'")):
        both_cases(word, tokens)
    return out


SPECIAL_CASES: dict[str, tuple[int, ...]] = _special_cases()


def _cut_mask(cuts) -> int:
    return sum(1 << c for c in cuts)


_SPECIAL_MAX_LEN = max(len(k) for k in SPECIAL_CASES)
_SPECIAL_CHARS = frozenset("".join(SPECIAL_CASES))
_NUMBER_UNIT_RE = "[0-9](?:" + "|".join(
    "".join(f"\\x{{{ord(c):x}}}" for c in u) for u in sorted(_UNITS, key=len, reverse=True)) + ")$"


def _prev(a: np.ndarray, first: np.ndarray, fill=0) -> np.ndarray:
    """Value of the previous character, ``fill`` at chunk starts (``first``)."""
    out = np.empty_like(a)
    out[0] = fill
    out[1:] = a[:-1]
    out[first] = fill
    return out


def _next(a: np.ndarray, last: np.ndarray, fill=0) -> np.ndarray:
    out = np.empty_like(a)
    out[-1] = fill
    out[:-1] = a[1:]
    out[last] = fill
    return out


def _rule_token_starts(cp: np.ndarray, with_specials: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Word starts (char positions) for chunks joined by single newlines, by spaCy's rules,
    and the starts of words that are a whole core."""
    N = len(cp)
    f = _flags(cp)
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
    pf = _prev(f, first)
    nf = _next(f, last)
    pcp = _prev(cp, first)

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
    elig_p = (((f & _PRE) != 0) & ~(plus & ((nf & _DIG) != 0))) | multi
    bad = nonws & ~elig_p
    cum = np.cumsum(bad, dtype=np.int32)
    in_pre = nonws & (cum == (cum - bad)[c_start][chunk_id])

    # Suffix run: the trailing stretch of suffix characters (their context is the characters
    # before, still there when spaCy strips from the right).
    apos = (cp == 0x27) | (cp == 0x2019)
    s_of_apos = ((cp == 0x73) | (cp == 0x53)) & _prev(apos, first, False)
    p2f = _prev(pf, first)
    ctx_dot = single_dot & (
        ((pf & (_DIG | _LOW | _DOTX | _PCT | _QUO)) != 0)
        | (((pf & _UPP) != 0) & ((p2f & _UPP) != 0))
        | (((pf & _FCK) != 0) & (_prev(pcp, first) == 0xB0))
    )
    elig_s = (((f & _SUF) != 0) | multi | s_of_apos | ctx_dot
              | (plus & ((pf & _DIG) != 0)))
    bad = nonws & ~elig_s
    cum = np.cumsum(bad, dtype=np.int32)
    in_suf = nonws & ~in_pre & ((cum[c_end - 1][chunk_id] - cum + bad) == 0)

    pre_len = np.bincount(chunk_id[in_pre], minlength=n_chunks)
    suf_len = np.bincount(chunk_id[in_suf], minlength=n_chunks)
    core_start = c_start + pre_len
    core_end = c_end - suf_len

    starts = first.copy()
    starts |= in_pre & ~cont_dot
    starts |= nonws & ~in_pre & _prev(in_pre, first, False)  # the core starts after the prefixes
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
    digit = (f & _DIG) != 0
    d_idx = np.flatnonzero(digit)
    has_core = core_end > core_start
    if len(d_idx) and has_core.any():
        cand = np.flatnonzero(has_core)
        j = np.searchsorted(d_idx, core_end[cand]) - 1
        ld = np.where(j >= 0, d_idx[np.maximum(j, 0)], -1)
        ok = (ld >= core_start[cand]) & (ld < core_end[cand] - 1) & (core_end[cand] - ld - 1 <= 4)
        cand, ld = cand[ok], ld[ok]
        if len(cand):
            tails = _spans_to_strings(cp, ld + 1, core_end[cand])
            is_unit = _mask(pc.is_in(tails, value_set=_UNIT_STRINGS))
            unit_pos = ld[is_unit] + 1
            starts[unit_pos] = True
            core_end[cand[is_unit]] = unit_pos

    # Infixes inside the core (lookarounds see only the core, as in spaCy).
    in_core = nonws & ~in_pre & ~in_suf
    in_core &= np.arange(N) < core_end[chunk_id]
    pic = _prev(in_core, first, False)
    nic = _next(in_core, last, False)
    ncp = _next(cp, last)
    infix = in_core & (((f & _SO) != 0) | (cp == 0x2026))
    infix_run = in_core & multi
    left_an = pic & ((pf & (_ALP | _DIG)) != 0)
    right_a = nic & ((nf & _ALP) != 0)
    infix |= in_core & ((f & _DOP) != 0) & pic & ((pf & _DIG) != 0) & nic & (
        ((nf & _DIG) != 0) | (ncp == 0x2D))
    infix |= single_dot & in_core & pic & ((pf & (_LOW | _QUO)) != 0) & nic & ((nf & (_UPP | _QUO)) != 0)
    infix |= in_core & (cp == 0x2C) & pic & ((pf & _ALP) != 0) & right_a
    infix |= in_core & ((f & _ISYM) != 0) & left_an & right_a
    # Hyphens between a letter/digit and a letter: "-", "--", "---", "—", "——", "–", "~".
    h_idx = np.flatnonzero(in_core & ((f & _HYP) != 0))
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
            url = _mask(pc.match_substring_regex(
                _spans_to_strings(cp, core_start[cand], core_end[cand]), _URL_RE))
            if url.any():
                bad_chunk = np.zeros(n_chunks, dtype=bool)
                bad_chunk[cand[url]] = True
                keep = ~bad_chunk[chunk_id]
                infix_tok &= keep
                infix_run &= keep
        # Token starts: at each infix (a run starts once) and right after it.
        run_cont = infix_run & _prev(infix_run, first, False) & (pcp == cp)
        starts |= infix_tok & ~run_cont
        run_goes_on = infix_run & _next(infix_run, last, False) & (ncp == cp)
        after = np.flatnonzero(infix_tok & ~run_goes_on) + 1
        after = after[after < N]
        starts[after[in_core[after]]] = True

    if with_specials:
        _apply_special_cases(cp, f, starts, nonws, chunk_id, c_end, core_start, core_end)
    tok = np.flatnonzero(starts & nonws)
    # Words that are a whole core (candidates for the one-word special cases).
    nxt = np.empty_like(tok)
    nxt[:-1] = tok[1:]
    nxt[-1:] = N
    c = chunk_id[tok]
    whole_core = (tok == core_start[c]) & (np.minimum(nxt, c_end[c]) == core_end[c])
    return tok, tok[whole_core]


def _apply_special_cases(cp, f, starts, nonws, chunk_id, c_end, core_start, core_end) -> None:
    """Special cases, as spaCy applies them after the rules (in place on ``starts``).

    A special string whose rule split has k > 1 tokens ("Mr." -> "Mr" "."; ":)" -> ":" ")")
    is merged wherever its k tokens follow each other in a chunk (spaCy's special-case
    matcher; longer matches first) and then cut as the special case says. Special strings
    the rules leave whole ("don't", "cannot") are applied per distinct word by
    ``split_words``, to words that are a whole core (all that remains of a chunk after
    stripping affixes).
    """
    N = len(cp)
    tok_s = np.flatnonzero(starts & nonws)
    m = len(tok_s)
    if m == 0:
        return
    tok_c = chunk_id[tok_s]
    tok_e = np.empty_like(tok_s)
    tok_e[:-1] = tok_s[1:]
    tok_e[-1] = N
    np.minimum(tok_e, c_end[tok_c], out=tok_e)
    # Spans made only of characters that occur in special cases, and short enough.
    bad = np.zeros(N + 1, dtype=np.int32)
    np.cumsum(nonws & ((f & _SPC) == 0), out=bad[1:])
    taken = np.zeros(m, dtype=bool)
    for k in (4, 3, 2):  # longest first, like spaCy's filter of overlapping matches
        keys, cuts = _specials_by_tokens().get(k, (None, None))
        if keys is None or m < k:
            continue
        t = np.arange(m - k + 1)
        last = t + k - 1
        a, b = tok_s[t], tok_e[last]
        ok = (tok_c[t] == tok_c[last]) & (b - a <= _SPECIAL_MAX_LEN) & (bad[b] == bad[a])
        ok &= ~taken[t] & ~taken[last]
        t = t[ok]
        if not len(t):
            continue
        idx = pc.index_in(_spans_to_strings(cp, tok_s[t], tok_e[t + k - 1]), value_set=keys)
        hit = _mask(pc.is_valid(idx))
        if not hit.any():
            continue
        t = t[hit]
        sel = _np(idx.filter(pa.array(hit))).astype(np.int64)
        if k > 1 and len(t) > 1:
            # Overlapping matches of the same length: the later one wins (spaCy's order).
            clash = np.zeros(len(t), dtype=bool)
            clash[:-1] = t[1:] <= t[:-1] + k - 1
            t, sel = t[~clash], sel[~clash]
        for j in range(k):
            taken[t + j] = True
        a, b, masks = tok_s[t], tok_e[t + k - 1], cuts[sel]
        for off in range(1, _SPECIAL_MAX_LEN):  # one step per character offset
            inside = a + off < b
            if not inside.any():
                break
            starts[a[inside] + off] = ((masks[inside] >> np.uint64(off)) & np.uint64(1)).astype(bool)


_UNIT_STRINGS = pa.array(_UNITS + list(_CURRENCY) + ["+"])


@functools.lru_cache(maxsize=1)
def _one_word_splits() -> tuple[pa.Array, np.ndarray]:
    """Special cases the rules leave as one word but that split ("don't", "cannot", "10am"),
    with their cut positions in bytes."""
    keys = [k for k in _specials_by_tokens()[1][0].to_pylist() if SPECIAL_CASES[k]]
    # Cut positions in UTF-8 bytes: the words are cut in the encoded text.
    cuts = [_cut_mask(len(k[:c].encode()) for c in SPECIAL_CASES[k]) for k in keys]
    return pa.array(keys, pa.string()), np.array(cuts, dtype=np.uint64)


@functools.lru_cache(maxsize=1)
def _specials_by_tokens() -> dict[int, tuple[pa.Array, np.ndarray]]:
    """Special cases grouped by how many tokens the rules alone cut them into."""
    keys = list(SPECIAL_CASES)
    cp = np.frombuffer("\n".join(keys).encode("utf-32-le"), dtype=np.uint32)
    starts, _ = _rule_token_starts(cp, with_specials=False)
    line_start = np.concatenate(([0], np.flatnonzero(cp == 0x0A) + 1))
    n_tok = np.diff(np.searchsorted(starts, np.append(line_start, len(cp))))
    out = {}
    for k in np.unique(n_tok):
        sel = [i for i in np.flatnonzero(n_tok == k)]
        out[int(k)] = (pa.array([keys[i] for i in sel]),
                       np.array([_cut_mask(SPECIAL_CASES[keys[i]]) for i in sel], dtype=np.uint64))
    return out



def _spans_to_strings(cp: np.ndarray, a: np.ndarray, b: np.ndarray) -> pa.Array:
    """Arrow strings of the code point spans [a, b) (spans hold no newline)."""
    if len(a) == 0:
        return pa.array([], pa.string())
    lengths = (b - a) + 1
    base = np.repeat(a - (np.cumsum(lengths) - lengths), lengths)
    idx = base + np.arange(int(lengths.sum()))
    chars = cp[np.minimum(idx, len(cp) - 1)].copy()
    chars[np.cumsum(lengths) - 1] = 0x0A
    text = chars[:-1].tobytes().decode("utf-32-le")
    return pc.list_flatten(pc.split_pattern(pa.array([text]), "\n"))


# ASCII byte classes for the plain-word fast path.
_BYTE_WS = np.zeros(256, dtype=bool)
_BYTE_WS[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True  # str.isspace() in ASCII
_BYTE_RULE = np.array([bool(_char_flags(chr(i)) & _RULE) for i in range(128)] + [False] * 128)


def _text_bytes(texts: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Buffer | None, int]:
    """UTF-8 bytes of all texts (a view), each text's byte offsets into it, the data buffer
    and where the view starts in it."""
    n = len(texts)
    bufs = texts.buffers()
    off_type = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    if n == 0 or bufs[2] is None:
        return np.zeros(0, np.uint8), np.zeros(n + 1, np.int64), None, 0
    off = np.frombuffer(bufs[1], dtype=off_type)[texts.offset: texts.offset + n + 1].astype(np.int64)
    b = np.frombuffer(bufs[2], dtype=np.uint8)[off[0]: off[-1]]
    return b, off - off[0], bufs[2], int(off[0])


@dataclass
class Words:
    """The words of a batch of texts: an id per word (equal ids = equal words) and, per
    distinct word, its properties.

    ``offsets[d]:offsets[d + 1]`` index the words of text ``d``.
    """

    doc: np.ndarray
    offsets: np.ndarray
    ids: np.ndarray
    vocab: pa.Array
    lengths: np.ndarray  # characters per word

    @property
    def n_docs(self) -> int:
        return len(self.offsets) - 1

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)

    def values(self) -> pa.Array:
        """The words themselves, as an Arrow string array."""
        return self.vocab.take(pa.array(self.ids))

    def vocab_flag(self, per_vocab: np.ndarray) -> np.ndarray:
        return per_vocab[self.ids] if len(self.ids) else np.zeros(0, dtype=per_vocab.dtype)

    def vocab_match(self, pattern: str) -> np.ndarray:
        """Per word: whether it matches an RE2 pattern (evaluated once per distinct word)."""
        return self.vocab_flag(_mask(pc.match_substring_regex(self.vocab, pattern)))

    def vocab_index_in(self, values: list[str]) -> np.ndarray:
        """Per word: its index in ``values``, -1 when absent."""
        idx = pc.fill_null(pc.index_in(self.vocab, value_set=pa.array(values, pa.string())), -1)
        return self.vocab_flag(_np(idx).astype(np.int64))

    @functools.cached_property
    def symbol(self) -> np.ndarray:
        """Only characters from datatrove's PUNCTUATION_SET."""
        return self.vocab_match(f"^[{re2_class(PUNCTUATION)}]+$")

    @functools.cached_property
    def alpha(self) -> np.ndarray:
        """Has a letter (``str.isalpha`` on some character)."""
        return self.vocab_match(r"\pL")

    @functools.cached_property
    def punct(self) -> np.ndarray:
        """Only Unicode punctuation (spaCy's ``is_punct``)."""
        return self.vocab_match(r"^\pP+$")

    @functools.cached_property
    def ender(self) -> np.ndarray:
        """One sentence-ending character (spaCy's sentencizer marks)."""
        return self.vocab_match(f"^[{_TERMINAL}]$")


def split_words(texts: pa.Array) -> Words:
    """English words of every text, split like spaCy's rule tokenizer (whitespace dropped).

    This reproduces ``datatrove.utils.text.split_into_words(text, "en")`` (spaCy's
    ``blank("en")`` tokenizer) up to rare special cases.
    """
    n_docs = len(texts)
    b, doff, buf, base = _text_bytes(texts)
    B = len(b)
    if B == 0:
        z = np.zeros(0, np.int64)
        return Words(z, np.zeros(n_docs + 1, np.int64), z, pa.array([], pa.string()), z)

    # Whitespace and chunk boundaries from bytes; non-ASCII characters are classified from
    # their code points (few of them in English text).
    ws = _BYTE_WS[b]
    rule = _BYTE_RULE[b]
    lead = np.flatnonzero(b >= 0xC0)
    if len(lead):
        n_bytes = 2 + (b[lead] >= 0xE0) + (b[lead] >= 0xF0)
        pad = np.concatenate((b, np.zeros(3, np.uint8))).astype(np.uint32)
        cp = np.where(n_bytes == 2, pad[lead] & 0x1F, np.where(n_bytes == 3, pad[lead] & 0x0F, pad[lead] & 0x07))
        for k in range(1, 4):
            more = n_bytes > k
            cp = np.where(more, (cp << 6) | (pad[lead + k] & 0x3F), cp)
        fl = _flags(cp)
        for k in range(4):  # mark every byte of the character
            at = lead[n_bytes > k] + k
            sel = n_bytes > k
            ws[at] = (fl[sel] & _WSB) != 0
            rule[at] = (fl[sel] & _RULE) != 0
    nonws = ~ws
    nonempty = doff[1:] > doff[:-1]
    brk = np.ones(B + 1, dtype=bool)  # brk[i]: a chunk cannot continue from i-1 to i
    brk[1:B] = ws[:-1]
    brk[doff[:-1][nonempty]] = True
    first = nonws & brk[:-1]
    brk_after = np.ones(B, dtype=bool)
    brk_after[:-1] = ws[1:]
    brk_after[doff[1:][nonempty] - 1] = True
    last = nonws & brk_after
    c_start = np.flatnonzero(first)
    c_end = np.flatnonzero(last) + 1

    # Chunks with a rule character go through the rules; the others are one word each.
    rule_pos = np.flatnonzero(rule & nonws)
    starts = first
    rule_chunk = np.zeros(len(c_start), dtype=bool)
    whole_core = np.zeros(B, dtype=bool)
    if len(rule_pos):
        rc = np.searchsorted(c_start, rule_pos, side="right") - 1
        rc = rc[np.concatenate(([True], rc[1:] != rc[:-1]))]  # sorted: drop repeats
        rule_chunk[rc] = True
        lens = c_end[rc] - c_start[rc]
        # Gather their bytes, joined by newlines, and decode to code points.
        total = int(lens.sum()) + len(rc)
        src = np.repeat(c_start[rc] - (np.cumsum(lens + 1) - (lens + 1)), lens + 1) + np.arange(total)
        sub = b[np.minimum(src, B - 1)]
        sep_at = np.cumsum(lens + 1) - 1
        sub[sep_at] = 0x0A
        cp_sub = np.frombuffer(sub[:-1].tobytes().decode("utf-8").encode("utf-32-le"), dtype=np.uint32)
        tok, core_tok = _rule_token_starts(cp_sub)
        # Char positions in the joined chunks -> byte positions in the text.
        wide = np.flatnonzero(cp_sub >= 0x80)
        extra = np.zeros(len(wide) + 1, dtype=np.int64)
        np.cumsum((cp_sub[wide] >= 0x800).astype(np.int64) + (cp_sub[wide] >= 0x10000) + 1, out=extra[1:])
        chunk_base = sep_at - lens  # byte where each joined chunk starts

        def to_text_bytes(pos: np.ndarray) -> np.ndarray:
            sub_byte = pos + extra[np.searchsorted(wide, pos)]
            which = np.searchsorted(sep_at, sub_byte, side="right")  # index into rc
            return c_start[rc[which]] + (sub_byte - chunk_base[which])

        starts[to_text_bytes(tok)] = True
        whole_core[to_text_bytes(core_tok)] = True
    ends = np.zeros(B + 1, dtype=bool)
    ends[c_end] = True
    tok_start, tok_end = _spans_from_starts(starts, ends)
    tokens = _byte_spans(buf, base, tok_start, tok_end)
    enc = pc.dictionary_encode(tokens)
    ids = _np(enc.indices).astype(np.int64)
    vocab = enc.dictionary

    # Words that still split, decided once per distinct word: one-word special cases
    # ("don't", "cannot", "10am") when the word is a whole chunk or core, numbers with a
    # unit ("5kg", "N500m") when the word is a whole plain chunk (rule chunks had theirs).
    # Cut positions are in bytes.
    keys, key_cuts = _one_word_splits()
    cuts = np.zeros(len(vocab), dtype=np.uint64)
    sp = pc.index_in(vocab, value_set=keys)
    hit = _mask(pc.is_valid(sp))
    if hit.any():
        cuts[hit] = key_cuts[_np(sp.filter(pa.array(hit))).astype(np.int64)]
    unit_cut = np.zeros(len(vocab), dtype=np.int64)
    unit = _mask(pc.match_substring_regex(vocab, _NUMBER_UNIT_RE))
    if unit.any():
        sub = vocab.filter(pa.array(unit))
        tail = pc.replace_substring_regex(sub, "^.*[0-9]", "")
        unit_cut[unit] = _np(pc.binary_length(sub)).astype(np.int64) - _np(pc.binary_length(tail))
    cand = np.flatnonzero((cuts[ids] != 0) | (unit_cut[ids] != 0))
    if len(cand):
        plain = np.ones(len(cand), dtype=bool)
        if rule_chunk.any():
            k = np.searchsorted(c_start, tok_start[cand], side="right") - 1
            plain = ~rule_chunk[k]
        cand_cut = cand[plain | whole_core[tok_start[cand]]]
        cand_unit = cand[plain]
        ids, tok_start, tok_end, vocab = _cut_words(
            buf, base, ids, tok_start, tok_end, vocab,
            cand_cut, cuts[ids[cand_cut]], cand_unit, unit_cut[ids[cand_unit]])
    first_tok = np.searchsorted(tok_start, doff)
    offsets = first_tok.astype(np.int64)
    offsets[-1] = len(tok_start)
    doc = np.repeat(np.arange(n_docs, dtype=np.int64), np.diff(offsets))
    vocab_len = _np(pc.utf8_length(vocab)).astype(np.int64)
    return Words(doc, offsets, ids, vocab, vocab_len[ids])


def _cut_words(buf, base, ids, tok_start, tok_end, vocab, cut_at, cut_masks, unit_at, unit_cuts):
    """Cut some words into pieces (bit k of a mask: a piece starts k bytes in; a unit cut:
    the unit starts that many bytes in). Returns new ids, spans and the grown vocabulary."""
    m = len(ids)
    offs = [np.zeros(0, np.int64)]
    owner = [np.zeros(0, np.int64)]
    unit_ok = unit_cuts > 0
    offs.append(unit_cuts[unit_ok])
    owner.append(unit_at[unit_ok])
    for off in range(1, 64):  # one step per character offset, not per word
        on = ((cut_masks >> np.uint64(off)) & np.uint64(1)).astype(bool)
        if on.any():
            offs.append(np.full(int(on.sum()), off, dtype=np.int64))
            owner.append(cut_at[on])
    owner_all = np.concatenate(owner)
    off_all = np.concatenate(offs)
    if not len(owner_all):
        return ids, tok_start, tok_end, vocab
    # One (word, offset) pair per new boundary; sort them into word order.
    order = np.lexsort((off_all, owner_all))
    owner_all, off_all = owner_all[order], off_all[order]
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = (owner_all[1:] != owner_all[:-1]) | (off_all[1:] != off_all[:-1])
    owner_all, off_all = owner_all[keep], off_all[keep]
    n_cuts = np.bincount(owner_all, minlength=m)
    pieces = n_cuts + 1
    new_m = m + len(owner_all)
    new_start = np.repeat(tok_start, pieces)
    new_end = np.repeat(tok_end, pieces)
    new_ids = np.repeat(ids, pieces)
    first_piece = np.cumsum(pieces) - pieces  # where each old word's pieces begin
    # The j-th cut of a word ends piece j and starts piece j + 1.
    rank = np.arange(len(owner_all)) - (np.cumsum(n_cuts) - n_cuts)[owner_all]
    at = first_piece[owner_all] + rank + 1
    new_start[at] = tok_start[owner_all] + off_all
    new_end[at - 1] = new_start[at]
    changed = np.flatnonzero(np.repeat(pieces > 1, pieces))
    piece_str = _byte_spans(buf, base, new_start[changed], new_end[changed])
    known = pc.index_in(piece_str, value_set=vocab)
    is_known = _mask(pc.is_valid(known))
    piece_ids = np.empty(len(changed), dtype=np.int64)
    piece_ids[is_known] = _np(known.filter(pa.array(is_known)))
    if (~is_known).any():
        extra = pc.dictionary_encode(piece_str.filter(pa.array(~is_known)))
        piece_ids[~is_known] = len(vocab) + _np(extra.indices).astype(np.int64)
        vocab = pa.concat_arrays([vocab, extra.dictionary])
    new_ids[changed] = piece_ids
    assert len(new_ids) == new_m
    return new_ids, new_start, new_end, vocab


def _spans_from_starts(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Word spans from a start mask (length B) and a chunk-end mask (length B + 1)."""
    bound = ends.copy()
    bound[:-1] |= starts
    pos = np.flatnonzero(bound)
    is_start = np.zeros(len(pos), dtype=bool)
    is_start[:-1] = starts[pos[:-1]]
    at = np.flatnonzero(is_start)
    return pos[at], pos[at + 1]


def _byte_spans(buf: pa.Buffer, base: int, start: np.ndarray, end: np.ndarray) -> pa.Array:
    """Arrow strings for the byte spans [start, end) of the text data (sorted, disjoint)."""
    m = len(start)
    # Interleave words and the gaps between them, then keep the words.
    off = np.empty(2 * m, dtype=np.int64)
    off[0::2] = start + base
    off[1::2] = end + base
    large = off[-1] >= 2**31 - 1
    arr_type = pa.large_string() if large else pa.string()
    off_arr = off.astype(np.int64 if large else np.int32)
    both = pa.Array.from_buffers(arr_type, 2 * m - 1, [None, pa.py_buffer(off_arr), buf])
    return both.take(pa.array(np.arange(0, 2 * m, 2)))


def split_chunks(texts: pa.Array) -> Segments:
    """``str.split()`` for every text: maximal runs of non-whitespace."""
    seg = Segments.from_lists(pc.utf8_split_whitespace(texts))
    nonempty = _mask(pc.greater(pc.binary_length(seg.values), 0))
    return seg if nonempty.all() else seg.select(nonempty)


def sentence_counts(words: Words) -> np.ndarray:
    """spaCy ``sentencizer`` sentence count per text, over its words.

    A new sentence starts at the first word after a sentence-ending mark (".", "!", "?"
    and other scripts' marks) that is not itself punctuation; closing quotes and brackets
    after the mark do not end the wait.
    """
    counts = (words.counts > 0).astype(np.int64)
    if len(words.doc) == 0:
        return counts
    # Drop punctuation that neither ends a sentence nor starts one; what remains alternates
    # between enders and ordinary words. A word right after an ender starts a sentence.
    ender, punct = words.ender, words.punct
    keep = ender | ~punct
    doc = words.doc[keep]
    ender = ender[keep]
    starts = np.zeros(len(doc), dtype=bool)
    starts[1:] = ender[:-1] & ~ender[1:] & (doc[1:] == doc[:-1])
    return counts + np.bincount(doc[starts], minlength=words.n_docs)


# ---------------------------------------------------------------------------------------------
# N-grams
# ---------------------------------------------------------------------------------------------

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_POLY = np.uint64(0x100000001B3)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads small integer ids over 64 bits."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


@dataclass
class NGramGroups:
    """Positions (global word indices) of candidate n-grams grouped by equal n-gram.

    ``pos`` is sorted by (group, position); ``group_start`` indexes into it.
    """

    pos: np.ndarray
    group: np.ndarray
    group_start: np.ndarray
    group_count: np.ndarray

    @property
    def first_pos(self) -> np.ndarray:
        return self.pos[self.group_start]


class NGramIndex:
    """N-gram statistics of the words of a batch, one n at a time, n increasing.

    An n-gram can only repeat where its (n-1)-gram prefix repeats, so each step only
    groups the positions that were in a repeated group at the previous n: after n = 3 or 4
    few positions remain. Grouping is one sort of 64-bit keys (high bits: rolling hash of
    the word ids, low bits: the position), so no argsort is needed.
    """

    def __init__(self, words: Words):
        self.words = words
        self.doc = words.doc
        self.n_docs = words.n_docs
        n_words = len(words.doc)
        self.doc_end = words.offsets[1:][words.doc] if n_words else np.zeros(0, np.int64)
        self.cum_len = np.zeros(n_words + 1, dtype=np.int64)
        np.cumsum(words.lengths, out=self.cum_len[1:])
        self.word_hash = _mix64(words.ids)
        self.pos_bits = max(int(max(n_words, 1)).bit_length(), 1)
        self.n = 0
        self.candidates = np.arange(n_words, dtype=np.int64)
        self.hash = np.zeros(n_words, dtype=np.uint64)
        self.groups: NGramGroups | None = None

    def advance(self, group: bool = True) -> NGramGroups | None:
        """Move to n + 1: hash the candidate positions and (if asked) group them.

        Without grouping every valid position stays a candidate for the next n.
        """
        n = self.n + 1
        cand = self.candidates
        cand = cand[cand + n <= self.doc_end[cand]] if len(cand) else cand
        with np.errstate(over="ignore"):
            # Rolling polynomial hash over mixed word ids, wrapping mod 2**64.
            h = self.hash[cand] * _POLY + self.word_hash[cand + n - 1]
        self.hash = np.zeros(len(self.doc), dtype=np.uint64)
        self.hash[cand] = h
        self.n = n
        if not group:
            self.groups = None
            self.candidates = cand
            return None
        self.groups = self._group(cand, h)
        repeated = np.repeat(self.groups.group_count >= 2, self.groups.group_count)
        # Order does not matter: grouping sorts anyway.
        self.candidates = self.groups.pos[repeated]
        return self.groups

    def _group(self, pos: np.ndarray, h: np.ndarray) -> NGramGroups:
        if len(pos) == 0:
            z = np.zeros(0, np.int64)
            return NGramGroups(z, z, z, z)
        bits = np.uint64(self.pos_bits)
        packed = ((h >> bits) << bits) | pos.astype(np.uint64)
        packed.sort()
        spos = (packed & np.uint64((1 << self.pos_bits) - 1)).astype(np.int64)
        shash = packed >> bits
        sdoc = self.doc[spos]
        new = np.ones(len(spos), dtype=bool)
        new[1:] = (shash[1:] != shash[:-1]) | (sdoc[1:] != sdoc[:-1])
        start = np.flatnonzero(new)
        count = np.diff(np.append(start, len(spos)))
        group = np.cumsum(new) - 1
        return NGramGroups(spos, group, start, count)

    def ngram_chars(self, pos: np.ndarray, n: int, with_spaces: bool) -> np.ndarray:
        """Characters of the n-grams starting at ``pos`` (joined by spaces or not)."""
        chars = self.cum_len[pos + n] - self.cum_len[pos]
        return chars + (n - 1) if with_spaces else chars

    def top_ngram_chars(self) -> np.ndarray:
        """Per document: chars of its most frequent n-gram (" ".join) times its count.

        Ties go to the n-gram seen first, as ``Counter.most_common(1)`` does; when no
        n-gram repeats that is the document's first n-gram.
        """
        n, g = self.n, self.groups
        out = np.zeros(self.n_docs, dtype=np.float64)
        words_per_doc = self.words.counts
        has = words_per_doc >= n
        starts = self.words.offsets[:-1][has]
        out[has] = self.ngram_chars(starts, n, True)
        rep = g.group_count >= 2
        if rep.any():
            first = g.first_pos[rep]
            count = g.group_count[rep].astype(np.uint64)
            mask = np.uint64((1 << self.pos_bits) - 1)
            # Best = highest count, then earliest first occurrence, packed into one integer.
            value = (count << np.uint64(self.pos_bits)) | (mask - first.astype(np.uint64))
            best = np.zeros(self.n_docs, dtype=np.uint64)
            np.maximum.at(best, self.doc[first], value)
            hit = best > 0
            bcount = (best[hit] >> np.uint64(self.pos_bits)).astype(np.int64)
            bpos = (mask - (best[hit] & mask)).astype(np.int64)
            out[hit] = self.ngram_chars(bpos, n, True) * bcount
        return out

    def duplicated_chars(self) -> np.ndarray:
        """Per document: chars in duplicated n-grams, counted the way datatrove does.

        datatrove scans positions left to right keeping a set of seen n-grams; an n-gram
        already in the set adds its chars ("".join) and the scan jumps n words ahead
        without adding the skipped n-grams to the set; otherwise it is added and the scan
        moves one word. We reproduce that exactly: flag positions whose n-gram was seen at
        an earlier *visited* position, follow the jumps with pointer doubling, and repeat
        until the visited set is stable (each round fixes at least the next position, in
        practice one or two rounds suffice).
        """
        n, g = self.n, self.groups
        out = np.zeros(self.n_docs, dtype=np.int64)
        if len(g.pos) == 0:
            return out
        # A position is a duplicate if its group has an earlier member (at first: any).
        first_member = np.zeros(len(g.pos), dtype=bool)
        first_member[g.group_start] = True
        dup_pos = np.sort(g.pos[~first_member])
        for _ in range(len(g.pos) + 1):
            visited_dups = self._greedy_path(dup_pos, n)
            # Recompute duplicates against visited positions only.
            visited = self._visited(g.pos, visited_dups, n)
            first_visited = np.full(len(g.group_start), np.iinfo(np.int64).max, dtype=np.int64)
            vis_idx = np.flatnonzero(visited)
            if len(vis_idx):
                gv = g.group[vis_idx]
                firsts = np.ones(len(gv), dtype=bool)
                firsts[1:] = gv[1:] != gv[:-1]
                first_visited[gv[firsts]] = g.pos[vis_idx[firsts]]
            new_dup = np.sort(g.pos[g.pos > first_visited[g.group]])
            if np.array_equal(new_dup, dup_pos):
                break
            dup_pos = new_dup
        if len(visited_dups):
            chars = self.ngram_chars(visited_dups, n, False)
            out += np.bincount(self.doc[visited_dups], weights=chars, minlength=self.n_docs).astype(np.int64)
        return out

    def _greedy_path(self, dup_pos: np.ndarray, n: int) -> np.ndarray:
        """The duplicate positions the left-to-right scan lands on.

        The scan reaches the first duplicate of each document; from a duplicate at q it
        resumes at q + n and walks to the next duplicate at or after q + n.
        """
        m = len(dup_pos)
        if m == 0:
            return dup_pos
        doc = self.doc[dup_pos]
        nxt = np.searchsorted(dup_pos, dup_pos + n).astype(np.int64)
        ok = nxt < m
        ok[ok] = doc[nxt[ok]] == doc[ok]
        nxt[~ok] = m  # sink
        nxt = np.append(nxt, m)
        starts = np.ones(m, dtype=bool)
        starts[1:] = doc[1:] != doc[:-1]
        marked = np.append(starts, False)
        # Pointer doubling: after levels k..0, marked holds every node 0..2^(k+1)-1 steps
        # from a start.
        jumps = [nxt]
        longest = int(np.bincount(doc).max())
        while (1 << len(jumps)) < longest + 1:
            jumps.append(jumps[-1][jumps[-1]])
        for jump in reversed(jumps):
            marked[jump[np.flatnonzero(marked)]] = True
        marked[m] = False
        return dup_pos[marked[:m]]

    def _visited(self, pos: np.ndarray, visited_dups: np.ndarray, n: int) -> np.ndarray:
        """Whether the scan visits each position: not strictly inside a jump q -> q + n."""
        if len(visited_dups) == 0:
            return np.ones(len(pos), dtype=bool)
        j = np.searchsorted(visited_dups, pos, side="left") - 1
        inside = j >= 0
        q = visited_dups[np.maximum(j, 0)]
        inside &= (pos < q + n) & (self.doc[q] == self.doc[pos])
        return ~inside
