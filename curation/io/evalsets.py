"""Reading evaluation sets (benchmarks to decontaminate against, held-out eval text): JSONL,
Parquet, CoNLL-U or plain text, optionally compressed."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq


def open_text(path: Path) -> io.TextIOBase:
    """A text file, decompressed by its extension (.gz, .xz, .bz2, .zst); bad UTF-8 replaced."""
    name = path.name.lower()
    if name.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path), encoding="utf-8", errors="replace")
    if name.endswith(".xz"):
        return io.TextIOWrapper(lzma.open(path), encoding="utf-8", errors="replace")
    if name.endswith(".bz2"):
        return io.TextIOWrapper(bz2.open(path), encoding="utf-8", errors="replace")
    if name.endswith(".zst"):
        import zstandard

        return io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(open(path, "rb")), encoding="utf-8",
                                errors="replace")
    return open(path, encoding="utf-8", errors="replace")


def base_name(path: Path) -> str:
    """The lower-cased file name without its compression extension."""
    name = path.name.lower()
    for ext in (".gz", ".xz", ".bz2", ".zst"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def read_eval_texts(path: str | Path, text_field: str = "text") -> Iterator[str]:
    """Documents of one eval file: JSONL rows' ``text_field``, Parquet's column, CoNLL-U
    sentences (``# text =``), or non-empty lines of a text file."""
    path = Path(path)
    base = base_name(path)
    if base.endswith(".parquet"):
        t = pq.read_table(path, columns=[text_field])
        yield from (x for x in t.column(text_field).to_pylist() if x)
        return
    with open_text(path) as f:
        if base.endswith((".jsonl", ".json", ".ndjson")):
            for line in f:
                line = line.strip()
                if line:
                    v = json.loads(line).get(text_field)
                    if v:
                        yield str(v)
        elif base.endswith(".conllu"):
            for line in f:
                if line.startswith("# text ="):
                    yield line[len("# text ="):].strip()
        else:
            for line in f:
                if line.strip():
                    yield line.rstrip("\n")
