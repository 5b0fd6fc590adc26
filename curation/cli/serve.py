"""`refinery serve`: the HTTP service over a runs directory."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from curation.cli.app import app, err, fail


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
        fail(f"--stage-modules: {e}")
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
        fail(str(e))
