"""HTML -> main text. Resiliparse (C++, default) or trafilatura (Python, slower, option), as plain
text or Markdown (``format``), one engine (``engine``) or several combined (``engines`` + ``policy``)."""

from __future__ import annotations

from typing import ClassVar, Literal

import pyarrow as pa
from pydantic import Field, model_validator

from curation.stages.base import MapStage, StageResult, registry
from curation.text.extraction import MARKUP_KEY, ENGINES, decode_html, extract_page  # noqa: F401 (re-exported: tests)
from curation.text.extract_pages import ExtractionTimeout, doc_limits as _doc_limits, extract_pages, resolve_engines  # noqa: F401 (re-exported)


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
        engine, engines = resolve_engines(data.get("engine"), data.get("engines"), "extract")
        return {**data, "engine": engine, "engines": engines}

    def process(self, batch: pa.Table) -> StageResult:
        if "html" not in batch.column_names:
            raise ValueError("extract: input has no 'html' column; use it on a warc input")
        fmt = self.format
        texts, reasons = extract_pages(batch.column("html").to_pylist(), batch.column("charset").to_pylist(),
                                       engines=self.engines, format=fmt, policy=self.policy,
                                       timeout_s=self.timeout_s, min_chars=self.min_chars, prefix="extract")
        out = batch.drop_columns(["html", "charset"])
        # Markdown: the text field says so (TextState.of reads it), so the stages after this one
        # measure its plain view; in the field, not a handed-on state, so the executor still
        # joins extraction's small batches (a state would keep them apart: the chain x0.5)
        field = pa.field("text", pa.string(), metadata=None if fmt == "text" else {MARKUP_KEY: fmt})
        out = out.set_column(out.schema.get_field_index("text"), field, pa.array(texts, pa.string()))
        return StageResult(out, pa.array(reasons, pa.string()))
