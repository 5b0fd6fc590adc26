"""Per-language rules for the heuristic filters: shipped presets and words for CJK text.

The Gopher, C4 and FineWeb filters take ``by_lang:`` (language code -> fields overriding the
stage's own, thresholds and stop words alike) and ``lang_config:`` (a named preset of such
entries). This module holds what those need below the stage layer:

- ``preset(name)``: a preset as ``{lang: {stage type: {field: value}}}``, read from
  ``curation/text/data/lang_rules/NAME.json`` (see the README there for where the numbers
  come from). ``fineweb2``: FineWeb-2's published per-language thresholds and stop words, for
  every language the ``langid`` stage can name that FineWeb-2 has a config for; every other
  language code (the preset's ``codes``: CLD2's languages and all ISO 639-1 codes) gets the
  preset's ``fallback`` (``fallback_entry``), never the stage's English rules. ``auto``:
  ``fineweb2`` plus per-language thresholds calibrated on natural text (its ``base`` and
  ``languages`` are merged field by field).
- ``char_words(texts)``: words for languages written without spaces (Chinese, Japanese):
  every Han, Hiragana and Katakana character (and CJK punctuation) is a word of its own,
  the rest of the text is split as usual (``words.split_words``), so Latin words, numbers
  and URLs inside a Chinese page stay whole. FineWeb-2 split these languages with jieba
  (zh) and SudachiPy (ja); neither is a dependency here, and a dictionary segmenter is
  ~100x slower than this. Single characters make stop-word lists of single characters
  (all of FineWeb-2's zh and ja stop words are) match exactly, but counts, n-grams and
  newline-per-word ratios are per character, not per dictionary word: the preset scales
  the thresholds that depend on it (see ``CHAR_WORDS`` in the data and its README).
- A ``lang_config`` may also name a file (``is_file``: a path, or a name ending ``.json``) in a
  preset's format: the ``_calibration.json`` a ``calibrate_rules`` stage writes (an overlay of
  its ``base`` preset, like ``auto``), reused by path in the same or another run. It is read
  when the DAG is validated and its entries go into the filter's params hash.
- ``default_words(lang)``: ``"chars"`` for the languages above, ``"spaces"`` otherwise; what
  a ``by_lang`` entry without ``words:`` uses.
"""

from __future__ import annotations

import functools
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from curation.text import words as ts

DATA_DIR = Path(__file__).parent / "data" / "lang_rules"

#: Languages written without spaces between words, split into characters by default.
CHAR_WORD_LANGS = frozenset({"zh", "ja", "yue", "wuu", "lzh"})

#: A character that is a word of its own in ``char_words``: Han ideographs, kana (with the
#: middle dot and the prolonged sound mark), CJK symbols and punctuation (U+3001..U+303F,
#: U+3000 is a space) and the full-width punctuation of U+FF01..U+FF65. As RE2 sees it.
CJK_CHAR_RE2 = (r"[\p{Han}\p{Hiragana}\p{Katakana}\x{30FB}\x{30FC}\x{3001}-\x{303F}"
                r"\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF20}\x{FF3B}-\x{FF40}\x{FF5B}-\x{FF65}]")

#: What a language code in ``by_lang`` looks like: the ``lang`` column's codes (langid writes
#: ISO 639-1 where one exists, else ISO 639-3).
LANG_CODE = re.compile(r"^[a-z]{2,3}$")

WORD_MODES = ("spaces", "chars")


def default_words(lang: str) -> str:
    """How a language's text is split into words unless its entry says (``words:``)."""
    return "chars" if lang in CHAR_WORD_LANGS else "spaces"


def cjk_spaced(texts: pa.Array) -> pa.Array:
    """The texts with a space on either side of every CJK character (``CJK_CHAR_RE2``)."""
    return pc.replace_substring_regex(texts, f"({CJK_CHAR_RE2})", r" \1 ")


