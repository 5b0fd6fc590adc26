"""MinHash signatures over whole batches with numpy, LSH band parameters and band hashes.

The text path, for a batch of documents (never a Python loop per word or shingle):

1. ``normalize_text``: NFKC, casefold, every whitespace character mapped to an ASCII one.
   ASCII documents (most of a crawl) take pyarrow's ``ascii_lower``; only the others go
   through Python's ``unicodedata`` / ``str.casefold`` (one C call per document).
2. ``word_hashes`` / ``normalized_word_hashes``: words are maximal runs of non-whitespace
   bytes of the UTF-8 buffer, cut and hashed to 64 bits in one compiled scan
   (``curation.dedup.kernels.scan_words``): 8-byte little-endian chunks, every chunk after
   the first mixed with its position (splitmix64), summed per word, the length mixed in.
3. ``shingle_hashes``: word n-grams as a polynomial over the word hashes (uint64
   wraparound), never crossing a document; documents shorter than n words are one shingle
   of all their words. A final splitmix64 keeps the top 32 bits.
4. ``MinHasher.signatures``: num_perm hash functions ``h_k(x) = (a_k x + b_k) mod 2^32``
   (``affine32``, the default) or the strongly universal multiply-add-shift
   ``((a_k x + b_k) mod 2^64) >> 32`` on 64-bit words (``multiply_shift64``); each
   document's minima in a compiled loop with the permutations innermost (SIMD lanes).

The compiled loops (``curation/dedup/kernels.py``) replaced array passes in issue 32 and are
bit-exact with them: ``tests/test_minhash.py`` pins the signatures' bytes.

Why ``affine32`` by default: 32-bit lanes multiply with SIMD but 64-bit ones mostly
scalar, so it is several times faster, and its Jaccard error on real document pairs equals the
binomial ideal (``tests/test_minhash.py`` and ``tests/benchmarks/bench_minhash.py`` measure
both families against datasketch).

Signatures are ``uint32`` (num_docs, num_perm). They are consumed by ``band_hashes`` (LSH)
and can be handed to datasketch (``LeanMinHash(seed=..., hashvalues=sig.astype(uint64))``)
to compare candidate pairs with its ``MinHashLSH``.

Persisted dedup artifacts (signatures, buckets, edges) carry a header (algorithm, version,
seed, params) in their Parquet schema metadata; ``check_header`` refuses a file whose
header differs from what the reader expects.
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.dedup import kernels as _k
from curation.hashing import GOLDEN, fmix64
from curation.io.artifacts import ArtifactMismatch, check_header, read_artifact, write_artifact  # noqa: F401
from curation.text.arrow import readonly_bytes

#: Bump when signatures for the same parameters would change (hashing, tokenising...).
MINHASH_VERSION = 1
NORMALIZATION = "nfkc-casefold-whitespace"

_U64 = np.uint64
_MASK64 = 0xFFFFFFFFFFFFFFFF
_GOLDEN = _U64(GOLDEN)
_NGRAM_BASE = _U64(0x9FB21C651E98DF25)  # odd multiplier of the n-gram polynomial

# Bytes that split words: ASCII whitespace as Python's str.split() sees it.
_WS_BYTES = np.zeros(256, dtype=bool)
_WS_BYTES[[9, 10, 11, 12, 13, 28, 29, 30, 31, 32]] = True
# The same per byte for a compiled word cut: 1 ASCII whitespace, 2 a byte that may lead a
# multi-byte whitespace character (``kernels._ws_width`` decides), 0 neither.
_WS_LEADS = _WS_BYTES.astype(np.uint8)
_WS_LEADS[[0xC2, 0xE1, 0xE2, 0xE3]] = 2
# Whitespace characters NFKC keeps (the other spaces become U+0020 under NFKC).
_UNICODE_WS = {0x85: " ", 0x1680: " ", 0x2028: " ", 0x2029: " "}
_UNICODE_WS_CHARS = tuple(chr(c) for c in _UNICODE_WS)




# ---------------------------------------------------------------------------------------------
# text normalisation (shared with exact dedup)


def _normalize_one(s: str) -> str:
    if not unicodedata.is_normalized("NFKC", s):
        s = unicodedata.normalize("NFKC", s)
    s = s.casefold()
    if any(c in s for c in _UNICODE_WS_CHARS):
        s = s.translate(_UNICODE_WS)
    return s


def _normalize_words(words: list[str], collapse: bool = True) -> list[str]:
    """``" ".join(_normalize_one(w).split())`` of every word (none holds whitespace), by one
    normalisation of the words joined with newlines: a newline is an NFKC starter nothing
    composes across, and no character folds or decomposes into one, so the pieces are the
    words' own. (A Python call per distinct non-ASCII word was a tenth of exact dedup's
    keys on the long bench pages.) Should the pieces not line up, word by word.
    ``collapse=False``: the forms as they are (``_normalize_one(w)`` each), for a caller that
    splits them at whitespace itself."""
    if not words:
        return []
    parts = _normalize_one("\n".join(words)).split("\n")
    if len(parts) != len(words):
        parts = [_normalize_one(w) for w in words]
    return [" ".join(p.split()) for p in parts] if collapse else parts


def normalize_text(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """NFKC + casefold, nulls as empty strings, the whitespace that NFKC keeps (U+0085,
    U+2028...) mapped to a space. Whitespace runs are kept (see ``collapse_whitespace``)."""
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if pa.types.is_large_string(texts.type):
        texts = texts.cast(pa.string())
    texts = pc.fill_null(texts, "")
    ascii_mask = pc.string_is_ascii(texts)
    lowered = pc.ascii_lower(texts)
    if pc.all(ascii_mask).as_py() in (True, None):
        return lowered
    # The non-ASCII documents need Unicode rules pyarrow lacks (casefold, NFKC quick check).
    idx = np.flatnonzero(~ascii_mask.to_numpy(zero_copy_only=False))
    fixed = pa.array([_normalize_one(s) for s in texts.take(pa.array(idx)).to_pylist()], pa.string())
    # splice the fixed documents back by index without materialising the ASCII ones in Python
    pos = np.full(len(texts), -1, dtype=np.int64)
    pos[idx] = np.arange(len(idx))
    merged = pa.chunked_array([lowered, fixed]).combine_chunks()
    order = np.where(pos < 0, np.arange(len(texts)), len(texts) + pos)
    return merged.take(pa.array(order))


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 starting at 0, UTF-8 bytes) of a string array without copying text."""
    if pa.types.is_large_string(arr.type):
        off_t = np.int64
    elif pa.types.is_string(arr.type):
        off_t = np.int32
    else:
        raise TypeError(f"expected a string array, got {arr.type}")
    bufs = arr.buffers()
    offsets = np.frombuffer(bufs[1], dtype=off_t, count=len(arr) + 1, offset=arr.offset * np.dtype(off_t).itemsize)
    data = readonly_bytes(bufs[2] if bufs[2] is not None else b"")
    start = int(offsets[0])
    return offsets.astype(np.int64) - start, data[start:int(offsets[-1])]


