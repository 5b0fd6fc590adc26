"""A ``where`` expression: DuckDB SQL over a row's columns and nothing else (the sandbox the
``select`` stage and the ``cc_index`` input share).

An expression is checked once, parsed, never bound: it must be one boolean expression over the
row (no statement around it, no subquery, no table function such as ``read_text`` or ``glob``,
no other table), and ``expression_columns`` names the columns it reads, so a caller can check
them against the columns it has before anything runs. It is evaluated on a DuckDB connection
with no file system, network or extension loading (``SANDBOX_CONFIG``, locked), one per thread,
over an Arrow table or dataset registered as ``rows``: even an expression that got past the
check reaches no file.

``implied_ranges`` adds what a prefix match implies (``col LIKE 'swe%'`` -> ``col >= 'swe' AND
col < 'swf'``) as plain comparisons, which DuckDB pushes into a Parquet scan's row-group
statistics where it cannot push the match itself.
"""

from __future__ import annotations

import functools
import json
import threading


class WhereError(ValueError):
    """An expression that does not parse, reads anything but the row's columns, or names a
    column the rows do not have."""


#: how a ``where`` is evaluated, and so also how it is parsed and checked: one statement over
#: the batch registered as ``rows``, nothing else
TEMPLATE = "SELECT ({where})::BOOLEAN AS k FROM rows"

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


def scan_connection(memory_limit: str, temp_directory: str, database: str = ":memory:", threads: int | None = None):
    """A new sandboxed connection for one large sorted scan: its memory held to
    ``memory_limit``, what does not fit spilled to ``temp_directory``, its tables in
    ``database`` (a file there is stored compressed): DuckDB's own files, which no SQL on the
    connection can name. Rows come in no particular order unless sorted."""
    import duckdb  # noqa: PLC0415

    cfg = {k: v for k, v in SANDBOX_CONFIG.items() if k != "lock_configuration"}
    cfg.update(memory_limit=memory_limit, temp_directory=temp_directory, preserve_insertion_order=False,
               **({"threads": threads} if threads else {}))
    cfg["lock_configuration"] = True  # last: the settings above are taken first
    return duckdb.connect(database=database, config=cfg)


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


def reads_beyond_row(node) -> str | None:
    """What in a parsed expression reads something other than the row (a subquery, a table
    function, another table), or None."""
    if isinstance(node, dict):
        if node.get("class") == "SUBQUERY" or node.get("type") == "SUBQUERY":
            return "a subquery (SELECT ...)"
        if node.get("type") in ("TABLE_FUNCTION", "BASE_TABLE", "JOIN", "EXPRESSION_LIST"):
            return f"a table reference ({node.get('function', {}).get('function_name') or node.get('table_name') or node['type']})"
        for v in node.values():
            found = reads_beyond_row(v)
            if found:
                return found
    elif isinstance(node, list):
        for v in node:
            found = reads_beyond_row(v)
            if found:
                return found
    return None


def _parsed(sql: str, where: str) -> dict:
    tree = json.loads(sandboxed_connection().execute("SELECT json_serialize_sql(?)", [sql]).fetchall()[0][0])
    if tree.get("error"):
        raise WhereError(f"where: {tree.get('error_message', 'does not parse')}: {where!r}")
    return tree


@functools.lru_cache(maxsize=256)
def _checked(where: str) -> tuple[frozenset[str], str]:
    """(columns read, the expression's parse tree as JSON)."""
    # as a WHERE clause first: unbalanced parentheses are a syntax error there
    _parsed(f"SELECT * FROM rows WHERE {where}", where)
    # then exactly as evaluated: one CAST(...) AS k over the table rows, and nothing else
    stmts = _parsed(TEMPLATE.format(where=where), where)["statements"]
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
        raise WhereError(f"where: one boolean expression over the row's columns, not a statement: {where!r}")
    beyond = reads_beyond_row(node["select_list"])
    if beyond:
        raise WhereError(f"where: {beyond} is not allowed: the expression sees the row's columns only: {where!r}")
    return frozenset(_column_refs(node["select_list"])), json.dumps(item["child"])


def expression_columns(where: str) -> set[str]:
    """The column names a SQL boolean expression reads (parsed, not bound: no table needed).
    WhereError if it does not parse, or reads anything but the row: a subquery, a table
    function (``read_text``, ``glob``, ``range``), another table."""
    return set(_checked(where)[0])


def evaluate(where: str, rows) -> "pa.ChunkedArray":  # noqa: F821
    """``where`` over ``rows`` (boolean, null where it is null), on this thread's sandboxed
    connection: even an expression that got past ``expression_columns`` reaches no file."""
    con = sandboxed_connection()
    con.register("rows", rows)
    try:
        return con.sql(TEMPLATE.format(where=where)).to_arrow_table().column("k")
    finally:
        con.unregister("rows")


# ---------------------------------------------------------------------------------------------
# what a prefix match implies, for a scan's statistics


def _strip_casts(node: dict) -> dict:
    while node.get("class") == "CAST" and (node.get("type_expr") or {}).get("type_name", "").upper() in ("BOOLEAN", "BOOL"):
        node = node["child"]
    return node


