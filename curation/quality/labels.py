"""From a crawl and a reference corpus to a fastText label file, through a teacher.

``quality_label(crawl, positive, teacher, out)``: the crawl and the reference corpus are files
(local or on object storage: Parquet, JSONL(.gz), .txt; a folder, a glob or a file) or
``Tables``: Arrow tables, as a run's stage gives its whole rows (``refinery quality label
RUN/STAGE`` reads them through the run's manifest, ``curation.pipeline.run_input.node_rows``;
this module never lists a run directory). Score teachers label the top ``fraction`` of the
crawl positive and the bottom ``fraction`` negative; the reference teacher labels the
reference positive and an equally large random sample of the crawl negative. Ties and samples
are decided by a seeded hash of each document's id, so the same inputs give the same labels.
``OUT`` is the fastText training file; ``OUT.json`` says how it was made.
"""

from __future__ import annotations

import glob
import gzip
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import numpy as np
import pyarrow as pa

from curation.formats.manifest import MANIFEST
from curation.io import location
from curation.io.files import atomic_path, file_sha256, write_json
from curation.quality.classifier import prepare_text
from curation.quality.teachers import ReferenceTeacher, Teacher, make_teacher, text_key

POSITIVE = "__label__hq"
NEGATIVE = "__label__lq"
SUFFIXES = (".parquet", ".jsonl", ".jsonl.gz", ".json.gz", ".txt")


class LabelError(ValueError):
    """Inputs that cannot be labelled (nothing found, nothing left after filtering...)."""


@dataclass(frozen=True)
class Tables:
    """Documents as Arrow tables with an ``id`` and a text column (e.g. a run stage's whole
    rows), and the name the label file's sidecar records for them."""

    name: str
    tables: Iterable[pa.Table]

    def __str__(self) -> str:
        return self.name


Documents = str | Path | Tables


def _files(source: str | Path) -> list[str]:
    """The document files of ``source`` (local or a URL): a folder (recursively), a glob or a
    file. A folder holding a run's stage output is refused: its shards are read through the
    manifest (``Tables``), never by listing."""
    s = str(source)
    if any(c in s for c in "*?["):
        found = location.glob(s) if location.is_remote(s) else sorted(glob.glob(s, recursive=True))
        files = [f for f in found if f.endswith(SUFFIXES)]
    elif under := location.files_under(s):
        manifests = sorted(f for f in under if location.name(f) == MANIFEST)
        if manifests:
            raise LabelError(f"{source}: holds a run's stage output ({manifests[0]}): label RUN/STAGE with "
                             "`refinery quality label`, which reads its committed shards through the manifest")
        files = sorted(f for f in under if f.endswith(SUFFIXES) and not location.name(f).startswith("."))
    else:
        files = [s] if location.exists(s) else []
    if not files:
        raise LabelError(f"{source}: no documents found (Parquet, JSONL(.gz) or .txt files, or a run's RUN/STAGE)")
    return files


def _table_docs(t: pa.Table, text_field: str, where: str) -> list[tuple[str, str]]:
    if text_field not in t.column_names:
        raise LabelError(f"{where}: no {text_field!r} column (columns: {sorted(t.column_names)})")
    ids = t.column("id").to_pylist() if "id" in t.column_names else [f"{where}:{i}" for i in range(t.num_rows)]
    return [(str(i), x) for i, x in zip(ids, t.column(text_field).to_pylist()) if x]


def read_documents(source: Documents, text_field: str = "text", min_chars: int = 1) -> list[tuple[str, str]]:
    """(id, text) of every document in ``source``: ``Tables``, or files (a folder, a file or a
    glob, local or on object storage) of Parquet shards, JSONL(.gz) (one object a line,
    ``text_field``) or plain text (one document per file). Ids are the documents' own (``id``
    column / field) or file:line."""
    docs: list[tuple[str, str]] = []
    if isinstance(source, Tables):
        for n, t in enumerate(source.tables):
            docs += _table_docs(t, text_field, f"{source.name}[{n}]")
        return [(i, t) for i, t in docs if len(t.strip()) >= min_chars]
    for f in _files(source):
        name = location.name(f)
        if name.endswith(".parquet"):
            cols = [c for c in ("id", text_field) if c in location.read_schema(f).names]
            docs += _table_docs(location.read_parquet(f, columns=cols), text_field, f)
        elif name.endswith((".jsonl", ".jsonl.gz", ".json.gz")):
            with location.open_read(f) as raw:
                fh = io.TextIOWrapper(gzip.GzipFile(fileobj=raw) if name.endswith(".gz") else raw, encoding="utf-8")
                for n, line in enumerate(fh):
                    if not line.strip():
                        continue
                    obj = json.loads(line)
                    if obj.get(text_field):
                        docs.append((str(obj.get("id", f"{name}:{n}")), obj[text_field]))
        elif name.endswith(".txt"):
            docs.append((name, location.read_bytes(f).decode("utf-8", errors="replace")))
    return [(i, t) for i, t in docs if len(t.strip()) >= min_chars]


