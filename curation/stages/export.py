"""Export a tokenized or packed stage to the format another trainer reads (``curation/export/``).

At the end of a DAG (``{type: export, input: pack, format: megatron}``) it writes into its own
folder, ``RUN/STAGE/``; ``refinery export RUN/STAGE --format F --out DIR`` runs the same code into
DIR (``curation/pipeline/export.py``). One Ray task per upstream shard, in the run's order (shards
by key; a mix stage's rows are already interleaved), each streaming its shard batch by batch into
the format's writer (memory: one batch, plus the format's per-shard index) and returning a
manifest line with the files it wrote, so a rerun redoes only missing shards. Then the format's
folder-level files (MDS's ``index.json``) and the export manifest, ``export.json``::

    format, unit (docs | rows), the stage exported (run, node, params hash), the tokenizer (kind,
    fingerprint, vocab size, EOS and pad ids, directory), the token dtype, documents / rows /
    tokens / padding, tokens per source, and per output shard (in order) its files with bytes
    and sha256 and its tokens per source

Refused with one line: a stage without ``input_ids``; a ``tokenizer`` whose fingerprint is not
the one the tokens were made with; tokens whose tokenizer is unknown, without ``tokenizer``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator

from curation.io import location
from curation.export import FORMATS, format_module
from curation.export.common import Docs, ExportError, Rows, TokenInfo
from curation.formats.packed import TOKENIZER_METADATA
from curation.io.files import safe_names
from curation.stages.base import GlobalStage, Resources, registry
from curation.stages.paths import PathStr
from curation.stages.context import RunSource, ShardSink, StageContext
from curation.tokenizer.model import Tokenizer, TokenizerError, checked_tokenizer_dir, tokenizer_fingerprint


EXPORT_MANIFEST = "export.json"
#: rows per batch a task reads (and hands its writer)
BATCH_ROWS = 1024
DOC_COLUMNS = ["id", "source", "input_ids"]
ROW_COLUMNS = ["input_ids", "doc_lens", "doc_ids", "source", "source_tokens"]
TEXT_FORMATS = ("parquet", "jsonl")


# ---------------------------------------------------------------------------------------------
# Arrow batches -> numpy units


def _flat(col: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(values, lengths) of a list column; a null list is empty."""
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    lengths = pc.fill_null(pc.list_value_length(col), 0).to_numpy(zero_copy_only=False).astype(np.int64)
    return pc.list_flatten(col).to_numpy(zero_copy_only=False), lengths


def docs_of(batch: pa.RecordBatch, text: bool = False) -> Docs:
    """The batch's non-empty documents."""
    tokens, lengths = _flat(batch.column("input_ids"))
    names = batch.schema.names
    n = batch.num_rows
    ids = batch.column("id").to_pylist() if "id" in names else [str(i) for i in range(n)]
    sources = batch.column("source").to_pylist() if "source" in names else [None] * n
    texts = batch.column("text").to_pylist() if text and "text" in names else None
    keep = lengths > 0
    if not keep.all():
        idx = np.flatnonzero(keep).tolist()
        ids, sources = [ids[i] for i in idx], [sources[i] for i in idx]
        texts = [texts[i] for i in idx] if texts is not None else None
    return Docs(tokens.astype(np.int32, copy=False), lengths[keep], ids, sources, texts)


def rows_of(batch: pa.RecordBatch) -> tuple[Rows, list[dict[str, int]]]:
    """The batch's packed rows, and each row's tokens per source."""
    tokens, lengths = _flat(batch.column("input_ids"))
    width = int(lengths[0]) if len(lengths) else 0
    if (lengths != width).any():
        raise ExportError("packed rows of different lengths: not a pack stage's output")
    doc_lens, pieces = _flat(batch.column("doc_lens"))
    doc_ids = pc.list_flatten(batch.column("doc_ids")).to_pylist()
    per_row = [json.loads(s) if s else {} for s in batch.column("source_tokens").to_pylist()]
    # a piece's source is known when its row holds one source (pack's per_source, the default)
    piece_sources = [next(iter(st)) if len(st) == 1 else None for st, n in zip(per_row, pieces.tolist())
                     for _ in range(n)]
    rows = Rows(tokens.astype(np.int32, copy=False).reshape(len(lengths), width), doc_lens.astype(np.int64),
                pieces, doc_ids, batch.column("source").to_pylist(), piece_sources)
    return rows, per_row


