"""DuckDB over a run directory's own Parquet shards: nothing stored twice.

Views: one per stage (its committed shards), ``kept`` (the DAG's output), ``rejected`` (every
dropped row of every stage, with ``stage`` and ``reason``), ``manifest`` (one row per committed
shard per stage: rows_in, rows, rejected_rows, bytes, sha256).
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import yaml

from curation.pipeline.dag import Dag, parse_dag
from curation.io.shards import Manifest


class RunNotFound(FileNotFoundError):
    """A path that is not a refinery run directory (no dag.yaml)."""


def load_run_dag(run_dir: str | Path) -> Dag:
    p = Path(run_dir) / "dag.yaml"
    if not p.exists():
        raise RunNotFound(f"{run_dir}: not a refinery run directory (no dag.yaml)")
    return parse_dag(yaml.safe_load(p.read_text()), str(p))


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


def connect(run_dir: str | Path, read_only: bool = True) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB connection with the run's views registered."""
    run_dir = Path(run_dir).resolve()
    dag = load_run_dag(run_dir)
    hashes = dag.hashes()
    con = duckdb.connect(":memory:")
    files: dict[str, list[str]] = {}
    rejected: list[str] = []
    manifest_rows: list[str] = []
    for node in list(dag.inputs) + list(dag.stages):
        if node in dag.stages and dag.stages[node].kind == "union":
            continue
        done = Manifest(run_dir, node).done(hashes[node])
        files[node] = [str(run_dir / e["file"]) for k, e in sorted(done.items()) if e.get("file")]
        rejected += [str(run_dir / e["rejected_file"]) for k, e in sorted(done.items()) if e.get("rejected_file")]
        for k, e in sorted(done.items()):
            manifest_rows.append(
                f"({_q(node)}, {_q(k)}, {int(e.get('rows_in', 0))}, {int(e.get('rows', 0))}, "
                f"{int(e.get('rejected_rows', 0))}, {int(e.get('bytes', 0))}, {_q(e.get('sha256') or '')})")
    for node, st in dag.stages.items():  # unions: their upstreams' files
        if st.kind == "union":
            files[node] = sorted(f for u in _leaves(dag, node) for f in files.get(u, []))

    def view(name: str, paths: list[str], empty_sql: str) -> None:
        if paths:
            lst = "[" + ", ".join(_q(p) for p in paths) + "]"
            con.execute(f"create view {_ident(name)} as select * from read_parquet({lst}, union_by_name=true)")
        else:
            con.execute(f"create view {_ident(name)} as {empty_sql}")

    empty_docs = "select null::varchar as id, null::varchar as text, null::varchar as source where false"
    for node, paths in files.items():
        if paths or node in dag.stages:
            view(node, paths, empty_docs)
    view("kept", files.get(dag.output, []), empty_docs)
    view("rejected", rejected,
         "select null::varchar as id, null::varchar as source, null::varchar as stage, null::varchar as reason where false")
    values = ", ".join(manifest_rows) or "(null, null, 0, 0, 0, 0, null)"
    con.execute("create view manifest as select * from (values " + values +
                ") t(stage, shard, rows_in, rows, rejected_rows, bytes, sha256) where stage is not null")
    return con


def _leaves(dag: Dag, node: str) -> list[str]:
    st = dag.stages.get(node)
    if st is None or st.kind != "union":
        return [node]
    return [leaf for u in st.upstreams() for leaf in _leaves(dag, u)]


def stage_table(run_dir: str | Path) -> list[dict]:
    """Per node (inputs, then stages in order): docs in, kept, rejected, rows out (differs
    from kept where a row holds many documents: pack)."""
    con = connect(run_dir)
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


def top_reasons(run_dir: str | Path, limit: int = 15) -> list[dict]:
    con = connect(run_dir)
    # reasons like minhash_dedup:cluster=123 group by their rule, not by their value
    res = con.execute(
        "select stage, split_part(reason, '=', 1) as reason, count(*) as n from rejected "
        "group by all order by n desc, stage, reason limit ?", [limit]).fetchall()
    return [{"stage": s, "reason": r, "docs": int(n)} for s, r, n in res]


def output_summary(run_dir: str | Path) -> dict:
    """Rows of the output, and text chars / tokens / sources when the output has those columns."""
    con = connect(run_dir)
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
