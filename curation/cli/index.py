"""`refinery index`: corpus indexes for incremental dedup, and crawl indexes built from WARCs."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from curation.cli.app import app, console, fail, mib


index_app = typer.Typer(no_args_is_help=True, help="Corpus indexes: a deduplicated corpus' dedup state, reused by the next snapshot.")


app.add_typer(index_app, name="index")


def _index_add(index: str, run_dir: str, stages: str, name: Optional[str]) -> None:
    from curation.dedup.index import IndexMismatch
    from curation.pipeline.corpus_index import add_run_dir
    from curation.pipeline.rundir import RunNotFound

    try:
        res = add_run_dir(index, run_dir, [s.strip() for s in stages.split(",") if s.strip()], name)
    except (IndexMismatch, ValueError, FileNotFoundError, RunNotFound) as e:
        fail(str(e))
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
        fail(f"{out} already holds an index; use `refinery index add {out} RUN`")
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
        fail(f"{index}: no corpus index (no _index.json)")
    try:
        rep = apply_superseded(index, shards, out, member)
    except (ValueError, FileNotFoundError) as e:
        fail(str(e))
    console.print(f"[green]wrote[/] {len(rep['files'])} shards to {out}: {rep['rows'] - rep['removed']:,} of "
                  f"{rep['rows']:,} rows kept, {rep['removed']:,} superseded removed ({rep['superseded']:,} listed)")


@index_app.command("show")
def index_show(index: str = typer.Argument(..., help="the index (local or s3://...)")) -> None:
    """Members, documents and size on disk."""
    from curation.dedup.index import CorpusIndex, is_index

    if not is_index(index):
        fail(f"{index}: no corpus index (no _index.json)")
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
            fail(f"{w}: no WARC file matches")
        found += hits
    try:
        rep = build_index(sorted(set(found)), out, root, crawl, workers, not no_langid, overwrite,
                          progress=lambda r: None)
    except ValueError as e:
        fail(str(e))
    skipped = ", ".join(f"{k} {v:,}" for k, v in sorted(rep["skipped"].items())) or "none"
    console.print(f"[green]indexed[/] {rep['warcs']:,} WARCs ({mib(rep['warc_bytes'])}) into {out}: "
                  f"{rep['rows']:,} response records of {rep['records']:,} ({skipped} not indexed) in "
                  f"{rep['seconds']:.1f} s ({rep['cpu_seconds']:.1f} CPU s, language {rep['langid_cpu_seconds']:.1f} s)",
                  highlight=False)
    console.print(f"  read it with {{format: cc_index, paths: [\"{location.join(out, '*.parquet')}\"], "
                  f"warc_root: \"{rep['warc_root']}\", where: \"...\", source: web}}", highlight=False)
