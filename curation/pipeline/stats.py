"""DuckDB over a run directory's own Parquet shards: nothing stored twice.

Views: one per stage (its committed shards), ``kept`` (the DAG's output), ``rejected`` (every
dropped row of every stage, with ``stage`` and ``reason``), ``manifest`` (one row per committed
shard per stage: rows_in, rows, rejected_rows, bytes, sha256).
"""

from __future__ import annotations

from pathlib import Path

import duckdb

from curation.pipeline.dag import Dag
from curation.pipeline.rundir import RunDir, RunNotFound  # noqa: F401  (RunNotFound: callers catch it from here)


def load_run_dag(run_dir: str | Path) -> Dag:
    return RunDir(run_dir).load_dag()


def connect(run_dir: str | Path, read_only: bool = True, views: list[str] | None = None,
            query: str | None = None) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the run's views registered (see ``RunDir.connect``):
    all of them, those named in ``views``, or those ``query`` reads."""
    rd = RunDir(run_dir)
    if query is not None:
        views = [*(views or []), *rd.views_in(query)]
    return rd.connect(views)


def stage_table(run_dir: str | Path) -> list[dict]:
    """Per node (inputs, then stages in order): docs in, kept, rejected, rows out (differs
    from kept where a row holds many documents: pack)."""
    con = connect(run_dir, views=["manifest"])
    dag = load_run_dag(run_dir)
    rows = []
    for node in list(dag.inputs) + list(dag.stages):
        if node in dag.stages and dag.stages[node].kind == "union":
            continue
        r = con.execute("select coalesce(sum(rows_in),0), coalesce(sum(rows),0), coalesce(sum(rejected_rows),0), "
                        "count(*) from manifest where stage = ?", [node]).fetchone()
        kind = "input" if node in dag.inputs else dag.stages[node].type
        docs_in, rows_out, rejected = int(r[0]), int(r[1]), int(r[2])
        # a pack stage's rows hold many documents: every document not rejected was kept
        per_row = node in dag.stages and type(dag.stages[node]).output_unit == "rows"
        rows.append({"stage": node, "type": kind, "docs_in": docs_in,
                     "kept": docs_in - rejected if per_row else rows_out,
                     "rejected": rejected, "shards": int(r[3]), "rows_out": rows_out})
    return rows


def empty_inputs(run_dir: str | Path) -> list[dict]:
    """Input files that held no document (0 documents, no rejected row: nothing to count in
    the stage table), from their manifest lines, so ``refinery stats`` names them."""
    rd, dag = RunDir(run_dir), load_run_dag(run_dir)
    return [{"input": node, "shard": key, "path": e.get("empty_file_path"), "why": e["empty_file"]}
            for node in dag.inputs for key, e in sorted(rd.entries(node).items()) if e.get("empty_file")]


def top_reasons(run_dir: str | Path, limit: int = 15) -> list[dict]:
    con = connect(run_dir, views=["rejected"])
    # reasons like minhash_dedup:cluster=123 group by their rule, not by their value
    res = con.execute(
        "select stage, split_part(reason, '=', 1) as reason, count(*) as n from rejected "
        "group by all order by n desc, stage, reason limit ?", [limit]).fetchall()
    return [{"stage": s, "reason": r, "docs": int(n)} for s, r, n in res]


def output_summary(run_dir: str | Path) -> dict:
    """Rows of the output, and text chars / tokens / sources when the output has those columns."""
    con = connect(run_dir, views=["kept"])
    cols = {r[0] for r in con.execute("describe kept").fetchall()}
    out: dict = {"rows": int(con.execute("select count(*) from kept").fetchone()[0])}
    if "text" in cols:
        out["chars"] = int(con.execute("select coalesce(sum(length(text)), 0) from kept").fetchone()[0])
    if "num_tokens" in cols:
        out["tokens"] = int(con.execute("select coalesce(sum(num_tokens), 0) from kept").fetchone()[0])
    if "input_ids" in cols and "doc_lens" in cols:  # packed rows
        out["tokens"] = int(con.execute("select coalesce(sum(list_sum(doc_lens)), 0) from kept").fetchone()[0])
    if "source" in cols:
        by_source = con.execute("select source, count(*) from kept group by 1 order by 2 desc, 1").fetchall()
        out["by_source"] = {s: int(c) for s, c in by_source}
    return out
