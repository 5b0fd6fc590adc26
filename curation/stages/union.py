"""``union``: several upstreams (inputs or stages) read as one. It writes nothing; its shards are
theirs, so a stage after it reads each upstream's committed shards as they are."""

from __future__ import annotations

from typing import ClassVar

from curation.stages.base import Stage, registry


@registry.register("union")
class UnionStage(Stage):
    """Concatenate several upstreams (inputs or stages). Writes nothing; its shards are theirs."""

    type: str = "union"
    inputs: list[str]
    kind: ClassVar[str] = "union"

    def upstreams(self) -> list[str]:
        return list(self.inputs)
