"""Pipeline benchmarks: print figures, assert nothing.

Section (a), heuristic filters: our four vectorised filter stages against datatrove's
``GopherRepetitionFilter -> GopherQualityFilter -> C4QualityFilter`` on the same real
documents, both on 2 worker processes, reading JSONL and writing Parquet. Prints docs/s,
the speed ratio, the keep/drop agreement and a per-rule table of disagreements.

Run: ``.venv/bin/python tests/benchmarks/bench_pipeline.py [--copies N] [--only ours|datatrove]``
(datatrove and spaCy come with the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import lzma
import os
import re
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

SHARED_DATA = Path(os.environ.get("REFINERY_SHARED_DATA", "/work/shared/data"))
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


# ---------------------------------------------------------------------------------------------
# Real documents
# ---------------------------------------------------------------------------------------------


def _jsonl_gz(path: Path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def _wikitext_articles(path: Path) -> list[str]:
    """WikiText-2 as one document per article (top-level ``= Title =`` headings split them)."""
    text = lzma.open(path, "rt", encoding="utf-8").read()
    articles, current = [], []
    for line in text.split("\n"):
        if re.fullmatch(r" = [^=].*[^=] = ", line) and current:
            articles.append("\n".join(current).strip("\n"))
            current = []
        current.append(line)
    if current:
        articles.append("\n".join(current).strip("\n"))
    return [a for a in articles if a.strip()]


def _ud_ewt_documents(path: Path) -> list[str]:
    """English Web Treebank documents: ``# text`` sentences, paragraphs on separate lines."""
    docs, paras, sents = [], [], []
    for line in lzma.open(path, "rt", encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("# newdoc"):
            if sents:
                paras.append(" ".join(sents))
            if paras:
                docs.append("\n".join(paras))
            paras, sents = [], []
        elif line.startswith("# newpar"):
            if sents:
                paras.append(" ".join(sents))
            sents = []
        elif line.startswith("# text = "):
            sents.append(line[len("# text = ") :])
    if sents:
        paras.append(" ".join(sents))
    if paras:
        docs.append("\n".join(paras))
    return docs


def _botchan_chapters(path: Path, lines_per_doc: int = 60) -> list[str]:
    lines = lzma.open(path, "rt", encoding="utf-8-sig").read().split("\n")
    return ["\n".join(lines[i : i + lines_per_doc]) for i in range(0, len(lines), lines_per_doc)]


def load_real_documents() -> list[dict]:
    """About 1,700 distinct real English documents from shared/data, as ``{id, text, source}``.

    Web pages (DCLM, Dolma CC), news articles (article-extraction gold bodies), Wikipedia
    (WikiText-2), web treebank documents (UD EWT: reviews, emails, blogs) and a novel.
    """
    docs: list[dict] = []
    seen: set[str] = set()

    def add(source: str, text: str) -> None:
        if text in seen:
            return
        seen.add(text)
        docs.append({"id": f"{source}-{len(docs)}", "text": text, "source": source})

    for name in ("dclm_majority_data.jsonl.gz", "dclm_agreement_data.jsonl.gz"):
        for rec in _jsonl_gz(SHARED_DATA / "jsonl" / name):
            add("dclm", rec["text"])
    for name in ("dolma_cc_en_head-0091.jsonl.gz", "dolma_cc_en_head-0174.jsonl.gz"):
        for rec in _jsonl_gz(SHARED_DATA / "jsonl" / name):
            add("dolma_cc", rec["text"])
    with gzip.open(SHARED_DATA / "html" / "article_extraction_benchmark_ground-truth.json.gz", "rt") as f:
        for rec in json.load(f).values():
            add("news", rec["articleBody"])
    for name in ("wikitext-2_valid.txt.xz", "wikitext-2_test.txt.xz"):
        for text in _wikitext_articles(SHARED_DATA / "text" / name):
            add("wikitext", text)
    for name in ("ud_english_ewt-dev.conllu.xz", "ud_english_ewt-test.conllu.xz"):
        for text in _ud_ewt_documents(SHARED_DATA / "text" / name):
            add("ud_ewt", text)
    for text in _botchan_chapters(SHARED_DATA / "text" / "sentencepiece_botchan.txt.xz"):
        add("botchan", text)
    return docs


if __name__ == "__main__":
    docs = load_real_documents()
    print(len(docs), Counter(d["source"] for d in docs))
