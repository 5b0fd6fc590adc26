"""Vectorised text measurements shared by the heuristic filters (``filters.py``).

Everything works on a whole batch at once: numpy over the UTF-8 bytes of all documents (a
zero-copy view of the Arrow text buffer) and over integer arrays, a few pyarrow kernels, and
compiled (numba) loops in ``curation.text.kernels`` where numpy needed many passes per word. There is
no Python loop per word, line or n-gram; the Python loops that exist run over byte offsets
inside short spans (at most 16 or 64 rounds), or once per document around a C call (hashing
its bytes).

The pieces:

- ``Segments``: documents cut into parts (lines, paragraphs), flat: one Arrow string array
  of all parts plus the document of each part; ``split_lines`` / ``split_newlines`` make
  them with Python's ``splitlines`` / ``re.split`` semantics from the bytes.
- ``split_words`` -> ``Words``: English words split as spaCy's rule tokenizer does (what
  datatrove's ``split_into_words`` uses for English), as byte spans, with per-word
  measurements (characters, only punctuation, has a letter, a 64-bit id, ...).
- ``sentence_counts``: spaCy's ``sentencizer`` rule over those words.
- ``duplicate_stats``: per document, how many parts repeat an earlier part and their chars.

N-gram repetition over the word ids is compiled code, in ``curation.text.repetition``.
"""

from __future__ import annotations

import functools
import unicodedata
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.text import kernels as tk

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


class _PerDoc:
    """Items of a batch grouped by document: ``offsets[d]:offsets[d + 1]`` are text d's."""

    @property
    def n_docs(self) -> int:
        return len(self.offsets) - 1

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass
class Segments(_PerDoc):
    """Parts of each document of a batch, flattened.

    ``values[offsets[d]:offsets[d + 1]]`` are the parts of document ``d`` in order;
    ``doc[i]`` is the document of part ``i``.
    """

    values: pa.Array
    doc: np.ndarray
    offsets: np.ndarray
    byte_len: np.ndarray | None = None
    #: where each part starts in the batch's UTF-8 bytes (set by the byte-level splitters)
    byte_start: np.ndarray | None = None

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

    def lengths(self) -> np.ndarray:
        """Length of every part in code points (what Python's ``len`` counts)."""
        return _np(pc.utf8_length(self.values)).astype(np.int64)

    def per_doc_sum(self, per_part: np.ndarray) -> np.ndarray:
        return np.bincount(self.doc, weights=per_part, minlength=self.n_docs)

    def select(self, mask: np.ndarray) -> Segments:
        """Keep the parts where ``mask`` is true (documents keep their order)."""
        counts = np.bincount(self.doc[mask], minlength=self.n_docs)
        seg = Segments.from_counts(self.values.filter(pa.array(mask)), counts)
        if self.byte_len is not None:
            seg.byte_len = self.byte_len[mask]
        if self.byte_start is not None:
            seg.byte_start = self.byte_start[mask]
        return seg

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
    seg = _split_at(texts, "lines")
    # splitlines drops the empty piece after a final line break (and returns [] for "").
    last = seg.offsets[1:][seg.counts > 0] - 1
    drop = np.zeros(len(seg.values), dtype=bool)
    drop[last] = seg.byte_len[last] == 0
    return seg.select(~drop) if drop.any() else seg


def split_newlines(texts: pa.Array, min_run: int = 1, runs: bool = True) -> Segments:
    """``re.split("\\n+")`` (``runs``; with ``min_run=2``: ``"\\n{2,}"``) or
    ``text.split("\\n")`` (``runs=False``) for every text; empty parts kept."""
    return _split_at(texts, "newline", min_run=min_run, runs=runs)


