"""`refinery eval` (stages measured on labelled data) and `refinery extract train` (the block
model)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from curation.cli.app import app, console, fail


eval_app = typer.Typer(no_args_is_help=True, help="Measure curation stages on labelled data: decontamination "
                       "recall on planted leaks, rules' kept share per label and language, language-ID accuracy, "
                       "near-duplicate P/R/F1. Each prints tables and writes JSON (RUN/STAGE/_eval_<kind>.json).")


app.add_typer(eval_app, name="eval")


_TARGET_HELP = "RUN/STAGE, RUN, or DAG.yaml[:STAGE]"


def _eval(fn, *args, **kwargs) -> None:
    from curation.pipeline.dag import DagError
    from curation.pipeline.evaluate import EvalError
    from curation.pipeline.rundir import RunNotFound

    try:
        rep = fn(*args, **kwargs)
    except (EvalError, DagError, RunNotFound, FileNotFoundError, ValueError) as e:
        fail(str(e))
    for tb in rep.get("tables", []):
        t = Table(title=tb["title"])
        for i, c in enumerate(tb["columns"]):
            t.add_column(c, justify="left" if i == 0 else "right")
        for r in tb["rows"]:
            t.add_row(*[str(x) for x in r])
        console.print(t)
    for w in rep.get("written", []):
        console.print(f"report: {w}", highlight=False, soft_wrap=True)


@eval_app.command("decontam")
def eval_decontam_cmd(
    stage: str = typer.Argument(..., help="RUN/STAGE of a decontaminate stage (or RUN with one)"),
    plant: int = typer.Option(50, "--plant", min=1, help="eval items planted per eval set (each in every leak form)"),
    hosts: int = typer.Option(1000, "--hosts", min=1, help="kept documents of the stage used as hosts"),
    forms: Optional[str] = typer.Option(None, "--forms", help="leak forms, comma-separated (default: all)"),
    negatives: Optional[str] = typer.Option(None, "--negatives", help="look-alike file (JSONL...) expected unflagged"),
    negatives_field: str = typer.Option("text", "--negatives-field", help="its text field(s), comma-separated"),
    eval_dir: Optional[str] = typer.Option(None, "--eval-dir", help="where the stage's eval_sets are (overrides)"),
    clean: Optional[str] = typer.Option(None, "--clean", help="clean documents the stage never judged (JSONL...): "
                                        "false drops are measured on them (without it: not measured)"),
    clean_field: str = typer.Option("text", "--clean-field", help="their text field"),
    seed: int = typer.Option(0, "--seed"),
    json_out: Optional[str] = typer.Option(None, "--json", help="also write the report here"),
) -> None:
    """Plant the stage's own eval items in its kept documents in every leak form; recall per
    form and benchmark, item attribution; false drops on independent clean documents (--clean)."""
    from curation.pipeline.evaluate import eval_decontam

    nf = negatives_field.split(",") if "," in negatives_field else negatives_field
    _eval(eval_decontam, stage, plant=plant, hosts=hosts, seed=seed, forms=forms.split(",") if forms else None,
          negatives=negatives, negatives_field=nf, eval_dir=eval_dir, json_out=json_out, clean=clean,
          clean_field=clean_field)


@eval_app.command("extract")
def eval_extract_cmd(
    gold: str = typer.Option("aeb,trafilatura,readability", "--gold",
                             help="gold sets, comma-separated: aeb, trafilatura, readability (from $REFINERY_DATA or "
                                  "../shared/data) or a JSONL of {html, gold} rows (gold text or gold HTML)"),
    engines: Optional[str] = typer.Option(None, "--engines",
                                          help="engine specs, comma-separated: ENGINE[+ENGINE][:FORMAT][:POLICY] or "
                                               "policy:POLICY[:FORMAT], e.g. resiliparse:markdown, policy:route "
                                               "(default: resiliparse,resiliparse:markdown,trafilatura; with --ab: "
                                               "resiliparse,trafilatura)"),
    ab: Optional[str] = typer.Option(None, "--ab", help="RUN/STAGE of an extract stage: the engines on the run's "
                                     "own pages (text kept, empty pages, the pages they differ on most)"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1,
                                        help="at most this many pages of each gold set (with --ab: documents, "
                                             "default 1000)"),
    sample: int = typer.Option(20, "--sample", min=0, help="with --ab: pages written side by side for reading"),
    workers: int = typer.Option(1, "--workers", min=1, help="processes extracting (docs/s stays per core)"),
    seed: int = typer.Option(0, "--seed", help="with --ab: which documents are sampled"),
    json_out: Optional[str] = typer.Option(None, "--out", "--json",
                                           help="write the report here (gold sets: default eval-extract.json; "
                                                "--ab: also RUN/STAGE/_eval_extract.json)"),
) -> None:
    """Extraction engines side by side. Against gold: word P/R/F1, the trafilatura set's
    with/without snippet rates, code lines / table rows / headings / list items kept, per set,
    page type and language, docs/s per core. With --ab RUN/STAGE: on the run's own pages."""
    from curation.pipeline.evaluate_extract import eval_extract, eval_extract_ab

    specs = [e for e in (engines or ("resiliparse,trafilatura" if ab else
                                     "resiliparse,resiliparse:markdown,trafilatura")).split(",") if e.strip()]
    if ab:
        _eval(eval_extract_ab, ab, specs, limit=limit or 1000, sample=sample, seed=seed, workers=workers,
              json_out=json_out)
    else:
        _eval(eval_extract, [g for g in gold.split(",") if g], specs, json_out=json_out, limit=limit, workers=workers)


