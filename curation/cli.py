"""The `refinery` command."""

from __future__ import annotations

import os
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
        _fail(f"--stage-modules / ${STAGE_MODULES_ENV}: {e}")
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
def stats(run_dir: str = typer.Argument(..., help="run directory (local or s3://...)")) -> None:
    """Per-stage documents in / kept / rejected, top drop reasons, output summary."""
    from curation.pipeline.stats import RunNotFound, empty_inputs, output_summary, stage_table, top_reasons

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
            _fail(f"{run_dir}: no progress.json (not a run directory, or the run has not started)")

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


def resolve_cluster(address: str | None) -> tuple[str | None, str]:
    """The Ray address runs should use, and why. ``None``/``auto``: a cluster only if one was
    started with ``ray start`` (or named by ``RAY_ADDRESS``) and answers, else embedded: another
    program's embedded Ray is not a cluster to lean on; ``local``/``""``: embedded; anything
    else: as given (a run fails loudly if it is wrong)."""
    import socket
    import tempfile

    if address in ("local", ""):
        return None, "ray: an embedded Ray per run (--address local)"
    if address not in (None, "auto"):
        return address, f"ray: cluster at {address}"
    found, origin = os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS"
    if not found:  # what `ray start --head` leaves for `ray.init("auto")`
        current = Path(os.environ.get("RAY_TMPDIR", tempfile.gettempdir())) / "ray" / "ray_current_cluster"
        found, origin = (current.read_text().strip() or None, str(current)) if current.exists() else (None, "")
    if not found:
        return None, "ray: no cluster running (no RAY_ADDRESS, no `ray start` here); each run starts an embedded Ray"
    if "://" in found:
        return found, f"ray: cluster at {found} ({origin})"
    host, _, port = found.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return found, f"ray: the running cluster at {found} ({origin})"
    except (OSError, ValueError) as e:
        return None, f"ray: {found} ({origin}) does not answer ({e}); each run starts an embedded Ray"