def _split_at(texts: pa.Array, kind: str, min_run: int = 1, runs: bool = True) -> Segments:
    """Split every text at separators found in its UTF-8 bytes (no regex engine)."""
    n = len(texts)
    b, doff, buf, base = _text_bytes(texts)
    B = len(b)
    if kind == "lines":
        # \n \r \v \f \x1c-\x1e, "\r\n" as one, and \x85 \u2028 \u2029 (multi-byte).
        brk = ((b >= 0x0A) & (b <= 0x0D)) | ((b >= 0x1C) & (b <= 0x1E))
        sep_s = np.flatnonzero(brk)
        crlf = (b[sep_s] == 0x0D) & (b[np.minimum(sep_s + 1, B - 1)] == 0x0A) & (sep_s + 1 < B)
        sep_e = sep_s + 1 + crlf
        lf_after_cr = np.zeros(len(sep_s), dtype=bool)
        lf_after_cr[1:] = crlf[:-1] & (sep_s[1:] == sep_s[:-1] + 1)
        sep_s, sep_e = sep_s[~lf_after_cr], sep_e[~lf_after_cr]
        c2 = np.flatnonzero((b[:-1] == 0xC2) & (b[1:] == 0x85)) if B > 1 else np.zeros(0, np.int64)
        e2 = np.flatnonzero((b[:-2] == 0xE2) & (b[1:-1] == 0x80) & ((b[2:] == 0xA8) | (b[2:] == 0xA9))) \
            if B > 2 else np.zeros(0, np.int64)
        if len(c2) or len(e2):
            sep_s = np.concatenate((sep_s, c2, e2))
            sep_e = np.concatenate((sep_e, c2 + 2, e2 + 3))
            order = np.argsort(sep_s, kind="stable")
            sep_s, sep_e = sep_s[order], sep_e[order]
    else:
        nl = np.flatnonzero(b == 0x0A)
        if runs and len(nl):
            doc_start = np.zeros(B + 1, dtype=bool)
            doc_start[doff] = True
            start = np.ones(len(nl), dtype=bool)
            # A run never crosses texts: a text's first byte starts a new run.
            start[1:] = (nl[1:] != nl[:-1] + 1) | doc_start[nl[1:]]
            first = np.flatnonzero(start)
            length = np.diff(np.append(first, len(nl)))
            sep_s, sep_e = nl[first], nl[first] + length
            keep = (sep_e - sep_s) >= min_run
            sep_s, sep_e = sep_s[keep], sep_e[keep]
        else:
            sep_s, sep_e = nl, nl + 1
    # Pieces: from each text start or separator end to the next separator start or text end.
    sep_doc = np.searchsorted(doff, sep_s, side="right") - 1
    n_sep = np.bincount(sep_doc, minlength=n) if len(sep_s) else np.zeros(n, np.int64)
    counts = n_sep + 1
    total = int(counts.sum())
    starts = np.empty(total, dtype=np.int64)
    ends = np.empty(total, dtype=np.int64)
    first_piece = np.cumsum(counts) - counts
    starts[first_piece] = doff[:-1]
    ends[first_piece + counts - 1] = doff[1:]
    rank = np.arange(len(sep_s)) - (np.cumsum(n_sep) - n_sep)[sep_doc]
    at = first_piece[sep_doc] + rank
    ends[at] = sep_s
    starts[at + 1] = sep_e
    seg = Segments.from_counts(_byte_spans(buf, base, starts, ends, gaps=True), counts)
    seg.byte_len = ends - starts
    seg.byte_start = starts
    return seg


def strip(values: pa.Array) -> pa.Array:
    """``str.strip()`` (Python's whitespace definition)."""
    return pc.utf8_trim(values, characters=PY_WHITESPACE)


def count_py_words(values: pa.Array) -> np.ndarray:
    """``len(s.split())`` for every string."""
    b, doff, _, _ = _text_bytes(values)
    if not len(b):
        return np.zeros(len(values), dtype=np.int64)
    ws = (_byte_classes(b) & _B_WS) != 0
    first = ~ws
    first[1:] &= ws[:-1]
    nonempty = doff[1:] > doff[:-1]
    first[doff[:-1][nonempty]] = ~ws[doff[:-1][nonempty]]
    return np.diff(np.searchsorted(np.flatnonzero(first), doff))


def ends_with_any(values: pa.Array, chars) -> np.ndarray:
    """Whether each string's last character is one of ``chars``."""
    return _mask(pc.match_substring_regex(values, f"[{re2_class(chars)}]$"))


