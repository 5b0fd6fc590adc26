"""HTML -> main text. Resiliparse (C++, default) or trafilatura (Python, slower, option)."""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager
from typing import Literal

import pyarrow as pa
from pydantic import Field

from curation.stages.base import MapStage, StageResult, registry


class ExtractionTimeout(Exception):
    """One document took longer than ``timeout_s`` to extract."""


@contextmanager
def _time_limit(seconds: float):
    # SIGALRM interrupts Python code (trafilatura) without killing the worker; only possible on
    # the main thread, which is where Ray runs task code. Elsewhere the limit is not enforced.
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise ExtractionTimeout()

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def decode_html(html: bytes, charset: str | None) -> str:
    """Bytes -> str using the HTTP charset when valid, else resiliparse's detector."""
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    enc = charset or detect_encoding(html)
    try:
        return bytes_to_str(html, enc)
    except LookupError:  # an unknown charset name in the header
        return bytes_to_str(html, detect_encoding(html))


def _resiliparse(html: str) -> str:
    from resiliparse.extract.html2text import extract_plain_text

    return extract_plain_text(html, main_content=True, alt_texts=False)


def _trafilatura(html: str) -> str:
    import trafilatura

    return trafilatura.extract(html, include_comments=False, include_tables=False, favor_precision=False,
                               deduplicate=False) or ""


ENGINES = {"resiliparse": _resiliparse, "trafilatura": _trafilatura}


@registry.register("extract")
class Extract(MapStage):
    """Extract main text from the ``html`` column WARC readers emit; drops ``html``/``charset``."""

    type: Literal["extract"] = "extract"
    engine: Literal["resiliparse", "trafilatura"] = "resiliparse"
    timeout_s: float = Field(default=5.0, ge=0)
    min_chars: int = Field(default=1, ge=0)

    def process(self, batch: pa.Table) -> StageResult:
        if "html" not in batch.column_names:
            raise ValueError("extract: input has no 'html' column; use it on a warc input")
        fn = ENGINES[self.engine]
        texts: list[str | None] = []
        reasons: list[str | None] = []
        charsets = batch.column("charset").to_pylist()
        for html, charset in zip(batch.column("html").to_pylist(), charsets):
            text, reason = None, None
            if not html:
                reason = "extract:empty_html"
            else:
                try:
                    with _time_limit(self.timeout_s):
                        text = fn(decode_html(html, charset)).strip()
                    if len(text) < max(self.min_chars, 1):
                        reason = "extract:no_text"
                except ExtractionTimeout:
                    reason = "extract:timeout"
                except Exception as e:  # a parser bug on one page must not end the shard
                    reason = f"extract:error:{type(e).__name__}"
            texts.append(text)
            reasons.append(reason)
        out = batch.drop_columns(["html", "charset"])
        out = out.set_column(out.schema.get_field_index("text"), "text", pa.array(texts, pa.string()))
        return StageResult(out, pa.array(reasons, pa.string()))