def _prefix_match(node: dict) -> tuple[str, str] | None:
    """(column, prefix) when ``node`` is ``col LIKE 'p%...'``, ``starts_with(col, 'p')`` or
    ``prefix(col, 'p')`` with a plain ASCII prefix; else None."""
    if node.get("class") != "FUNCTION":
        return None
    name = node.get("function_name")
    args = [a.get("expression", a) for a in node.get("arguments") or node.get("children") or []]
    if name not in ("~~", "starts_with", "prefix") or len(args) != 2:
        return None
    col, const = args
    if col.get("class") != "COLUMN_REF" or const.get("class") != "CONSTANT":
        return None
    lit = const.get("literal") or const.get("value") or {}
    text = lit.get("text") if isinstance(lit, dict) else None
    if not isinstance(text, str):
        return None
    if name == "~~":
        cut = min([i for i in (text.find("%"), text.find("_"), text.find("\\")) if i >= 0], default=-1)
        if cut < 0:
            return None  # no wildcard: an equality DuckDB pushes itself
        text = text[:cut]
    if not text or not text.isascii() or not all(32 <= ord(c) < 126 for c in text):
        return None
    return col["column_names"][-1], text


def _range(col: str, prefix: str) -> str:
    hi = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    q = '"' + col.replace('"', '""') + '"'
    return f"({q} >= '{prefix.replace(chr(39), chr(39) * 2)}' AND {q} < '{hi.replace(chr(39), chr(39) * 2)}')"


def _implied(node: dict) -> str | None:
    node = _strip_casts(node)
    m = _prefix_match(node)
    if m:
        return _range(*m)
    if node.get("class") == "CONJUNCTION" and node.get("type") == "CONJUNCTION_OR":
        parts = [_implied(c) for c in node.get("children") or []]
        return "(" + " OR ".join(parts) + ")" if parts and all(parts) else None
    return None


def implied_ranges(where: str) -> list[str]:
    """Range comparisons that the top-level conjuncts of ``where`` imply (a prefix match, or an
    OR of them): ANDed to the expression they change no row's result, and a Parquet scan skips
    the row groups whose min/max lie outside them."""
    tree = _strip_casts(json.loads(_checked(where)[1]))
    conjuncts = tree.get("children", []) if tree.get("class") == "CONJUNCTION" and tree.get("type") == "CONJUNCTION_AND" \
        else [tree]
    return [r for r in (_implied(c) for c in conjuncts) if r]


# ---------------------------------------------------------------------------------------------
# what a scan's statistics cannot skip by

#: comparisons of a column with constants, which a Parquet scan checks against row-group min/max
_PRUNABLE = {"COMPARE_EQUAL", "COMPARE_LESSTHAN", "COMPARE_GREATERTHAN", "COMPARE_LESSTHANOREQUALTO",
             "COMPARE_GREATERTHANOREQUALTO", "COMPARE_IN", "COMPARE_BETWEEN", "OPERATOR_IS_NULL",
             "OPERATOR_IS_NOT_NULL"}


def _bare(node: dict) -> dict:
    while node.get("class") == "CAST":
        node = node["child"]
    return node


def _prunable(node: dict) -> str | None:
    """The column a conjunct bounds by constants (so row groups can be skipped by its
    statistics), or None: a function of the column (``lower(url) = 'x'``, a regex, ``LIKE
    '%x%'``), a negation, ``<>``, two columns compared, an OR over several columns."""
    node = _strip_casts(node)
    m = _prefix_match(node)
    if m:
        return m[0]
    if node.get("class") == "CONJUNCTION":
        cols = {_prunable(c) for c in node.get("children") or []}
        return cols.pop() if len(cols) == 1 and None not in cols else None
    if node.get("type") not in _PRUNABLE:
        return None
    kids = [_bare(k) for k in ([node.get("left"), node.get("right")] if "left" in node
                               else [node.get("input"), node.get("lower"), node.get("upper")] if "input" in node
                               else node.get("children") or []) if k]
    cols = [k for k in kids if k.get("class") == "COLUMN_REF"]
    if len(cols) != 1 or any(k.get("class") not in ("COLUMN_REF", "CONSTANT") for k in kids):
        return None
    return cols[0]["column_names"][-1]


def _sql_of(node: dict) -> str:
    stmt = json.loads(sandboxed_connection().execute("SELECT json_serialize_sql('SELECT 1 FROM rows')").fetchall()[0][0])
    stmt["statements"][0]["node"]["select_list"] = [node]
    sql = sandboxed_connection().execute("SELECT json_deserialize_sql(?::JSON)", [json.dumps(stmt)]).fetchall()[0][0]
    sql = sql.removeprefix("SELECT ").removesuffix(' FROM "rows"')
    for op, word in ((" !~~ ", " NOT LIKE "), (" ~~* ", " ILIKE "), (" ~~ ", " LIKE ")):  # DuckDB's names back
        sql = sql.replace(op, word)
    return sql


def unpushed(where: str) -> list[str]:
    """The top-level conjuncts of ``where`` that no row-group statistics can rule out (see
    ``_prunable``), as SQL: a scan reads their columns in every row group the others keep.
    Empty when every conjunct bounds a column by constants."""
    tree = _strip_casts(json.loads(_checked(where)[1]))
    conjuncts = tree.get("children", []) if tree.get("class") == "CONJUNCTION" and tree.get("type") == "CONJUNCTION_AND" \
        else [tree]
    return [_sql_of(c) for c in conjuncts if _prunable(c) is None]
