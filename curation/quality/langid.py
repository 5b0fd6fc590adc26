"""Language detectors behind one interface (``detect(texts) -> (codes, scores)``), label
normalisation to ISO 639-1, and the text sampling that bounds detection time. The ``langid``
stage (``curation/stages/langid.py``) holds the parameters and rules and calls these.

- ``Cld2Detector``: Google's CLD2 through ``pycld2`` (model compiled into the wheel); the
  default, chosen on ``tests/benchmarks/bench_langid.py``. Its score is the share of the text
  CLD2 attributes to the language, halved when CLD2 calls the detection unreliable.
- ``FastTextLanguageDetector``: a fastText language-ID model (lid.176 or GlotLID format); the
  score is the model's probability. Labels are normalised (``normalize_lang``).
"""

from __future__ import annotations

import functools
import os
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.formats.lang_codes import ISO3_TO_1 as _ISO3_TO_1
from curation.io.files import cached_file_sha256


# GlotLID / NLLB label individual languages where ISO 639-1 names the macrolanguage. Applied
# only to labels with a script suffix (``arb_Arab``): in lid.176, ``als`` means Alemannic.
_INDIVIDUAL_TO_MACRO = {
    "arb": "ar", "cmn": "zh", "zsm": "ms", "pes": "fa", "ekk": "et", "lvs": "lv", "khk": "mn",
    "swh": "sw", "azj": "az", "uzn": "uz", "npi": "ne", "ory": "or", "pbt": "ps", "plt": "mg",
    "gaz": "om", "ydd": "yi", "als": "sq", "quy": "qu", "kmr": "ku", "gug": "gn", "ckb": "ckb",
}

# Withdrawn two-letter codes still emitted by CLD2 and older tools.
_LEGACY = {"iw": "he", "in": "id", "ji": "yi", "jw": "jv", "mo": "ro"}

# A letter in any script: digits, punctuation and symbols alone carry no language. Found
# with RE2 (``curation.stages.base.LETTER_RE2``): Python's ``[^\W\d_]`` on every character it knows.
# C0/C1 control characters: CLD2 rejects U+0080..U+009F (mojibake of windows-1252 quotes,
# common in crawled text) as "invalid UTF-8"; they carry no language either.
# (one pattern for Python's re and for RE2 through Arrow: both read two-digit \xHH)
_CONTROL_PATTERN = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]"
_CONTROL = re.compile(_CONTROL_PATTERN)


@functools.lru_cache(maxsize=4096)  # a few hundred labels, called once per document
def normalize_lang(label: str | None) -> str | None:
    """A language label from any detector as ISO 639-1 where one exists, else its own code.

    ``__label__en`` -> ``en``, ``__label__eng_Latn`` -> ``en``, ``arb_Arab`` -> ``ar``,
    ``zh-Hant`` -> ``zh``, ``iw`` -> ``he``, ``ceb`` -> ``ceb``."""
    if not label:
        return None
    code = label.removeprefix("__label__").strip().replace("-", "_")
    base, _, script = code.partition("_")
    base = base.lower()
    if not base:
        return None
    if len(base) == 3:
        if script and base in _INDIVIDUAL_TO_MACRO:
            return _INDIVIDUAL_TO_MACRO[base]
        return _ISO3_TO_1.get(base, base)
    return _LEGACY.get(base, base)


class Cld2Detector:
    """Google's Compact Language Detector 2 (``pycld2``): the default detector."""

    name = "cld2"

    def __init__(self) -> None:
        import pycld2

        self._cld2 = pycld2

    @staticmethod
    def version() -> str:
        from importlib.metadata import version

        return version("pycld2")

    def detect(self, texts: list[str] | pa.Array) -> tuple[list[str | None], np.ndarray]:
        """``texts``: Python strings, or an Arrow string array (``window_texts``): then the
        scan for control characters reads it as it is (building one from the strings again
        cost ~3.5 us a long bench page, 3% of the first look)."""
        detect, error = self._cld2.detect, self._cld2.error
        codes: list[str | None] = []
        if isinstance(texts, pa.Array):
            arr, texts = texts, texts.to_pylist()
        else:
            arr = pa.array(texts, pa.string())
        scores = np.zeros(len(texts), np.float32)
        # one scan of the batch finds the few texts with control characters to clean
        dirty = pc.match_substring_regex(arr, _CONTROL_PATTERN).to_pylist()
        for i, (t, has_control) in enumerate(zip(texts, dirty)):
            try:
                reliable, _, details = detect(_CONTROL.sub(" ", t) if has_control else t)
            except error:  # nothing left that CLD2 accepts
                codes.append(None)
                continue
            _name, code, percent, _ = details[0]
            if code in ("un", "xx") or code.startswith("xx-"):  # unknown / unsupported script
                codes.append(None)
                continue
            codes.append(normalize_lang(code))
            scores[i] = percent / 100.0 if reliable else percent / 200.0
        return codes, scores