# ---------------------------------------------------------------------------------------------
# the Ray task: one upstream shard -> one output shard


@dataclass(frozen=True)
class ExportJob:
    out: ShardSink  # keyed by the upstream shard key (the manifest line's key)
    index: int  # its place in the run's order
    name: str  # output files' base name
    path: str  # upstream Parquet shard
    out_dir: str
    format: str
    unit: str  # "docs" or "rows"
    info: tuple  # TokenInfo fields, in order
    options: tuple = ()  # (name, value) pairs for the writer


def export_task(job: ExportJob) -> dict:
    """Stream one shard into the format's writer; return its manifest entry (files, counts)."""
    info = TokenInfo(*job.info)
    writer = format_module(job.format).WRITER(Path(job.out_dir), job.name, info, job.index, dict(job.options))
    counts = {"docs": 0, "rows": 0, "tokens": 0, "padding": 0, "empty_docs": 0}
    per_source: dict[str, int] = {}
    pf = location.parquet_file(job.path)
    try:
        if job.unit == "rows":
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=ROW_COLUMNS):
                rows, row_sources = rows_of(batch)
                writer.write_rows(rows)
                used = int(rows.doc_lens.sum())
                counts["rows"] += len(rows)
                counts["docs"] += len(rows.doc_lens)
                counts["tokens"] += used
                counts["padding"] += rows.tokens.size - used
                for st in row_sources:
                    for s, n in st.items():
                        per_source[s] = per_source.get(s, 0) + int(n)
        else:
            names = pf.schema_arrow.names
            cols = [c for c in DOC_COLUMNS + (["text"] if job.format in TEXT_FORMATS else []) if c in names]
            for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=cols):
                docs = docs_of(batch, job.format in TEXT_FORMATS)
                counts["empty_docs"] += batch.num_rows - len(docs)
                if len(docs):
                    writer.write_docs(docs)
                counts["docs"] += len(docs)
                counts["tokens"] += int(docs.lengths.sum())
                for s, n in zip(docs.sources, docs.lengths.tolist()):
                    per_source[s or "-"] = per_source.get(s or "-", 0) + n
        files = writer.close()
    except BaseException:
        writer.abort()
        raise
    n_in = pf.metadata.num_rows
    return {"shard": job.out.key, "stage": job.out.stage, "params_hash": job.out.params_hash, "rows_in": n_in,
            "rows": n_in - counts["empty_docs"], "file": None, "rejected_file": None, "rejected_rows": 0,
            "export": {"name": job.name, "files": files, **counts,
                       "source_tokens": dict(sorted(per_source.items())), **writer.extra()}}


# ---------------------------------------------------------------------------------------------
# what the tokens are


def recorded_tokenizer(source: RunSource, node: str) -> tuple[dict | None, str | None]:
    """(the tokenizer description the tokens were made with, from the nearest shards upstream of
    ``node`` whose footers record one; the directory of the tokenize stage upstream, or None)."""
    desc: dict | None = None
    directory: str | None = None
    todo, seen = [node], set()
    while todo and (desc is None or directory is None):
        n = todo.pop(0)
        if n in seen:
            continue
        seen.add(n)
        if desc is None:
            found = {}
            for _, path in source.node_shards(n):
                meta = location.read_schema(path).metadata or {}
                if TOKENIZER_METADATA in meta:
                    d = json.loads(meta[TOKENIZER_METADATA])
                    found[d["fingerprint"]] = d
            if len(found) > 1:
                raise ExportError(f"{source.stage_dir(n)}: tokens made with {len(found)} different tokenizers; "
                                  "export each branch on its own")
            desc = next(iter(found.values()), None)
        st = source.node_stage(n)
        if st is not None:
            if st.type == "tokenize" and directory is None:
                directory = getattr(st, "tokenizer", None)
            todo += st.upstreams()
    return desc, directory