def char_words(texts: pa.Array) -> ts.Words:
    """Words of texts in a language written without spaces: each CJK character is a word, the
    rest is split by ``words.split_words``. The words are spans of ``cjk_spaced(texts)``
    (lengths, flags, ids and ``match`` are right; byte positions are not the original's)."""
    return ts.split_words(cjk_spaced(texts))


def count_char_words(values: pa.Array) -> np.ndarray:
    """``str.split()`` word counts after spacing CJK characters (C4's words per line)."""
    return ts.count_py_words(cjk_spaced(values))


def is_file(name: str) -> bool:
    """Whether a ``lang_config`` value names a file (a calibration written by the
    ``calibrate_rules`` stage, or any file in a preset's format) rather than a shipped preset."""
    return name.endswith(".json") or "/" in name or "\\" in name


def _load(name: str) -> dict[str, Any]:
    if is_file(name):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ValueError(f"lang_config {name!r}: no such file")
        return _parse(path.read_text(encoding="utf-8"), name)
    path = DATA_DIR / f"{name}.json"
    if not path.exists():
        raise ValueError(f"unknown lang_config {name!r} (known: {', '.join(presets())}, or a .json file)")
    return _parse(path.read_text(encoding="utf-8"), name)


@functools.lru_cache(maxsize=64)
def _parse(text: str, name: str) -> dict[str, Any]:
    """A preset's data (cached by its text: a file rewritten is read again)."""
    data = json.loads(text)
    if not isinstance(data, dict) or not isinstance(data.get("languages"), dict):
        raise ValueError(f"lang_config {name!r}: not a preset (a JSON object with 'languages')")
    if "base" in data:  # an overlay: the base preset's entries with this one's fields over them
        base = _load(data["base"])
        merged = json.loads(json.dumps(base["languages"]))
        for lang, stages in data["languages"].items():
            for stage, fields in stages.items():
                merged.setdefault(lang, {}).setdefault(stage, {}).update(fields)
        data = {**base, **{k: v for k, v in data.items() if k != "languages"}, "languages": merged}
    if "fallback" in data:
        for lang in data.get("codes", []):
            data["languages"].setdefault(lang, data["fallback"])
    return data


def sha256(name: str) -> str:
    """A digest of what ``lang_config: name`` reads (a file's text; a preset's too)."""
    import hashlib  # noqa: PLC0415

    path = Path(name).expanduser() if is_file(name) else DATA_DIR / f"{name}.json"
    return hashlib.sha256(path.read_bytes()).hexdigest()


def root_preset(name: str) -> str:
    """The shipped preset at the bottom of ``name``'s chain of ``base`` overlays (``fineweb2``
    for ``auto`` and for a calibration over either)."""
    data = json.loads((Path(name).expanduser() if is_file(name) else DATA_DIR / f"{name}.json").read_text("utf-8"))
    return root_preset(data["base"]) if "base" in data else name


def presets() -> list[str]:
    """Names of the shipped presets."""
    return sorted(p.stem for p in DATA_DIR.glob("*.json"))


def preset(name: str) -> dict[str, dict[str, dict[str, Any]]]:
    """A preset as ``{lang: {stage type: {field: value}}}`` (a fresh copy each call)."""
    return json.loads(json.dumps(_load(name)["languages"]))


def fallback_entry(lang: str, name: str = "fineweb2") -> dict[str, dict[str, Any]]:
    """What a language without an entry of its own gets in preset ``name`` (``{stage type:
    {field: value}}``): the median of FineWeb-2's thresholds over the languages whose values
    were checked, and no stop-word rule (there is no list). ``lang`` is unused for now: the
    same entry for every language (a fresh copy)."""
    del lang
    return json.loads(json.dumps(_load(name)["fallback"]))


def has_own_entry(lang: str, name: str = "fineweb2") -> bool:
    """Whether ``lang`` has values of its own in preset ``name`` (not the fallback)."""
    data = _load(name)
    return lang in data["languages"] and data["languages"][lang] is not data.get("fallback")


def preset_stages(name: str) -> list[str]:
    """The stage types a preset has values for."""
    return sorted({st for entry in _load(name)["languages"].values() for st in entry})

