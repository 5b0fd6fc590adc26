"""Compiled loops of the MinHash text path (``curation.dedup.minhash``), bit-exact with the
array passes they replace (``tests/test_minhash.py`` pins the signatures' bytes).

- ``scan_words``: one pass over a batch's UTF-8 bytes bounds the output, a second cuts the
  words at whitespace (``str.split``'s characters, multi-byte ones included) and document
  ends and hashes each as its bytes are read (ASCII letters lowered when asked); numpy took
  ~20 passes over the bytes and as many temporary arrays.
- ``span_hashes``: the same word hash over given byte spans.
- ``shingle_hashes``: the n-gram polynomial and its final mix, per document.
- ``minhash_affine32`` / ``minhash_multiply_shift64``: each document's minimum of every hash
  function, the permutations in the inner loop (SIMD lanes), no block buffer written and read
  back per block.

The word hash: the span's first 8 bytes (little-endian, zero-padded) plus, for each further
8-byte chunk c (1, 2, ...), ``fmix64(chunk ^ (c + 1) * CHUNK_SALT)``, all summed mod 2^64;
then ``x = sum + length * LEN_SALT`` and a half mixer ``x ^= x >> 32; x *= MIX1; x ^= x >> 29``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from curation.hashing import MIX1, MIX2
from curation.text.counts import space_after

_CHUNK_SALT = np.uint64(0xD6E8FEB86659FD93)
_LEN_SALT = np.uint64(0xA0761D6478BD642F)
_M1 = np.uint64(MIX1)
_M2 = np.uint64(MIX2)

@njit(cache=True, nogil=True)
def _fmix64(x):
    x ^= x >> np.uint64(30)
    x *= _M1
    x ^= x >> np.uint64(27)
    x *= _M2
    x ^= x >> np.uint64(31)
    return x


@njit(cache=True, nogil=True)
def _byte(data, i, lower):
    b = data[i]
    if lower and b >= 65 and b <= 90:
        b += 32
    return np.uint64(b)


@njit(cache=True, nogil=True)
def _hash_span(data, s, e, lower):
    length = e - s
    summed = np.uint64(0)
    k = min(length, 8)
    for j in range(k):
        summed |= _byte(data, s + j, lower) << np.uint64(8 * j)
    c = 1
    p = s + 8
    while p < e:
        chunk = np.uint64(0)
        k = min(e - p, 8)
        for j in range(k):
            chunk |= _byte(data, p + j, lower) << np.uint64(8 * j)
        summed += _fmix64(chunk ^ (np.uint64(c + 1) * _CHUNK_SALT))
        c += 1
        p += 8
    x = summed + np.uint64(length) * _LEN_SALT
    x ^= x >> np.uint64(32)
    x *= _M1
    x ^= x >> np.uint64(29)
    return x


@njit(cache=True, nogil=True)
def _ws_width(data, i, n, ws_table):
    """Width in bytes of the whitespace character at ``data[i]``, 0 when it is none
    (``str.split``'s characters; the multi-byte ones: U+0085, U+00A0, U+1680, U+2000-U+200A,
    U+2028, U+2029, U+202F, U+205F, U+3000)."""
    b0 = data[i]
    if b0 < 128:
        return 1 if ws_table[b0] else 0
    if b0 < 0xC2:
        return 0
    b1 = data[min(i + 1, n - 1)]
    b2 = data[min(i + 2, n - 1)]
    if b0 == 0xC2 and (b1 == 0x85 or b1 == 0xA0):
        return 2
    if ((b0 == 0xE1 and b1 == 0x9A and b2 == 0x80)
            or (b0 == 0xE2 and b1 == 0x80 and (b2 <= 0x8A or b2 == 0xA8 or b2 == 0xA9 or b2 == 0xAF))
            or (b0 == 0xE2 and b1 == 0x81 and b2 == 0x9F)
            or (b0 == 0xE3 and b1 == 0x80 and b2 == 0x80)):
        return 3
    return 0


@njit(cache=True, nogil=True)
def _word_hash(summed, chunk, c, length):
    """The word hash from its running state: the sum over full chunks, the open chunk and
    its index, the word's length in bytes."""
    if c == 0:
        summed = chunk
    elif chunk or length > 8 * c:  # the open chunk holds bytes
        summed += _fmix64(chunk ^ (np.uint64(c + 1) * _CHUNK_SALT))
    x = summed + np.uint64(length) * _LEN_SALT
    x ^= x >> np.uint64(32)
    x *= _M1
    x ^= x >> np.uint64(29)
    return x


