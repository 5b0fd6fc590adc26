"""Benchmark decontamination: an exact index of the eval sets' normalised word n-grams, matched
against a whole Arrow column of documents at a time.

**Words.** A leak on the web rarely looks like the benchmark file: punctuation is spaced out
(``3 , 5 .``), quotes are typographic or HTML entities (``&quot;``, ``&#39;``, ``’``), a
boilerplate line splits the passage, code is re-indented, text is re-wrapped, full-width or
ligature characters replace ASCII. So a word here is a run of letters, digits and marks
(Unicode ``L*``, ``N*``, ``M*``), and everything else (punctuation, symbols, spaces, line
breaks, indentation) only separates words. Per word:

- HTML character references (numeric, and HTML5 names of one code point) are decoded where
  they stand: ``&#233;`` and ``&eacute;`` are letters of their word, ``&quot;`` or ``&nbsp;``
  separators;
- invisible format characters that split words in copied text (soft hyphen, zero-width
  joiners, word joiner, BOM) are skipped; a zero-width space separates;
- scripts written without spaces (Han, kana, Thai, Lao, Khmer, Myanmar) make one word per
  character;
- ASCII is lowercased in the compiled scan; words with other characters are then put in
  Unicode NFKC and lowercased by Arrow (``utf8_normalize``, ``utf8_lower``), all such words of
  a batch in one call.

The scan (``_scan``, numba) walks the UTF-8 bytes of the whole column once and returns each
word's byte span in its document and its normalised bytes; nothing runs in Python per word.

**Index.** Every window of ``n`` consecutive words of every eval text is keyed by a 64-bit
hash (polynomial over per-word hashes, mixed with the length). An eval text shorter than ``n``
words but at least ``min_words`` long is indexed whole (one window of its length), so short
benchmark items are caught too. A document's windows are probed in a one-bit-per-slot bitmap
(a Bloom filter with one probe: a pre-filter only), then in the sorted key array, and every
key hit is **verified** byte for byte against the eval words it names: a match is an exact
equality of ``L`` normalised words, never a hash coincidence.

**Matches.** Per document, the verified windows of one eval item are merged into spans (two
windows of the same item closer than ``span_gap`` words join, so a boilerplate line inside a
leak is part of it), with the item's share of words covered and the byte span in the
original text. ``remove_spans`` cuts those spans out and keeps the rest of the document.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from numba import njit

from curation.text.arrow import readonly_bytes

#: character classes of the scan
SEP, WORD, SOLO, SKIP = 0, 1, 2, 3
_MAX_CP = 0x30000
#: scripts written without spaces between words: each letter is a word
_SOLO_RANGES = ((0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF), (0x3040, 0x30FF), (0x31F0, 0x31FF),
                (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0xFF66, 0xFF9F), (0x20000, 0x2FFFF))
#: format characters that sit inside words in copied text (soft hyphen, ZWNJ, ZWJ, word joiner,
#: BOM, invisible operators); other Cf characters (e.g. the zero-width space) separate
_SKIP_CHARS = (0x00AD, 0x200C, 0x200D, 0x2060, 0x2061, 0x2062, 0x2063, 0x2064, 0xFEFF)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_POLY = np.uint64(0x100000001B3)  # window polynomial base (odd)


@lru_cache(maxsize=1)
def char_classes() -> np.ndarray:
    """Class (``SEP``/``WORD``/``SOLO``/``SKIP``) of every code point below U+30000 (above: SEP)."""
    t = np.zeros(_MAX_CP, np.uint8)
    for cp in range(_MAX_CP):
        cat = unicodedata.category(chr(cp))
        if cat[0] in "LNM":
            t[cp] = WORD
    for lo, hi in _SOLO_RANGES:
        for cp in range(lo, min(hi + 1, _MAX_CP)):
            cat = unicodedata.category(chr(cp))
            if cat[0] == "L" or cat[0] == "N":
                t[cp] = SOLO
            elif cat[0] == "M":
                t[cp] = SKIP  # a vowel sign or tone mark belongs to the letter before it
    for cp in _SKIP_CHARS:
        t[cp] = SKIP
    return t


@njit(cache=True, nogil=True)
def _fnv(data, s, e):
    h = np.uint64(0xCBF29CE484222325)
    for k in range(s, e):
        h = (h ^ np.uint64(data[k])) * np.uint64(0x100000001B3)
    return h


@lru_cache(maxsize=1)
def entity_table() -> tuple[np.ndarray, np.ndarray]:
    """HTML5 named character references that stand for one code point: (sorted FNV-1a hashes
    of their names, code points)."""
    import html.entities

    keys, cps = [], []
    for name, val in html.entities.html5.items():
        if name.endswith(";") and len(val) == 1:
            b = np.frombuffer(name[:-1].encode(), np.uint8)
            keys.append(_fnv(b, 0, len(b)))
            cps.append(ord(val))
    k = np.array(keys, np.uint64)
    order = np.argsort(k)
    return k[order], np.array(cps, np.int64)[order]


@njit(cache=True, nogil=True)
def _put_utf8(out, k, cp):
    if cp < 0x80:
        out[k] = cp
        return k + 1
    if cp < 0x800:
        out[k] = 0xC0 | (cp >> 6)
        out[k + 1] = 0x80 | (cp & 0x3F)
        return k + 2
    if cp < 0x10000:
        out[k] = 0xE0 | (cp >> 12)
        out[k + 1] = 0x80 | ((cp >> 6) & 0x3F)
        out[k + 2] = 0x80 | (cp & 0x3F)
        return k + 3
    out[k] = 0xF0 | (cp >> 18)
    out[k + 1] = 0x80 | ((cp >> 12) & 0x3F)
    out[k + 2] = 0x80 | ((cp >> 6) & 0x3F)
    out[k + 3] = 0x80 | (cp & 0x3F)
    return k + 4


@njit(cache=True, nogil=True)
def _entity(data, i, end, ent_keys, ent_cps):
    """An HTML character reference at ``data[i] == '&'``: (code point, its length in bytes),
    -1 for an unknown name, or (-2, 0) when there is none."""
    j = i + 1
    if j < end and data[j] == 35:  # '#'
        j += 1
        hexa = j < end and (data[j] == 120 or data[j] == 88)
        if hexa:
            j += 1
        v = 0
        nd = 0
        while j < end and nd < 8:
            c = data[j]
            if 48 <= c <= 57:
                v = v * (16 if hexa else 10) + (c - 48)
            elif hexa and 97 <= (c | 32) <= 102:
                v = v * 16 + ((c | 32) - 87)
            else:
                break
            nd += 1
            j += 1
        if nd == 0 or j >= end or data[j] != 59 or v > 0x10FFFF:
            return -2, 0
        return v, j + 1 - i
    nd = 0
    while j < end and nd < 32:
        c = data[j]
        if (97 <= (c | 32) <= 122) or (nd > 0 and 48 <= c <= 57):
            nd += 1
            j += 1
        else:
            break
    if nd < 2 or j >= end or data[j] != 59:
        return -2, 0
    h = _fnv(data, i + 1, j)
    k = np.searchsorted(ent_keys, h)
    if k < len(ent_keys) and ent_keys[k] == h:
        return ent_cps[k], j + 1 - i
    return -1, j + 1 - i


@njit(cache=True, nogil=True)
def _scan(data, offsets, table, ent_keys, ent_cps, tok_start, tok_end, norm, norm_off, nonascii, doc_tok):
    """Words of every document ``data[offsets[d]:offsets[d+1]]``: byte spans (``tok_start``,
    ``tok_end``, relative to the document), normalised bytes (``norm[norm_off[t]:norm_off[t+1]]``,
    ASCII lowercased), whether a word holds non-ASCII, and each document's first word
    (``doc_tok``). Returns the number of words."""
    ntab = len(table)
    nt = 0
    nn = 0
    for d in range(len(offsets) - 1):
        doc_tok[d] = nt
        base = offsets[d]
        i = base
        end = offsets[d + 1]
        in_tok = False
        while i < end:
            b = data[i]
            ln = 1
            cp = -1
            if b < 0x80:
                cp = b
            elif 0xC2 <= b < 0xE0 and i + 1 < end:
                cp = ((b & 0x1F) << 6) | (data[i + 1] & 0x3F)
                ln = 2
            elif 0xE0 <= b < 0xF0 and i + 2 < end:
                cp = ((b & 0x0F) << 12) | ((data[i + 1] & 0x3F) << 6) | (data[i + 2] & 0x3F)
                ln = 3
            elif 0xF0 <= b < 0xF5 and i + 3 < end:
                cp = ((b & 0x07) << 18) | ((data[i + 1] & 0x3F) << 12) | ((data[i + 2] & 0x3F) << 6) | (data[i + 3] & 0x3F)
                ln = 4
            from_entity = False
            if b == 38:  # '&'
                v, el = _entity(data, i, end, ent_keys, ent_cps)
                if v != -2:
                    cp = v
                    ln = el
                    from_entity = True
            cls = 0
            if 0 <= cp < ntab:
                cls = table[cp]
            if cls == 1 or cls == 2:
                if cls == 2 and in_tok:
                    norm_off[nt + 1] = nn
                    nt += 1
                    in_tok = False
                if not in_tok:
                    tok_start[nt] = i - base
                    norm_off[nt] = nn
                    nonascii[nt] = False
                    in_tok = True
                if cp < 0x80:
                    c = cp
                    if 65 <= c <= 90:
                        c += 32
                    norm[nn] = c
                    nn += 1
                else:
                    nonascii[nt] = True
                    if from_entity:
                        nn = _put_utf8(norm, nn, cp)
                    else:
                        for k in range(ln):
                            norm[nn + k] = data[i + k]
                        nn += ln
                tok_end[nt] = i + ln - base
                if cls == 2:
                    norm_off[nt + 1] = nn
                    nt += 1
                    in_tok = False
            elif cls == 3:
                pass
            elif in_tok:
                norm_off[nt + 1] = nn
                nt += 1
                in_tok = False
            i += ln
        if in_tok:
            norm_off[nt + 1] = nn
            nt += 1
    doc_tok[len(offsets) - 1] = nt
    norm_off[nt] = nn
    return nt


@njit(cache=True, nogil=True)
def _hash_words(data, off):
    """64-bit hash of each word ``data[off[t]:off[t+1]]`` (FNV-1a, splitmix64-finalised)."""
    n = len(off) - 1
    out = np.empty(n, np.uint64)
    for t in range(n):
        h = np.uint64(0xCBF29CE484222325)
        for k in range(off[t], off[t + 1]):
            h = (h ^ np.uint64(data[k])) * np.uint64(0x100000001B3)
        z = h + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        out[t] = z ^ (z >> np.uint64(31))
    return out


@njit(cache=True, nogil=True)
def _verify(p, q, lens, a_data, a_off, b_data, b_off):
    """Whether words ``a[p:p+L]`` equal words ``b[q:q+L]`` byte for byte, per candidate."""
    out = np.zeros(len(p), np.bool_)
    for c in range(len(p)):
        ok = True
        for k in range(lens[c]):
            s1, e1 = a_off[p[c] + k], a_off[p[c] + k + 1]
            s2, e2 = b_off[q[c] + k], b_off[q[c] + k + 1]
            if e1 - s1 != e2 - s2:
                ok = False
                break
            for j in range(e1 - s1):
                if a_data[s1 + j] != b_data[s2 + j]:
                    ok = False
                    break
            if not ok:
                break
        out[c] = ok
    return out


def _mix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, int64 offsets of each row) of a string / large_string array (nulls: empty)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_string(arr.type) or pa.types.is_binary(arr.type):
        odt = np.int32
    elif pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        odt = np.int64
    else:
        arr = arr.cast(pa.large_string())
        odt = np.int64
    bufs = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(bufs[1], odt)[arr.offset: arr.offset + n + 1].astype(np.int64)
    data = readonly_bytes(bufs[2] if bufs[2] is not None else b"")
    if arr.null_count:
        valid = np.asarray(arr.is_valid())
        ends = np.where(valid, offsets[1:], offsets[:-1])  # a null row: zero words
        offsets = np.concatenate([offsets[:1], ends])
        # rows after a null must start where they start: rebuild as (start, end) pairs
        starts = np.asarray(offsets[:-1])
        return data, np.stack([starts, ends])
    return data, offsets


@dataclass
class Words:
    """The normalised words of a column of texts (row for row)."""

    doc_tok: np.ndarray  # int64 [n_docs + 1]: first word of each document
    start: np.ndarray  # int64 byte start of each word in its document's UTF-8
    end: np.ndarray  # int64 byte end
    data: np.ndarray  # uint8 normalised bytes of every word
    off: np.ndarray  # int64 [n_words + 1]
    hashes: np.ndarray  # uint64 per word

    @property
    def n_words(self) -> int:
        return len(self.hashes)

    def word(self, t: int) -> str:
        return bytes(self.data[self.off[t]:self.off[t + 1]]).decode("utf-8", "replace")


def words_of(texts: pa.Array | pa.ChunkedArray | list) -> Words:
    """Scan a column of texts (see the module doc)."""
    if not isinstance(texts, (pa.Array, pa.ChunkedArray)):
        texts = pa.array(texts, pa.large_string())
    data, offsets = _string_buffers(texts)
    if offsets.ndim == 2:  # nulls: rows as (start, end); scan a compacted copy
        starts, ends = offsets
        lens = ends - starts
        new_off = np.zeros(len(lens) + 1, np.int64)
        np.cumsum(lens, out=new_off[1:])
        idx = np.repeat(starts - new_off[:-1], lens) + np.arange(new_off[-1])
        data, offsets = data[idx], new_off
    nbytes = int(offsets[-1] - offsets[0])
    ndocs = len(offsets) - 1
    cap = nbytes // 2 + ndocs + 2
    tok_start = np.empty(cap, np.int64)
    tok_end = np.empty(cap, np.int64)
    norm = np.empty(max(nbytes, 1), np.uint8)
    norm_off = np.empty(cap + 1, np.int64)
    nonascii = np.empty(cap, np.bool_)
    doc_tok = np.empty(ndocs + 1, np.int64)
    nt = _scan(data, offsets, char_classes(), *entity_table(), tok_start, tok_end, norm, norm_off, nonascii, doc_tok)
    off = norm_off[:nt + 1].copy()
    norm = norm[:off[-1]]
    non = np.flatnonzero(nonascii[:nt])
    if len(non):
        # NFKC + lowercase of every word with a non-ASCII character, in one Arrow call
        arr = pa.LargeStringArray.from_buffers(nt, pa.py_buffer(off), pa.py_buffer(norm))
        fixed = pc.utf8_lower(pc.utf8_normalize(arr.take(pa.array(non)), "NFKC"))
        mask = np.zeros(nt, bool)
        mask[non] = True
        arr = pc.replace_with_mask(arr, pa.array(mask), fixed)
        norm, off = _string_buffers(arr)
        norm = norm[off[0]:off[-1]].copy()
        off = off - off[0]
    return Words(doc_tok, tok_start[:nt].copy(), tok_end[:nt].copy(), norm, off, _hash_words(norm, off))


def window_keys(words: Words, length: int) -> tuple[np.ndarray, np.ndarray]:
    """(key, first word) of every window of ``length`` words inside one document."""
    h = words.hashes
    nwin = len(h) - length + 1
    if nwin <= 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    acc = np.zeros(nwin, np.uint64)
    with np.errstate(over="ignore"):
        for k in range(length):
            acc = acc * _POLY + h[k:k + nwin]
    pos = np.arange(nwin, dtype=np.int64)
    doc_end = np.repeat(words.doc_tok[1:], np.diff(words.doc_tok))[:nwin]
    ok = pos + length <= doc_end
    return _mix(acc[ok] + np.uint64(length)), pos[ok]


@dataclass
class EvalItem:
    """One benchmark item: its id and the texts indexed for it (e.g. question + answer joined,
    and each field alone so that a short field is indexed whole)."""

    benchmark: str
    item: str
    texts: list[str]


@dataclass
class Hit:
    """One eval item found in one document: merged span(s) of verified windows."""

    doc: int
    item: int  # index into ``EvalIndex.items``
    start: int  # byte offsets in the document's UTF-8
    end: int
    windows: int
    coverage: float  # share of the item's (best) text's words inside matched windows


@dataclass
class EvalIndex:
    """Exact n-gram index of eval items (see the module doc)."""

    n: int
    min_words: int
    items: list[EvalItem]
    words: Words  # of every indexed text
    text_item: np.ndarray  # item of each indexed text
    keys: np.ndarray  # sorted uint64
    key_text: np.ndarray  # per key: indexed text
    key_pos: np.ndarray  # per key: first word in that text (global word index)
    key_len: np.ndarray  # per key: window length
    lengths: tuple[int, ...]  # window lengths present
    bitmap: np.ndarray  # uint8 bit array: pre-filter
    bits: int
    short_items: int = 0  # items with no text of at least ``min_words`` words (never matched)
    stats: dict = field(default_factory=dict)

    @classmethod
    def build(cls, items: list[EvalItem], n: int = 13, min_words: int = 8) -> EvalIndex:
        texts, owner = [], []
        for i, it in enumerate(items):
            for t in dict.fromkeys(it.texts):
                if t:
                    texts.append(t)
                    owner.append(i)
        words = words_of(pa.array(texts, pa.large_string()))
        text_item = np.asarray(owner, np.int64)
        nw = np.diff(words.doc_tok)
        keys, pos, lens = [], [], []
        k, p = window_keys(words, n)
        keys.append(k)
        pos.append(p)
        lens.append(np.full(len(k), n, np.int32))
        short = np.flatnonzero((nw >= min_words) & (nw < n))
        lengths = {n} if len(k) else set()
        for L in np.unique(nw[short]):
            sel = short[nw[short] == L]
            k, p = window_keys(words, int(L))
            first = words.doc_tok[sel]
            keep = np.isin(p, first)
            keys.append(k[keep])
            pos.append(p[keep])
            lens.append(np.full(int(keep.sum()), L, np.int32))
            lengths.add(int(L))
        keys_a = np.concatenate(keys)
        pos_a = np.concatenate(pos)
        len_a = np.concatenate(lens)
        order = np.argsort(keys_a, kind="stable")
        keys_a, pos_a, len_a = keys_a[order], pos_a[order], len_a[order]
        text_of_word = np.repeat(np.arange(len(texts)), nw)
        key_text = text_of_word[pos_a] if len(pos_a) else np.zeros(0, np.int64)
        bits = max(16, int(np.ceil(np.log2(max(1, len(keys_a)) * 16))))
        bitmap = np.zeros(1 << (bits - 3), np.uint8)
        slot = (keys_a >> np.uint64(64 - bits)).astype(np.int64)
        np.bitwise_or.at(bitmap, slot >> 3, (1 << (slot & 7)).astype(np.uint8))
        covered = np.zeros(len(items), bool)
        covered[text_item[nw >= min_words]] = True
        return cls(n, min_words, items, words, text_item, keys_a, key_text, pos_a, len_a,
                   tuple(sorted(lengths)), bitmap, bits, int((~covered).sum()),
                   {"texts": len(texts), "words": words.n_words, "keys": len(keys_a),
                    "unique_keys": int(len(np.unique(keys_a)))})

    # -- matching ----------------------------------------------------------------------------

    def candidates(self, words: Words) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Verified (document word, index key position, length) triples."""
        ps, ks, ls = [], [], []
        for L in self.lengths:
            key, pos = window_keys(words, L)
            if not len(key):
                continue
            slot = (key >> np.uint64(64 - self.bits)).astype(np.int64)
            maybe = (self.bitmap[slot >> 3] >> (slot & 7).astype(np.uint8)) & 1
            sel = np.flatnonzero(maybe)
            if not len(sel):
                continue
            key, pos = key[sel], pos[sel]
            lo = np.searchsorted(self.keys, key, "left")
            hi = np.searchsorted(self.keys, key, "right")
            cnt = hi - lo
            if not cnt.any():
                continue
            rep = np.repeat(np.arange(len(key)), cnt)
            kidx = np.repeat(lo - np.cumsum(cnt) + cnt, cnt) + np.arange(int(cnt.sum()))
            same_len = self.key_len[kidx] == L
            rep, kidx = rep[same_len], kidx[same_len]
            p = pos[rep]
            ok = _verify(p, self.key_pos[kidx], self.key_len[kidx].astype(np.int64),
                         words.data, words.off, self.words.data, self.words.off)
            ps.append(p[ok])
            ks.append(kidx[ok])
            ls.append(np.full(int(ok.sum()), L, np.int64))
        if not ps:
            z = np.zeros(0, np.int64)
            return z, z, z
        return np.concatenate(ps), np.concatenate(ks), np.concatenate(ls)

    def match(self, words: Words, span_gap: int = 16) -> tuple[np.ndarray, list[Hit]]:
        """Per document the number of verified windows, and the hits (item spans)."""
        ndocs = len(words.doc_tok) - 1
        p, kidx, L = self.candidates(words)
        counts = np.zeros(ndocs, np.int32)
        if not len(p):
            return counts, []
        doc = np.searchsorted(words.doc_tok, p, "right") - 1
        uniq = np.unique(np.stack([doc, p, L]), axis=1)
        np.add.at(counts, uniq[0], 1)
        text = self.key_text[kidx]
        item = self.text_item[text]
        q = self.key_pos[kidx] - self.words.doc_tok[text]  # window start inside its eval text
        hits: list[Hit] = []
        order = np.lexsort((p, item, doc))
        doc, item, p, L, text, q = doc[order], item[order], p[order], L[order], text[order], q[order]
        groups = np.split(np.arange(len(doc)), np.flatnonzero((np.diff(doc) != 0) | (np.diff(item) != 0)) + 1)
        text_len = np.diff(self.words.doc_tok)
        dh, eh = words.hashes, self.words.hashes
        for g in groups:
            d, it = int(doc[g[0]]), int(item[g[0]])
            lo_d, hi_d = int(words.doc_tok[d]), int(words.doc_tok[d + 1])
            cov = {int(t): np.zeros(int(text_len[t]), bool) for t in np.unique(text[g])}
            # spans in the document: windows joined when closer than span_gap words, each
            # span then extended word by word along the eval text it is aligned with
            spans: list[list[int]] = []  # [start, end, windows, first window row, last window row]
            for r in g.tolist():
                s_, e_ = int(p[r]), int(p[r] + L[r])
                cov[int(text[r])][q[r]:q[r] + L[r]] = True
                if spans and s_ <= spans[-1][1] + span_gap:
                    sp = spans[-1]
                    if e_ > sp[1]:
                        sp[1], sp[4] = e_, r
                    sp[2] += 1
                else:
                    spans.append([s_, e_, 1, r, r])
            for sp in spans:
                r0, r1 = sp[3], sp[4]
                t0, t1 = int(text[r0]), int(text[r1])
                base0, base1 = int(self.words.doc_tok[t0]), int(self.words.doc_tok[t1])
                # right: doc words from sp[1] against text t1 from the last window's end
                i, k, n_t = sp[1], int(q[r1] + L[r1]), int(text_len[t1])
                while k < n_t and i < hi_d:
                    if dh[i] == eh[base1 + k]:
                        cov[t1][k] = True
                        i, k = i + 1, k + 1
                        continue
                    j = next((j for j in range(1, span_gap + 1) if i + j < hi_d and dh[i + j] == eh[base1 + k]
                              and (k + 1 >= n_t or (i + j + 1 < hi_d and dh[i + j + 1] == eh[base1 + k + 1]))), 0)
                    if not j:
                        break
                    i += j
                sp[1] = i
                # left: doc words before sp[0] against text t0 before the first window's start
                i, k = sp[0] - 1, int(q[r0]) - 1
                while k >= 0 and i >= lo_d:
                    if dh[i] == eh[base0 + k]:
                        cov[t0][k] = True
                        i, k = i - 1, k - 1
                        continue
                    j = next((j for j in range(1, span_gap + 1) if i - j >= lo_d and dh[i - j] == eh[base0 + k]
                              and (k == 0 or (i - j - 1 >= lo_d and dh[i - j - 1] == eh[base0 + k - 1]))), 0)
                    if not j:
                        break
                    i -= j
                sp[0] = i + 1
            best = max(float(c.mean()) for c in cov.values())
            for sp in spans:
                hits.append(self._hit(words, d, it, sp[0], sp[1], sp[2], best))
        return counts, hits

    @staticmethod
    def _hit(words: Words, d: int, it: int, s: int, e: int, nwin: int, cov: float) -> Hit:
        return Hit(d, it, int(words.start[s]), int(words.end[e - 1]), nwin, cov)


def remove_spans(text: str, spans: list[tuple[int, int]]) -> str:
    """``text`` without the byte ranges ``spans`` of its UTF-8 (overlaps joined). A cut that
    leaves its line blank takes the line (and its line break) with it."""
    b = text.encode("utf-8", "surrogatepass")
    out, last = [], 0
    for s, e in sorted(spans):
        ls = b.rfind(b"\n", 0, s) + 1
        if not b[ls:s].strip():
            s = ls
            le = b.find(b"\n", e)
            le = len(b) if le < 0 else le + 1
            if not b[e:le].strip():
                e = le
        if e <= last:
            continue
        s = max(s, last)
        out.append(b[last:s])
        last = e
    out.append(b[last:])
    return b"".join(out).decode("utf-8", "surrogatepass")


def byte_to_char(text: str, offsets: list[int]) -> list[int]:
    """Character offsets of byte offsets into ``text``'s UTF-8."""
    b = text.encode("utf-8", "surrogatepass")
    return [len(b[:o].decode("utf-8", "surrogatepass")) for o in offsets]