def _whitespace_mask(data: np.ndarray, high: np.ndarray | None = None) -> np.ndarray:
    """Per byte: is it (part of) a character ``str.split`` treats as whitespace?

    Bytes below 32 are rare except newlines and tabs, so the lookup table is only consulted
    for them; the multi-byte whitespace characters (U+0085, U+00A0, U+1680, U+2000-U+200A,
    U+2028, U+2029, U+202F, U+205F, U+3000) are looked for among the non-ASCII bytes
    (``high``: their positions, when the caller has them).
    """
    ws = data <= 32
    low = np.flatnonzero(data < 32)
    ws[low] = _WS_BYTES[data[low]]
    lead = np.flatnonzero(data >= 0xC2) if high is None else high[data[high] >= 0xC2]
    if len(lead):
        b0 = data[lead]
        b1 = np.take(data, lead + 1, mode="clip")
        b2 = np.take(data, lead + 2, mode="clip")
        two = (b0 == 0xC2) & ((b1 == 0x85) | (b1 == 0xA0))
        three = (((b0 == 0xE1) & (b1 == 0x9A) & (b2 == 0x80))
                 | ((b0 == 0xE2) & (b1 == 0x80) & ((b2 <= 0x8A) | (b2 == 0xA8) | (b2 == 0xA9) | (b2 == 0xAF)))
                 | ((b0 == 0xE2) & (b1 == 0x81) & (b2 == 0x9F))
                 | ((b0 == 0xE3) & (b1 == 0x80) & (b2 == 0x80)))
        for width, sel in ((2, two), (3, three)):
            at = lead[sel]
            for j in range(width):
                ws[at + j] = True
    return ws