@app.command()
def serve(
    runs_dir: Path = typer.Option(Path("runs"), "--runs-dir", help="where run directories live (the service's only state)"),
    address: Optional[str] = typer.Option(None, "--address",
                                          help="Ray cluster for every run: ray://head:10001, host:port or auto; 'local' for an "
                                               "embedded Ray per run. Default: a running cluster if one is reachable "
                                               "(RAY_ADDRESS or `ray start` here), else embedded"),
    token_file: Optional[Path] = typer.Option(None, "--token-file", help="file holding the API token (default: $REFINERY_TOKEN)"),
    host: str = typer.Option("127.0.0.1", "--host"),
    port: int = typer.Option(8080, "--port"),
    allowed_root: list[str] = typer.Option([], "--allowed-root",
                                           help="a directory (or URL prefix) submitted DAGs may read; repeatable (default: --base-dir)"),
    base_dir: Optional[Path] = typer.Option(None, "--base-dir", help="relative paths in submitted DAGs resolve here (default: the current directory)"),
    max_concurrent: int = typer.Option(2, "--max-concurrent", min=1, help="runs at once; the rest wait in a FIFO queue"),
    stage_modules: str = typer.Option("", "--stage-modules", envvar="REFINERY_STAGE_MODULES",
                                      help="module prefixes submitted `type: module:Class` stages may come from, comma "
                                           "separated (mypkg,teamfilters); default none: the service imports no module "
                                           "a client names"),
    max_queued: int = typer.Option(100, "--max-queued", min=1, help="runs waiting at once; a submission past it gets 429"),
    max_run_seconds: float = typer.Option(86400, "--max-run-seconds", min=0,
                                          help="a run still going after this long is cancelled and marked timed "
                                               "out (default: a day; 0: no limit)"),
    max_run_bytes: int = typer.Option(100 << 30, "--max-run-bytes", min=0,
                                      help="a run's directory on disk: past it the run stops, fails with that "
                                           "reason and removes its work files; Bloom filters larger are refused at "
                                           "submission (default 100 GiB; 0: no quota)"),
    max_run_memory: Optional[int] = typer.Option(None, "--max-run-memory", min=0,
                                                 help="bytes of memory a run's processes may hold: the kernel's "
                                                      "limit on each (RLIMIT_DATA; at least 2 GiB) and, for all of "
                                                      "them together, stopped past it (default: half this "
                                                      "machine's memory; 0: no cap)"),
    sql_max_bytes: int = typer.Option(4 << 20, "--sql-max-bytes", min=1024, help="bytes of cell text one /sql answer may hold"),
    max_connections: int = typer.Option(200, "--max-connections", min=1,
                                        help="open connections at once; requests past it get 503"),
    header_timeout: float = typer.Option(10.0, "--header-timeout", min=1,
                                         help="seconds a connection may take to send a request head"),
    behind_tls_proxy: bool = typer.Option(False, "--behind-tls-proxy",
                                          help="allow a non-loopback --host: the address is only reachable through "
                                               "a TLS proxy (the service itself speaks plain HTTP)"),
    trusted_proxy: list[str] = typer.Option([], "--trusted-proxy",
                                            help="address of a proxy whose X-Forwarded-Proto the service believes "
                                                 "(https there makes the session cookie Secure); repeatable"),
    body_timeout: float = typer.Option(60.0, "--body-timeout", min=1,
                                       help="seconds a token holder may take to send a request body after its head "
                                            "(a stranger's body: --header-timeout)"),
    max_strangers: Optional[int] = typer.Option(None, "--max-strangers", min=1,
                                                help="connections open at once without having shown the token; past "
                                                     "it the oldest is closed (default: half of --max-connections)"),
    sql_memory_bytes: int = typer.Option(1 << 30, "--sql-memory-bytes", min=64 << 20,
                                         help="memory one /sql query may add to its process (the kernel's limit; "
                                              "413 past it)"),
    max_patterns: int = typer.Option(256, "--max-patterns", min=1,
                                     help="distinct input path patterns one submitted DAG may name (422 past it)"),
    max_input_files: int = typer.Option(100_000, "--max-input-files", min=1,
                                        help="files the input patterns of one submitted DAG may match (422 past it)"),
    max_bloom_bytes: int = typer.Option(1 << 30, "--max-bloom-bytes", min=1,
                                        help="bytes of an exact_dedup stage's Bloom filters, priced at submission "
                                             "from expected_items and false_positive_rate (422 past it)"),
    min_split_bytes: int = typer.Option(1024, "--min-split-bytes", min=1,
                                        help="smallest split_bytes an input may ask for (422 below it)"),
    max_shards: int = typer.Option(200_000, "--max-shards", min=1,
                                   help="input shards one submitted DAG may cut its files into, priced from their "
                                        "sizes and split_bytes (422 past it)"),
    max_param_file_bytes: int = typer.Option(4 << 20, "--max-param-file-bytes", min=1,
                                             help="bytes of a stage parameter file read whole at submission "
                                                  "(lang_config, calibrate_rules' base and the base files they "
                                                  "name; 422 past it)"),
) -> None:
    """Serve the HTTP API and dashboard: submit DAGs, follow runs, read stats, query shards."""
    from curation.pipeline.dag import parse_stage_modules
    from curation.service.app import ServeRefused, serve as serve_app
    from curation.service.auth import TokenError
    from curation.service.runs import RunsDirBusy

    try:
        modules = parse_stage_modules(stage_modules)
    except ValueError as e:
        _fail(f"--stage-modules: {e}")
    address, why = resolve_cluster(address)
    err.print(f"[refinery serve] {why}", highlight=False, soft_wrap=True)
    try:
        serve_app(runs_dir, address, token_file, host, port, allowed_root, max_concurrent, base_dir=base_dir,
                  stage_modules=modules, max_queued=max_queued, max_run_seconds=max_run_seconds or None,
                  sql_max_bytes=sql_max_bytes, max_connections=max_connections, header_timeout_s=header_timeout,
                  behind_tls_proxy=behind_tls_proxy, body_timeout_s=body_timeout, max_strangers=max_strangers,
                  sql_memory_bytes=sql_memory_bytes, max_patterns=max_patterns, max_input_files=max_input_files,
                  max_bloom_bytes=max_bloom_bytes, min_split_bytes=min_split_bytes, max_shards=max_shards,
                  max_run_bytes=max_run_bytes or None, max_run_memory=-1 if max_run_memory is None else max_run_memory,
                  max_param_file_bytes=max_param_file_bytes, trusted_proxies=trusted_proxy)
    except (TokenError, RunsDirBusy, ServeRefused) as e:
        _fail(str(e))


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
            _fail(str(e))
        try:
            r = httpx.delete(f"{service.rstrip('/')}/runs/{quote(run, safe='')}", headers={"Authorization": f"Bearer {token}"},
                             timeout=60)
        except httpx.HTTPError as e:
            _fail(f"{service}: {type(e).__name__}: {e}", 1)
        try:
            detail = r.json().get("detail") if r.status_code != 200 else None
        except ValueError:
            detail = r.text[:300]
        if r.status_code != 200:
            _fail(f"{run}: HTTP {r.status_code}: {detail}", 1)
        console.print(f"[green]deleted[/] {run} ({r.json().get('state')})")
        return
    from curation.service.runs import RunConflict, RunMissing, RunsDirBusy, delete_local

    try:
        out = delete_local(run)
    except RunMissing:
        _fail(f"{run}: not a run directory (a run id needs --service URL)", 1)
    except RunsDirBusy as e:
        _fail(f"{e}; delete the run through it: refinery delete ID --service URL", 1)
    except RunConflict as e:
        _fail(str(e), 1)
    console.print(f"[green]deleted[/] {run} ({out['state']})")


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
        _fail(str(e))
    console.print((out / "report.md").read_text(), markup=False, highlight=False)
    console.print(f"report: {out}/report.md, {out}/eval_loss.png ({len(report.get('arms', {}))} arms)")


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
        _fail(str(e))
    except TasksFailed as e:
        _fail(str(e), 1)
    rows = f"{m['rows']} rows, " if m["unit"] == "rows" else ""
    console.print(f"[green]exported[/] {stage} -> {out}: {m['docs']} docs, {rows}{m['tokens']} tokens "
                  f"({m['token_dtype']}) in {len(m['files'])} files; manifest {out}/export.json")
    console.print(hand_off_line(out, w), markup=False, highlight=False, soft_wrap=True)


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
        _fail("give --step N or --loss-spikes")
    if curation_run is not None and not (curation_run / "dag.yaml").exists():
        _fail(f"{curation_run}: not a refinery run directory (no dag.yaml)")
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
        _fail(str(e))


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
        _fail(str(e))
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
    gold: str = typer.Option("wcxb", "--gold", help="gold sets, comma-separated: wcxb, aeb, readability (from "
                             "$REFINERY_DATA or ../shared/data) or JSONL files of {html, gold} rows"),
    out: Path = typer.Option(..., "--out", "-o", help="model file (.json); use it with extract's block_model:"),
    folds: int = typer.Option(5, "--folds", min=2, help="site-grouped folds (pass two learns from out-of-fold "
                              "scores)"),
    cv: bool = typer.Option(False, "--cv", help="first report out-of-fold word F1 per gold set and page type"),
    limit: Optional[int] = typer.Option(None, "--limit", min=1, help="at most this many pages of each gold set"),
    seed: int = typer.Option(0, "--seed"),
) -> None:
    """Train the block model `extract`'s `engine: blocks` decides main content with, on your own
    pages with their gold main text (the shipped model: `--gold wcxb`)."""
    from curation.extract.train import train_from_gold
    from curation.extract.gold import GoldSetError

    try:
        card = train_from_gold([g for g in gold.split(",") if g], str(out), folds=folds, cv=cv, seed=seed,
                               limit=limit, log=lambda m: console.print(m))
    except (ValueError, GoldSetError, ImportError) as e:
        _fail(str(e))
    console.print({k: card[k] for k in ("gold", "pages", "blocks", "cv_word_f1") if k in card})
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


