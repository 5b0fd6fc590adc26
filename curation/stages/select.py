"""``select``: keep the rows for which a SQL boolean expression over their columns holds.

```yaml
english: {type: select, input: langid, where: "lang = 'en' AND lang_score > 0.5"}
other:   {type: select, input: langid, where: "lang <> 'en'"}      # a second branch: routing
```

The expression is DuckDB SQL evaluated on each Arrow batch (zero-copy; only the columns it
names are scanned). A row is kept when the expression is true; false or NULL drops it with
reason ``select:<stage name>``. The DAG checks the expression's syntax and its column names
against the columns upstream stages produce before anything runs.
"""

from __future__ import annotations

import json
import threading
from typing import ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import field_validator

from curation.stages.base import MapStage, Resources, StageResult, registry


class SelectError(ValueError):
    """An expression that does not parse, or that names a column the rows do not have."""


def _column_refs(node) -> set[str]:
    out: set[str] = set()
    if isinstance(node, dict):
        if node.get("class") == "COLUMN_REF" and node.get("column_names"):
            out.add(node["column_names"][-1])
        for v in node.values():
            out |= _column_refs(v)
    elif isinstance(node, list):
        for v in node:
            out |= _column_refs(v)
    return out


def expression_columns(where: str) -> set[str]:
    """The column names a SQL boolean expression reads (parsed, not bound: no table needed)."""
    import duckdb  # noqa: PLC0415

    tree = json.loads(duckdb.execute("SELECT json_serialize_sql(?)", [f"SELECT * FROM t WHERE {where}"]).fetchone()[0])
    if tree.get("error"):
        raise SelectError(f"where: {tree.get('error_message', 'does not parse')}: {where!r}")
    stmt = tree["statements"][0]["node"]
    if len(tree["statements"]) != 1 or stmt.get("select_list", [{}])[0].get("class") != "STAR":
        raise SelectError(f"where: one boolean expression, not a statement: {where!r}")
    return _column_refs(stmt.get("where_clause"))


_local = threading.local()


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

    def process(self, batch: pa.Table, text=None) -> StageResult:
        import duckdb  # noqa: PLC0415

        con = getattr(_local, "con", None)
        if con is None:
            con = _local.con = duckdb.connect()
        cols = sorted(self.required_columns())
        missing = [c for c in cols if c not in batch.column_names]
        if missing:
            raise SelectError(f"select {self.name or ''}: where names {missing}; the rows have {batch.column_names}")
        rows = batch.select(cols) if cols else pa.table({"_": pa.nulls(batch.num_rows, pa.int8())})
        con.register("rows", rows)
        try:
            keep = con.sql(f"SELECT ({self.where})::BOOLEAN AS k FROM rows").to_arrow_table().column("k")
        except duckdb.Error as e:
            raise SelectError(f"select {self.name or ''}: {self.where!r}: {e}") from None
        finally:
            con.unregister("rows")
        keep = pc.fill_null(keep, False)
        reason = pa.scalar(f"select:{self.name or 'where'}", pa.string())
        reasons = pc.if_else(keep, pa.scalar(None, pa.string()), reason)
        if isinstance(reasons, pa.ChunkedArray):
            reasons = reasons.combine_chunks()
        return StageResult(batch, reasons, text)
