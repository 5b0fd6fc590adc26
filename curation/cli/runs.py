"""`refinery run`, `plan`, `status`, `stats`, `sql`, `delete`, `warmup`, `ablate`: running DAGs and
reading their run directories."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from curation.cli.app import app, console, err, fail, mib


@app.command()
def run(
    dag: Path = typer.Argument(..., help="pipeline DAG (YAML)"),
    out: str = typer.Option(..., "--out", "-o", help="run directory: a local folder or a URL (s3://bucket/runs/x)"),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", min=1,
                                          help="tasks in flight (default: every CPU Ray reports: this machine's, or the cluster's)"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster, e.g. ray://head:10001 or auto"),
    overwrite: bool = typer.Option(False, "--overwrite", help="reuse a run directory of another DAG"),
    quiet: bool = typer.Option(False, "--quiet", "-q"),
    stage_modules: Optional[str] = typer.Option(
        None, "--stage-modules", help="only `type: module:Class` stages from these module prefixes (comma separated; "
                                      "'' for built-in stages only), in this DAG and in every run it reads; nothing is "
                                      "added to sys.path. Default: $REFINERY_STAGE_MODULES if set (even empty), else any"),
) -> None:
    """Run (or resume) a pipeline DAG into a run directory."""
    from curation.pipeline.dag import STAGE_MODULES_ENV, DagError, load_dag, parse_stage_modules
    from curation.pipeline.executor import RunDirError, RunFailed, make_plan, run_dag
    from curation.io.inputs import InputError

    # The allow-list is the process's (the environment), so Ray workers started from here, and
    # every DAG parsed here (upstream runs' dag.yaml too), are held to it.
    try:
        if stage_modules is not None:
            os.environ[STAGE_MODULES_ENV] = ",".join(parse_stage_modules(stage_modules))
        elif STAGE_MODULES_ENV in os.environ:
            parse_stage_modules(os.environ[STAGE_MODULES_ENV])
    except ValueError as e:
        fail(f"--stage-modules / ${STAGE_MODULES_ENV}: {e}")
    try:
        d = load_dag(dag)
        make_plan(d)  # validates input paths before Ray starts
    except (DagError, InputError) as e:
        fail(str(e) if isinstance(e, DagError) else f"{dag}: {e}")
    try:
        state = run_dag(d, out, workers=workers, address=address, overwrite=overwrite, quiet=quiet)
    except RunDirError as e:
        fail(str(e))
    except RunFailed as e:
        fail(str(e), 1)
    if not quiet:
        s = state["stages"]
        console.print(f"[green]done[/] {d.name} -> {out}  ({sum(v['shards'] for v in s.values())} shard writes)")


@app.command()
def stats(run_dir: str = typer.Argument(..., help="run directory (local or s3://...)")) -> None:
    """Per-stage documents in / kept / rejected, top drop reasons, output summary."""
    from curation.pipeline.stats import RunNotFound, empty_inputs, output_summary, stage_table, top_reasons

    try:
        rows = stage_table(run_dir)
    except RunNotFound as e:
        fail(str(e))
    t = Table(title=f"{run_dir}")
    packed = any(r["rows_out"] != r["kept"] for r in rows)  # rows that hold many documents
    cols = ("stage", "type", "shards", "docs in", "kept", "rejected", "kept %") + (("rows out",) if packed else ())
    for c in cols:
        t.add_column(c, justify="right" if c not in ("stage", "type") else "left")
    for r in rows:
        pct = f"{100 * r['kept'] / r['docs_in']:.1f}" if r["docs_in"] else "-"
        cells = [r["stage"], r["type"], str(r["shards"]), str(r["docs_in"]), str(r["kept"]), str(r["rejected"]), pct]
        t.add_row(*cells, *((str(r["rows_out"]),) if packed else ()))
    console.print(t)
    empty = empty_inputs(run_dir)
    if empty:  # 0 documents each: absent from the table's counts, named here so none is lost silently
        console.print(f"empty input files ({len(empty)}, 0 documents): "
                      + ", ".join(f"{e['input']}/{e['shard']} = {e['path']} ({e['why']})" for e in empty),
                      markup=False, soft_wrap=True)
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
    _print_decontam_reports(run_dir)


def _print_decontam_reports(run_dir: str, top: int = 10) -> None:
    """Per benchmark of every ``decontaminate`` stage: items, leaked items, contaminated
    documents, and the most widespread leaks with their matched span."""
    from curation.pipeline.rundir import RunDir
    from curation.stages.decontaminate import REPORT

    rd = RunDir(run_dir)
    for name, st in rd.load_dag().stages.items():
        rep = rd.read_report(name, REPORT) if st.type == "decontaminate" else None
        if not rep:
            continue
        t = Table(title=f"{name}: decontamination ({rep['mode']}, {rep['ngram']}-grams), "
                        f"{rep['contaminated_documents']} of {rep['documents']} documents contaminated")
        for c in ("benchmark", "items", "too short", "leaked items", "documents"):
            t.add_column(c, justify="left" if c == "benchmark" else "right")
        for b in rep["benchmarks"]:
            t.add_row(b["benchmark"], str(b["items"]), str(b["items_too_short"]), str(b["leaked_items"]),
                      str(b["contaminated_documents"]))
        console.print(t)
        leaks = sorted((x for b in rep["benchmarks"] for x in b["leaks"]), key=lambda x: -x["documents"])[:top]
        if leaks:
            t2 = Table(title=f"{name}: most widespread leaks")
            for c in ("benchmark", "item", "documents", "coverage", "matched span (example)"):
                t2.add_column(c)
            for x in leaks:
                span = " ".join(x["span"].split())
                t2.add_row(x["benchmark"], x["item"], str(x["documents"]), f"{x['max_coverage']:.2f}",
                           span[:80] + ("…" if len(span) > 80 else ""))
            console.print(t2)


@app.command()
def status(run_dir: str = typer.Argument(..., help="run directory (local or s3://...)"),
           watch: bool = typer.Option(False, "--watch", "-w", help="refresh until the run ends"),
           interval: float = typer.Option(2.0, "--interval", help="seconds between refreshes with --watch"),
           as_json: bool = typer.Option(False, "--json", help="print progress.json as it is")) -> None:
    """A run's live progress: per phase shards done, documents and bytes per second (overall and
    the last minute), ETA, tasks per node, and the slowest running tasks (stragglers)."""
    import json
    import time

    from curation.io import location
    from curation.pipeline.progress import render_status
    from curation.pipeline.rundir import RunDir

    path = RunDir(run_dir).progress_file

    def read() -> dict:
        try:
            return json.loads(location.read_text(path))
        except (OSError, ValueError):
            fail(f"{run_dir}: no progress.json (not a run directory, or the run has not started)")

    if as_json:
        print(json.dumps(read(), indent=1))
        return
    if not watch:
        console.print(render_status(read()))
        return
    from rich.live import Live

    if not location.exists(path):  # --watch started beside `refinery run`: wait for the run to begin
        err.print(f"[refinery status] waiting for {path} ...", highlight=False)
        while not location.exists(path):
            time.sleep(interval)
    with Live(render_status(read()), console=console, refresh_per_second=4) as live:
        while True:
            prog = read()
            live.update(render_status(prog))
            if prog.get("state") != "running":
                break
            time.sleep(interval)


@app.command()
def sql(run_dir: str = typer.Argument(..., help="run directory (local or s3://...)"),
        query: str = typer.Argument(..., help="SQL over views: kept, rejected, manifest, <stage>")) -> None:
    """Run a DuckDB query over a run's shards."""
    import duckdb

    from curation.pipeline.stats import RunNotFound, connect

    try:
        con = connect(run_dir, query=query)  # only the views the query reads
        cur = con.execute(query)
    except RunNotFound as e:
        fail(str(e))
    except duckdb.Error as e:
        fail(f"query failed: {e}")
    cols = [d[0] for d in cur.description]
    t = Table(*cols)
    for row in cur.fetchall():
        t.add_row(*["" if v is None else str(v) for v in row])
    console.print(t)


