"""Language identification: adds ``lang`` (ISO 639-1 where one exists) and ``lang_score``.

Two detectors, one interface (``detect(texts) -> (codes, scores)``):

- default: Google's CLD2 through ``pycld2`` (model compiled into the wheel, nothing to fetch).
  Chosen on ``tests/benchmarks/bench_langid.py``: 0.97 accuracy over 75 languages on documents
  of > 200 characters at ~23,000 docs/s on one core, against lingua 0.97 at ~250 docs/s,
  py3langid 0.94 at ~1,300, CLD3 0.89 at ~3,600 and fastText lid.176.ftz 0.84 at ~5,000.
  ``lang_score`` is the share of the text CLD2 attributes to the language, halved when CLD2
  itself calls the detection unreliable (a close second language, or too little text).
- ``model: PATH``: a fastText language-ID model (lid.176 or GlotLID format); ``lang_score`` is
  the model's probability, the quantity the published thresholds (0.65 in datatrove and DCLM)
  were set on. Labels are normalised: ``__label__en`` and ``__label__eng_Latn`` both give ``en``.

The detectors, the label normalisation and the text sampling are ``curation/quality/langid.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PrivateAttr, field_validator

from curation.quality.langid import Cld2Detector, detector_for, model_fingerprint, normalize_lang, window_texts
from curation.stages.base import LETTER_RE2, MapStage, Rule, registry
from curation.stages.paths import PathStr
from curation.text.arrow import text_array, text_column

if TYPE_CHECKING:  # pragma: no cover
    from curation.text.state import TextState


@registry.register("langid")
class LanguageId(MapStage):
    """Detect each document's language; keep the ``keep`` languages at ``lang_score >= min_score``.

    Adds ``lang`` (string, ISO 639-1 where one exists, null when nothing was detected) and
    ``lang_score`` (float32 in [0, 1]). Drops, in this order: ``langid:no_text`` (empty, or no
    letter at all: punctuation, digits, whitespace), ``langid:low_score`` (score below
    ``min_score``, also when no language was found), ``langid:lang=xx`` (a confident language
    outside ``keep``). ``keep`` omitted keeps every language; ``min_score: 0`` keeps every
    document that has text. ``keep`` accepts ISO 639-1 or 639-3 codes (``en``, ``eng``).

    ``min_score`` and ``keep`` are thresholds (``rules``): stored rows re-decide from ``lang``
    and ``lang_score`` without running the detector again.

    A text longer than ``sample_chars`` (6,000) is detected on ``sample_windows`` (6) evenly
    spaced windows of it (``sample_text``): on the scale WARC's pages this took CLD2 from
    0.23 to 0.13 s per 803 documents with no label or keep decision changed; ``sample_chars:
    null`` detects whole texts. A text longer than ``first_look_chars`` (1,500) is first read
    on narrower windows totalling that many characters, and only detected on the full windows
    when that first look scores under ``first_look_score`` (0.95): see ``_detect``.
    """

    type: Literal["langid"] = "langid"
    columns: ClassVar[tuple[str, ...]] = ('lang', 'lang_score')
    keep: list[str] | None = None
    min_score: float = Field(default=0.65, ge=0.0, le=1.0)
    model: PathStr | None = None
    #: a text longer than this is detected on ``sample_windows`` evenly spaced windows of
    #: it totalling this many characters (None: the whole text; see ``sample_text``)
    sample_chars: int | None = Field(default=6000, ge=100)
    sample_windows: int = Field(default=6, ge=1)
    #: a text longer than this is first detected on ``sample_windows`` windows totalling this
    #: many characters; a score of at least ``first_look_score`` there is the answer, anything
    #: less (two languages, an unreliable call) is detected again on ``sample_chars`` (None:
    #: no first look; see ``_detect``)
    first_look_chars: int | None = Field(default=1500, ge=100)
    first_look_score: float = Field(default=0.95, gt=0.0, le=1.0)

    _detector: Any = PrivateAttr(default=None)

    @field_validator("keep")
    @classmethod
    def _normalise_keep(cls, v: list[str] | None) -> list[str] | None:
        if v is None:
            return None
        out = [normalize_lang(x) for x in v]
        if not out or any(x is None for x in out):
            raise ValueError("keep: a non-empty list of language codes, e.g. [en] (or omit it to keep all)")
        return sorted(set(out))

    @field_validator("model")
    @classmethod
    def _model_loadable(cls, v: str | None) -> str | None:
        if v is None:
            return None
        from curation.quality.classifier import checked_model_path

        return checked_model_path(v)

    def params(self) -> dict[str, Any]:
        p = super().params()
        if self.model:
            p["model"] = {"sha256": model_fingerprint(self.model)}
        else:
            p["detector"] = {"name": Cld2Detector.name, "version": Cld2Detector.version()}
        return p

    def setup(self) -> None:
        self._detector = detector_for(self.model)

    #: ``lang_score`` and ``lang`` are stored, so the thresholds re-decide without detecting
    #: again; ``no_text`` looks for a letter in the (unchanged) text column.
    rules: ClassVar[tuple[Rule, ...]] = (
        Rule("no_text", "text", "no letter"),
        Rule("low_score", "lang_score", "< or null", "min_score"),  # null: no language found
        Rule("lang={value}", "lang", "not in", "keep"),
    )

    def measure(self, batch: pa.Table, text: TextState | None = None) -> tuple[pa.Table, TextState | None]:
        """Adds ``lang`` and ``lang_score``; the text (and its state) is unchanged."""
        if "text" not in batch.column_names:
            raise ValueError(f"langid: input has no 'text' column (columns: {batch.column_names})")
        if text is not None:
            text = self.text_state(batch, text)
        if self._detector is None:
            self.setup()
        # a Markdown page's language is its plain view's (no code fences or table pipes)
        col = text.plain if text is not None else text_column(batch)
        n = len(col)
        has_text = pc.fill_null(pc.match_substring_regex(col, LETTER_RE2), False).to_numpy(zero_copy_only=False)
        todo = np.flatnonzero(has_text)
        codes: list[str | None] = [None] * n
        scores = np.zeros(n, np.float32)
        if len(todo):
            got_codes, got_scores = self._detect(col, todo, text.char_lengths if text is not None else None)
            scores[todo] = got_scores
            for i, c in zip(todo.tolist(), got_codes):
                codes[i] = c
        table = batch.drop_columns([c for c in ("lang", "lang_score") if c in batch.column_names])
        table = table.append_column("lang", pa.array(codes, pa.string()))
        # no language found: null score, not 0 (a measurement that was not made)
        mask = np.array([c is None for c in codes], bool)
        table = table.append_column("lang_score", pa.array(scores, pa.float32(), mask=mask))
        return table, text

    def _detect(self, texts: pa.Array | list[str], rows: np.ndarray | None = None,
                nchars: np.ndarray | None = None) -> tuple[list[str | None], np.ndarray]:
        """Codes and scores of ``texts`` (of its ``rows``, all when None; ``nchars``: every
        text's length in characters, when known), each detected on at most ``sample_chars``
        characters (``window_texts``: only those are copied).

        A text longer than ``first_look_chars`` is first detected on windows totalling that
        many characters (the same evenly spaced windows, narrower): most web pages are one
        language, and CLD2's time grows with the characters it reads (~36 ns each here). A
        first look scoring ``first_look_score`` or more decides; the rest (mixed pages, close
        languages) are detected again on the full windows. On the scale WARCs' pages
        (``tests/benchmarks/bench_langid.py --pages``) a 1,500-char first look cut detection
        time 1.7x (default pages) and 1.9x (long pages) with no label and no keep decision
        changed (2,000 chars: 1.3x / 1.8x, one keep decision moved); lingua's mixed documents
        (``--long``) all went on to the full windows, with the same decisions as before."""
        texts = text_array(texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(texts, pa.string()))
        rows = np.arange(len(texts)) if rows is None else np.asarray(rows, np.int64)
        if self.sample_chars is None:
            return self._detector.detect(texts.take(pa.array(rows)).to_pylist())
        if nchars is None:
            nchars = pc.utf8_length(texts).to_numpy(zero_copy_only=False).astype(np.int64)
        codes: list[str | None] = [None] * len(rows)
        scores = np.zeros(len(rows), np.float32)
        rest = np.arange(len(rows))
        look = self.first_look_chars
        if look is not None and look < self.sample_chars:
            first = np.flatnonzero(nchars[rows] > look)
            if len(first):
                c1, s1 = self._detector.detect(window_texts(texts, rows[first], look, self.sample_windows, nchars))
                sure = np.zeros(len(rows), bool)
                for i, c, sc in zip(first.tolist(), c1, s1.tolist()):
                    if c is not None and sc >= self.first_look_score:
                        codes[i], scores[i] = c, sc
                        sure[i] = True
                rest = np.flatnonzero(~sure)
        if len(rest):
            c2, s2 = self._detector.detect(window_texts(texts, rows[rest], self.sample_chars, self.sample_windows,
                                                        nchars))
            for i, c in zip(rest.tolist(), c2):
                codes[i] = c
            scores[rest] = s2
        return codes, scores

    def decide(self, table: pa.Table) -> pa.Array | None:
        r = super().decide(table)
        return r if r is not None and r.null_count < len(r) else None
