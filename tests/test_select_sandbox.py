"""A ``select``'s ``where`` sees the batch's columns and nothing else (issue #52, review
security-s4 findings 1, 5 and 10): expressions that read files are refused when the DAG is
validated, and even one that skips validation cannot reach a file; threads evaluating at once
never share a connection; ``/`` in an expression is just division."""

from __future__ import annotations

import threading

import duckdb
import pyarrow as pa
import pytest

from curation.pipeline.dag import DagError, parse_dag
from curation.stages.select import Select, SelectError, evaluate, expression_columns

#: the review's exploit: a subquery over a file function, the path spelled with chr(47)
READ_HOSTNAME = ("error((SELECT text FROM read_text(chr(47)||'etc'||chr(47)||'hostname') t(url, text))) IS NULL")
HOSTILE = [
    READ_HOSTNAME,
    "(SELECT count(*) FROM glob(chr(47)||'*')) > 0",
    "(SELECT count(*) FROM read_text(chr(47)||'proc'||chr(47)||'self'||chr(47)||'environ')) = 1",
    "EXISTS (SELECT 1 FROM range(1000000000000))",
    "text IN (SELECT text FROM read_csv('x'))",
    "(SELECT 1 FROM duckdb_settings() LIMIT 1) = 1",
    "true) AS k FROM rows, read_text('x') --",
    "true; SELECT * FROM read_text('x')",
]


def _dag(where: str) -> dict:
    return {"name": "sandbox", "inputs": {"docs": {"format": "jsonl", "paths": ["x.jsonl"], "source": "web"}},
            "stages": {"sel": {"type": "select", "where": where}}}


@pytest.mark.parametrize("where", HOSTILE)
def test_expressions_reading_beyond_the_row_are_refused_at_validation(where):
    with pytest.raises(DagError, match=r"stages\.sel\.where: "):
        parse_dag(_dag(where))


def test_the_refusal_says_why():
    with pytest.raises(SelectError, match=r"a subquery \(SELECT \.\.\.\) is not allowed: the expression sees the "
                                          r"row's columns only"):
        expression_columns(READ_HOSTNAME)


def test_a_file_read_that_skips_validation_fails_with_a_permission_error():
    rows = pa.table({"url": ["u"], "text": ["t"]})
    with pytest.raises(duckdb.PermissionException, match="disabled by configuration"):
        evaluate(READ_HOSTNAME, rows)
    with pytest.raises(duckdb.PermissionException):
        evaluate("(SELECT count(*) FROM glob(chr(47)||'*')) > 0", rows)
    # a stage built without validation is checked again when it runs
    sel = Select.model_construct(type="select", where=READ_HOSTNAME, name="sel", input="docs")
    with pytest.raises(SelectError, match="subquery"):
        sel.process(rows)


def test_the_sandbox_cannot_be_switched_off_from_an_expression():
    rows = pa.table({"text": ["t"]})
    with pytest.raises(duckdb.Error, match="locked"):
        evaluate("true) AS k FROM rows; SET enable_external_access = true; SELECT (true", rows)


@pytest.mark.parametrize("where, columns", [
    ("length(text) / 2 > 10", {"text"}),
    (r"regexp_matches(url, '^https?://[^/]*\.xxx(?:[:/]|$)')", {"url"}),
    ("url LIKE 'https://example.com/%' AND lang = 'en'", {"url", "lang"}),
    ("list_contains(['a', 'b'], lang)", {"lang"}),
])
def test_slashes_and_urls_in_an_expression_are_data(where, columns):
    assert expression_columns(where) == columns
    if "lang" not in columns:  # the input's rows have text and url, not lang
        assert parse_dag(_dag(where)).stages["sel"].where == where


def test_division_keeps_the_right_rows():
    batch = pa.table({"id": ["a", "b"], "text": ["short", "x" * 30]})
    res = Select(where="length(text) / 2 > 10", name="s", input="docs").process(batch)
    assert res.reasons.to_pylist() == ["select:s", None]


def test_threads_evaluating_at_once_get_no_errors():
    """Finding 5: every thread has its own connection (one shared connection answered
    'connection is busy' or handed a thread another thread's result)."""
    errors: list[BaseException] = []
    wrong = []
    batch = pa.table({"id": [str(i) for i in range(500)], "n": list(range(500)), "text": ["t"] * 500})
    start = threading.Barrier(8)

    def work(t: int) -> None:
        start.wait()
        for i in range(40):
            try:
                k = (t * 40 + i) % 500
                where = f"n >= {k} AND length(text) / 1 = {1 + t * 0}"
                expression_columns(where + f" AND {i} = {i}")  # distinct texts: parsed, not cached
                kept = Select(where=where, name="s", input="docs").process(batch).reasons.null_count
                if kept != 500 - k:
                    wrong.append((t, i, kept))
            except BaseException as e:  # noqa: BLE001 (any error counts)
                errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    assert not wrong, wrong[:3]