def main() -> None:  # pragma: no cover
    app()



index_app = typer.Typer(no_args_is_help=True, help="Corpus indexes: a deduplicated corpus' dedup state, reused by the next snapshot.")
app.add_typer(index_app, name="index")


def _index_add(index: str, run_dir: str, stages: str, name: Optional[str]) -> None:
    from curation.dedup.index import IndexMismatch
    from curation.pipeline.corpus_index import add_run_dir
    from curation.pipeline.rundir import RunNotFound

    try:
        res = add_run_dir(index, run_dir, [s.strip() for s in stages.split(",") if s.strip()], name)
    except (IndexMismatch, ValueError, FileNotFoundError, RunNotFound) as e:
        _fail(str(e))
    m = res["member"]
    if not res["added"]:
        console.print(f"{run_dir} is already member {m['name']!r} of {index} (generation {res['generation']}): nothing to do")
        return
    parts = []
    if m.get("exact"):
        parts.append(f"{m['exact']['keys']:,} exact keys")
    if m.get("near"):
        parts.append(f"{m['near']['indexed_docs']:,} documents' band keys ({m['near']['band_rows']:,} rows)")
    if m.get("superseded"):
        parts.append(f"{m['superseded']:,} earlier members' documents superseded (refinery index apply-superseded)")
    console.print(f"[green]added[/] {m['name']} to {index}: {', '.join(parts)}; generation {res['generation']}")


