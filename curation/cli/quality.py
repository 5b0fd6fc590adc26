"""`refinery quality`: label with a teacher, train and evaluate the fastText quality classifier."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from curation.cli.app import app, console, fail


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
    from curation.io.inputs import InputError
    from curation.pipeline.run_input import node_rows
    from curation.quality.labels import LabelError, Tables, quality_label
    from curation.quality.teachers import TeacherError

    def documents(source: str) -> str | Tables:
        rows = node_rows(source)  # a run's RUN/STAGE: its committed shards, through the manifest
        return source if rows is None else Tables(source, rows)

    try:
        info = quality_label(documents(run_dir), documents(positive) if positive else None, teacher, out,
                             fraction=fraction, seed=seed)
    except (LabelError, TeacherError, InputError, FileNotFoundError) as e:
        fail(str(e))
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
        fail(str(e))
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
        fail(str(e))
    console.print(f"AUC {res['auc']:.3f}  (length only {res['length_auc']:.3f})  on {res['docs']} docs")
    console.print(res)
