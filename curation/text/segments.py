"""Documents cut into parts (lines, paragraphs, whitespace chunks), flat: ``Segments`` holds
one Arrow string array of all parts plus the document of each part. ``split_lines`` /
``split_newlines`` cut from the bytes with Python's ``splitlines`` / ``re.split`` semantics;
``duplicate_stats`` counts parts that repeat an earlier part of their document."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.text.arrow import byte_spans, mask, text_bytes, to_numpy
from curation.text.chars import PY_WHITESPACE, re2_class

class PerDoc:
    """Items of a batch grouped by document: ``offsets[d]:offsets[d + 1]`` are text d's."""

    @property
    def n_docs(self) -> int:
        return len(self.offsets) - 1

    @property
    def counts(self) -> np.ndarray:
        return np.diff(self.offsets)


@dataclass
class Segments(PerDoc):
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
        return to_numpy(pc.utf8_length(self.values)).astype(np.int64)

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
    b, doff, buf, base = text_bytes(texts)
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
    seg = Segments.from_counts(byte_spans(buf, base, starts, ends, gaps=True), counts)
    seg.byte_len = ends - starts
    seg.byte_start = starts
    return seg


def strip(values: pa.Array) -> pa.Array:
    """``str.strip()`` (Python's whitespace definition)."""
    return pc.utf8_trim(values, characters=PY_WHITESPACE)


def ends_with_any(values: pa.Array, chars) -> np.ndarray:
    """Whether each string's last character is one of ``chars``.

    ASCII ``chars`` are read from each string's last byte (an ASCII byte is never inside a
    multi-byte character): the regex took C4 a tenth of its time."""
    if isinstance(values, pa.Array) and all(ord(c) < 0x80 for c in chars):
        b, doff, _, _ = text_bytes(values)
        table = np.zeros(256, dtype=bool)
        table[[ord(c) for c in chars]] = True
        out = np.zeros(len(values), dtype=bool)
        has = doff[1:] > doff[:-1]
        out[has] = table[b[doff[1:][has] - 1]]
        if values.null_count:
            out &= mask(pc.is_valid(values))
        return out
    return mask(pc.match_substring_regex(values, f"[{re2_class(chars)}]$"))


def replace_regex_in_some(values: pa.Array, needle: int, pattern: str, replacement: str) -> pa.Array:
    """``pc.replace_substring_regex(values, pattern, replacement)`` for a pattern that only
    matches where the ASCII byte ``needle`` is: the regex runs on the strings holding that
    byte (found by one vectorised pass over all bytes), the rest are left as they are.
    C4's citations ("[12]", "[edit]") are in a few lines per page; the regex over every
    line was a tenth of the stage."""
    if not isinstance(values, pa.Array) or len(values) == 0:
        return pc.replace_substring_regex(values, pattern, replacement)
    b, doff, _, _ = text_bytes(values)
    some = np.zeros(len(values), dtype=bool)
    some[np.searchsorted(doff, np.flatnonzero(b == needle), side="right") - 1] = True
    return replace_regex_where(values, some, ((pattern, replacement),))


def replace_regex_where(values: pa.Array, where: np.ndarray, rules: tuple[tuple[str, str], ...]) -> pa.Array:
    """``rules`` (``(pattern, replacement)``, applied in order) run on the strings ``where``
    marks, put back in place; the others are left as they are (for patterns that cannot match
    them: the caller found the bytes they need)."""
    n = int(np.count_nonzero(where))
    if n == 0:
        return values

    def apply(texts: pa.Array) -> pa.Array:
        for pattern, replacement in rules:
            texts = pc.replace_substring_regex(texts, pattern, replacement)
        return texts

    if n == len(values):
        return apply(values)
    keep = pa.array(where)
    return pc.replace_with_mask(values, keep, apply(values.filter(keep)))


def duplicate_stats(seg: Segments, lengths: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Per document: parts equal to an earlier part of the same document, and their chars.

    The first occurrence of a part is not a duplicate; every later occurrence is.
    """
    n = seg.n_docs
    if len(seg.values) == 0:
        return np.zeros(n, np.int64), np.zeros(n, np.int64)
    ids = to_numpy(pc.dictionary_encode(seg.values).indices).astype(np.int64)
    key = seg.doc * (int(ids.max()) + 1) + ids
    _, first = np.unique(key, return_index=True)
    dup = np.ones(len(key), dtype=bool)
    dup[first] = False
    if lengths is None:
        lengths = seg.lengths()
    dup_count = np.bincount(seg.doc[dup], minlength=n)
    dup_chars = np.bincount(seg.doc[dup], weights=lengths[dup], minlength=n).astype(np.int64)
    return dup_count, dup_chars


def split_chunks(texts: pa.Array) -> Segments:
    """``str.split()`` for every text: maximal runs of non-whitespace."""
    seg = Segments.from_lists(pc.utf8_split_whitespace(texts))
    nonempty = mask(pc.greater(pc.binary_length(seg.values), 0))
    return seg if nonempty.all() else seg.select(nonempty)
