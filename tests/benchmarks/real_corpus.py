"""Readers for the real text in ../shared/data that several benchmarks draw documents from
(each benchmark picks its own mix): JSONL, WikiText-2 articles, UD English Web Treebank
documents, and a novel cut into chapters."""

from __future__ import annotations

import gzip
import json
import lzma
import os
import re
from pathlib import Path

SHARED_DATA = Path(os.environ.get("REFINERY_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))


def jsonl_gz(path: Path):
    with gzip.open(path, "rt", encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def wikitext_articles(path: Path) -> list[str]:
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


def ud_ewt_documents(path: Path) -> list[str]:
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
            sents.append(line[len("# text = "):])
    if sents:
        paras.append(" ".join(sents))
    if paras:
        docs.append("\n".join(paras))
    return docs


def botchan_chapters(path: Path, lines_per_doc: int = 60) -> list[str]:
    lines = lzma.open(path, "rt", encoding="utf-8-sig").read().split("\n")
    return ["\n".join(lines[i: i + lines_per_doc]) for i in range(0, len(lines), lines_per_doc)]
