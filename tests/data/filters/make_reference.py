"""Rebuild this folder's fixtures: real documents and what datatrove and spaCy make of them.

    .venv/bin/python tests/data/filters/make_reference.py   # needs the `bench` extra

Writes ``real_docs.jsonl.gz`` (a small selection of the real documents the benchmark uses,
see ``tests/benchmarks/bench_pipeline.py::load_real_documents``) and
``datatrove_reference.jsonl.gz``: per document, the drop reason (or null) of datatrove's
GopherRepetitionFilter, GopherQualityFilter, C4QualityFilter and FineWebQualityFilter, each
run alone with default thresholds, C4's rewritten text, and spaCy's English word split
(``datatrove.utils.text.split_into_words``). The tests compare our filters with these
without needing datatrove or spaCy installed.
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1] / "benchmarks"))

# How many documents of each source to keep, and the largest text taken (chars): enough
# variety for every rule, small enough to stay a fixture.
PER_SOURCE = {"dclm": 60, "dolma_cc": 10, "news": 20, "wikitext": 6, "ud_ewt": 30, "botchan": 6}
MAX_CHARS = 12_000


def main() -> None:
    from bench_pipeline import load_real_documents
    from datatrove.data import Document
    from datatrove.pipeline.filters import (C4QualityFilter, FineWebQualityFilter,
                                            GopherQualityFilter, GopherRepetitionFilter)
    from datatrove.utils.text import split_into_words

    taken: dict[str, int] = {}
    docs = []
    for d in load_real_documents():
        if len(d["text"]) > MAX_CHARS or taken.get(d["source"], 0) >= PER_SOURCE[d["source"]]:
            continue
        taken[d["source"]] = taken.get(d["source"], 0) + 1
        docs.append(d)
    filters = {"gopher_repetition": GopherRepetitionFilter(), "gopher_quality": GopherQualityFilter(),
               "c4_quality": C4QualityFilter(), "fineweb_quality": FineWebQualityFilter()}
    with gzip.open(HERE / "real_docs.jsonl.gz", "wt", encoding="utf-8") as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    with gzip.open(HERE / "datatrove_reference.jsonl.gz", "wt", encoding="utf-8") as f:
        for d in docs:
            rec = {"id": d["id"], "words": split_into_words(d["text"])}
            for name, flt in filters.items():
                doc = Document(text=d["text"], id=d["id"])
                res = flt.filter(doc)
                rec[name] = None if res is True else res[1]
                if name == "c4_quality":
                    rec["c4_text"] = doc.text
            f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    print(f"{len(docs)} documents: {taken}")


if __name__ == "__main__":
    main()
