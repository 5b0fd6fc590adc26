"""Rebuild the ``refinery eval`` fixtures (run by hand, from the repository root):

    .venv/bin/python tests/data/eval/make_fixtures.py

- ``rules_pages.jsonl.gz``: labelled pages for ``refinery eval rules``, 12 languages (en, de,
  fr, es, ru, ar, hi, tr, zh, ja, tl, sn): per language 4 natural pages (10 consecutive
  held-out, odd-numbered sentences of the language's lingua test file, in paragraphs of 2-4)
  and one page of each unnatural form (``curation.quality.evaluate.UNNATURAL_FORMS``) built
  from the same sentences, ``{id, text, lang, label, form}``. Source:
  ``shared/data/text/lingua_language_testdata_sentences.tar.xz`` (pemistahl/lingua-py @754ce21 :
  language-testdata/sentences/, Apache-2.0; sentences from the Leipzig Wortschatz corpora).
- ``dedup_pairs.jsonl``: labelled pairs of document ids of ``tests/data/dedup/`` for
  ``refinery eval dedup``: the 150 planted near-duplicates with their original (label 1, kind
  = the edit), and each near-duplicate with the original it is most similar to among the
  others (label 0, kind ``distinct``; exact 5-gram Jaccard), ``{a, b, label, kind}``.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from real_corpus import SHARED_DATA  # noqa: E402

from curation.dedup.minhash import jaccard, shingle_sets  # noqa: E402
from curation.quality.evaluate import natural_pages, unnatural_pages  # noqa: E402

HERE = Path(__file__).parent
LANGS = ("en", "de", "fr", "es", "ru", "ar", "hi", "tr", "zh", "ja", "tl", "sn")


def rules_pages() -> None:
    rng = random.Random(0)
    rows = []
    with tarfile.open(SHARED_DATA / "text" / "lingua_language_testdata_sentences.tar.xz") as tar:
        members = {Path(m.name).stem: m for m in tar.getmembers() if m.name.endswith(".txt")}
        for lang in LANGS:
            sents = [s.strip() for s in tar.extractfile(members[lang]).read().decode("utf-8").splitlines() if s.strip()]
            sents = sents[1::2]  # held out: odd-numbered sentences
            for k, t in enumerate(natural_pages(lang, sents[:40], 4, rng)):
                rows.append({"id": f"{lang}-natural-{k}", "text": t, "lang": lang, "label": "natural", "form": "natural"})
            for form, t in unnatural_pages(lang, sents[40:400], 1, rng):
                rows.append({"id": f"{lang}-{form}", "text": t, "lang": lang, "label": "unnatural", "form": form})
    with gzip.GzipFile(HERE / "rules_pages.jsonl.gz", "wb", mtime=0) as f:
        f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode())


def dedup_pairs() -> None:
    def load(name: str) -> list[dict]:
        with gzip.open(ROOT / "tests" / "data" / "dedup" / name, "rt", encoding="utf-8") as f:
            return [json.loads(x) for x in f]
    docs, dups = load("dclm_docs_150.jsonl.gz"), load("near_dups.jsonl.gz")
    doc_sets = dict(zip((d["id"] for d in docs), shingle_sets([d["text"] for d in docs], 5)))
    rows = []
    for d, s in zip(dups, shingle_sets([d["text"] for d in dups], 5)):
        rows.append({"a": d["origin"], "b": d["id"], "label": 1, "kind": d["edit"]})
        other = max((k for k in doc_sets if k != d["origin"]), key=lambda k: (jaccard(s, doc_sets[k]), k))
        rows.append({"a": other, "b": d["id"], "label": 0, "kind": "distinct"})
    (HERE / "dedup_pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


if __name__ == "__main__":
    rules_pages()
    dedup_pairs()
