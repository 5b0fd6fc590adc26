"""The `refinery` command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="refinery: raw crawl dumps in, training-ready token shards out.")
console = Console()
err = Console(stderr=True)


def _fail(msg: str, code: int = 2) -> None:
    err.print(f"[bold red]error:[/] {msg}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


@app.command()
def run(
    dag: Path = typer.Argument(..., help="pipeline DAG (YAML)"),
    out: Path = typer.Option(..., "--out", "-o", help="run directory"),
    workers: int = typer.Option(2, "--workers", "-w", min=1, help="parallel tasks (embedded Ray CPUs)"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster, e.g. ray://head:10001 or auto"),
    overwrite: bool = typer.Option(False, "--overwrite", help="reuse a run directory of another DAG"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
) -> None:
    """Run (or resume) a pipeline DAG into a run directory."""
    from curation.dag import DagError, load_dag
    from curation.executor import RunDirError, RunFailed, make_plan, run_dag
    from curation.io.inputs import InputError

    try:
        d = load_dag(dag)
        make_plan(d)  # validates input paths before Ray starts
    except (DagError, InputError) as e:
        _fail(str(e) if isinstance(e, DagError) else f"{dag}: {e}")
    try:
        state = run_dag(d, out, workers=workers, address=address, overwrite=overwrite, quiet=quiet)
    except RunDirError as e:
        _fail(str(e))
    except RunFailed as e:
        _fail(str(e), 1)
    if not quiet:
        s = state["stages"]
        console.print(f"[green]done[/] {d.name} -> {out}  ({sum(v['shards'] for v in s.values())} shard writes)")


@app.command()
def stats(run_dir: Path = typer.Argument(..., help="run directory")) -> None:
    """Per-stage documents in / kept / rejected, top drop reasons, output summary."""
    from curation.stats import RunNotFound, output_summary, stage_table, top_reasons

    try:
        rows = stage_table(run_dir)
    except RunNotFound as e:
        _fail(str(e))
    t = Table(title=f"{run_dir}")
    for c in ("stage", "type", "shards", "docs in", "kept", "rejected", "kept %"):
        t.add_column(c, justify="right" if c not in ("stage", "type") else "left")
    for r in rows:
        pct = f"{100 * r['kept'] / r['docs_in']:.1f}" if r["docs_in"] else "-"
        t.add_row(r["stage"], r["type"], str(r["shards"]), str(r["docs_in"]), str(r["kept"]), str(r["rejected"]), pct)
    console.print(t)
    reasons = top_reasons(run_dir)
    if reasons:
        t2 = Table(title="top drop reasons")
        for c in ("stage", "reason", "docs"):
            t2.add_column(c)
        for r in reasons:
            t2.add_row(r["stage"], r["reason"], str(r["docs"]))
        console.print(t2)
    summary = output_summary(run_dir)
    console.print(f"output: {summary}")


@app.command()
def sql(run_dir: Path = typer.Argument(..., help="run directory"),
        query: str = typer.Argument(..., help="SQL over views: kept, rejected, manifest, <stage>")) -> None:
    """Run a DuckDB query over a run's shards."""
    import duckdb

    from curation.stats import RunNotFound, connect

    try:
        con = connect(run_dir)
        cur = con.execute(query)
    except RunNotFound as e:
        _fail(str(e))
    except duckdb.Error as e:
        _fail(f"query failed: {e}")
    cols = [d[0] for d in cur.description]
    t = Table(*cols)
    for row in cur.fetchall():
        t.add_row(*["" if v is None else str(v) for v in row])
    console.print(t)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
