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

import functools
import json
import threading
from typing import ClassVar, Literal

import pyarrow as pa
import pyarrow.compute as pc
from pydantic import field_validator

from curation.stages.base import MapStage, Resources, StageResult, registry


class SelectError(ValueError):
    """An expression that does not parse, reads anything but the row's columns, or names a
    column the rows do not have."""


#: how a ``where`` is evaluated, and so also how it is parsed and checked: one statement over
#: the batch registered as ``rows``, nothing else
_TEMPLATE = "SELECT ({where})::BOOLEAN AS k FROM rows"

#: A where expression is a client's text in the service: its connection has no file system,
#: network or extension loading (``read_text``/``glob``/``httpfs`` are refused), and cannot
#: switch that back on (locked). Nothing but the registered batch is in it.
SANDBOX_CONFIG = {"enable_external_access": False, "autoinstall_known_extensions": False,
                  "autoload_known_extensions": False, "lock_configuration": True}

_local = threading.local()


def sandboxed_connection():
    """This thread's sandboxed DuckDB connection (made on first use: ~50 ms, too much per
    batch). Never shared across threads: a DuckDB connection runs one statement at a time."""
    import duckdb  # noqa: PLC0415

    con = getattr(_local, "con", None)
    if con is None:
        con = _local.con = duckdb.connect(config=dict(SANDBOX_CONFIG))
    return con


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


def _reads_beyond_row(node) -> str | None:
    """What in a parsed expression reads something other than the row (a subquery, a table
    function, another table), or None."""
    if isinstance(node, dict):
        if node.get("class") == "SUBQUERY" or node.get("type") == "SUBQUERY":
            return "a subquery (SELECT ...)"
        if node.get("type") in ("TABLE_FUNCTION", "BASE_TABLE", "JOIN", "EXPRESSION_LIST"):
            return f"a table reference ({node.get('function', {}).get('function_name') or node.get('table_name') or node['type']})"
        for v in node.values():
            found = _reads_beyond_row(v)
            if found:
                return found
    elif isinstance(node, list):
        for v in node:
            found = _reads_beyond_row(v)
            if found:
                return found
    return None


def _parsed(sql: str, where: str) -> dict:
    tree = json.loads(sandboxed_connection().execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0])
    if tree.get("error"):
        raise SelectError(f"where: {tree.get('error_message', 'does not parse')}: {where!r}")
    return tree


@functools.lru_cache(maxsize=256)
def _checked(where: str) -> frozenset[str]:
    # as a WHERE clause first: unbalanced parentheses are a syntax error there
    _parsed(f"SELECT * FROM rows WHERE {where}", where)
    # then exactly as evaluated: one CAST(...) AS k over the table rows, and nothing else
    stmts = _parsed(_TEMPLATE.format(where=where), where)["statements"]
    node = stmts[0]["node"] if len(stmts) == 1 else {}
    frm = node.get("from_table") or {}
    item = (node.get("select_list") or [{}])[0]
    plain = (node.get("type") == "SELECT_NODE" and len(node.get("select_list") or []) == 1
             and item.get("class") == "CAST" and item.get("alias") == "k"
             and frm.get("type") == "BASE_TABLE" and frm.get("table_name") == "rows" and not frm.get("schema_name")
             and not frm.get("catalog_name") and frm.get("sample") is None and frm.get("at_clause") is None
             and not node.get("modifiers") and not (node.get("cte_map") or {}).get("map")
             and all(node.get(k) in (None, [], {}) for k in ("where_clause", "group_expressions", "group_sets",
                                                             "having", "sample", "qualify")))
    if not plain:
        raise SelectError(f"where: one boolean expression over the row's columns, not a statement: {where!r}")
    beyond = _reads_beyond_row(node["select_list"])
    if beyond:
        raise SelectError(f"where: {beyond} is not allowed: the expression sees the row's columns only: {where!r}")
    return frozenset(_column_refs(node["select_list"]))


def expression_columns(where: str) -> set[str]:
    """The column names a SQL boolean expression reads (parsed, not bound: no table needed).
    SelectError if it does not parse, or reads anything but the row: a subquery, a table
    function (``read_text``, ``glob``, ``range``), another table."""
    return set(_checked(where))


def evaluate(where: str, rows: pa.Table) -> pa.ChunkedArray:
    """``where`` over ``rows`` (boolean, null where it is null), on this thread's sandboxed
    connection: even an expression that got past ``expression_columns`` reaches no file."""
    con = sandboxed_connection()
    con.register("rows", rows)
    try:
        return con.sql(_TEMPLATE.format(where=where)).to_arrow_table().column("k")
    finally:
        con.unregister("rows")


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