extract_app = typer.Typer(no_args_is_help=True, help="The main-content block model: train it on gold pages.")


app.add_typer(extract_app, name="extract")


@extract_app.command("train")
def extract_train_cmd(
    gold: str = typer.Option("wcxb,aeb,readability,trafilatura", "--gold",
                             help="gold sets, comma-separated: wcxb, aeb, readability, trafilatura (its snippets "
                             "label the blocks holding them; from $REFINERY_DATA or ../shared/data) or JSONL "
                             "files of {html, gold} rows"),
    out: Path = typer.Option(..., "--out", "-o", help="model file (.json); use it with extract's block_model:"),
    folds: int = typer.Option(5, "--folds", min=2, help="site-grouped folds (pass two learns from out-of-fold "
                              "scores)"),
    cv: bool = typer.Option(False, "--cv", help="first report out-of-fold word F1 per gold set and page type "
                            "(segment F1 for snippet sets)"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="at most this many pages of each gold set"),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Train the block model `extract`'s `engine: blocks` decides main content with, on your own
    pages with their gold main text (the shipped model: `--gold wcxb,aeb,readability,trafilatura`)."""
    from curation.extract.train import train_from_gold
    from curation.extract.gold import GoldSetError

    try:
        card = train_from_gold([g for g in gold.split(",") if g], str(out), folds=folds, cv=cv, seed=seed,
                               limit=limit, log=lambda m: console.print(m))
    except (ValueError, GoldSetError, ImportError) as e:
        fail(str(e))
    console.print({k: card[k] for k in ("gold", "pages", "blocks", "cv_word_f1", "cv_segment") if k in card})
    console.print(f"model: {out}")


@eval_app.command("rules")
def eval_rules_cmd(
    labelled: str = typer.Argument(..., help="JSONL/Parquet: text, lang, label (natural|unnatural or 1|0), form"),
    target: Optional[str] = typer.Option(None, "--stages", help=_TARGET_HELP + ": its per-language rule stages "
                                         "(default: Gopher repetition -> Gopher quality -> FineWeb)"),
    lang_config: Optional[str] = typer.Option(None, "--lang-config", help="also with these, comma-separated: "
                                              "english (no per-language rules), fineweb2, auto"),
    json_out: Optional[str] = typer.Option(None, "--json"),
) -> None:
    """Kept share of natural and unnatural pages per language."""
    from curation.pipeline.evaluate import eval_rules

    _eval(eval_rules, labelled, target, lang_configs=lang_config.split(",") if lang_config else (), json_out=json_out)


@eval_app.command("langid")
def eval_langid_cmd(
    labelled: str = typer.Argument(..., help="JSONL/Parquet: text, lang"),
    target: Optional[str] = typer.Option(None, "--stage", help=_TARGET_HELP + " with a langid stage (default: stock)"),
    json_out: Optional[str] = typer.Option(None, "--json"),
) -> None:
    """Language-ID accuracy per language, kept share, confusions."""
    from curation.pipeline.evaluate import eval_langid

    _eval(eval_langid, labelled, target, json_out=json_out)


@eval_app.command("dedup")
def eval_dedup_cmd(
    stage: Optional[str] = typer.Argument(None, help=_TARGET_HELP + " with a minhash_dedup stage (default: stock)"),
    pairs: str = typer.Option(..., "--pairs", help="JSONL: a, b (ids) or text_a, text_b; label (1|0); kind"),
    docs: list[str] = typer.Option([], "--docs", help="JSONL/Parquet files with the pairs' ids and texts"),
    json_out: Optional[str] = typer.Option(None, "--json"),
) -> None:
    """Near-duplicate P/R/F1 at the stage's threshold (and the run's clusters when it holds the pairs)."""
    from curation.pipeline.evaluate import eval_dedup

    _eval(eval_dedup, pairs, stage, docs=docs, json_out=json_out)