@njit(cache=True, nogil=True)
def scan_words(data, offsets, ws_table, lower):
    """One pass over a batch's UTF-8 bytes: the maximal non-whitespace runs, cut at document
    offsets, hashed as they are read (ASCII letters lowered when ``lower``).

    Returns ``(hashes, doc_offsets, high_words, high_starts, high_ends)``: ``doc_offsets[d]``
    is the index of document d's first word; the ``high_*`` arrays list the words holding a
    byte >= 0x80 (index, byte span), in order.
    """
    n = len(data)
    num_docs = len(offsets) - 1
    # upper bounds, so that the scan never grows an array (a reassigned array costs the loop
    # its hoisted pointers): every word but a document's first follows a whitespace
    # character, one ASCII byte or a multi-byte one led by C2, E1, E2 or E3; a word holding
    # a byte >= 0x80 holds the start of a run of them, or follows a multi-byte space
    seps = 0
    runs = 0
    prev_high = False
    for i in range(n):
        b = data[i]
        high = b >= 128
        if high:
            if not prev_high:
                runs += 1
            if b == 0xC2 or b == 0xE1 or b == 0xE2 or b == 0xE3:
                seps += 1
                runs += 1
        elif ws_table[b]:
            seps += 1
        prev_high = high
    words_max = seps
    leads = runs + num_docs  # a run may span documents: one word on each side
    hashes = np.empty(words_max + num_docs, dtype=np.uint64)
    doc_offsets = np.empty(num_docs + 1, dtype=np.int64)
    hw = np.empty(leads + 1, dtype=np.int64)
    hs = np.empty(leads + 1, dtype=np.int64)
    he = np.empty(leads + 1, dtype=np.int64)
    k = 0
    nh = 0
    for d in range(num_docs):
        doc_offsets[d] = k
        end = offsets[d + 1]
        # words ending inside the document are hashed at the whitespace after them, the
        # document's last word after the loop (the same code: the loop runs one step past)
        inword = False
        hi = False
        s = 0
        summed = np.uint64(0)
        chunk = np.uint64(0)
        c = 0  # index of the open chunk
        sh = 0  # bit position inside it
        skip = 0  # continuation bytes of a multi-byte whitespace character still to pass
        for i in range(offsets[d], end):
            if skip:
                skip -= 1
                continue
            b = data[i]
            if b < 128:
                ws = ws_table[b]
            elif b >= 0xC2:
                skip = _ws_width(data, i, n, ws_table)
                ws = skip > 0
                if ws:
                    skip -= 1
            else:
                ws = False
            if ws:
                if inword:
                    inword = False
                    hashes[k] = _word_hash(summed, chunk, c, i - s)
                    if hi:
                        hw[nh] = k
                        hs[nh] = s
                        he[nh] = i
                        nh += 1
                    k += 1
                continue
            if not inword:
                inword = True
                hi = False
                s = i
                summed = np.uint64(0)
                chunk = np.uint64(0)
                c = 0
                sh = 0
            if b >= 128:
                hi = True
            elif lower and b >= 65 and b <= 90:
                b += np.uint8(32)
            chunk |= np.uint64(b) << np.uint64(sh)
            sh += 8
            if sh == 64:
                if c == 0:
                    summed = chunk
                else:
                    summed += _fmix64(chunk ^ (np.uint64(c + 1) * _CHUNK_SALT))
                c += 1
                chunk = np.uint64(0)
                sh = 0
        if inword:
            hashes[k] = _word_hash(summed, chunk, c, end - s)
            if hi:
                hw[nh] = k
                hs[nh] = s
                he[nh] = end
                nh += 1
            k += 1
    doc_offsets[num_docs] = k
    return hashes[:k], doc_offsets, hw[:nh], hs[:nh], he[:nh]