def resolve_tokens(source: RunSource, node: str, tokenizer: str | None) -> TokenInfo:
    """The tokenizer of ``node``'s tokens, checked against ``tokenizer`` when one is given."""
    where = str(source.stage_dir(node))
    desc, directory = recorded_tokenizer(source, node)
    if tokenizer:
        try:
            given = Tokenizer.load(tokenizer).describe()
        except TokenizerError as e:
            raise ExportError(f"--tokenizer: {e}") from None
        if desc is not None and given["fingerprint"] != desc["fingerprint"]:
            made = f" ({directory})" if directory else ""
            raise ExportError(f"{where}: tokenizer mismatch: {tokenizer} is {given['fingerprint'][:12]} but the "
                              f"tokens were made with {desc['fingerprint'][:12]}{made}")
        return TokenInfo.of(desc or given, str(tokenizer))
    if desc is None:
        raise ExportError(f"{where}: no tokenizer is recorded for these tokens; pass --tokenizer DIR")
    if directory and (not Path(directory).exists() or tokenizer_fingerprint(directory) != desc["fingerprint"]):
        directory = None  # retrained or moved since: not the one that made these tokens
    return TokenInfo.of(desc, directory)


def unit_of(paths: list[str], where: str) -> str:
    """``docs`` (tokenized documents) or ``rows`` (packed rows); refuses shards without tokens."""
    schemas = [location.read_schema(p) for p in paths]
    for p, s in zip(paths, schemas):
        if "input_ids" not in s.names:
            raise ExportError(f"{where}: no input_ids in {Path(p).name} (columns: {', '.join(s.names)}); export "
                              "takes a tokenize or pack stage, or a stage after one")
    packed = ["doc_lens" in s.names for s in schemas]
    if any(packed) and not all(packed):
        raise ExportError(f"{where}: mixes packed rows and documents")
    return "rows" if all(packed) else "docs"


# ---------------------------------------------------------------------------------------------
# the stage


