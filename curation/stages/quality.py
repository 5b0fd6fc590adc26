"""``quality``: P(high quality) from a fastText classifier trained with ``refinery quality train``
(see ``curation/quality/``), row-local (fuses): adds the score; with ``min_score: 0.5`` drops
documents scoring below 0.5 (``quality:low_score``). ``type: quality`` with ``keep_top`` is read as
``quality_top`` (``curation/stages/quality_top.py``).

Documents without text (empty, whitespace) get a null ``quality`` and ``quality:no_text``. The
model is loaded once per worker process (a per-process cache keyed by path, mtime and size); a
missing or corrupt model file stops the run before any work with ``quality.model: cannot load
'PATH': why``.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
from pydantic import Field, PrivateAttr

from curation.quality.scoring import score_table, with_quality
from curation.stages.base import MapStage, Stage, StageResult, registry
from curation.stages.paths import PathStr
from curation.stages.quality_model import QualityModel


@registry.register("quality")
class QualityScore(QualityModel, MapStage):
    """Score documents with a fastText quality classifier (adds ``quality``); with
    ``min_score`` (0..1) drop those below it. Row-local: fuses with its neighbours.

    ``model``: the ``.bin`` written by ``refinery quality train`` (its card beside it names
    the positive label). ``type: quality`` with ``keep_top`` is read as ``quality_top``.
    """

    type: Literal["quality"] = "quality"
    columns: ClassVar[tuple[str, ...]] = ('quality',)
    model: PathStr
    min_score: float | None = Field(default=None, ge=0.0, le=1.0)

    _scorer_ready: bool = PrivateAttr(default=False)

    @classmethod
    def variant(cls, params: dict[str, Any]) -> type[Stage]:
        # a corpus quantile needs every score first: the global stage
        return registry["quality_top"] if params.get("keep_top") is not None else cls

    def setup(self) -> None:
        from curation.quality.classifier import load_scorer

        load_scorer(self.model, "quality.model", self.positive_label)  # fails early, caches
        self._scorer_ready = True

    def process(self, batch: pa.Table) -> StageResult:
        if not self._scorer_ready:
            self.setup()
        scores, has = score_table(batch, self.model, self.positive_label)
        table = with_quality(batch, scores)
        if self.min_score is None and has.all():
            return StageResult(table, None)
        low = has & (scores < (self.min_score if self.min_score is not None else -1.0))
        reasons = np.where(~has, "quality:no_text", np.where(low, "quality:low_score", None))
        return StageResult(table, pa.array(reasons.tolist(), pa.string()))
