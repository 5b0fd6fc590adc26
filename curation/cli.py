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
    from curation.pipeline.dag import DagError, load_dag
    from curation.pipeline.executor import RunDirError, RunFailed, make_plan, run_dag
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
    from curation.pipeline.stats import RunNotFound, output_summary, stage_table, top_reasons

    try:
        rows = stage_table(run_dir)
    except RunNotFound as e:
        _fail(str(e))
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

    from curation.pipeline.stats import RunNotFound, connect

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


tokenizer_app = typer.Typer(no_args_is_help=True, help="Train and inspect tokenizers (BPE / Unigram).")
app.add_typer(tokenizer_app, name="tokenizer")


@tokenizer_app.command("train")
def tokenizer_train(
    inputs: list[str] = typer.Argument(..., help="RUN/STAGE directories, folders or globs of Parquet shards"),
    out: Path = typer.Option(..., "--out", "-o", help="output directory (tokenizer + card.json)"),
    kind: str = typer.Option("bpe", "--kind", help="bpe (tokenizers, byte-level) or unigram (sentencepiece)"),
    vocab_size: int = typer.Option(32000, "--vocab-size", min=256),
    max_docs: Optional[int] = typer.Option(None, "--max-docs", help="train on at most this many documents"),
) -> None:
    """Train a tokenizer on the `text` column of shards, streaming (never the whole corpus in memory)."""
    from curation.pipeline.rundir import resolve_corpus
    from curation.tokenizer.model import TokenizerError, train_tokenizer

    if kind not in ("bpe", "unigram"):
        _fail(f"--kind: {kind!r} is not one of bpe, unigram")
    try:
        tok = train_tokenizer(resolve_corpus(inputs), out, kind=kind, vocab_size=vocab_size,
                              max_docs=max_docs, progress=sys.stderr.isatty())
    except (TokenizerError, FileNotFoundError) as e:
        _fail(str(e))
    console.print(f"[green]trained[/] {tok!r} -> {out}")


@tokenizer_app.command("report")
def tokenizer_report_cmd(
    tokenizer: Path = typer.Argument(..., help="tokenizer directory"),
    inputs: list[str] = typer.Argument(..., help="RUN/STAGE directories or Parquet files to measure on"),
    max_docs: Optional[int] = typer.Option(None, "--max-docs"),
) -> None:
    """Fertility (tokens per word) and bytes per token by source and language, with a PNG chart."""
    from curation.tokenizer.model import TokenizerError
    from curation.pipeline.rundir import resolve_corpus
    from curation.tokenizer.report import tokenizer_report

    try:
        tokenizer_report(tokenizer, inputs if len(inputs) > 1 else inputs[0], max_docs=max_docs,
                         corpus=resolve_corpus(inputs))
    except (TokenizerError, FileNotFoundError) as e:
        _fail(str(e))


@app.command(context_settings={"allow_extra_args": False})
def train(
    config: Path = typer.Argument(..., help="trainer config (YAML)"),
    resume: Optional[str] = typer.Option(None, "--resume", help="'auto' (default), 'never', or a checkpoint path"),
    anneal_from: Optional[str] = typer.Option(None, "--anneal-from", help="branch an annealing phase from this checkpoint"),
    mix: Optional[str] = typer.Option(None, "--mix", help="annealing mix, e.g. web=0.3,math=0.7"),
    override: list[str] = typer.Option([], "--set", help="override a config value, e.g. --set optim.lr=1e-3"),
) -> None:
    """Train a model on packed shards (one process; use torchrun -m training for many)."""
    from training.train import main as train_main

    code = train_main(str(config), resume=resume, overrides=override, anneal_from=anneal_from, mix=mix)
    if code:
        raise typer.Exit(code)


