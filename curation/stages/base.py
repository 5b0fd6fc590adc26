"""What a stage is: typed parameters (a pydantic model) plus one batch method.

Three kinds:
- ``MapStage``: row-local. ``process(batch) -> StageResult``. Consecutive map stages fuse
  into one Ray task per shard (read once, write once).
- ``GlobalStage``: needs to see the whole corpus (dedup, mix, pack, corpus quantiles).
  ``run(ctx)`` drives its own Ray phases through a ``GlobalContext``.
- ``UnionStage``: concatenates several upstreams; writes nothing itself.

A filter never silently drops: ``StageResult.reasons`` holds, per row, ``None`` (kept)
or a reason string such as ``gopher_quality:mean_word_length``. The executor sends
rejected rows, with every signal column the stage measured, to ``rejected/STAGE/``.
"""

from __future__ import annotations

import hashlib
import json
from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
from pydantic import BaseModel, ConfigDict

if TYPE_CHECKING:  # pragma: no cover
    from curation.pipeline.context import GlobalContext

#: Bump when a stage's output for the same parameters changes meaning; part of every params hash.
ALGORITHM_VERSION = 1


@dataclass
class StageResult:
    """A processed batch: all rows (with signal columns added) and a drop reason per row."""

    table: pa.Table
    reasons: pa.Array | None = None  # string array, null = keep; None = keep everything

    @classmethod
    def keep_all(cls, table: pa.Table) -> StageResult:
        return cls(table, None)


class Stage(BaseModel):
    """Base of every stage config. Subclasses add typed parameters and register a ``type``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    input: str | None = None

    kind: ClassVar[str] = "map"
    #: what an output row is: a document, or (pack) a training row holding many documents
    output_unit: ClassVar[str] = "docs"

    def upstreams(self) -> list[str]:
        return [self.input] if self.input else []

    def params(self) -> dict[str, Any]:
        """The parameters that define this stage's output (everything but the wiring)."""
        return self.model_dump(mode="json", exclude={"input", "inputs"})

    def params_hash(self, upstream_hashes: list[str]) -> str:
        """Hash of parameters, algorithm version and upstream hashes: changes when output would."""
        payload = json.dumps(
            {"params": self.params(), "version": ALGORITHM_VERSION, "upstream": upstream_hashes},
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def setup(self) -> None:
        """Load models etc. Called once per worker process before the first batch."""


class MapStage(Stage):
    kind: ClassVar[str] = "map"

    @abstractmethod
    def process(self, batch: pa.Table) -> StageResult:
        """Transform one batch of documents; return all rows plus a drop reason per row."""


class GlobalStage(Stage):
    kind: ClassVar[str] = "global"

    @abstractmethod
    def run(self, ctx: GlobalContext) -> None:
        """Read every upstream shard through ``ctx``, write output shards through ``ctx``."""


class UnionStage(Stage):
    """Concatenate several upstreams (inputs or stages). Writes nothing; its shards are theirs."""

    type: str = "union"
    inputs: list[str]
    kind: ClassVar[str] = "union"

    def upstreams(self) -> list[str]:
        return list(self.inputs)


class _Registry(dict):
    def register(self, name: str):
        def deco(cls):
            if name in self:
                raise ValueError(f"stage type {name!r} registered twice")
            self[name] = cls
            return cls

        return deco


#: stage ``type`` name -> class
registry: _Registry = _Registry()
registry["union"] = UnionStage
