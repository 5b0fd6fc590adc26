"""Read-only SQL over one run directory, safe to expose over HTTP.

Three layers, each sufficient against a different mistake in the others:

1. the text must be exactly one ``SELECT`` statement (DuckDB's own parser decides, via
   ``duckdb.extract_statements``), so COPY / ATTACH / INSTALL / LOAD / CREATE / PRAGMA / SET /
   EXPORT / CALL never reach execution;
2. the connection is locked down after the run's views are registered: no external access
   except the run directory (``allowed_directories``), no extension auto-install, no spilling
   to a temp directory, and ``lock_configuration`` so a query cannot undo any of it. DuckDB
   checks file table functions (``read_csv('/etc/passwd')``, ``glob``, ``read_text``) against
   that list after resolving ``..`` and symlinks;
3. resources are bounded: one thread and a memory cap per query, a row limit, cells cut inside
   the query (``left(CAST(x AS VARCHAR), N)``, so a 10 MB string never reaches Python), rows
   fetched in small batches up to a byte budget, and a wall-clock limit enforced by
   interrupting the connection from a timer.

DuckDB's ``memory_limit`` covers its buffer manager only (a string or list built by a scalar
function is outside it) and its interrupt is checked between chunks only (one row of scalar
work runs on): the service therefore runs each query in a child process the kernel holds to
a memory cap and the service kills at its deadline (``curation.service.sql_box``).
"""

from __future__ import annotations

import datetime as _dt
import decimal
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import duckdb

from curation.pipeline.stats import connect


