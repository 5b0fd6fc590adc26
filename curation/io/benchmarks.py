"""Eval sets to decontaminate against, as items (an id and the texts indexed for it): shipped
registry entries for well-known benchmarks, or any file.

A **registry entry** knows a benchmark's file layout: which fields make an item, how its id is
formed, which file names it goes by. The files themselves are not shipped (licences, size):
``find_benchmark(name, dirs)`` looks for them under the folders given (the stage's
``eval_dir``, then ``$REFINERY_EVAL_DIR``). Per item the indexed texts are the fields joined
(a leak usually copies question and answer, prompt and solution, together) and each field
alone (so a short field is still indexed whole); GSM8K's answers are indexed with and without
their ``<<48/2=24>>`` calculator annotations, which web copies usually drop.

A **file** (JSONL, Parquet, CoNLL-U, plain text; .gz/.xz/.bz2/.zst) is read with
``eval_text_field`` (a field, or several joined): one item per JSONL row or Parquet row
(id: its ``id``/``task_id``/``unique_id`` field or the row number), per CoNLL-U document
(``# newdoc``; sentences joined), per non-empty line of a text file.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pyarrow.parquet as pq

from curation.io.evalsets import base_name, open_text
from curation.text.decontam import EvalItem

_CALC = re.compile(r"<<[^<>]*>>")


def _gsm8k(row: dict) -> list[str]:
    q, a = row.get("question") or "", row.get("answer") or ""
    clean = _CALC.sub("", a)
    return [f"{q}\n{a}", f"{q}\n{clean}", q, clean]


def _fields(*names: str) -> Callable[[dict], list[str]]:
    def texts(row: dict) -> list[str]:
        vals = [str(row[f]) for f in names if row.get(f)]
        return ["\n".join(vals), *vals] if len(vals) > 1 else vals
    return texts


@dataclass(frozen=True)
class Benchmark:
    """A shipped registry entry: how to read a benchmark's items."""

    name: str
    files: tuple[str, ...]  # file name patterns, most specific first
    texts: Callable[[dict], list[str]]
    id_field: str | None = None  # else the row number
    description: str = ""


REGISTRY: dict[str, Benchmark] = {b.name: b for b in (
    Benchmark("gsm8k", ("gsm8k_test.jsonl*", "gsm8k*test*.jsonl*", "gsm8k/test.jsonl*"), _gsm8k,
              description="GSM8K test (openai/grade-school-math): question + worked answer"),
    Benchmark("math", ("math_test.jsonl*", "math*test*.jsonl*", "MATH*test*.jsonl*"), _fields("problem", "solution"),
              id_field="unique_id", description="MATH test (Hendrycks et al.): problem + solution"),
    Benchmark("humaneval", ("HumanEval.jsonl*", "humaneval*.jsonl*", "human_eval*.jsonl*"),
              _fields("prompt", "canonical_solution"), id_field="task_id",
              description="HumanEval (openai/human-eval): prompt + canonical solution"),
)}


def find_benchmark(name: str, dirs: list[str]) -> str:
    """The file of registry entry ``name`` under ``dirs`` (then ``$REFINERY_EVAL_DIR``)."""
    if name not in REGISTRY:
        raise ValueError(f"unknown eval set {name!r} (registry: {', '.join(REGISTRY)}; or give a file in eval_paths)")
    b = REGISTRY[name]
    search = [*dirs, *([os.environ["REFINERY_EVAL_DIR"]] if os.environ.get("REFINERY_EVAL_DIR") else [])]
    for pat in b.files:
        for d in search:
            root = Path(d).expanduser()
            found = sorted(p for p in root.glob(pat) if p.is_file()) if root.is_dir() else []
            if not found and root.is_dir():  # patterns are matched case-insensitively
                found = sorted(p for p in root.iterdir() if p.is_file() and fnmatch.fnmatch(p.name.lower(), pat.lower()))
            if found:
                return str(found[0].resolve())
    raise ValueError(f"eval set {name!r}: no file matching {', '.join(b.files)} under "
                     f"{', '.join(search) or '(no folder: set eval_dir or $REFINERY_EVAL_DIR)'}")


def _rows(path: str) -> Iterator[dict]:
    base = base_name(Path(path))
    if base.endswith(".parquet"):
        yield from pq.read_table(path).to_pylist()
        return
    with open_text(Path(path)) as f:
        for line in f:
            line = line.strip()
            if line:
                yield json.loads(line)


def benchmark_items(name: str, path: str) -> list[EvalItem]:
    """Items of registry entry ``name`` read from ``path``."""
    b = REGISTRY[name]
    out = []
    for i, row in enumerate(_rows(path)):
        item = str(row.get(b.id_field) or i) if b.id_field else str(i)
        out.append(EvalItem(name, item, [t for t in b.texts(row) if t]))
    return out


def file_items(path: str, text_field: str | list[str] = "text", name: str | None = None) -> list[EvalItem]:
    """Items of an eval file (see the module doc); the benchmark is named after the file."""
    p = Path(path)
    base = base_name(p)
    name = name or re.sub(r"\.(jsonl|json|ndjson|parquet|conllu|txt)$", "", base)
    fields = [text_field] if isinstance(text_field, str) else list(text_field)
    out: list[EvalItem] = []
    if base.endswith((".parquet", ".jsonl", ".json", ".ndjson")):
        texts = _fields(*fields)
        for i, row in enumerate(_rows(path)):
            ident = next((str(row[k]) for k in ("id", "task_id", "unique_id") if row.get(k) is not None), str(i))
            t = [x for x in texts(row) if x]
            if t:
                out.append(EvalItem(name, ident, t))
    elif base.endswith(".conllu"):
        doc, sents, k = None, [], 0
        with open_text(p) as f:
            for line in f:
                if line.startswith("# newdoc"):
                    if sents:
                        out.append(EvalItem(name, doc or str(k), [" ".join(sents)]))
                        k += 1
                    doc, sents = line.partition("=")[2].strip() or None, []
                elif line.startswith("# text ="):
                    sents.append(line[len("# text ="):].strip())
        if sents:
            out.append(EvalItem(name, doc or str(k), [" ".join(sents)]))
    else:
        with open_text(p) as f:
            for i, line in enumerate(f):
                if line.strip():
                    out.append(EvalItem(name, f"line{i + 1}", [line.rstrip("\n")]))
    return out