@app.command()
def delete(
    run: str = typer.Argument(..., help="a run id (with --service) or a run directory"),
    service: Optional[str] = typer.Option(None, "--service", envvar="REFINERY_SERVICE",
                                          help="the service's URL (http://127.0.0.1:8080): delete the run through "
                                               "it, as DELETE /runs/ID does; default: RUN is a local run directory"),
    token_file: Optional[Path] = typer.Option(None, "--token-file",
                                              help="file holding the service's token (default: $REFINERY_TOKEN)"),
) -> None:
    """Delete a done, failed or cancelled run and its directory: through the service (its rules:
    not a queued or running run, not one another active run reads), or a local run directory
    (a service's runs directory only while no service manages it)."""
    if service:
        from urllib.parse import quote

        import httpx

        from curation.service.auth import TokenError, load_token

        try:
            token = load_token(token_file)
        except TokenError as e:
            fail(str(e))
        try:
            r = httpx.delete(f"{service.rstrip('/')}/runs/{quote(run, safe='')}", headers={"Authorization": f"Bearer {token}"},
                             timeout=60)
        except httpx.HTTPError as e:
            fail(f"{service}: {type(e).__name__}: {e}", 1)
        try:
            detail = r.json().get("detail") if r.status_code != 200 else None
        except ValueError:
            detail = r.text[:300]
        if r.status_code != 200:
            fail(f"{run}: HTTP {r.status_code}: {detail}", 1)
        console.print(f"[green]deleted[/] {run} ({r.json().get('state')})")
        return
    from curation.service.runs import RunConflict, RunMissing, RunsDirBusy, delete_local

    try:
        out = delete_local(run)
    except RunMissing:
        fail(f"{run}: not a run directory (a run id needs --service URL)", 1)
    except RunsDirBusy as e:
        fail(f"{e}; delete the run through it: refinery delete ID --service URL", 1)
    except RunConflict as e:
        fail(str(e), 1)
    console.print(f"[green]deleted[/] {run} ({out['state']})")


