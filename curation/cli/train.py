"""`refinery train` and `refinery trace`: the trainer, and the documents behind its steps."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from curation.cli.app import app, console, fail


@app.command(context_settings={"allow_extra_args": False})
def train(
    config: Path = typer.Argument(..., help="trainer config (YAML)"),
    resume: Optional[str] = typer.Option(None, "--resume", help="'auto' (default), 'never', or a checkpoint path"),
    anneal_from: Optional[str] = typer.Option(None, "--anneal-from", help="branch an annealing phase from this checkpoint"),
    mix: Optional[str] = typer.Option(None, "--mix", help="annealing mix, e.g. web=0.3,math=0.7"),
    override: list[str] = typer.Option([], "--set", help="override a config value, e.g. --set optim.lr=1e-3"),
    peak_flops: Optional[float] = typer.Option(None, "--peak-flops",
                                               help="peak FLOP/s of one device for MFU, e.g. 989e12 (default: table by GPU name; none on CPU)"),
) -> None:
    """Train a model on packed shards (one process; use torchrun -m training for many)."""
    from training.train import main as train_main

    if peak_flops is not None:
        override = [*override, f"metrics.peak_flops={peak_flops}"]
    code = train_main(str(config), resume=resume, overrides=override, anneal_from=anneal_from, mix=mix)
    if code:
        raise typer.Exit(code)


_TRACE_SIGNALS = ("quality", "gopher_", "c4_", "fineweb_", "lang")


def _trace_join(documents: list[dict], runs: list[Path]) -> None:
    """Fill each traced document (in place) with source, url, token count and curation signals
    from the runs' DuckDB views (``RunDir.connect``): every node with an ``id`` column,
    downstream first, so the stage that recorded the most signals wins. A document id may carry
    the input name a pack run read it under (``web/ccnet/...#8`` for ``ccnet/...#8``)."""
    from curation.pipeline.rundir import RunDir

    for d in documents:
        d.setdefault("signals", {})
    for run in runs:
        rd = RunDir(run)
        dag = rd.load_dag()
        con = rd.connect()
        con.execute("create temp table want (doc varchar, key varchar)")
        con.executemany("insert into want values (?, ?)",
                        [(d["id"], k) for d in documents for k in {d["id"], d["id"].split("/", 1)[-1]}])
        found: set[str] = set()
        for node in [*reversed(list(dag.stages)), *dag.inputs]:
            try:
                cols = [c[0] for c in con.execute(f'select * from "{node}" limit 0').description]
            except Exception:  # noqa: BLE001 - a node without a view (nothing committed)
                continue
            if "id" not in cols or "doc_ids" in cols:
                continue
            pick = [c for c in cols if c in ("source", "url", "num_tokens") or c.startswith(_TRACE_SIGNALS)]
            sel = ", ".join(f't."{c}"' for c in pick)
            rows = con.execute(f'select w.doc{", " + sel if sel else ""} from "{node}" t join want w on t.id = w.key '
                               "where w.doc not in (select unnest(?::varchar[]))", [sorted(found)]).fetchall()
            by_id = {r[0]: dict(zip(pick, r[1:])) for r in rows}
            for d in documents:
                got = by_id.get(d["id"])
                if got is None:
                    continue
                found.add(d["id"])
                d.setdefault("found_in", f"{run}/{node}")
                for c, v in got.items():
                    if v is None:
                        continue
                    if c.startswith(_TRACE_SIGNALS):
                        d["signals"].setdefault(c, v)
                    else:
                        d.setdefault(c, v)


def _trace_signals_text(signals: dict) -> str:
    groups: dict[str, list[str]] = {}
    for k, v in signals.items():
        group, _, name = k.partition("_") if k.startswith(("gopher_", "c4_", "fineweb_")) else ("", "", k)
        if k == "quality":
            continue
        val = f"{v:.3g}" if isinstance(v, float) else str(v)
        groups.setdefault(group, []).append(f"{name}={val}")
    return "\n".join(f"{g + ': ' if g else ''}{' '.join(items)}" for g, items in groups.items())


@app.command()
def trace(
    train_run: Path = typer.Argument(..., help="training run directory (the config's run_dir)"),
    step: Optional[int] = typer.Option(None, "--step", help="the step to trace"),
    curation_run: Optional[Path] = typer.Option(None, "--curation-run",
                                                help="curation run directory to join signals from (the pack's own run is always searched)"),
    loss_spikes: bool = typer.Option(False, "--loss-spikes", help="trace every step the guard flagged (skipped or clipped spike)"),
    as_json: bool = typer.Option(False, "--json", help="one JSON object per step instead of tables"),
) -> None:
    """The documents behind a training step: id, source, url, tokens and their curation signals."""
    import json as _json

    from curation.pipeline.rundir import RunNotFound
    from training.trace import TraceError, flagged_steps, step_documents

    if (step is None) == (not loss_spikes):
        fail("give --step N or --loss-spikes")
    if curation_run is not None and not (curation_run / "dag.yaml").exists():
        fail(f"{curation_run}: not a refinery run directory (no dag.yaml)")
    try:
        targets = flagged_steps(train_run) if loss_spikes else [{"step": step}]
        if loss_spikes and not targets:
            console.print(f"{train_run}: the guard flagged no step")
            return
        for target in targets:
            traced = step_documents(train_run, target["step"])
            runs = [curation_run] if curation_run is not None else []
            if traced["data"].startswith("file://"):  # the pack's own run: ids, sources, urls, token counts
                pack_run = Path(traced["data"].removeprefix("file://")).parent
                if (pack_run / "dag.yaml").exists() and pack_run.resolve() not in [r.resolve() for r in runs]:
                    runs.append(pack_run)
            docs = traced["documents"]
            _trace_join(docs, runs)
            for d in docs:
                d.setdefault("source", d["row_source"])
            head = {k: target[k] for k in ("event", "loss", "grad_norm", "message") if target.get(k) is not None}
            if as_json:
                print(_json.dumps({"step": traced["step"], **head, "rows": [r["row"] for r in traced["rows"]],
                                   "documents": docs}, default=str))
                continue
            t = Table(title=f"step {traced['step']}: {len(traced['rows'])} rows, {len(docs)} documents"
                            + (f" - {head['message']}" if "message" in head else ""), show_lines=True)
            for c in ("id", "source", "url", "tokens", "quality", "signals"):
                t.add_column(c, justify="right" if c in ("tokens", "quality") else "left", overflow="fold")
            for d in docs:
                total = d.get("num_tokens")
                q = d["signals"].get("quality")
                t.add_row(d["id"], str(d.get("source") or ""), str(d.get("url") or ""),
                          f"{d['tokens']}" + (f"/{total}" if total is not None and total != d["tokens"] else ""),
                          "" if q is None else f"{q:.3f}", _trace_signals_text(d["signals"]))
            console.print(t)
    except (TraceError, RunNotFound, FileNotFoundError) as e:
        fail(str(e))