class FastTextLanguageDetector:
    """A fastText language-ID model (lid.176.bin/.ftz, GlotLID ``model.bin``) from a file."""

    name = "fasttext"

    def __init__(self, path: str) -> None:
        from curation.quality.classifier import load_fasttext

        self.model = load_fasttext(path, field="langid.model")

    def detect(self, texts: list[str] | pa.Array) -> tuple[list[str | None], np.ndarray]:
        from curation.quality.classifier import predict_batch

        if isinstance(texts, pa.Array):
            texts = texts.to_pylist()
        if not texts:
            return [], np.zeros(0, np.float32)
        labels, probs = predict_batch(self.model, texts, k=1)
        codes = [normalize_lang(lab[0]) if len(lab) else None for lab in labels]
        # fastText's softmax can exceed 1 by rounding
        scores = np.clip(np.array([p[0] if len(p) else 0.0 for p in probs], np.float32), 0.0, 1.0)
        return codes, scores


def model_fingerprint(path: str) -> str:
    """sha256 of a model file, cached per file version: retraining changes the params hash,
    moving the file does not."""
    return cached_file_sha256(path)


def sample_texts(texts: pa.Array, rows: np.ndarray, chars: int, windows: int,
                 nchars: np.ndarray | None = None) -> list[str]:
    """``[sample_text(texts[i], chars, windows) for i in rows]``: ``window_texts`` as
    Python strings."""
    return window_texts(texts, rows, chars, windows, nchars).to_pylist()


def window_texts(texts: pa.Array, rows: np.ndarray, chars: int, windows: int,
                 nchars: np.ndarray | None = None) -> pa.Array:
    """``sample_text(texts[i], chars, windows)`` for i in ``rows``, an Arrow string array cut
    from the UTF-8 bytes: only the windows are copied. ``nchars``: every text's length in
    characters, when the caller has it (``TextState.char_lengths``).

    On the long bench pages (12,700 characters, mostly multilingual) converting whole texts
    to Python strings to slice them cost ~13 us a document and the slicing ~6; the compiled
    walk to the windows' bytes costs a few: the stage 3-6% faster (``bench_kernels_vs_commit``,
    CLD2 itself is the rest)."""
    from curation.quality.langid_kernels import window_bytes  # numba: loaded when first sampled
    from curation.text.arrow import text_array, text_bytes

    arr = text_array(texts)
    if nchars is None:
        nchars = pc.utf8_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    b, off, _, _ = text_bytes(arr)
    rows = np.asarray(rows, np.int64)
    if not len(rows):
        return pa.array([], pa.large_string())
    out_off, out = window_bytes(b, off, rows, np.asarray(nchars, np.int64), chars, windows)
    return pa.Array.from_buffers(pa.large_string(), len(rows), [None, pa.py_buffer(out_off), pa.py_buffer(out)])


def sample_text(text: str, chars: int, windows: int) -> str:
    """``text`` itself when it has at most ``chars`` characters, else ``windows`` evenly spaced
    windows of ``chars // windows`` characters from its start to its end, one per line.

    Detection time grows with the text (CLD2: ~0.2 ms for a 6 KB page, ~30 ms for a 1 MB
    one) and a few thousand characters decide the language. Windows over the whole text, not
    its head, keep ``lang_score`` an estimate of the share of the whole text: on long
    documents with a banner or a footer in another language (lingua's test sentences joined to
    12,000 characters, ``tests/benchmarks/bench_langid.py --long``), the head alone moved 52 of
    300 keep decisions at 0.65, six windows of 1,000 characters 7, and labels on one-language
    documents agreed with the whole text on 438 of 439."""
    n = len(text)
    if n <= chars:
        return text
    width = max(1, chars // windows)
    if windows == 1:
        return text[:width]
    step = (n - width) / (windows - 1)
    return "\n".join(text[int(i * step): int(i * step) + width] for i in range(windows))


_DETECTORS: dict[str | None, Any] = {}


def detector_for(model: str | None):
    """One detector per process and model (workers build it once, not per batch)."""
    key = model
    if model is not None:
        st = os.stat(model)
        key = f"{os.path.realpath(model)}:{st.st_mtime_ns}:{st.st_size}"
    if key not in _DETECTORS:
        _DETECTORS[key] = FastTextLanguageDetector(model) if model else Cld2Detector()
    return _DETECTORS[key]
