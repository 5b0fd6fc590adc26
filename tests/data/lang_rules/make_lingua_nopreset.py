"""Rebuild ``lingua_nopreset.jsonl.gz`` (run by hand, from the repository root):

    .venv/bin/python tests/data/lang_rules/make_lingua_nopreset.py

Natural pages in languages that had no ``fineweb2`` entry before every language got one
(Korean, Tagalog, Shona, Zulu, Latin, Telugu): the first 60 odd-numbered sentences of each
language's lingua test file (``shared/data/text/lingua_language_testdata_sentences.tar.xz``,
Apache-2.0; sentences from the Leipzig Wortschatz corpora), 10 sentences a page in paragraphs
of 3 (as ``tests/benchmarks/bench_lang_natural.py`` builds its natural pages): 6 pages a
language, ``{text, lang}``.
"""

from __future__ import annotations

import gzip
import json
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from real_corpus import SHARED_DATA  # noqa: E402

LANGS = ("ko", "tl", "sn", "zu", "la", "te")

if __name__ == "__main__":
    rows = []
    with tarfile.open(SHARED_DATA / "text" / "lingua_language_testdata_sentences.tar.xz") as tar:
        for lang in LANGS:
            member = next(m for m in tar.getmembers() if m.name.endswith(f"/{lang}.txt"))
            sents = [s.strip() for s in tar.extractfile(member).read().decode("utf-8").splitlines() if s.strip()]
            sents = sents[1::2][:60]
            for i in range(0, 60, 10):
                chunk = sents[i: i + 10]
                rows.append({"text": "\n".join(" ".join(chunk[j: j + 3]) for j in range(0, 10, 3)), "lang": lang})
    with gzip.open(Path(__file__).parent / "lingua_nopreset.jsonl.gz", "wt", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
