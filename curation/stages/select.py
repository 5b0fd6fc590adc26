"""``select``: keep the rows for which a SQL boolean expression over their columns holds.

```yaml
english: {type: select, input: langid, where: "lang = 'en' AND lang_score > 0.5"}
other:   {type: select, input: langid, where: "lang <> 'en'"}      # a second branch: routing
```

The expression is DuckDB SQL evaluated on each Arrow batch (zero-copy; only the columns it
names are scanned), on a connection with no file system, network or extension loading
(``SANDBOX_CONFIG``): it sees the row's columns and nothing else, and one that reads anything
else (a subquery, a table function such as ``read_text`` or ``glob``) is refused when the DAG
is validated, by ``refinery run`` and the service alike. A row is kept when the expression is true; false or NULL drops it with
reason ``select:<stage name>``. The DAG checks the expression's syntax and its column names
against the columns upstream stages produce before anything runs.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import field_validator

from curation.io.sql_where import (  # noqa: F401  (SANDBOX_CONFIG, sandboxed_connection: the stage's API)
    SANDBOX_CONFIG, TEMPLATE, WhereError, evaluate, expression_columns, sandboxed_connection)
from curation.stages.base import MapStage, Resources, StageResult, registry

#: the sandbox lives below the stages (``curation.io.sql_where``): the ``cc_index`` input runs
#: its ``where`` the same way
SelectError = WhereError
_TEMPLATE = TEMPLATE


@registry.register("select")
class Select(MapStage):
    """Keep rows where ``where`` (DuckDB SQL over the row's columns) is true."""

    type: Literal["select"] = "select"
    where: str
    #: the reason suffix of dropped rows; the DAG fills in the stage's name
    name: str | None = None
    resources: ClassVar[Resources] = Resources(cpus=1)

    @field_validator("where")
    @classmethod
    def _parses(cls, v: str) -> str:
        expression_columns(v)  # raises SelectError (a ValueError: a validation error)
        return v

    @property
    def reason_prefix(self) -> str:
        return "select"

    def required_columns(self) -> set[str]:
        return expression_columns(self.where)

    @classmethod
    def node_defaults(cls, node: str) -> dict[str, Any]:
        return {"name": node}

    def columns_needed(self) -> dict[str, set[str]]:
        return {"where": self.required_columns()}

    def process(self, batch: pa.Table, text=None) -> StageResult:
        import duckdb  # noqa: PLC0415

        cols = sorted(self.required_columns())  # checked again here: a stage built without validation
        missing = [c for c in cols if c not in batch.column_names]
        if missing:
            raise SelectError(f"select {self.name or ''}: where names {missing}; the rows have {batch.column_names}")
        rows = batch.select(cols) if cols else pa.table({"_": pa.nulls(batch.num_rows, pa.int8())})
        try:
            keep = evaluate(self.where, rows)
        except duckdb.Error as e:
            raise SelectError(f"select {self.name or ''}: {self.where!r}: {e}") from None
        keep = pc.fill_null(keep, False)
        reason = pa.scalar(f"select:{self.name or 'where'}", pa.string())
        reasons = pc.if_else(keep, pa.scalar(None, pa.string()), reason)
        if isinstance(reasons, pa.ChunkedArray):
            reasons = reasons.combine_chunks()
        return StageResult(batch, reasons, text)