def collapse_whitespace(texts: pa.Array) -> pa.Array:
    """Whitespace runs -> one space, leading/trailing whitespace removed (vectorised over
    the batch's bytes). Input is normalised text (``normalize_text``: its only whitespace
    is ASCII).

    Memory stays at a few bytes per input byte: the output is the input with a boolean
    mask applied (the first whitespace byte between two words of a document becomes the
    space), not a per-byte position array.
    """
    texts = pc.fill_null(texts, "")
    offsets, data = _string_buffers(texts)
    n = len(data)
    if n == 0:
        return texts
    ws = _whitespace_mask(data)
    starts, ends = _word_spans(offsets, data, ws)
    doc_words = np.searchsorted(starts, offsets, side="left")
    # the byte right after a word becomes the separator, unless it is its document's last word
    last = np.zeros(len(starts), dtype=bool)
    nonempty = np.diff(doc_words) > 0
    last[doc_words[1:][nonempty] - 1] = True
    emit = ~ws
    emit[ends[~last]] = True
    out = np.where(ws, np.uint8(32), data)[emit]
    # emitted bytes per document: a cumulative count at the document boundaries
    counts = np.zeros(len(offsets) - 1, dtype=np.int64)
    lens = np.diff(offsets)
    has = lens > 0
    if has.any():
        counts[has] = np.add.reduceat(emit, offsets[:-1][has], dtype=np.int64)
    new_off = np.zeros(len(offsets), dtype=np.int32)
    np.cumsum(counts, out=new_off[1:])
    return pa.Array.from_buffers(pa.string(), len(texts), [None, pa.py_buffer(new_off), pa.py_buffer(out)])