def seeded_rank(ids: Sequence[str], seed: int) -> np.ndarray:
    """A deterministic pseudo-random number per id (uint64): ties and samples follow it."""
    return np.array([int.from_bytes(hashlib.sha256(f"{seed}:{i}".encode()).digest()[:8], "little") for i in ids],
                    np.uint64)


def top_bottom(scores: np.ndarray, ids: Sequence[str], fraction: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the top and bottom ``fraction`` by score; equal scores ordered by seeded id hash."""
    if not 0 < fraction <= 0.5:
        raise LabelError(f"fraction must be in (0, 0.5], got {fraction}")
    k = int(round(len(scores) * fraction))
    order = np.lexsort((seeded_rank(ids, seed), -np.asarray(scores, np.float64)))  # best first
    return order[:k], order[len(order) - k:][::-1]


def write_label_file(path: str | Path, positives: Sequence[str], negatives: Sequence[str], seed: int = 0) -> dict:
    """fastText training file (``__label__hq text`` lines, text through ``prepare_text``),
    shuffled with ``seed``. Returns counts and the file's sha256."""
    rows = [f"{POSITIVE} {prepare_text(t)}" for t in positives] + [f"{NEGATIVE} {prepare_text(t)}" for t in negatives]
    order = np.random.default_rng(seed).permutation(len(rows))
    path = Path(path)
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for i in order:
            f.write(rows[i] + "\n")
    return {"file": str(path), "sha256": file_sha256(path), "positives": len(positives), "negatives": len(negatives)}


def label_documents(teacher: Teacher, crawl: list[tuple[str, str]], reference: list[tuple[str, str]] | None,
                    fraction: float = 0.3, seed: int = 0) -> tuple[list[str], list[str], dict[str, Any]]:
    """Positives, negatives and a summary, by ``teacher`` over ``crawl`` (see module doc)."""
    if not crawl:
        raise LabelError("the crawl has no documents")
    if isinstance(teacher, ReferenceTeacher):
        if not reference:
            raise LabelError("the reference teacher needs a reference corpus (positive=...)")
        ref_keys = {text_key(t) for _, t in reference}
        pool = [(i, t) for i, t in crawl if text_key(t) not in ref_keys]  # crawl copies of reference docs: not negatives
        k = min(len(reference), len(pool))
        pick = np.argsort(seeded_rank([i for i, _ in pool], seed), kind="stable")[:k]
        pos = [t for _, t in reference]
        neg = [pool[j][1] for j in sorted(pick.tolist())]
        summary = {"pool": len(crawl), "reference": len(reference), "reference_in_crawl": len(crawl) - len(pool),
                   "negatives_sampled": k, "reference_keys": len(ref_keys)}
        return pos, neg, summary
    texts = [t for _, t in crawl]
    scores = np.asarray(teacher.score(texts), np.float64)
    top, bottom = top_bottom(scores, [i for i, _ in crawl], fraction, seed)
    finite = scores[np.isfinite(scores)]
    summary = {"pool": len(crawl), "fraction": fraction,
               "score_quantiles": {q: float(np.quantile(finite, q)) for q in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)}
               if len(finite) else {},
               "top_min_score": float(scores[top].min()) if len(top) else None,
               "bottom_max_score": float(scores[bottom].max()) if len(bottom) else None}
    return [texts[i] for i in top], [texts[i] for i in bottom], summary


def quality_label(crawl: Documents, positive: Documents | None, teacher: str, out: str | Path,
                  fraction: float = 0.3, seed: int = 0, text_field: str = "text", min_chars: int = 1,
                  teacher_options: dict[str, Any] | None = None,
                  log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Label crawl documents for classifier training (``refinery quality label``).

    ``crawl``: the documents to label: files (a folder, a glob, a file) or ``Tables`` (a run's
    stage: ``refinery quality label RUN/STAGE``). ``positive``: the reference corpus (the same
    kinds), needed by ``reference`` and ``perplexity``. ``teacher``: ``reference`` | ``perplexity`` | ``pkg.module:function``.
    Writes ``out`` (fastText format) and ``out.json`` (teacher, sources, counts); returns the
    latter."""
    source = str(crawl)
    crawl_docs = read_documents(crawl, text_field, min_chars)
    reference = read_documents(positive, text_field, min_chars) if positive else None
    if log:
        log(f"quality label: {len(crawl_docs)} crawl documents, {len(reference or [])} reference documents, teacher {teacher}")
    t = make_teacher(teacher, [x for _, x in reference] if reference else None, **(teacher_options or {}))
    pos, neg, summary = label_documents(t, crawl_docs, reference, fraction, seed)
    info = write_label_file(out, pos, neg, seed)
    meta = {"labels": info, "teacher": t.describe(), "seed": seed, "fraction": fraction,
            "positive_label": POSITIVE, "negative_label": NEGATIVE,
            "crawl": {"source": source, "documents": len(crawl_docs)},
            "reference": {"source": str(positive), "documents": len(reference)} if reference else None,
            "selection": summary}
    write_json(f"{out}.json", meta)
    if log:
        log(f"quality label: wrote {info['positives']} positives, {info['negatives']} negatives to {out}")
    return meta