@index_app.command("build")
def index_build(
    run_dir: str = typer.Argument(..., help="a finished run (local or s3://...)"),
    stages: str = typer.Option("exact,near", "--stages", help="exact, near, or the run's stage names, comma-separated"),
    out: str = typer.Option(..., "--out", "-o", help="the index: a local folder or a URL (must not hold an index yet)"),
    name: Optional[str] = typer.Option(None, "--name", help="the member's name (default: the run folder's name)"),
) -> None:
    """Start a corpus index from a run's exact_dedup / minhash_dedup stages (reads no text)."""
    from curation.dedup.index import is_index

    if is_index(out):
        _fail(f"{out} already holds an index; use `refinery index add {out} RUN`")
    _index_add(out, run_dir, stages, name)


@index_app.command("add")
def index_add(
    index: str = typer.Argument(..., help="the index (local or s3://...)"),
    run_dir: str = typer.Argument(..., help="a finished run, e.g. one deduplicated with against: [INDEX]"),
    stages: str = typer.Option("exact,near", "--stages", help="exact, near, or the run's stage names, comma-separated"),
    name: Optional[str] = typer.Option(None, "--name", help="the member's name (default: the run folder's name)"),
) -> None:
    """Append a run's survivors to an index (adding the same run again is a no-op)."""
    _index_add(index, run_dir, stages, name)


@index_app.command("apply-superseded")
def index_apply_superseded(
    index: str = typer.Argument(..., help="the index (local or s3://...)"),
    shards: list[str] = typer.Argument(..., help="old shards: Parquet files or folders (their top-level *.parquet)"),
    out: str = typer.Option(..., "--out", "-o", help="where the filtered copies go (not the shards' own folder)"),
    member: Optional[str] = typer.Option(None, "--member", help="only the documents of this member (default: all)"),
) -> None:
    """Write copies of old shards without the documents a later member superseded (keep: latest,
    highest_quality, source_rank); the old shards are not rewritten in place."""
    from curation.dedup.index import is_index
    from curation.pipeline.corpus_index import apply_superseded

    if not is_index(index):
        _fail(f"{index}: no corpus index (no _index.json)")
    try:
        rep = apply_superseded(index, shards, out, member)
    except (ValueError, FileNotFoundError) as e:
        _fail(str(e))
    console.print(f"[green]wrote[/] {len(rep['files'])} shards to {out}: {rep['rows'] - rep['removed']:,} of "
                  f"{rep['rows']:,} rows kept, {rep['removed']:,} superseded removed ({rep['superseded']:,} listed)")


@index_app.command("show")
def index_show(index: str = typer.Argument(..., help="the index (local or s3://...)")) -> None:
    """Members, documents and size on disk."""
    from curation.dedup.index import CorpusIndex, is_index

    if not is_index(index):
        _fail(f"{index}: no corpus index (no _index.json)")
    idx = CorpusIndex(index)
    t = Table(title=f"{index}: generation {idx.manifest['generation']}")
    for c in ("member", "exact keys", "near docs", "band rows", "superseded"):
        t.add_column(c)
    for m in idx.members:
        t.add_row(m["name"], f"{m['exact']['keys']:,}" if m.get("exact") else "-",
                  f"{m['near']['indexed_docs']:,}" if m.get("near") else "-",
                  f"{m['near']['band_rows']:,}" if m.get("near") else "-", f"{m.get('superseded', 0):,}")
    console.print(t)
    size = idx.size()
    console.print(f"{size['files']} files, {size['bytes'] / 1e6:,.1f} MB (exact {size['exact_bytes'] / 1e6:,.1f}, "
                  f"near {size['near_bytes'] / 1e6:,.1f})")


# --- issue 63: plan a DAG before paying; index WARCs in Common Crawl's columnar schema ----------