@njit(cache=True, nogil=True)
def shingle_hashes(words, doc_offsets, ngram, salt, base):
    """Per document, ``g = sum_j words[i + j] * base^(n - 1 - j)`` (uint64 wraparound) of
    every n-gram start i (one shingle of all its words when it has fewer than n), then
    ``fmix64(g ^ salt)``. Returns ``(hashes, shingle_offsets)``."""
    num_docs = len(doc_offsets) - 1
    sh_off = np.empty(num_docs + 1, dtype=np.int64)
    sh_off[0] = 0
    for d in range(num_docs):
        c = doc_offsets[d + 1] - doc_offsets[d]
        sh_off[d + 1] = sh_off[d] + (c - ngram + 1 if c >= ngram else min(c, 1))
    out = np.empty(sh_off[num_docs], dtype=np.uint64)
    for d in range(num_docs):
        w0 = doc_offsets[d]
        c = doc_offsets[d + 1] - w0
        if c == 0:
            continue
        width = min(c, ngram)
        o = sh_off[d]
        for t in range(sh_off[d + 1] - o):
            g = words[w0 + t]
            for j in range(1, width):
                g = g * base + words[w0 + t + j]
            out[o + t] = _fmix64(g ^ salt)
    return out, sh_off


@njit(cache=True, nogil=True)
def span_hashes(data, starts, ends):
    """The word hash of each byte span ``data[starts[i]:ends[i]]`` (not lowered)."""
    out = np.empty(len(starts), dtype=np.uint64)
    for i in range(len(starts)):
        out[i] = _hash_span(data, starts[i], ends[i], False)
    return out


@njit(cache=True, nogil=True)
def minhash_affine32(x, offsets, a, b, shift):
    """``sig[d, k] = min over document d's shingles of (a[k] * (x >> shift) + b[k]) mod 2^32``."""
    num_docs = len(offsets) - 1
    k = len(a)
    sig = np.empty((num_docs, k), dtype=np.uint32)
    row = np.empty(k, dtype=np.uint32)
    for d in range(num_docs):
        row[:] = np.uint32(0xFFFFFFFF)
        for i in range(offsets[d], offsets[d + 1]):
            xi = np.uint32(x[i] >> shift)
            for j in range(k):
                v = np.uint32(a[j] * xi + b[j])
                if v < row[j]:
                    row[j] = v
        sig[d] = row
    return sig


@njit(cache=True, nogil=True)
def minhash_multiply_shift64(x, offsets, a, b, shift):
    """``sig[d, k] = min over document d's shingles of ((a[k] * (x >> shift) + b[k]) mod 2^64) >> 32``."""
    num_docs = len(offsets) - 1
    k = len(a)
    sig = np.empty((num_docs, k), dtype=np.uint32)
    row = np.empty(k, dtype=np.uint64)
    for d in range(num_docs):
        row[:] = np.uint64(0xFFFFFFFFFFFFFFFF)
        for i in range(offsets[d], offsets[d + 1]):
            xi = x[i] >> shift
            for j in range(k):
                v = a[j] * xi + b[j]
                if v < row[j]:
                    row[j] = v
        for j in range(k):
            sig[d, j] = np.uint32(row[j] >> np.uint64(32))
    return sig


@njit(cache=True, nogil=True)
def spans_equal(data, starts, ends, rep_starts, rep_ends):
    """Whether every span ``data[starts[i]:ends[i]]`` holds the bytes of its representative
    ``data[rep_starts[i]:rep_ends[i]]`` (a check that words grouped by hash are one word)."""
    for i in range(len(starts)):
        s, e, r = starts[i], ends[i], rep_starts[i]
        if e - s != rep_ends[i] - r:
            return False
        for j in range(e - s):
            if data[s + j] != data[r + j]:
                return False
    return True


@njit(cache=True, nogil=True)
def _lowered(x):
    """Byte ``x`` with A-Z lowered, without a branch (``_byte`` is the hashing path's)."""
    return x | (np.uint8(32) * (np.uint8(x - np.uint8(65)) < np.uint8(26)))


