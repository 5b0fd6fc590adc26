"""A batch of pages -> main texts, one reason per page that gave none: what ``extract`` does to
its WARC rows and ``reextract`` to the records it re-reads, with per-page time limits.

``extract_pages(htmls, charsets, ...)`` decodes each page (``engines.decode_html``),
extracts it (``extraction.extract_page``) and returns ``(texts, reasons)``, reasons being
``PREFIX:empty_html``, ``PREFIX:no_text``, ``PREFIX:timeout`` or ``PREFIX:error:TYPE`` (null:
kept). A parser bug on one page never ends the batch.
"""

from __future__ import annotations

import signal
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Literal, Sequence

import pyarrow as pa
from pydantic import BaseModel, Field, model_validator

from curation.extract.engines import ENGINES, decode_html, extract_page
from curation.text.markup import MARKUP_KEY


class ExtractionTimeout(Exception):
    """One document took longer than ``timeout_s`` to extract."""


@contextmanager
def doc_limits(seconds: float, interrupt: bool) -> Iterator[Callable[[Callable[[], str]], str]]:
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


def extract_pages(htmls: Sequence[bytes | None], charsets: Sequence[str | None], *,
                  engines: Sequence[str] = ("resiliparse",), format: str = "text", policy: str = "first",
                  timeout_s: float = 5.0, min_chars: int = 1, prefix: str = "extract",
                  block_model: str | None = None) -> tuple[list[str | None], list[str | None]]:
    """Per page: its main text (stripped) or None, and None or why it has none."""
    engines = tuple(engines)
    if engines == ("resiliparse",) and format == "text":
        fn = ENGINES["resiliparse"]  # today's path, called directly: no per-page dispatch
    else:
        def fn(html: str) -> str:
            return extract_page(html, engines=engines, format=format, policy=policy, block_model=block_model)
    texts: list[str | None] = []
    reasons: list[str | None] = []
    with doc_limits(timeout_s, interrupt=engines != ("resiliparse",)) as limited:
        for html, charset in zip(htmls, charsets):
            text, reason = None, None
            if not html:
                reason = f"{prefix}:empty_html"
            else:
                try:
                    text = limited(lambda: fn(decode_html(html, charset)).strip())  # noqa: B023 (called here)
                    if len(text) < max(min_chars, 1):
                        reason = f"{prefix}:no_text"
                except ExtractionTimeout:
                    text, reason = None, f"{prefix}:timeout"
                except Exception as e:  # a parser bug on one page must not end the shard
                    reason = f"{prefix}:error:{type(e).__name__}"
            texts.append(text)
            reasons.append(reason)
    return texts, reasons


def resolve_engines(engine: str | None, engines: list[str] | None, stage: str = "extract") -> tuple[str | None, list[str]]:
    """A stage's ``engine`` (one, the shorthand) and ``engines`` (several), both set: ``engines``
    defaults to ``[engine or "resiliparse"]``, ``engine`` to ``engines[0]``. Both given is an error
    unless ``engine == engines[0]`` (the resolved form, a model dumped and validated again)."""
    if engine is not None and engines is not None and (not engines or engines[0] != engine):
        raise ValueError(f"{stage}: give engine (one) or engines (several), not both")
    if engines is None:
        engines = [engine or "resiliparse"]
    return engine or (engines[0] if engines else None), engines


class ExtractOptions(BaseModel):
    """The parameters ``extract`` and ``reextract`` share, and the two things both do with them:
    extract a batch of pages and name the ``text`` field they write (a stage subclasses this
    beside ``MapStage``; stages never import each other)."""

    #: one engine (shorthand for ``engines: [engine]``); ``blocks``: the learned main-content decision
    engine: Literal["resiliparse", "trafilatura", "blocks"] | None = None
    #: several engines, combined per page by ``policy`` (``extraction.extract_page``)
    engines: list[Literal["resiliparse", "trafilatura", "blocks"]] | None = Field(default=None, min_length=1)
    policy: Literal["first", "longest", "union", "route"] = "first"
    format: Literal["text", "markdown"] = "text"
    timeout_s: float = Field(default=5.0, ge=0)
    min_chars: int = Field(default=1, ge=0)
    #: the ``blocks`` engine's model: a file ``refinery extract train`` wrote (default: the shipped one)
    block_model: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_engine_list(cls, data):
        # resolved before the (frozen) model is built: engine and engines both always set
        if not isinstance(data, dict):
            return data
        field = cls.model_fields.get("type")
        engine, engines = resolve_engines(data.get("engine"), data.get("engines"), field.default if field else "extract")
        if data.get("block_model") is not None and "blocks" not in engines:
            raise ValueError("block_model is the blocks engine's model: add blocks to engine/engines")
        return {**data, "engine": engine, "engines": engines}

    def extract(self, htmls: Sequence[bytes | None], charsets: Sequence[str | None],
                prefix: str) -> tuple[list[str | None], list[str | None]]:
        """``extract_pages`` with these options: (text or None, reason or None) per page."""
        return extract_pages(htmls, charsets, engines=self.engines, format=self.format, policy=self.policy,
                             timeout_s=self.timeout_s, min_chars=self.min_chars, prefix=prefix,
                             block_model=self.block_model)

    def text_field(self) -> pa.Field:
        """The ``text`` field written: Markdown says so in its metadata (``TextState.of`` reads
        it), so the stages after measure its plain view. In the field, not a handed-on state, so
        the executor still joins extraction's small batches (a state would keep them apart)."""
        return pa.field("text", pa.string(), metadata=None if self.format == "text" else {MARKUP_KEY: self.format})