class SqlRejected(ValueError):
    """A query the service will not run; ``status`` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def check_select(query: str) -> str:
    """The query if it is exactly one SELECT statement; raises SqlRejected otherwise."""
    if not query or not query.strip():
        raise SqlRejected("q: empty query")
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.Error as e:
        raise SqlRejected(f"q: {str(e).splitlines()[0]}") from None
    if len(statements) != 1:
        raise SqlRejected(f"q: exactly one statement allowed, got {len(statements)}")
    st = statements[0]
    if st.type != duckdb.StatementType.SELECT:
        kind = str(st.type).rsplit(".", 1)[-1]
        raise SqlRejected(f"q: only read-only SELECT queries are allowed (got a {kind} statement)", 403)
    return query


def locked_connection(run_dir: str | Path, memory_limit: str = "512MB",
                      query: str | None = None) -> duckdb.DuckDBPyConnection:
    """``curation.pipeline.stats.connect`` (the views ``query`` reads; all without a query) with
    the file system closed to everything but the run."""
    run_dir = Path(run_dir).resolve()
    con = connect(run_dir, query=query)
    con.execute("set threads = 1")
    con.execute("set enable_progress_bar = false")  # it would print to the service's log
    con.execute(f"set memory_limit = '{memory_limit}'")
    con.execute("set temp_directory = ''")  # a temp dir would otherwise be readable too
    con.execute("set autoinstall_known_extensions = false")
    con.execute("set autoload_known_extensions = false")
    con.execute("set allowed_directories = [?]", [str(run_dir) + "/"])
    con.execute("set enable_external_access = false")
    con.execute("set lock_configuration = true")
    return con


@dataclass
class QueryResult:
    """Columns, rows (JSON-ready), whether the row limit cut the result, and time taken."""

    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool
    elapsed_s: float
    truncated_cells: int = 0
    limit: int = 0


def _jsonable(v: Any, max_chars: int, cut: list[int]) -> Any:
    if v is None or isinstance(v, (bool, int, float)):
        return v
    if isinstance(v, str):
        if len(v) > max_chars:
            cut[0] += 1
            return v[:max_chars] + "…"
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x, max_chars, cut) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x, max_chars, cut) for k, x in v.items()}
    if isinstance(v, (bytes, bytearray, memoryview)):
        return _jsonable(bytes(v).hex(), max_chars, cut)
    if isinstance(v, (_dt.date, _dt.datetime, _dt.time)):
        return v.isoformat()
    if isinstance(v, (decimal.Decimal, uuid.UUID, _dt.timedelta)):
        return str(v)
    return str(v)


_KEEP_TYPES = ("BOOLEAN", "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT",
               "UINTEGER", "UBIGINT", "UHUGEINT", "FLOAT", "DOUBLE", "DATE", "TIME", "TIMESTAMP",
               "TIMESTAMP WITH TIME ZONE", "INTERVAL", "UUID", "NULL")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _cut_query(query: str, columns: list[str], types: list[str], max_cell_chars: int) -> str:
    """The query with every column of unbounded size cut to ``max_cell_chars + 1`` characters
    inside DuckDB (the extra character tells a cut cell apart). Nested and binary values become
    their text form; fixed-size values are left as they are."""
    cols = []
    for i, (name, typ) in enumerate(zip(columns, types)):
        ref = f"#{i + 1}"
        if typ in _KEEP_TYPES or typ.startswith("DECIMAL"):
            cols.append(f"{ref} AS {_quote(name)}")
        else:
            cols.append(f"left(CAST({ref} AS VARCHAR), {max_cell_chars + 1}) AS {_quote(name)}")
    return f"SELECT {', '.join(cols)} FROM ({query}) AS q"


def _approx_bytes(v: Any) -> int:
    if isinstance(v, str):
        return len(v) + 2
    return 8


def run_select(run_dir: str | Path, query: str, max_rows: int = 1000, timeout_s: float = 10.0,
               max_cell_chars: int = 10_000, memory_limit: str = "512MB",
               max_bytes: int = 4 << 20, before_query: Callable[[], None] | None = None) -> QueryResult:
    """Run one checked SELECT over the run, at most ``max_rows`` rows and about ``max_bytes``
    of cell text, within ``timeout_s``. Either limit sets ``truncated``. ``before_query``: called
    once the run's views exist, just before the client's query runs (the box caps the process's
    memory there)."""
    check_select(query)
    con = locked_connection(run_dir, memory_limit, query)
    if before_query is not None:
        before_query()
    timed_out = threading.Event()

    def interrupt() -> None:
        timed_out.set()
        con.interrupt()

    timer = threading.Timer(timeout_s, interrupt)
    t0 = time.perf_counter()
    timer.start()
    try:
        # A relation is lazy: the LIMIT is pushed into the plan, so a huge result is never built.
        rel = con.sql(query)
        if rel is None:
            raise SqlRejected("q: the statement returns no rows")
        columns, types = list(rel.columns), [str(t) for t in rel.types]
        # positional references (#1): the query's column names may repeat or be empty
        con.execute(f"{_cut_query(query, columns, types, max_cell_chars)} LIMIT {max_rows + 1}")
        rows, size, over_budget = [], 0, False
        batch = max(1, min(256, max_bytes // max(1, len(columns) * (max_cell_chars + 2))))
        while len(rows) <= max_rows and not over_budget:
            chunk = con.fetchmany(batch)
            if not chunk:
                break
            for r in chunk:
                size += sum(_approx_bytes(v) for v in r)
                if size > max_bytes and rows:
                    over_budget = True
                    break
                rows.append(r)
    except duckdb.InterruptException:
        raise SqlRejected(f"q: query exceeded the {timeout_s:g} s time limit", 408) from None
    except (duckdb.OutOfMemoryException, MemoryError):
        raise SqlRejected(f"q: query needed more memory than a /sql query may use ({memory_limit})", 413) from None
    except duckdb.PermissionException as e:
        raise SqlRejected(f"q: {str(e).splitlines()[0]} (only the run's own files can be read)", 403) from None
    except duckdb.Error as e:
        if timed_out.is_set():
            raise SqlRejected(f"q: query exceeded the {timeout_s:g} s time limit", 408) from None
        raise SqlRejected(f"q: {str(e).splitlines()[0]}") from None
    finally:
        timer.cancel()
        elapsed = time.perf_counter() - t0
        con.close()
    cut = [0]
    out = [[_jsonable(v, max_cell_chars, cut) for v in r] for r in rows[:max_rows]]
    return QueryResult(columns, types, out, len(rows) > max_rows or over_budget, round(elapsed, 4), cut[0], max_rows)