@registry.register("export")
class Export(GlobalStage):
    """Write the input stage's tokens in ``format`` (megatron, nanotron, olmo, mds, parquet,
    jsonl) into this stage's folder, with ``export.json``. ``tokenizer``: the tokenizer directory,
    checked against the one the tokens were made with (default: the upstream tokenize stage's);
    parquet/jsonl decode tokens with it when the stage kept no text. ``mds_size_limit``: bytes
    per MDS shard file."""

    type: Literal["export"] = "export"
    format: Literal["megatron", "nanotron", "olmo", "mds", "parquet", "jsonl"]
    tokenizer: PathStr | None = None
    mds_size_limit: int = Field(default=1 << 26, gt=1024, lt=1 << 32)
    resources: ClassVar[Resources] = Resources(cpus=1)

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_exists(cls, v: str | None) -> str | None:
        return None if v is None else checked_tokenizer_dir(v)

    def params(self) -> dict[str, Any]:
        p = super().params()
        if self.tokenizer is not None:
            p["tokenizer"] = {"fingerprint": tokenizer_fingerprint(self.tokenizer)}
        return p

    def output_columns(self, upstream: set[str] | None) -> set[str] | None:
        return None  # files for other tools, not rows

    def run(self, ctx: StageContext) -> None:
        self.export(ctx, self.input)

    def check(self, source: RunSource, node: str, upstream: list[tuple[str, str]]) -> tuple[str, TokenInfo]:
        """(unit, tokenizer) of ``node``'s shards ``upstream``; raises ``ExportError`` for what
        cannot be exported (checked before any task starts)."""
        assert self.format in FORMATS
        where = str(source.stage_dir(node))
        if not upstream:
            raise ExportError(f"{where}: no committed shards to export (run the pipeline first)")
        unit = unit_of([p for _, p in upstream], where)
        info = resolve_tokens(source, node, self.tokenizer)
        if self.format in TEXT_FORMATS and info.dir is None and (
                unit == "rows" or any("text" not in location.read_schema(p).names for _, p in upstream)):
            raise ExportError(f"{where}: {self.format} export decodes tokens the stage holds without text and "
                              "needs the tokenizer that made them: pass --tokenizer DIR")
        return unit, info

    def export(self, ctx: StageContext, node: str) -> dict:
        """Export ``node`` of the run ``ctx.source`` (its shards are ``ctx.upstream``) into
        ``ctx``'s stage folder. Returns the manifest written as ``export.json``."""
        source = ctx.source
        unit, info = self.check(source, node, ctx.upstream)
        if location.is_remote(ctx.stage_dir):  # the formats' writers (memmapped .bin/.idx, MDS) need a local folder
            raise ExportError(f"{ctx.stage_dir}: exports are written to a local folder; "
                              "export the stage with `refinery export RUN/STAGE --out DIR` on a local DIR")
        out = Path(ctx.stage_dir)
        # files an earlier export into this folder wrote (another format, say): removed at the end
        earlier = {f["path"] for e in ctx.entries().values() for f in e.get("export", {}).get("files", [])}
        earlier |= {f["path"] for f in (ctx.read_report(EXPORT_MANIFEST) or {}).get("files", [])}
        # a committed shard whose files are gone is redone (a later manifest line replaces it)
        gone = [e for e in ctx.committed().values()
                if not all((out / f["path"]).is_file() for f in e.get("export", {}).get("files", []))]
        if gone:
            ctx.commit([{**e, "params_hash": "files-missing"} for e in gone])
        names = safe_names([k for k, _ in ctx.upstream])
        options = (("size_limit", self.mds_size_limit),)
        jobs = [ExportJob(ctx.output(k), i, names[i], p, str(out), self.format, unit,
                          tuple(info.to_dict().values()), options)
                for i, (k, p) in enumerate(ctx.upstream)]
        results = [e["export"] for e in ctx.phase("export", export_task, jobs, commit=True)]
        folder_files = format_module(self.format).finish(out, results, info)
        manifest = summarize(self.format, unit, info, results, folder_files)
        manifest["source"] = {"run": str(source.root), "node": node, "params_hash": source.node_hash(node)}
        for path in earlier - {f["path"] for f in manifest["files"]}:
            if Path(path).name == path and not path.startswith("."):  # only names this code writes
                (out / path).unlink(missing_ok=True)
        ctx.write_report(EXPORT_MANIFEST, manifest)
        return manifest


def token_dtype(fmt: str, vocab_size: int) -> str:
    from curation.export import megatron, nanotron, olmo  # noqa: PLC0415

    if fmt == "megatron":
        return megatron.token_dtype(vocab_size).name
    if fmt == "nanotron":
        return "uint16" if nanotron.token_size(vocab_size) == 2 else "uint32"
    if fmt == "olmo":
        return olmo.token_dtype(vocab_size).name
    return "int32"


def summarize(fmt: str, unit: str, info: TokenInfo, results: list[dict], folder_files: list[dict]) -> dict:
    """The export manifest (``export.json``) from the output shards' results, in order."""
    per_source: dict[str, int] = {}
    for r in results:
        for s, n in r["source_tokens"].items():
            per_source[s] = per_source.get(s, 0) + n
    shards = [{"name": r["name"], "files": [f["path"] for f in r["files"]], "docs": r["docs"], "rows": r["rows"],
               "tokens": r["tokens"], "source_tokens": r["source_tokens"],
               **({"docs_without_eos": r["docs_without_eos"]} if "docs_without_eos" in r else {})}
              for r in results]
    total = {k: sum(r[k] for r in results) for k in ("docs", "rows", "tokens", "padding", "empty_docs")}
    out = {"format": fmt, "unit": unit, "tokenizer": info.to_dict(), "token_dtype": token_dtype(fmt, info.vocab_size),
           **total, "tokens_by_source": dict(sorted(per_source.items())), "shards": shards,
           "files": [f for r in results for f in r["files"]] + folder_files}
    if unit == "docs":
        out.pop("rows")
        out.pop("padding")
    if "docs_without_eos" in (results[0] if results else {}):
        out["docs_without_eos"] = sum(r["docs_without_eos"] for r in results)
    return out
