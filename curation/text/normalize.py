"""Text clean-up: Unicode repair (ftfy), symbol-only lines, whitespace.

Steps, in order (each can be switched off):

1. **Unicode repair** with ``ftfy.fix_text``: mojibake (UTF-8 read as cp1252/latin-1,
   ``itâ€™s`` -> ``it’s``), C1 controls, HTML entities in text that is not HTML
   (``unescape_html="auto"``: ``&amp;`` -> ``&`` unless the text holds a ``<``), terminal
   escapes, control characters, surrogates. Like datatrove's ``FTFYFormatter`` (FineWeb's),
   nothing that merely enforces a style: quotes stay curly, ligatures and full-width
   characters stay, line breaks stay, no Unicode normalisation (``normalization: NFC`` turns
   one on). Only texts ftfy can change are given to it: those with an HTML entity, a control
   character, or mojibake as ftfy's own detector sees it (``ftfy.badness.is_bad``, the check
   ftfy makes before it tries to re-decode anything), found by one RE2 scan of the column
   (ftfy's detector regex translated to RE2; ``is_bad`` in Python if that ever fails). On
   clean text this makes the step ~100x cheaper than calling ftfy on every document.
2. **Trailing whitespace** of every line (spaces, tabs, NBSP and the other Unicode spaces,
   ``\\r``) is removed, so ``\\r\\n`` becomes ``\\n`` and whitespace-only lines become empty.
3. **Symbol lines**: a line that holds at least one character and only punctuation (``\\p{P}``),
   symbols (``\\p{S}``: ``|``, ``©``, ``►``, emoji...) and spaces is removed with its line
   break (datatrove's ``SymbolLinesFormatter`` does the same with a fixed character list).
   Lines with a letter or a digit stay.
4. **Runs of spaces** inside a line (two or more spaces, tabs or other Unicode spaces after
   a visible character) become one space; leading indentation is kept.
5. **Blank lines**: more than ``max_blank_lines`` consecutive empty lines become that many.
6. The text is **stripped** of leading and trailing whitespace.

Steps 2-6 are Arrow (RE2) operations over the whole column; only step 1 runs per document.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: horizontal whitespace (no line breaks): tab, space, NBSP, U+1680, U+2000..U+200A, U+202F,
#: U+205F, U+3000
HSPACE = r"\t \x{a0}\x{1680}\x{2000}-\x{200a}\x{202f}\x{205f}\x{3000}"
#: a line made only of punctuation, symbols and horizontal spaces (at least one of the former)
SYMBOL_LINE_RE2 = rf"(?m)^[{HSPACE}]*[\p{{P}}\p{{S}}][\p{{P}}\p{{S}}{HSPACE}]*(?:\n|$)"
#: ASCII and C1 control characters, and the other characters ftfy removes (its
#: ``CONTROL_CHARS``: U+206A..U+206F, BOM, U+FFF9..U+FFFC)
_CONTROLS_RE2 = r"[\x{0}-\x{8}\x{b}\x{e}-\x{1f}\x{7f}-\x{9f}\x{206a}-\x{206f}\x{feff}\x{fff9}-\x{fffc}]"
#: ftfy's ``HTML_ENTITY_RE``
_ENTITY_RE2 = r"&#?[0-9A-Za-z]{1,24};"


def verbose_to_re2(pattern: str) -> str:
    """A Python ``re.VERBOSE`` pattern made of literals, classes and ``\\s``/``\\w``/``\\d`` as
    an RE2 pattern: whitespace and comments outside classes dropped, the shorthand classes
    spelled out as Python's Unicode ones. Raises ValueError on what it does not handle."""
    shorthand = {"s": r"\s\x{b}\p{Z}\x{85}\x{1c}-\x{1f}", "w": r"\p{L}\p{N}_", "d": r"\p{Nd}"}
    out: list[str] = []
    i, n, in_class = 0, len(pattern), False

    def lit(c: str) -> str:
        return c if c.isprintable() and not c.isspace() else f"\\x{{{ord(c):x}}}"

    while i < n:
        c = pattern[i]
        if c == "\\":
            nxt = pattern[i + 1]
            if nxt in shorthand:
                out.append(shorthand[nxt] if in_class else f"[{shorthand[nxt]}]")
            elif nxt.isalnum() and nxt not in "xu":
                raise ValueError(f"escape \\{nxt} not handled")
            else:
                out.append(c + nxt)
            i += 2
        elif in_class:
            if c == "]" and out[-1] not in ("[", "[^"):
                in_class = False
                out.append(c)
            else:
                out.append(lit(c))
            i += 1
        elif c == "[":
            in_class = True
            neg = pattern.startswith("[^", i)
            out.append("[^" if neg else "[")
            i += 2 if neg else 1
        elif c.isspace():
            i += 1
        elif c == "#":
            j = pattern.find("\n", i)
            i = n if j < 0 else j
        else:
            out.append(lit(c))
            i += 1
    return "".join(out)


