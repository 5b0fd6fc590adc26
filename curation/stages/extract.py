"""HTML -> main text (``curation.extract``): resiliparse (C++, default), trafilatura (Python,
slower) or ``blocks`` (the project's learned main-content decision), as plain text or Markdown
(``format``), one engine (``engine``) or several combined (``engines`` + ``policy``)."""

from __future__ import annotations

from typing import ClassVar, Literal

import pyarrow as pa

from curation.stages.base import MapStage, StageResult, registry
from curation.stages.paths import PathStr
from curation.extract.pages import ExtractOptions


@registry.register("extract")
class Extract(MapStage, ExtractOptions):
    """Extract main text from the ``html`` column WARC readers emit; drops ``html``/``charset``.
    Parameters: ``ExtractOptions`` (engine or engines + policy, format, timeout_s, min_chars)."""

    type: Literal["extract"] = "extract"
    #: a path: the service keeps it inside its roots, as every path parameter
    block_model: PathStr | None = None

    rewrites_text: ClassVar[bool] = True

    def process(self, batch: pa.Table) -> StageResult:
        if "html" not in batch.column_names:
            raise ValueError("extract: input has no 'html' column; use it on a warc input")
        texts, reasons = self.extract(batch.column("html").to_pylist(), batch.column("charset").to_pylist(), "extract")
        out = batch.drop_columns(["html", "charset"])
        out = out.set_column(out.schema.get_field_index("text"), self.text_field(), pa.array(texts, pa.string()))
        return StageResult(out, pa.array(reasons, pa.string()))
