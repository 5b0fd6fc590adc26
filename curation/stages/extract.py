"""HTML -> main text. Resiliparse (C++, default) or trafilatura (Python, slower, option), as plain
text or Markdown (``format``), one engine (``engine``) or several combined (``engines`` + ``policy``)."""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from typing import Callable, ClassVar, Iterator, Literal

import pyarrow as pa
from pydantic import Field, model_validator

from curation.stages.base import MapStage, StageResult, registry
from curation.text.extraction import MARKUP_KEY, ENGINES, decode_html, extract_page  # noqa: F401 (re-exported: tests)


class ExtractionTimeout(Exception):
    """One document took longer than ``timeout_s`` to extract."""


@contextmanager
def _doc_limits(seconds: float, interrupt: bool) -> Iterator[Callable[[Callable[[], str]], str]]:
    """Per-document time limits for one batch: yields ``limited(f)``, which returns ``f()`` or
    raises ``ExtractionTimeout`` when it ran longer than ``seconds`` (0: no limit).

    ``interrupt`` (a Python extractor, trafilatura): SIGALRM stops the document at the limit.
    Only the main thread gets signals, and Ray runs task code there; elsewhere the document is
    timed like a C++ one. The handler is installed once per batch, the timer armed per document.

    Otherwise (resiliparse's C++, which no signal interrupts) the document is timed and
    rejected when it returns over the limit: what the alarm did for it too (the handler ran
    after the call), without its four signal calls per document (46 us a page, 2% of
    extraction on the scale bench's long pages)."""
    if seconds <= 0:
        yield lambda f: f()
        return
    if not interrupt or threading.current_thread() is not threading.main_thread():
        def timed(f: Callable[[], str]) -> str:
            t0 = time.monotonic()
            out = f()
            if time.monotonic() - t0 > seconds:
                raise ExtractionTimeout()
            return out

        yield timed
        return

    def _raise(signum, frame):
        raise ExtractionTimeout()

    outer = signal.getitimer(signal.ITIMER_REAL)[0]  # a caller's deadline (e.g. pytest-timeout)
    t0 = time.monotonic()

    def alarmed(f: Callable[[], str]) -> str:
        left = outer - (time.monotonic() - t0)
        signal.setitimer(signal.ITIMER_REAL, seconds if outer <= 0 else max(min(seconds, left), 1e-3))
        try:
            return f()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    old = signal.signal(signal.SIGALRM, _raise)
    try:
        yield alarmed
    finally:
        signal.signal(signal.SIGALRM, old)
        if outer > 0:  # give the outer alarm back what is left of it
            signal.setitimer(signal.ITIMER_REAL, max(outer - (time.monotonic() - t0), 1e-3))


@registry.register("extract")
class Extract(MapStage):
    """Extract main text from the ``html`` column WARC readers emit; drops ``html``/``charset``."""

    type: Literal["extract"] = "extract"
    #: one engine (shorthand for ``engines: [engine]``)
    engine: Literal["resiliparse", "trafilatura"] | None = None
    #: several engines, combined per page by ``policy`` (``extraction.extract_page``)
    engines: list[Literal["resiliparse", "trafilatura"]] | None = Field(default=None, min_length=1)
    policy: Literal["first", "longest", "union", "route"] = "first"
    format: Literal["text", "markdown"] = "text"
    timeout_s: float = Field(default=5.0, ge=0)
    min_chars: int = Field(default=1, ge=0)

    rewrites_text: ClassVar[bool] = True

    @model_validator(mode="before")
    @classmethod
    def _one_engine_list(cls, data):
        # resolved before the (frozen) model is built: engine and engines both always set
        if not isinstance(data, dict):
            return data
        engine, engines = data.get("engine"), data.get("engines")
        # engine == engines[0]: the resolved form (a model dumped and validated again)
        if engine is not None and engines is not None and (not engines or engines[0] != engine):
            raise ValueError("extract: give engine (one) or engines (several), not both")
        if engines is None:
            engines = [engine or "resiliparse"]
        return {**data, "engine": engine or (engines[0] if engines else None), "engines": engines}

    def process(self, batch: pa.Table) -> StageResult:
        if "html" not in batch.column_names:
            raise ValueError("extract: input has no 'html' column; use it on a warc input")
        engines, fmt, policy = tuple(self.engines), self.format, self.policy
        if engines == ("resiliparse",) and fmt == "text":
            fn = ENGINES["resiliparse"]  # today's path, called directly: no per-page dispatch
        else:
            def fn(html: str) -> str:
                return extract_page(html, engines=engines, format=fmt, policy=policy)
        texts: list[str | None] = []
        reasons: list[str | None] = []
        charsets = batch.column("charset").to_pylist()
        with _doc_limits(self.timeout_s, interrupt=engines != ("resiliparse",)) as limited:
            for html, charset in zip(batch.column("html").to_pylist(), charsets):
                text, reason = None, None
                if not html:
                    reason = "extract:empty_html"
                else:
                    try:
                        text = limited(lambda: fn(decode_html(html, charset)).strip())  # noqa: B023 (called here)
                        if len(text) < max(self.min_chars, 1):
                            reason = "extract:no_text"
                    except ExtractionTimeout:
                        text, reason = None, "extract:timeout"
                    except Exception as e:  # a parser bug on one page must not end the shard
                        reason = f"extract:error:{type(e).__name__}"
                texts.append(text)
                reasons.append(reason)
        out = batch.drop_columns(["html", "charset"])
        # Markdown: the text field says so (TextState.of reads it), so the stages after this one
        # measure its plain view; in the field, not a handed-on state, so the executor still
        # joins extraction's small batches (a state would keep them apart: the chain x0.5)
        field = pa.field("text", pa.string(), metadata=None if fmt == "text" else {MARKUP_KEY: fmt})
        out = out.set_column(out.schema.get_field_index("text"), field, pa.array(texts, pa.string()))
        return StageResult(out, pa.array(reasons, pa.string()))
