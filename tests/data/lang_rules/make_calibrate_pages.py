"""Rebuild ``calibrate_pages.jsonl.gz`` (run by hand, from the repository root):

    .venv/bin/python tests/data/lang_rules/make_calibrate_pages.py

Pages for the ``calibrate_rules`` tests (``tests/test_calibrate_rules.py``) and
``pipelines/calibrate-lang.yaml``: lingua's test sentences
(``shared/data/text/lingua_language_testdata_sentences.tar.xz``, pemistahl/lingua-py @754ce21 :
language-testdata/sentences/, Apache-2.0; sentences from the Leipzig Wortschatz corpora) in
English (the reference), Tagalog (no FineWeb-2 config, no stop-word list), German (a preset
entry) and Shona (too few pages to calibrate). Per language but Shona: 60 natural pages (the
first 600 sentences, 10 a page in paragraphs of 2-4) and 2 pages of each unnatural form of
``curation.quality.evaluate.unnatural_pages`` (tag clouds, menus, word salad, boilerplate,
repeated paragraphs, teasers, listings: what the rules exist to drop); Shona: 10 natural pages.
``{id, text, lang, form}``; seeded, byte-identical on rebuild.
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

from curation.quality.evaluate import natural_pages, unnatural_pages  # noqa: E402

LANGS = {"en": (60, 2), "tl": (60, 2), "de": (60, 2), "sn": (10, 0)}

if __name__ == "__main__":
    rng = random.Random(0)
    rows = []
    with tarfile.open(SHARED_DATA / "text" / "lingua_language_testdata_sentences.tar.xz") as tar:
        for lang, (n_nat, n_unnat) in LANGS.items():
            member = next(m for m in tar.getmembers() if m.name.endswith(f"/{lang}.txt"))
            sents = [s.strip() for s in tar.extractfile(member).read().decode("utf-8").splitlines() if s.strip()]
            for i, t in enumerate(natural_pages(lang, sents[: n_nat * 10], n_nat, rng)):
                rows.append({"id": f"{lang}-natural-{i}", "text": t, "lang": lang, "form": "natural"})
            if n_unnat:
                for i, (form, t) in enumerate(unnatural_pages(lang, sents[: n_nat * 10], n_unnat, rng)):
                    rows.append({"id": f"{lang}-{form}-{i}", "text": t, "lang": lang, "form": form})
    out = Path(__file__).parent / "calibrate_pages.jsonl.gz"
    with gzip.GzipFile(out, "wb", mtime=0) as f:
        for r in rows:
            f.write((json.dumps(r, ensure_ascii=False) + "\n").encode())
    print(out, len(rows))