@njit(cache=True, nogil=True)
def lowered_words(data, offsets, table):
    """Each document's words (the maximal non-whitespace runs, ``str.split``'s characters;
    ``table`` per byte: 0 no whitespace, 1 an ASCII whitespace byte, 2 a byte that may lead
    a multi-byte whitespace character, ``minhash._WS_LEADS``) joined by one space, ASCII
    letters lowered, written as they are cut: one pass over the bytes. The words holding a
    byte >= 0x80 are written the same way and listed for ``splice_words`` to replace.

    Returns (output offsets, output bytes, and per such word: its document, its bytes in
    ``data``, its bytes in the output). The output is never longer than the input (a space
    stands for at least one whitespace byte). Cutting every word's span first and joining
    them in a second kernel wrote and read three arrays per word: the key text x1.12 on the
    long bench pages, x1.06 on the default ones (same bytes; A/B against the two kernels in
    one process). Most of what is left is the branch at each word's ends (a copy alone runs
    at ~0.1 ns a byte, this at ~6; a branch-free form measured slower)."""
    n = len(data)
    num_docs = len(offsets) - 1
    # a word holding a byte >= 0x80 holds one of its own; every word but a document's first
    # follows a byte the table marks
    highs = 0
    seps = 0
    for i in range(n):
        highs += data[i] >= 0x80
        seps += table[data[i]] != 0
    m = min(highs, seps + num_docs)
    hd = np.empty(m, np.int64)
    hs = np.empty(m, np.int64)
    he = np.empty(m, np.int64)
    hos = np.empty(m, np.int64)
    hoe = np.empty(m, np.int64)
    out = np.empty(n, np.uint8)
    out_off = np.empty(num_docs + 1, np.int64)
    p = 0
    k = 0
    for d in range(num_docs):
        out_off[d] = p
        hi = offsets[d + 1]
        i = offsets[d]
        first = True
        while i < hi:
            t = table[data[i]]
            if t == 1:
                i += 1
                continue
            if t == 2:
                w = space_after(data, i, hi)  # a character never crosses a document's end
                if w:
                    i += w
                    continue
            if not first:
                out[p] = 32
                p += 1
            first = False
            s = i
            ws = p
            x = data[i]
            acc = x
            out[p] = _lowered(x)
            p += 1
            i += 1
            while True:
                while i < hi and table[data[i]] == 0:
                    x = data[i]
                    acc |= x
                    out[p] = _lowered(x)
                    p += 1
                    i += 1
                if i >= hi or table[data[i]] == 1 or space_after(data, i, hi):
                    break
                x = data[i]  # a lead byte of no space: part of the word
                acc |= x
                out[p] = x
                p += 1
                i += 1
            if acc >= 128:
                hd[k] = d
                hs[k] = s
                he[k] = i
                hos[k] = ws
                hoe[k] = p
                k += 1
    out_off[num_docs] = p
    return out_off, out[:p], hd[:k], hs[:k], he[:k], hos[:k], hoe[:k]


@njit(cache=True, nogil=True)
def splice_words(out_off, out, hd, hos, hoe, repl, r_off, r_data):
    """``lowered_words``' output with its listed words (document ``hd``, output bytes
    ``hos:hoe``, in order) replaced by ``r_data[r_off[repl[j]]:r_off[repl[j] + 1]]``; an
    empty replacement removes the word and one space beside it, so that the words left
    are still joined by one space. Returns (int64 offsets, bytes)."""
    num_docs = len(out_off) - 1
    extra = 0
    for j in range(len(hd)):
        extra += r_off[repl[j] + 1] - r_off[repl[j]]
    res = np.empty(len(out) + extra, np.uint8)
    res_off = np.empty(num_docs + 1, np.int64)
    q = 0
    j = 0
    for d in range(num_docs):
        res_off[d] = q
        start = q
        src = out_off[d]
        end = out_off[d + 1]
        while j < len(hd) and hd[j] == d:
            ws, we = hos[j], hoe[j]
            res[q:q + ws - src] = out[src:ws]  # what lies before the word, its space included
            q += ws - src
            a, b = r_off[repl[j]], r_off[repl[j] + 1]
            if b > a:
                res[q:q + b - a] = r_data[a:b]
                q += b - a
            elif q > start:  # words before it: the space just copied goes with it
                q -= 1
            elif we < end and out[we] == 32:  # its document's first word so far: the space after
                we += 1
            src = we
            j += 1
        res[q:q + end - src] = out[src:end]
        q += end - src
    res_off[num_docs] = q
    return res_off, res[:q]