@app.command()
def warmup() -> None:
    """Compile the numba kernels once into their on-disk cache (make setup and the Docker
    images run this), so the first run's workers do not each compile them."""
    from curation.pipeline.warmup import cache_location, warm_kernels

    took = warm_kernels()
    print(f"[refinery warmup] kernels ready in {cache_location()}: "
          + ", ".join(f"{k} {v:.1f}s" for k, v in took.items()))


@app.command()
def ablate(
    config: Path = typer.Argument(..., help="ablation config (YAML): arms, eval set, model, tokens, seeds"),
    out: Path = typer.Option(..., "--out", "-o", help="output directory (arms, packed data, runs, report)"),
    workers: int = typer.Option(2, "--workers", "-w", min=1),
) -> None:
    """Train the same small model on each arm's DAG output; compare held-out loss per token."""
    from curation.experiments.ablate import ablate as run_ablation
    from curation.pipeline.dag import DagError

    try:
        report = run_ablation(str(config), str(out), workers=workers)
    except (DagError, ValueError, FileNotFoundError) as e:
        fail(str(e))
    console.print((out / "report.md").read_text(), markup=False, highlight=False)
    console.print(f"report: {out}/report.md, {out}/eval_loss.png ({len(report.get('arms', {}))} arms)")


def _core_hours(h: float) -> str:
    return f"{h:,.1f} core-hours" if h >= 10 else f"{h:,.3g} core-hours ({h * 3600:,.1f} core-seconds)"


@app.command()
def plan(
    dag: Path = typer.Argument(..., help="pipeline DAG (YAML)"),
    docs_per_core_s: Optional[float] = typer.Option(
        None, "--docs-per-core-s", min=0.001,
        help="documents per second per core of your DAG (default: the web DAG's, measured by bench_scale.py --index)"),
    files: int = typer.Option(20, "--files", min=0, help="WARC files listed per index input (largest reads first)"),
    json_out: Optional[Path] = typer.Option(None, "--json", help="write the whole plan (every WARC file) here"),
) -> None:
    """What a DAG will read before it runs: for an index input (format: cc_index) the records and
    bytes it selects, per WARC file and in total, and the projected core-hours; nothing is read but
    the index."""
    import json

    from curation.io.inputs import InputError
    from curation.pipeline.dag import DagError, load_dag
    from curation.pipeline.estimate import DEFAULT_DOCS_PER_CORE_S, estimate

    rate = docs_per_core_s or DEFAULT_DOCS_PER_CORE_S
    try:
        est = estimate(load_dag(dag), rate)
    except (DagError, InputError) as e:
        fail(str(e) if isinstance(e, DagError) else f"{dag}: {e}")
    for name, v in est["inputs"].items():
        if v["format"] != "cc_index":
            if "files" in v:
                console.print(f"[bold]{name}[/] ({v['format']}): {v['files']:,} files, {mib(v['bytes'])}, "
                              f"{v['tasks']:,} tasks (read whole)")
            else:
                console.print(f"[bold]{name}[/] ({v['format']}): {v['note']}")
            continue
        ix = v["index"]
        console.print(f"[bold]{name}[/] (cc_index, where {v['where']!r}): {v['records']:,} records, "
                      f"{mib(v['bytes'])} in {v['warc_files']:,} WARC files, {v['tasks']:,} tasks; "
                      f"{v['bytes_per_record']:,.0f} bytes a record", highlight=False)
        console.print(f"  index: {ix['files']:,} files of {mib(ix['bytes'])}, {mib(ix['bytes_read'])} read by the "
                      f"selection in {ix['seconds']:.2f} s", highlight=False)
        if ix.get("not_pushed"):
            console.print("  not pushed to row-group statistics (read in every row group): "
                          + "; ".join(ix["not_pushed"]), highlight=False)
        console.print(f"  projected: {_core_hours(v['core_hours'])} at {rate:,.1f} documents/s/core", highlight=False)
        if files and v["per_file"]:
            t = Table(title=f"{name}: WARC files by bytes to read" + (f" (top {files} of {v['warc_files']:,})"
                                                                    if v["warc_files"] > files else ""))
            for c in ("warc_filename", "records", "bytes"):
                t.add_column(c, justify="left" if c == "warc_filename" else "right")
            for row in v["per_file"][:files]:
                t.add_row(row["warc_filename"], f"{row['records']:,}", f"{row['bytes']:,}")
            console.print(t)
    if "total" in est:
        tot = est["total"]
        console.print(f"[bold]total[/]: {tot['records']:,} records, {mib(tot['bytes'])}, "
                      f"{_core_hours(tot['core_hours'])} at {rate:,.1f} documents/s/core", highlight=False)
    if json_out:
        json_out.write_text(json.dumps(est, indent=1))
