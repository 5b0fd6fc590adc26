"""`refinery tokenizer` and `refinery export`: tokenizers, and tokens in other trainers' formats."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from curation.cli.app import app, console, fail


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
        fail(f"--kind: {kind!r} is not one of bpe, unigram")
    try:
        tok = train_tokenizer(resolve_corpus(inputs), out, kind=kind, vocab_size=vocab_size,
                              max_docs=max_docs, progress=sys.stderr.isatty())
    except (TokenizerError, FileNotFoundError) as e:
        fail(str(e))
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
        fail(str(e))


@app.command()
def export(
    stage: Path = typer.Argument(..., help="RUN/STAGE: a tokenize or pack stage (or a stage after one, e.g. mix)"),
    format: str = typer.Option(..., "--format", "-f", help="megatron, nanotron, olmo, mds, parquet or jsonl"),
    out: Path = typer.Option(..., "--out", "-o", help="output folder (files, export.json, _manifest.jsonl)"),
    tokenizer: Optional[Path] = typer.Option(None, "--tokenizer", help="tokenizer directory (checked against the tokens')"),
    workers: Optional[int] = typer.Option(None, "--workers", "-w", min=1,
                                          help="tasks in flight (default: every CPU Ray reports: this machine's, or the cluster's)"),
    address: Optional[str] = typer.Option(None, "--address", help="Ray cluster, e.g. ray://head:10001 or auto"),
    weights: Optional[str] = typer.Option(None, "--weights", help="per-source weights for the hand-off line: "
                                          "RUN/MIX (its target shares), a mix report, or web=0.4,math=0.6"),
) -> None:
    """Export tokenized documents or packed rows to another trainer's format, with a manifest."""
    from curation.export.common import ExportError
    from curation.pipeline.export import export_stage, hand_off_line, parse_weights
    from curation.pipeline.tasks import TasksFailed

    try:
        w = parse_weights(weights) if weights else None
        m = export_stage(stage, format, out, tokenizer, workers=workers, address=address)
    except ExportError as e:
        fail(str(e))
    except TasksFailed as e:
        fail(str(e), 1)
    rows = f"{m['rows']} rows, " if m["unit"] == "rows" else ""
    console.print(f"[green]exported[/] {stage} -> {out}: {m['docs']} docs, {rows}{m['tokens']} tokens "
                  f"({m['token_dtype']}) in {len(m['files'])} files; manifest {out}/export.json")
    console.print(hand_off_line(out, w), markup=False, highlight=False, soft_wrap=True)