@app.command()
def serve(
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="where run directories live (the service's only state)"),
    address: Optional[str] = typer.Option("auto", "--address",
                                          help="Ray cluster for every run: auto, ray://head:10001, or 'local' for an embedded Ray per run"),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help="file holding the API token (default: $REFINERY_TOKEN)"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8080, "--port"),
    allowed_root: list[str] = typer.Option([], "--allowed-root",
                                           help="a directory (or URL prefix) submitted DAGs may read; repeatable (default: --base-dir)"),
    base_dir: Optional[Path] = typer.Option(None, "--base-dir", help="relative paths in submitted DAGs resolve here (default: the current directory)"),
    max_concurrent: int = typer.Option(2, "--max-concurrent", min=1, help="runs at once; the rest wait in a FIFO queue"),
) -> None:
    """Serve the HTTP API and dashboard: submit DAGs, follow runs, read stats, query shards."""
    from curation.service.app import serve as serve_app
    from curation.service.auth import TokenError
    from curation.service.runs import RunsDirBusy

    try:
        serve_app(runs_dir, address, token_file, host, port, allowed_root, max_concurrent, base_dir=base_dir)
    except (TokenError, RunsDirBusy) as e:
        _fail(str(e))


quality_app = typer.Typer(no_args_is_help=True, help="Model-based quality: label with a teacher, train, evaluate.")
app.add_typer(quality_app, name="quality")


@quality_app.command("label")
def quality_label_cmd(
    run_dir: str = typer.Argument(..., help="RUN/STAGE (or Parquet/JSONL files) holding the crawl to label"),
    positive: Optional[str] = typer.Option(None, "--positive", help="reference corpus (JSONL/Parquet) for reference/perplexity"),
    teacher: str = typer.Option("reference", "--teacher", help="reference | perplexity | pkg.module:function"),
    out: Path = typer.Option(..., "--out", "-o", help="fastText label file to write"),
    fraction: float = typer.Option(0.3, "--fraction", help="top/bottom fraction labelled by score teachers"),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Label documents with a teacher (the slow, strong scorer a fast classifier learns from)."""
    from curation.quality.labels import LabelError, quality_label
    from curation.quality.teachers import TeacherError

    try:
        info = quality_label(run_dir, positive, teacher, out, fraction=fraction, seed=seed)
    except (LabelError, TeacherError, FileNotFoundError) as e:
        _fail(str(e))
    console.print(info)


@quality_app.command("train")
def quality_train_cmd(
    labels: list[str] = typer.Argument(..., help="fastText label file(s)"),
    out: Path = typer.Option(..., "--out", "-o", help="model path (.bin); a card is written beside it"),
    dim: int = typer.Option(64, "--dim"),
    epoch: int = typer.Option(20, "--epoch"),
    word_ngrams: int = typer.Option(2, "--word-ngrams"),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Train a fastText quality classifier (held-out AUC goes into its card)."""
    from curation.quality.classifier import quality_train

    try:
        card = quality_train(labels if len(labels) > 1 else labels[0], out, dim=dim, epoch=epoch,
                             word_ngrams=word_ngrams, seed=seed)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    console.print({k: card[k] for k in card if k in ("labels", "heldout", "metrics", "fasttext_params")} or card)


@quality_app.command("eval")
def quality_eval_cmd(
    model: Path = typer.Argument(..., help="quality model (.bin)"),
    heldout: Path = typer.Argument(..., help="JSONL/Parquet with text and a 0/1 label"),
    text_field: str = typer.Option("text", "--text-field"),
    label_field: str = typer.Option("label", "--label-field"),
) -> None:
    """ROC AUC (beside a length-only baseline), precision@k and calibration on labelled documents."""
    from curation.quality.classifier import ModelLoadError, quality_eval

    try:
        res = quality_eval(model, heldout, text_field=text_field, label_field=label_field)
    except (ModelLoadError, ValueError, FileNotFoundError) as e:
        _fail(str(e))
    console.print(f"AUC {res['auc']:.3f}  (length only {res['length_auc']:.3f})  on {res['docs']} docs")
    console.print(res)


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
        _fail(str(e))
    console.print((out / "report.md").read_text(), markup=False, highlight=False)
    console.print(f"report: {out}/report.md, {out}/eval_loss.png ({len(report.get('arms', {}))} arms)")


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