def _mib(n: float) -> str:
    """Bytes in the unit that reads best (B, KiB, MiB, GiB, TiB)."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n / (1 << shift):,.1f} {unit}"
    return f"{int(n):,} B"


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
        _fail(str(e) if isinstance(e, DagError) else f"{dag}: {e}")
    for name, v in est["inputs"].items():
        if v["format"] != "cc_index":
            if "files" in v:
                console.print(f"[bold]{name}[/] ({v['format']}): {v['files']:,} files, {_mib(v['bytes'])}, "
                              f"{v['tasks']:,} tasks (read whole)")
            else:
                console.print(f"[bold]{name}[/] ({v['format']}): {v['note']}")
            continue
        ix = v["index"]
        console.print(f"[bold]{name}[/] (cc_index, where {v['where']!r}): {v['records']:,} records, "
                      f"{_mib(v['bytes'])} in {v['warc_files']:,} WARC files, {v['tasks']:,} tasks; "
                      f"{v['bytes_per_record']:,.0f} bytes a record", highlight=False)
        console.print(f"  index: {ix['files']:,} files of {_mib(ix['bytes'])}, {_mib(ix['bytes_read'])} read by the "
                      f"selection in {ix['seconds']:.2f} s", highlight=False)
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
        console.print(f"[bold]total[/]: {tot['records']:,} records, {_mib(tot['bytes'])}, "
                      f"{_core_hours(tot['core_hours'])} at {rate:,.1f} documents/s/core", highlight=False)
    if json_out:
        json_out.write_text(json.dumps(est, indent=1))


@index_app.command("cc")
def index_cc(
    warcs: list[str] = typer.Argument(..., help="WARC files or globs (local or s3://...)"),
    out: str = typer.Option(..., "--out", "-o", help="the index folder (local or s3://...): one Parquet file per WARC"),
    root: Optional[str] = typer.Option(None, "--warc-root",
                                       help="warc_filename is each WARC's path below this (default: their common folder)"),
    crawl: Optional[str] = typer.Option(None, "--crawl", help="the crawl column's value (e.g. CC-MAIN-2024-51)"),
    workers: int = typer.Option(1, "--workers", "-w", min=1, help="WARCs indexed at once (processes)"),
    no_langid: bool = typer.Option(False, "--no-langid", help="leave content_languages empty (no CLD2)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="index WARCs again whose index file exists"),
) -> None:
    """Build a columnar index in Common Crawl's schema from WARCs (offsets, lengths, URL parts, a
    CLD2 language guess on the HTML bytes), so `format: cc_index` selects records of any crawl."""
    from curation.io import location
    from curation.io.warc_index import build_index

    found: list[str] = []
    for w in warcs:
        hits = location.glob(w) if any(c in w for c in "*?[") else ([w] if location.exists(w) else [])
        if not hits:
            _fail(f"{w}: no WARC file matches")
        found += hits
    try:
        rep = build_index(sorted(set(found)), out, root, crawl, workers, not no_langid, overwrite,
                          progress=lambda r: None)
    except ValueError as e:
        _fail(str(e))
    skipped = ", ".join(f"{k} {v:,}" for k, v in sorted(rep["skipped"].items())) or "none"
    console.print(f"[green]indexed[/] {rep['warcs']:,} WARCs ({_mib(rep['warc_bytes'])}) into {out}: "
                  f"{rep['rows']:,} response records of {rep['records']:,} ({skipped} not indexed) in "
                  f"{rep['seconds']:.1f} s ({rep['cpu_seconds']:.1f} CPU s, language {rep['langid_cpu_seconds']:.1f} s)",
                  highlight=False)
    console.print(f"  read it with {{format: cc_index, paths: [\"{location.join(out, '*.parquet')}\"], "
                  f"warc_root: \"{rep['warc_root']}\", where: \"...\", source: web}}", highlight=False)


if __name__ == "__main__":  # pragma: no cover
    import atexit
    import gc

    # Registered first, so it runs last of the exit handlers (after Ray's shutdown): the
    # interpreter's final collections would walk every object the command left (pyarrow, Ray,
    # the stages: about a second a process on a busy machine) to find garbage that exiting
    # frees anyway. Frozen, they are skipped; module teardown runs as usual.
    atexit.register(gc.freeze)
    sys.exit(app())