def normalize_collapsed(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """``collapse_whitespace(normalize_text(texts))`` straight from raw text: exact dedup's key
    text, byte for byte.

    Words are cut on the raw bytes (``str.split``'s characters) and written joined by
    spaces, ASCII letters lowered, in one compiled pass (``kernels.lowered_words``); only the
    batch's distinct non-ASCII words are normalised in Python and spliced in: NFKC +
    casefold of a word equals that of the text around it, since whitespace never composes
    with a neighbour (``normalized_word_hashes`` rests on the same fact). A
    normalised word holding whitespace ("¨" -> " ̈") is collapsed like the text. On the long
    bench pages (12,700 chars, mostly non-ASCII) the whole-text path took ~1.2 ms a document,
    most of it NFKC over every character and ~20 numpy passes over the bytes.
    """
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    offsets, data = _string_buffers(pc.fill_null(texts, ""))
    out_off, out, hd, hs, he, hos, hoe = _k.lowered_words(data, offsets, _WS_LEADS)
    if len(hd):
        _, first, inverse = np.unique(_k.span_hashes(data, hs, he), return_index=True, return_inverse=True)
        if not _k.spans_equal(data, hs, he, hs[first][inverse], he[first][inverse]):
            first = inverse = np.arange(len(hd))  # two words share a 64-bit hash: each on its own
        words = _spans_as_strings(data, hs[first], he[first])
        r_off, r_data = _string_buffers(pa.array(_normalize_words(words), pa.string()))
        out_off, out = _k.splice_words(out_off, out, hd, hos, hoe, inverse.astype(np.int64), r_off, r_data)
    if out_off[-1] < 2**31:
        return pa.Array.from_buffers(pa.string(), len(out_off) - 1,
                                     [None, pa.py_buffer(out_off.astype(np.int32)), pa.py_buffer(out)])
    return pa.Array.from_buffers(pa.large_string(), len(out_off) - 1, [None, pa.py_buffer(out_off), pa.py_buffer(out)])


def _spans_as_strings(data: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[str]:
    """The UTF-8 byte spans ``data[starts[i]:ends[i]]`` as Python strings (one gather, one
    Arrow conversion: no per-span slicing in Python)."""
    lens = ends - starts
    gather = np.repeat(starts - np.r_[0, np.cumsum(lens)[:-1]], lens) + np.arange(int(lens.sum()))
    off = np.r_[0, np.cumsum(lens)]
    typ, off = (pa.string(), off.astype(np.int32)) if off[-1] < 2**31 else (pa.large_string(), off.astype(np.int64))
    return pa.Array.from_buffers(typ, len(starts), [None, pa.py_buffer(off), pa.py_buffer(data[gather])]).to_pylist()


# ---------------------------------------------------------------------------------------------
# words and shingles


def _word_spans(offsets: np.ndarray, data: np.ndarray, ws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) byte offsets of the maximal non-whitespace runs, cut at documents."""
    n = len(data)
    boundary = np.zeros(n + 1, dtype=bool)
    boundary[offsets] = True
    prev_break = np.empty(n, dtype=bool)
    prev_break[0] = True
    prev_break[1:] = ws[:-1]
    prev_break |= boundary[:n]
    next_break = np.empty(n, dtype=bool)
    next_break[-1] = True
    next_break[:-1] = ws[1:]
    next_break |= boundary[1:]
    is_word = ~ws
    return np.flatnonzero(is_word & prev_break), np.flatnonzero(is_word & next_break) + 1


def word_hashes(texts: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hash of every whitespace-separated word of a batch of already normalised
    texts (``normalize_text``).

    Returns ``(hashes uint64[num_words], doc_offsets int64[num_docs + 1])``: the words of
    document i are ``hashes[doc_offsets[i]:doc_offsets[i + 1]]``, in text order.
    """
    offsets, data = _string_buffers(texts)
    if len(data) == 0:
        return np.zeros(0, np.uint64), np.zeros(len(offsets), np.int64)
    hashes, doc_offsets, _, _, _ = _k.scan_words(data, offsets, _WS_BYTES, False)
    return hashes, doc_offsets


def normalized_word_hashes(texts: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """``word_hashes(normalize_text(texts))`` straight from raw text, much faster.

    Words are cut on the raw bytes (every character ``str.split`` treats as whitespace,
    multi-byte ones included: NFKC maps whitespace to whitespace). ASCII words are lowered
    byte-wise and hashed where they lie. Only the distinct non-ASCII words of the batch are
    decoded and normalised in Python (NFKC + casefold of a word equals that of the text,
    since whitespace never composes with a neighbour), then hashed the same way; a word
    whose normal form contains whitespace (U+00A8 "¨" -> " ̈") becomes several words.
    """
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks() if texts.num_chunks != 1 else texts.chunk(0)
    if pa.types.is_large_string(texts.type):
        texts = texts.cast(pa.string())
    offsets, data = _string_buffers(pc.fill_null(texts, ""))
    if len(data) == 0:
        return np.zeros(0, np.uint64), np.zeros(len(offsets), np.int64)
    # one compiled scan: whitespace, words cut at documents, ASCII letters lowered and hashed
    # (word_of, w_start, w_end: the words holding a non-ASCII non-space byte, in order)
    hashes, doc_offsets, word_of, w_start, w_end = _k.scan_words(data, offsets, _WS_BYTES, True)
    if len(word_of) == 0:
        return hashes, doc_offsets
    raw = _k.span_hashes(data, w_start, w_end)
    uniq, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    words = _spans_as_strings(data, w_start[first], w_end[first])
    # normalised together (``_normalize_words``), not with a Python call per distinct word
    normal = pa.array(_normalize_words(words, collapse=False), pa.string())
    n_hash, n_off = word_hashes(normal)
    k = np.diff(n_off)[inverse]
    if (k == 1).all():  # the usual case: one normalised word per raw word
        hashes[word_of] = n_hash[n_off[inverse]]
        return hashes, doc_offsets
    # splice: every word has 1 hash, except the non-ASCII ones, which have k >= 0
    counts = np.ones(len(hashes), dtype=np.int64)
    counts[word_of] = k
    pos = np.cumsum(counts) - counts
    out = np.empty(int(counts.sum()), dtype=np.uint64)
    ascii_words = np.ones(len(hashes), dtype=bool)
    ascii_words[word_of] = False
    out[pos[ascii_words]] = hashes[ascii_words]
    w_rep = np.repeat(np.arange(len(word_of)), k)
    t = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
    out[pos[word_of][w_rep] + t] = n_hash[n_off[inverse][w_rep] + t]
    return out, np.r_[0, np.cumsum(counts)][doc_offsets].astype(np.int64)


def shingle_hashes(words: np.ndarray, doc_offsets: np.ndarray, ngram: int) -> tuple[np.ndarray, np.ndarray]:
    """64-bit hash of every word n-gram; n-grams never cross documents.

    A document with fewer than ``ngram`` (but at least one) words is a single shingle of all
    its words. Returns ``(hashes uint64[num_shingles], shingle_offsets int64[num_docs + 1])``.
    """
    # the n-gram length is part of the hash: a 3-word document is not a "3-gram" of a 5-gram corpus
    return _k.shingle_hashes(np.ascontiguousarray(words, dtype=np.uint64),
                             np.ascontiguousarray(doc_offsets, dtype=np.int64), int(ngram),
                             _U64((ngram * GOLDEN) & _MASK64), _NGRAM_BASE)


def _words_of(texts: pa.Array | pa.ChunkedArray | list[str], normalized: bool) -> tuple[np.ndarray, np.ndarray]:
    arr = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(texts, pa.string())
    if not normalized:
        return normalized_word_hashes(arr)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return word_hashes(pc.fill_null(arr, ""))


# ---------------------------------------------------------------------------------------------
# signatures


Family = Literal["affine32", "multiply_shift64"]


@dataclass(frozen=True)
class MinHasher:
    """Computes MinHash signatures of word n-gram shingles for whole batches of texts.

    ``num_perm`` hash functions drawn from ``seed``; ``family`` picks the hash family
    (module docstring). Signatures are ``uint32[num_docs, num_perm]``; a document without
    any word gets all ``0xFFFFFFFF`` and ``num_shingles == 0``.
    """

    num_perm: int = 128
    ngram: int = 5
    seed: int = 1
    family: Family = "affine32"
    block_shingles: int = 16384  # unused since the compiled minima (kept: callers pass it)

    def __post_init__(self) -> None:
        if self.num_perm < 1 or self.ngram < 1:
            raise ValueError("num_perm and ngram must be >= 1")
        if self.family not in ("affine32", "multiply_shift64"):
            raise ValueError(f"unknown hash family {self.family!r}")

    def header(self) -> dict[str, Any]:
        """What a signature depends on: recorded with every persisted signature."""
        return {"algorithm": "minhash-word-ngrams", "version": MINHASH_VERSION, "seed": self.seed,
                "params": {"num_perm": self.num_perm, "ngram": self.ngram, "family": self.family,
                           "normalization": NORMALIZATION}}

    def permutations(self) -> tuple[np.ndarray, np.ndarray]:
        """(a, b) uint64 arrays of the ``num_perm`` hash functions (a odd)."""
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([self.seed, 0x6D696E68])))
        a = rng.integers(0, 1 << 63, self.num_perm, dtype=np.uint64) * _U64(2) + _U64(1)
        b = rng.integers(0, _MASK64, self.num_perm, dtype=np.uint64, endpoint=True)
        return a, b

    def shingles(self, texts: pa.Array | list[str], normalized: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(32-bit shingle values as uint64, shingle offsets per document) of a batch."""
        sh, sh_off = shingle_hashes(*_words_of(texts, normalized), self.ngram)
        return sh >> _U64(32), sh_off

    def signatures(self, texts: pa.Array | list[str], normalized: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """``(signatures uint32[num_docs, num_perm], num_shingles int64[num_docs])``."""
        sh, off = shingle_hashes(*_words_of(texts, normalized), self.ngram)
        return self._minima(sh, off, 32), np.diff(off)

    def signatures_from_shingles(self, x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """Per-document minima of every hash function over 32-bit shingle values ``x``."""
        return self._minima(x, offsets, 0)

    def _minima(self, x: np.ndarray, offsets: np.ndarray, shift: int) -> np.ndarray:
        """Compiled: per document, every permutation's minimum over ``x >> shift``."""
        a, b = self.permutations()
        x = np.ascontiguousarray(x, dtype=np.uint64)
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        if self.family == "affine32":
            return _k.minhash_affine32(x, offsets, a.astype(np.uint32), b.astype(np.uint32), _U64(shift))
        return _k.minhash_multiply_shift64(x, offsets, a, b, _U64(shift))


def estimate_jaccard(sig_a: np.ndarray, sig_b: np.ndarray) -> np.ndarray:
    """Share of equal signature positions (row-wise for 2-D arrays)."""
    return np.mean(sig_a == sig_b, axis=-1)


def shingle_sets(texts: pa.Array | list[str], ngram: int) -> list[np.ndarray]:
    """Sorted unique 64-bit shingle hashes per document (for exact Jaccard checks)."""
    sh, off = shingle_hashes(*_words_of(texts, False), ngram)
    return [np.unique(sh[off[i]:off[i + 1]]) for i in range(len(off) - 1)]


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard similarity of two sorted unique uint64 arrays."""
    if len(a) == 0 and len(b) == 0:
        return 1.0
    inter = len(np.intersect1d(a, b, assume_unique=True))
    return inter / (len(a) + len(b) - inter)


# ---------------------------------------------------------------------------------------------
# LSH


def _band_error_integrals(threshold: float, num_perm: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """False-positive and false-negative areas of every (b, r) with b * r <= num_perm.

    The integrands are polynomials of degree b * r <= num_perm, so Gauss-Legendre with
    num_perm / 2 + 1 nodes integrates them exactly (datasketch uses scipy's quad).
    """
    nodes, weights = np.polynomial.legendre.leggauss(num_perm // 2 + 2)
    bs, rs = [], []
    for b in range(1, num_perm + 1):
        for r in range(1, num_perm // b + 1):
            bs.append(b)
            rs.append(r)
    b_ = np.array(bs, dtype=np.float64)[:, None]
    r_ = np.array(rs, dtype=np.float64)[:, None]

    def integrate(f, lo, hi):
        s = (hi - lo) / 2 * nodes + (hi + lo) / 2
        return (hi - lo) / 2 * (f(s[None, :]) @ weights)

    fp = integrate(lambda s: 1 - (1 - s ** r_) ** b_, 0.0, threshold)
    fn = integrate(lambda s: (1 - s ** r_) ** b_, threshold, 1.0)
    return np.array(bs), np.array(rs), fp, fn


def lsh_params(threshold: float, num_perm: int, weights: tuple[float, float] = (0.5, 0.5)) -> tuple[int, int]:
    """(bands, rows) minimising ``w_fp * FP area + w_fn * FN area`` (datasketch's
    ``_optimal_param``: same search order, first minimum wins)."""
    if not 0.0 < threshold < 1.0:
        raise ValueError("threshold must be in (0, 1)")
    bs, rs, fp, fn = _band_error_integrals(threshold, num_perm)
    err = weights[0] * fp + weights[1] * fn
    # datasketch keeps the first (b, r) whose error is strictly smaller; quadrature noise at
    # 1e-12 must not reorder ties, so compare with a tolerance in the same scan order
    best = 0
    for i in range(1, len(err)):
        if err[i] < err[best] - 1e-12:
            best = i
    return int(bs[best]), int(rs[best])


def band_hashes(sig: np.ndarray, bands: int, rows: int, seed: int = 0) -> np.ndarray:
    """uint64[num_docs, bands]: one hash per band of ``rows`` signature values. The band index
    is mixed in, so equal values in different bands never share a bucket."""
    if bands * rows > sig.shape[1]:
        raise ValueError(f"bands * rows = {bands * rows} > num_perm = {sig.shape[1]}")
    x = sig[:, : bands * rows].reshape(sig.shape[0], bands, rows).astype(np.uint64)
    h = fmix64((np.arange(bands, dtype=np.uint64) + _U64(1)) * _GOLDEN ^ _U64(seed & _MASK64))
    h = np.broadcast_to(h, (sig.shape[0], bands)).copy()
    for j in range(rows):
        h = fmix64(h * _NGRAM_BASE + x[:, :, j])
    return h
