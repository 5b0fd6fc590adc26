"""``TextState``: one batch's text and what has been measured on it, passed between stages.

A fused chain of filters (repetition -> quality -> C4 -> FineWeb) looks at the same documents
one after the other. Splitting words is the expensive part, so the split made by one stage
is handed to the next explicitly, instead of through hidden per-process memos:

- a ``TextState`` is built from one text array (``TextState(texts)`` or
  ``TextState.of(batch)``) and computes words, lines and paragraphs lazily, each at most
  once (``words``, ``word_counts()``, ``lines``, ``newlines()``, ``paragraphs``, ...);
- ``take(indices)`` is the state of a subset of rows (what the executor passes to the next
  stage: the rows a filter kept): words already split, with every per-word measurement
  already made, move along (spans are shifted when first read, nothing is split again;
  ``words_source`` reads per-document tallies where the words lie); known word counts too;
- a stage that rewrites the text (C4 removes lines) returns a new state for its new text,
  seeded with the per-document word counts it already knows (``TextState(new, word_counts=...)``);
  a count of ``-1`` means unknown (only those documents are split when counts are asked for).

A state belongs to exactly one text array: stages check that a state they are given has the
batch's row count and byte count (``check``), and ``take`` must get the same indices the
table got.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.text import segments
from curation.text import words as text_words
from curation.text.arrow import text_array, text_bytes, text_column, to_numpy


class TextState:
    """Text of one batch plus its splits, each computed on first use (see module docstring)."""

    def __init__(self, texts: pa.Array | pa.ChunkedArray, word_counts: np.ndarray | None = None,
                 markup: str = "text"):
        self.texts: pa.Array = text_array(texts)
        if markup not in ("text", "markdown"):
            raise ValueError(f"TextState: markup {markup!r}: 'text' or 'markdown'")
        #: what ``texts`` are written in (``extract``'s ``format``): ``plain`` strips Markdown
        self.markup = markup
        self._words: text_words.Words | None = None
        #: (words, docs): this state's words are ``words``' of texts ``docs``, moved over on
        #: first use (``take``: a stage that reads per-document tallies only never moves them)
        self._lazy: tuple[text_words.Words, np.ndarray] | None = None
        self._counts: np.ndarray | None = None
        if word_counts is not None:
            counts = np.asarray(word_counts).astype(np.int64)
            if counts.shape != (len(self.texts),):
                raise ValueError(f"word_counts: {counts.shape[0]} counts for {len(self.texts)} texts")
            self._counts = counts
        self._cache: dict = {}

    @classmethod
    def of(cls, batch: pa.Table, column: str = "text") -> TextState:
        """The state of a table's text column (Markdown where its field's metadata says so)."""
        from curation.text.markup import markup_of

        return cls(text_column(batch, column), markup=markup_of(batch.schema.field(column)))

    def __len__(self) -> int:
        return len(self.texts)

    def __repr__(self) -> str:
        done = [k if isinstance(k, str) else k[0] for k in self._cache] + (["words"] if self.has_words else [])
        return f"TextState({len(self)} texts, computed: {', '.join(done) or 'nothing'})"

    def check(self, batch: pa.Table, column: str = "text") -> TextState:
        """Raise unless this state can be the state of ``batch``'s text (same number of rows and
        of bytes: a cheap guard against passing a state along with the wrong rows)."""
        if len(self) != batch.num_rows:
            raise ValueError(f"text state of {len(self)} rows given with a batch of {batch.num_rows}")
        col = batch.column(column)
        got = pc.sum(pc.binary_length(col)).as_py() or 0
        mine = pc.sum(pc.binary_length(self.texts)).as_py() or 0
        if got != mine:
            raise ValueError(f"text state holds {mine} bytes of text, the batch {got}: not its text")
        return self

    @property
    def plain(self) -> pa.Array:
        """The texts without their markup, for measuring (``markup.plain_view``; line for
        line, so line signals count the same lines); the texts themselves when they are plain."""
        if self.markup == "text":
            return self.texts
        from curation.text.markup import plain_view

        return self._cached("plain", lambda: plain_view(self.texts))

    @property
    def measured(self) -> pa.Array:
        """What the measurements read: ``plain`` (words, newlines, paragraphs, stripped texts,
        character lengths are the plain view's, so a Markdown page is judged as its text).
        ``lines`` and ``byte_lengths`` stay the texts': C4 cuts the texts' own lines by them."""
        return self.plain

    # -- words ---------------------------------------------------------------------------

    @property
    def words(self) -> text_words.Words:
        """spaCy-style English words of every text (``words.split_words``), split once."""
        if self._words is None:
            if self._lazy is not None:
                source, docs = self._lazy
                b, doff, buf, base = text_bytes(self.measured)
                self._words = source.take_docs(docs, b, doff, buf, base)
                self._lazy = None
            else:
                self._words = text_words.split_words(self.measured)
        return self._words

    @property
    def has_words(self) -> bool:
        """Whether the words are already split (reading them then costs no split)."""
        return self._words is not None or self._lazy is not None

    def words_source(self, min_share: float = 0.5) -> tuple[text_words.Words, np.ndarray | None]:
        """The words to read per-document tallies from: ``(words, docs)``, text ``i``'s words
        being those of ``words``' text ``docs[i]``, or ``(self.words, None)``.

        Words taken over from an earlier state (``take``) are read where they lie when these
        texts are at least ``min_share`` of that state's (a tally over a few dropped texts
        costs less than moving every kept word's span and measurements: Gopher quality after
        Gopher repetition); fewer, and they are moved (``words``)."""
        if self._words is None and self._lazy is not None:
            source, docs = self._lazy
            if len(docs) >= min_share * (len(source.offsets) - 1):
                return source, docs
        return self.words, None

    def known_word_counts(self) -> np.ndarray:
        """Words per text where known without splitting, ``-1`` elsewhere."""
        if self._words is not None:
            return self._words.counts
        if self._lazy is not None:
            source, docs = self._lazy
            return source.counts[docs]
        if self._counts is not None:
            return self._counts
        return np.full(len(self), -1, np.int64)

    def word_counts(self) -> np.ndarray:
        """``split_words(texts).counts``, splitting only the texts whose count is not known."""
        if self._words is not None or self._lazy is not None:
            return self.known_word_counts()
        if self._counts is None:
            return self.words.counts
        unknown = np.flatnonzero(self._counts < 0)
        if len(unknown):
            if len(unknown) == len(self):
                return self.words.counts
            counts = self._counts.copy()
            counts[unknown] = text_words.split_words(self.measured.take(pa.array(unknown))).counts
            self._counts = counts
        return self._counts

    # -- lines and paragraphs ------------------------------------------------------------

    def _cached(self, key, make):
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    @property
    def lines(self) -> segments.Segments:
        """``str.splitlines()`` of every text (``words.split_lines``)."""
        return self._cached("lines", lambda: segments.split_lines(self.texts))

    def newlines(self, min_run: int = 1, runs: bool = True) -> segments.Segments:
        """``re.split("\\n+")`` / ``text.split("\\n")`` of every text (``words.split_newlines``)."""
        return self._cached(("newlines", min_run, runs), lambda: segments.split_newlines(self.measured, min_run, runs))

    @property
    def stripped(self) -> pa.Array:
        """``str.strip()`` of every text."""
        return self._cached("stripped", lambda: segments.strip(self.measured))

    @property
    def paragraphs(self) -> segments.Segments:
        """Paragraphs: the stripped text split at runs of two or more newlines."""
        return self._cached("paragraphs", lambda: segments.split_newlines(self.stripped, min_run=2))

    @property
    def char_lengths(self) -> np.ndarray:
        """Code points per text (``len``)."""
        return self._cached("char_lengths", lambda: to_numpy(pc.utf8_length(self.measured)).astype(np.int64))

    @property
    def byte_lengths(self) -> np.ndarray:
        return self._cached("byte_lengths", lambda: to_numpy(pc.binary_length(self.texts)).astype(np.int64))

    # -- subsets and new texts -----------------------------------------------------------

    def take(self, indices, texts: pa.Array | pa.ChunkedArray | None = None) -> TextState:
        """The state of these rows (in this order, repeats allowed): the words already split
        move along with their measurements, and so do known word counts; lines and the rest
        are recomputed on demand (they are cheap).

        ``texts``: those rows' text when the caller holds it already (the kept table's text
        column after a filter), so that it is not copied a second time; it must be
        ``self.texts.take(indices)`` (nulls may stand for ``""``), which is checked by length
        and bytes."""
        idx = np.asarray(indices.to_numpy(zero_copy_only=False) if isinstance(indices, (pa.Array, pa.ChunkedArray))
                         else indices, dtype=np.int64).reshape(-1)
        if texts is None:
            texts = self.texts.take(pa.array(idx, pa.int64()))
        else:
            texts = text_array(texts)
            # the cheap guard of ``check``: as many rows, and their lengths sum to the same bytes
            want = int(self.byte_lengths[idx].sum())
            got = pc.sum(pc.binary_length(texts)).as_py() or 0
            if len(texts) != len(idx) or got != want:
                raise ValueError(f"take: {len(texts)} texts of {got} bytes given for {len(idx)} rows of {want}")
        out = TextState(texts, markup=self.markup)
        if "plain" in self._cache:  # the plain view, like the words, is not remade
            out._cache["plain"] = self._cache["plain"].take(pa.array(idx, pa.int64()))
        if self._words is not None:  # moved on first use (``words``), from the words as split
            out._lazy = (self._words, idx)
        elif self._lazy is not None:
            source, docs = self._lazy
            out._lazy = (source, docs[idx])
        elif self._counts is not None:
            out._counts = self._counts[idx]
        return out


def rewritten_state(old: pa.Array, new: pa.Array, text: TextState | None, field: pa.Field) -> TextState:
    """The state of ``new``, a rewrite of the texts ``old`` (``pii``, ``normalize``): known word
    counts carried over where the text is unchanged, the markup (Markdown or text) the state or
    the text ``field`` says."""
    from curation.text.markup import markup_of

    if text is None:
        return TextState(new, markup=markup_of(field))
    same = pc.fill_null(pc.equal(old, new), True).to_numpy(zero_copy_only=False)
    return TextState(new, word_counts=np.where(same, text.known_word_counts(), -1), markup=text.markup)