@lru_cache(maxsize=1)
def badness_re2() -> str | None:
    """ftfy's mojibake detector (``ftfy.badness.BADNESS_RE``, what ``is_bad`` searches) as an
    RE2 pattern, or None where it cannot be translated (then ``is_bad`` runs in Python)."""
    from ftfy.badness import BADNESS_RE  # noqa: PLC0415

    try:
        pattern = verbose_to_re2(BADNESS_RE.pattern)
        pc.match_substring_regex(pa.array(["x"]), pattern)
    except (ValueError, IndexError, pa.ArrowInvalid):
        return None
    return pattern


def _np(arr) -> np.ndarray:
    """A boolean or integer Arrow column as numpy, nulls as false / 0."""
    return pc.fill_null(arr, False if pa.types.is_boolean(arr.type) else 0).to_numpy(zero_copy_only=False)


@dataclass(frozen=True)
class Normalizer:
    """See the module docstring; ``normalize(texts) -> (texts, fixed, lines_removed)``."""

    fix_unicode: bool = True
    unescape_html: bool | Literal["auto"] = "auto"
    normalization: Literal["NFC", "NFKC", "NFD", "NFKD"] | None = None
    strip_trailing_spaces: bool = True
    remove_symbol_lines: bool = True
    collapse_spaces: bool = True
    max_blank_lines: int | None = 1
    strip: bool = True

    def ftfy_config(self):
        from ftfy import TextFixerConfig  # noqa: PLC0415 (only stages that repair load it)

        return TextFixerConfig(
            unescape_html=self.unescape_html, remove_terminal_escapes=True, fix_encoding=True,
            restore_byte_a0=True, replace_lossy_sequences=True, decode_inconsistent_utf8=True,
            fix_c1_controls=True, fix_latin_ligatures=False, fix_character_width=False, uncurl_quotes=False,
            fix_line_breaks=False, fix_surrogates=True, remove_control_chars=True,
            normalization=self.normalization, explain=False,
        )

    def candidates(self, texts: pa.Array) -> np.ndarray:
        """Rows ftfy may change (a superset): HTML entities, control characters, mojibake as
        ftfy's own detector sees it (``is_bad``; only then does it try to re-decode), or any
        non-ASCII character when a Unicode normalisation is asked for."""
        if self.normalization is not None:
            return _np(pc.match_substring_regex(texts, r"[^\x{0}-\x{7f}]")).astype(bool)
        parts = [_CONTROLS_RE2] + ([_ENTITY_RE2] if self.unescape_html else [])
        bad = badness_re2()
        if bad is not None:
            parts.append(bad)
        cand = _np(pc.match_substring_regex(texts, "|".join(f"(?:{p})" for p in parts))).astype(bool)
        if bad is None:
            from ftfy.badness import is_bad  # noqa: PLC0415

            rest = np.flatnonzero(~cand & _np(pc.match_substring_regex(texts, r"[^\x{0}-\x{7f}]")).astype(bool))
            for i, t in zip(rest.tolist(), texts.take(pa.array(rest)).to_pylist()):
                cand[i] = is_bad(t)
        return cand

    def repair(self, texts: pa.Array) -> tuple[pa.Array, np.ndarray]:
        """ftfy over the texts that can change; ``(texts, changed per row)``."""
        import ftfy  # noqa: PLC0415

        n = len(texts)
        fixed = np.zeros(n, bool)
        cand = self.candidates(texts)
        idx = np.flatnonzero(cand)
        if not len(idx):
            return texts, fixed
        config = self.ftfy_config()
        changed, values = [], []
        for i, t in zip(idx.tolist(), texts.take(pa.array(idx)).to_pylist()):
            new = ftfy.fix_text(t, config=config)
            if new != t:
                changed.append(i)
                values.append(new)
        if not changed:
            return texts, fixed
        fixed[changed] = True
        order = np.arange(n, dtype=np.int64)
        order[np.array(changed, np.int64)] = n + np.arange(len(changed), dtype=np.int64)
        return pa.concat_arrays([texts, pa.array(values, texts.type)]).take(pa.array(order)), fixed

    def normalize(self, texts: pa.Array | pa.ChunkedArray) -> tuple[pa.Array, np.ndarray, np.ndarray]:
        """``(new texts, ftfy changed the text, symbol lines removed)`` per row; nulls stay."""
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        if not pa.types.is_string(texts.type):
            texts = texts.cast(pa.string())
        n = len(texts)
        fixed = np.zeros(n, bool)
        removed = np.zeros(n, np.int32)
        out = texts
        if self.fix_unicode:
            out, fixed = self.repair(out)
        if self.strip_trailing_spaces:
            out = pc.replace_substring_regex(out, rf"(?m)[{HSPACE}\r]+$", "")
        if self.remove_symbol_lines:
            removed = _np(pc.count_substring_regex(out, SYMBOL_LINE_RE2)).astype(np.int32)
            if removed.any():
                out = pc.replace_substring_regex(out, SYMBOL_LINE_RE2, "")
        if self.collapse_spaces:
            out = pc.replace_substring_regex(out, rf"([^{HSPACE}\n])[{HSPACE}]{{2,}}", "\\1 ")
        if self.max_blank_lines is not None:
            k = self.max_blank_lines
            out = pc.replace_substring_regex(out, "\n{%d,}" % (k + 2), "\n" * (k + 1))
        if self.strip:
            out = pc.utf8_trim_whitespace(out)
        return out, fixed, removed