def hashes_and_ellipses(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Per text: how many "#", and how many "..." or "…" (as ``str.count``), in one
    compiled pass over the bytes."""
    b, doff, _, _ = _text_bytes(texts)
    return tk.hashes_and_ellipses(b, doff)


def bullet_and_ellipsis_lines(texts: pa.Array, lines: Segments) -> tuple[np.ndarray, np.ndarray]:
    """Per line of ``lines`` (``split_lines(texts)``): starts with "•" or "-" after its
    leading whitespace; ends with "..." or "…" before its trailing whitespace."""
    b, _, _, _ = _text_bytes(texts)
    return tk.bullet_and_ellipsis_lines(b, lines.byte_start, lines.byte_len)


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
# One compiled pass (``kernels.scan_chunks``) finds the chunks and sorts them. Most are plain
# words (no punctuation or symbol): one word each. ASCII chunks that are a plain core with one
# affix character at either end ("word," "(word)") are decided from the neighbouring bytes. In
# both, a unit after a number at the end of the core ("5kg", "25$") is split off. Only the rest
# go through the full rules, decoded to code points, compiled one chunk at a time
# (``kernels.rule_starts``): a table gives each character its classes, the prefix run of a
# chunk is its leading stretch of prefix characters, the suffix run its trailing stretch of
# suffix characters, infixes are conditions on a character and its neighbours. Stripping a
# whole run at once gives spaCy's words. The array version of the same rules
# (``_rule_token_starts``, every rule a numpy expression) is the reference: with
# ``split_words(..., reference=True)`` every chunk goes through it, and the tests compare the
# two on real pages and fuzzed text. Special cases are then applied at byte level, as spaCy's
# special-case matcher does after affixes and units are split (merge the words a special
# string was cut into wherever they touch, cut one-word special cases), comparing 16-byte
# packed keys of candidate spans with the special strings.

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

# Character classes, one bit each (defined with the compiled rules that read them).
(_WSB, _PRE, _SUF, _DIG, _LOW, _UPP, _ALP, _QUO, _PCT, _DOTX, _SO, _ISYM, _FCK, _HYP, _DOP,
 _RULE, _SPC) = (tk.WSB, tk.PRE, tk.SUF, tk.DIG, tk.LOW, tk.UPP, tk.ALP, tk.QUO, tk.PCT, tk.DOTX,
                 tk.SO, tk.ISYM, tk.FCK, tk.HYP, tk.DOP, tk.RULE, tk.SPC)


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


_CP_FLAGS = np.zeros(0x110000, np.uint32)  # ``_char_flags`` by code point, filled on demand
_CP_FLAGS_KNOWN = np.zeros(0x110000, bool)


def _looked_up(lookup, table: np.ndarray, known: np.ndarray, classify):
    """``lookup()`` (a compiled table lookup returning (classes, code points not yet known));
    the unknown code points are classified with ``classify`` once per process and the lookup
    is run again (rare after the first batch)."""
    out, missing = lookup()
    if len(missing):
        for c in np.unique(missing).tolist():
            table[c] = classify(chr(c))
            known[c] = True
        out, missing = lookup()
    return out


def _flags(cp: np.ndarray) -> np.ndarray:
    """``_char_flags`` of every code point."""
    return _looked_up(lambda: tk.code_point_classes(cp, _CP_FLAGS, _CP_FLAGS_KNOWN), _CP_FLAGS, _CP_FLAGS_KNOWN,
                      _char_flags)


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


_SPECIAL_CHARS = frozenset("".join(SPECIAL_CASES))

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


def _rule_token_starts(cp: np.ndarray):
    """Word starts (char positions) for chunks joined by single newlines, by spaCy's rules,
    and the spans of the words that are a whole core (all that is left of a chunk after
    stripping prefixes and suffixes)."""
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

    tok = np.flatnonzero(starts & nonws)
    # Words that are a whole core (candidates for the one-word special cases).
    nxt = np.empty_like(tok)
    nxt[:-1] = tok[1:]
    nxt[-1:] = N
    c = chunk_id[tok]
    whole_core = (tok == core_start[c]) & (np.minimum(nxt, c_end[c]) == core_end[c])
    return tok, tok[whole_core], core_end[c[whole_core]]


_UNIT_STRINGS = pa.array(_UNITS + list(_CURRENCY) + ["+"])


@functools.lru_cache(maxsize=2)
def _unit_rows(bytes_: bool) -> tuple[np.ndarray, np.ndarray]:
    """What the rules split off after a number (units, currency signs, "+") as zero-padded
    rows of code points, or of UTF-8 bytes (``bytes_``), and their lengths."""
    units = [list(u.encode()) if bytes_ else [ord(c) for c in u] for u in _UNIT_STRINGS.to_pylist()]
    table = np.zeros((len(units), max(map(len, units))), np.uint8 if bytes_ else np.uint32)
    for i, u in enumerate(units):
        table[i, :len(u)] = u
    return table, np.array([len(u) for u in units], np.int64)


def _compiled_rule_starts(cp: np.ndarray):
    """``_rule_token_starts`` by the compiled rules (``kernels.rule_starts``); the array
    version stays as the reference the tests hold this to."""
    N = len(cp)
    starts, istarts, core_s, core_e, url_cand = tk.rule_starts(cp, _flags(cp), *_unit_rows(bytes_=False))
    cand = np.flatnonzero(url_cand)
    if len(cand):
        url = _mask(pc.match_substring_regex(_spans_to_strings(cp, core_s[cand], core_e[cand]), _URL_RE))
        for c in cand[url].tolist():  # a core that looks like a URL keeps its infixes
            istarts[core_s[c]:core_e[c]] = False
    starts |= istarts
    tok = np.flatnonzero(starts)
    # A word that is a whole core: it starts the core, and no word starts before its end.
    c_end = np.append(np.flatnonzero(cp == 0x0A), N)
    c = np.flatnonzero(core_e > core_s)
    cs, ce = core_s[c], core_e[c]
    cum = np.cumsum(starts, dtype=np.int64)
    ends_there = np.append(starts, True)[np.where(ce == c_end[c], N, ce)]
    whole = (cum[ce - 1] == cum[cs]) & ends_there
    return tok, cs[whole], ce[whole]


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


# Byte classes (one bit each) for the byte-level pass; every byte of a non-ASCII character
# gets the classes of its code point.
(_B_WS, _B_RULE, _B_PUN, _B_LET, _B_PC, _B_TRM, _B_DIG, _B_PRE, _B_SUF, _B_LOW, _B_UPP,
 _B_DOTX) = (tk.B_WS, tk.B_RULE, tk.B_PUN, tk.B_LET, tk.B_PC, tk.B_TRM, tk.B_DIG, tk.B_PRE, tk.B_SUF,
             tk.B_LOW, tk.B_UPP, tk.B_DOTX)


def _byte_class_of(c: str) -> int:
    f = _char_flags(c)
    return (
        _B_WS * bool(f & _WSB)
        | _B_RULE * bool(f & _RULE)
        | _B_PUN * (c in PUNCTUATION)
        | _B_LET * c.isalpha()
        | _B_PC * unicodedata.category(c).startswith("P")
        | _B_TRM * (c in TERMINAL_PUNCTUATION)
        | _B_DIG * ("0" <= c <= "9")
        | _B_PRE * bool(f & _PRE)
        | _B_SUF * bool(f & _SUF)
        | _B_LOW * bool(f & _LOW)
        | _B_UPP * bool(f & _UPP)
        | _B_DOTX * bool(f & _DOTX)
    )


_ASCII_CLASS = np.array([_byte_class_of(chr(i)) for i in range(128)] + [0] * 128, dtype=np.uint16)


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


_CP_CLASS = np.zeros(0x110000, np.uint16)  # class bits by code point, filled on demand
_CP_KNOWN = np.zeros(0x110000, bool)


def _byte_classes(b: np.ndarray) -> np.ndarray:
    """Class bits of every byte (non-ASCII characters classified from their code points,
    each distinct one once per process)."""
    return _looked_up(lambda: tk.byte_classes(b, _ASCII_CLASS, _CP_CLASS, _CP_KNOWN), _CP_CLASS, _CP_KNOWN,
                      _byte_class_of)


def _py_short_key(s: str) -> int:
    """``kernels.short_key`` of one Python string (for the keys we look for)."""
    raw = s.encode()
    assert len(raw) <= 16
    lo = int.from_bytes(raw[:8], "little")
    hi = int.from_bytes(raw[8:16], "little")
    hi_len = np.array([(hi + len(raw)) & ((1 << 64) - 1)], np.uint64)
    return int(_mix64(np.array([lo], np.uint64) ^ _mix64(hi_len))[0])


def _key_table(values) -> tuple[np.ndarray, np.ndarray]:
    """Sorted short keys of ``values`` (each at most 16 UTF-8 bytes) and their indices."""
    keys = np.array([_py_short_key(v) for v in values], dtype=np.uint64)
    order = np.argsort(keys, kind="stable")
    return keys[order], order


def _lookup(sorted_keys: np.ndarray, order: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Index (into the original values) of each key, -1 when absent."""
    if len(sorted_keys) == 0 or len(keys) == 0:
        return np.full(len(keys), -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(sorted_keys, keys), len(sorted_keys) - 1)
    return np.where(sorted_keys[at] == keys, order[at], -1)


class Words(_PerDoc):
    """The words of a batch of texts, as byte spans of the UTF-8 text, with the per-word
    measurements the filters use (each computed on first use, for the whole batch).

    ``offsets[d]:offsets[d + 1]`` index the words of text ``d``.
    """

    def __init__(self, doc, offsets, start, end, b, cls, buf, base):
        self.doc = doc
        self.offsets = offsets
        self.start = start
        self.end = end
        self._b = b
        if cls is not None:
            self._cls = cls
        self._buf = buf
        self._base = base

    @functools.cached_property
    def _cls(self) -> np.ndarray:
        return _byte_classes(self._b)

    def take_docs(self, docs: np.ndarray, b, doff, buf, base) -> Words:
        """The words of some of these texts, for a batch holding exactly those texts (same
        bytes, other positions): spans are moved, measurements already made are kept."""
        counts = self.counts[docs]
        first = self.offsets[:-1][docs]
        total = int(counts.sum())
        idx = np.repeat(first - (np.cumsum(counts) - counts), counts) + np.arange(total)
        shift = np.repeat(doff[:-1] - self._doff[docs], counts)
        offsets = np.zeros(len(docs) + 1, dtype=np.int64)
        np.cumsum(counts, out=offsets[1:])
        out = Words(np.repeat(np.arange(len(docs), dtype=np.int64), counts), offsets,
                    self.start[idx] + shift, self.end[idx] + shift, b, None, buf, base)
        out._doff = doff
        if "_cls" in self.__dict__:  # the bytes' classes move with them: no second pass over the text
            out.__dict__["_cls"] = tk.gather_ranges(self._cls, self._doff[docs], np.diff(doff))
        for name in ("byte_lengths", "lengths", "symbol", "alpha", "punct", "ender", "hash"):
            if name in self.__dict__:
                out.__dict__[name] = self.__dict__[name][idx]
        return out

    @functools.cached_property
    def byte_lengths(self) -> np.ndarray:
        return self.end - self.start

    def _measured(self, name: str) -> np.ndarray:
        """``lengths``, ``symbol``, ``alpha`` and ``punct`` come from one compiled pass over
        the words' bytes; whichever is asked first measures all four."""
        chars, symbol, alpha, punct = tk.word_measures(self._b, self._cls, self.start, self.end)
        for key, value in (("lengths", chars), ("symbol", symbol), ("alpha", alpha), ("punct", punct)):
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
        if not len(self.start):
            return np.zeros(0, dtype=bool)
        return (self.lengths == 1) & ((self._cls[self.start] & _B_TRM) != 0)

    @functools.cached_property
    def hash(self) -> np.ndarray:
        """64-bit id per word: equal words, equal ids (exact up to 16 bytes, then by
        dictionary encoding of the longer words)."""
        n_bytes = self.byte_lengths
        out = tk.short_keys(self._b, self.start, n_bytes)
        long = np.flatnonzero(n_bytes > 16)
        if len(long):
            enc = pc.dictionary_encode(_byte_spans(self._buf, self._base, self.start[long], self.end[long]))
            out[long] = _mix64(_np(enc.indices).astype(np.uint64) + np.uint64(0x5851F42D4C957F2D))
        return out

    def match(self, values: list[str]) -> np.ndarray:
        """Per word: index of the equal string in ``values``, -1 if none."""
        out = np.full(len(self.start), -1, dtype=np.int64)
        short = [i for i, v in enumerate(values) if len(v.encode()) <= 16]
        if short:
            words = [values[i] for i in short]
            keys, order = _key_table(words)
            cand = np.flatnonzero(self.byte_lengths <= 16)
            cand, hit = _find_keys(self._b, self.start[cand], self.byte_lengths[cand], keys,
                                   order, _key_filter(words), cand)
            out[cand] = np.array(short)[hit]
        long = [i for i, v in enumerate(values) if len(v.encode()) > 16]
        if long:
            cand = np.flatnonzero(self.byte_lengths > 16)
            idx = pc.index_in(_byte_spans(self._buf, self._base, self.start[cand], self.end[cand]),
                              value_set=pa.array([values[i] for i in long], pa.string()))
            found = _np(pc.fill_null(idx, -1)).astype(np.int64)
            out[cand] = np.where(found >= 0, np.array(long)[np.maximum(found, 0)], out[cand])
        return out

    def values(self) -> pa.Array:
        """The words themselves, as an Arrow string array (for inspection and tests)."""
        return _byte_spans(self._buf, self._base, self.start, self.end)


def split_words(texts: pa.Array, special_cases: bool = True, reference: bool = False) -> Words:
    """English words of every text, split like spaCy's rule tokenizer (whitespace dropped).

    This reproduces ``datatrove.utils.text.split_into_words(text, "en")`` (spaCy's
    ``blank("en")`` tokenizer) up to rare special cases. Every call splits: to split a batch
    once and hand the words to the next stage, use ``curation.text.state.TextState``.
    ``reference``: every chunk through the array version of the full rules, no compiled
    quick paths (the tests compare the two; same words, several times slower).
    """
    n_docs = len(texts)
    b, doff, buf, base = _text_bytes(texts)
    B = len(b)
    z = np.zeros(0, np.int64)
    if B == 0:
        words = Words(z, np.zeros(n_docs + 1, np.int64), z, z, b, b, buf, base)
    else:
        words = _split_words(b, doff, buf, base, special_cases, reference)
    words._doff = doff
    return words


def _split_words(b, doff, buf, base, special_cases: bool, reference: bool = False) -> Words:
    n_docs = len(doff) - 1
    cls = _byte_classes(b)
    # Chunks, and how the quick rules cut plain ones and ASCII "word," "(word)" (compiled).
    c_start, c_end, kind, core_s, core_e, suf_s = tk.scan_chunks(b, cls, doff, *_unit_rows(bytes_=True))
    if reference:  # every chunk by the array rules: what the tests hold the quick paths to
        kind[:] = 2
    quick = np.flatnonzero(kind != 2)
    slow = np.flatnonzero(kind == 2)
    # Spans that are a whole core (what is left of a chunk after its affixes and a unit):
    # one-word special cases apply to them.
    cores_s, cores_e = core_s[quick], core_e[quick]
    tok = np.zeros(0, np.int64)
    if len(slow):  # the full rules for the rest, on code points
        tok, core_a, core_b = _rule_chunks(b, c_start[slow], c_end[slow], reference)
        cores_s, cores_e = np.concatenate((cores_s, core_a)), np.concatenate((cores_e, core_b))
    tok_start, tok_end = tk.word_spans(c_start, c_end, kind, core_s, core_e, suf_s, tok)
    if special_cases:
        tok_start, tok_end = _apply_special_cases(b, tok_start, tok_end, cores_s, cores_e)
    offsets = np.searchsorted(tok_start, doff).astype(np.int64)
    offsets[-1] = len(tok_start)
    doc = np.repeat(np.arange(n_docs, dtype=np.int64), np.diff(offsets))
    return Words(doc, offsets, tok_start, tok_end, b, cls, buf, base)


def _rule_chunks(b: np.ndarray, cs: np.ndarray, ce: np.ndarray, reference: bool = False):
    """Run the full rules on some chunks (byte spans): word starts and whole-core spans, in
    bytes of ``b`` (``reference``: by the array version of the rules)."""
    # Their bytes joined by newlines, decoded to code points.
    joined = tk.join_spans(b, cs, ce, 0x0A)
    cp = np.frombuffer(joined.tobytes().decode("utf-8").encode("utf-32-le"), dtype=np.uint32)
    tok, core_a, core_b = (_rule_token_starts if reference else _compiled_rule_starts)(cp)
    at = tk.char_text_bytes(cp, cs)  # char position in the joined chunks -> byte in the text
    return at[tok], at[core_a], at[core_b]


def _apply_special_cases(b, tok_start, tok_end, core_s, core_e):
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
            t, hit = _find_keys(b, a, e - a, keys, order, sieve, t)
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
    n_b = core_e - core_s
    # Empty cores (all affixes) never match: their slot uses length 0, which no key has.
    c, hit = _find_keys(b, core_s, n_b, keys, order, sieve, np.arange(len(core_s)))
    if len(c):
        t = np.searchsorted(tok_start, core_s[c])
        ok = (tok_end[t] == core_e[c]) & ~taken[t]
        replace(t[ok], 1, core_s[c[ok]], cuts[hit[ok]])
    t = np.concatenate(rep_t) if rep_t else np.zeros(0, np.int64)
    if not len(t):
        return tok_start, tok_end
    k = np.concatenate(rep_k)
    off = np.concatenate(rep_off) if rep_off else np.zeros(0, np.int64)
    owner = np.concatenate(rep_owner) if rep_owner else np.zeros(0, np.int64)
    order = np.lexsort((off, owner))
    return tk.replace_spans(tok_start, tok_end, t, k, off[order], owner[order])


def _find_keys(b, start, n_bytes, keys, order, sieve, carry):
    """The spans whose bytes equal one of the keys: (their ``carry`` values, key indices).

    A table over (first byte, last byte, length) rules out almost every span before the
    exact 64-bit key is computed (compiled: ``kernels.find_keys``; ``_key_filter``)."""
    if not len(start):
        return carry, np.zeros(0, np.int64)
    idx, hit = tk.find_keys(b, np.ascontiguousarray(start, np.int64), np.ascontiguousarray(n_bytes, np.int64),
                            keys, order.astype(np.int64), sieve)
    return carry[idx], hit


def _key_filter(values) -> np.ndarray:
    """Per (first byte, last byte): a bit for each length a key with those ends has (keys
    are at most 16 bytes). 256 KiB, so the probe per span stays in cache."""
    sieve = np.zeros(1 << 16, dtype=np.uint32)
    for v in values:
        raw = v.encode()
        sieve[(raw[0] << 8) | raw[-1]] |= np.uint32(1 << len(raw))
    return sieve


@functools.lru_cache(maxsize=1)
def _special_tables() -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Special cases of at most 16 bytes grouped by how many words the rules alone cut them
    into: packed keys, their order and byte cut masks."""
    keys = [k for k in SPECIAL_CASES if len(k.encode()) <= 16]
    words = split_words(pa.array(keys, pa.string()), special_cases=False)
    out = {}
    for k in np.unique(words.counts):
        sel = [keys[i] for i in np.flatnonzero(words.counts == k)]
        table, order = _key_table(sel)
        cuts = np.array([_cut_mask(len(w[:c].encode()) for c in SPECIAL_CASES[w]) for w in sel],
                        dtype=np.uint64)
        out[int(k)] = (table, order, cuts, _key_filter(sel))
    return out


@functools.lru_cache(maxsize=1)
def _one_word_split_keys() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Packed keys of the special cases the rules leave as one word but that split
    ("don't", "cannot", "10am"), with their cut positions in bytes."""
    words = [k for k in SPECIAL_CASES if len(k.encode()) <= 16]
    one = split_words(pa.array(words, pa.string()), special_cases=False).counts == 1
    sel = [w for w, o in zip(words, one) if o and SPECIAL_CASES[w]]
    table, order = _key_table(sel)
    cuts = np.array([_cut_mask(len(w[:c].encode()) for c in SPECIAL_CASES[w]) for w in sel],
                    dtype=np.uint64)
    return table, order, cuts, _key_filter(sel)


def _byte_spans(buf: pa.Buffer, base: int, start: np.ndarray, end: np.ndarray, gaps: bool = True) -> pa.Array:
    """Arrow strings for the byte spans [start, end) of the text data (sorted, disjoint)."""
    m = len(start)
    if m == 0 or buf is None:
        return pa.array([""] * m, pa.string())
    # Interleave spans and the gaps between them, then keep the spans.
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


# ---------------------------------------------------------------------------------------------
# Word ids (n-gram repetition itself is in ``curation.text.repetition``)
# ---------------------------------------------------------------------------------------------

_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads small integer ids over 64 bits."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))
