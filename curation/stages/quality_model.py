"""The classifier both quality stages (``quality``, ``quality_top``) load: a path parameter,
validated when the DAG is (a bad path fails it), hashed by content (retraining reruns the stage,
moving the file does not)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, field_validator

from curation.stages.paths import PathStr


class QualityModel(BaseModel):
    """The classifier both quality stages load (validated: a bad path fails the DAG)."""

    model: PathStr | None = None
    positive_label: str | None = None

    @field_validator("model")
    @classmethod
    def _model_loadable(cls, v: str | None) -> str | None:
        from curation.quality.classifier import checked_model_path

        return None if v is None else checked_model_path(v)

    def params(self) -> dict[str, Any]:
        from curation.io.files import cached_file_sha256

        p = super().params()  # type: ignore[misc]
        if self.model is not None:  # retraining changes the hash, moving does not
            p["model"] = {"sha256": cached_file_sha256(self.model)}
        return p
