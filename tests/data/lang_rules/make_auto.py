"""Rebuild ``curation/text/data/lang_rules/auto.json`` (run by hand, from the repository root):

    .venv/bin/python tests/data/lang_rules/make_auto.py > curation/text/data/lang_rules/auto.json

``auto`` is ``fineweb2`` plus ``min_stop_words_frac`` (the share of a page's words that are stop
words) per language, calibrated on natural text: lingua's even-numbered sentences
(``shared/data/text/lingua_language_testdata_sentences.tar.xz``; the odd-numbered ones are what
``tests/benchmarks/bench_lang_natural.py`` measures on), pages of 10 sentences, for every
language with a stop-word list (English: Gopher's). The cut is half the 5th percentile of the
language's pages: the same share of natural pages is below half that quantile in every
language, English included, so each language loses about what English loses to the rule.
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from real_corpus import SHARED_DATA  # noqa: E402

from curation.stages.gopher_quality import GopherQualityFilter  # noqa: E402
from curation.text import lang_rules  # noqa: E402

QUANTILE, FACTOR = 5, 0.5

if __name__ == "__main__":
    stage = GopherQualityFilter(lang_config="fineweb2", min_stop_words_frac=0.0)
    langs = {}
    with tarfile.open(SHARED_DATA / "text" / "lingua_language_testdata_sentences.tar.xz") as tar:
        for m in sorted((m for m in tar.getmembers() if m.name.endswith(".txt")), key=lambda m: m.name):
            lang = Path(m.name).stem
            if not stage.view(lang).stop_words or (lang != "en" and not lang_rules.has_own_entry(lang)):
                continue
            sents = [s.strip() for s in tar.extractfile(m).read().decode("utf-8").splitlines() if s.strip()][0::2]
            sep = "" if lang in lang_rules.CHAR_WORD_LANGS else " "
            docs = [sep.join(sents[i: i + 10]) for i in range(0, len(sents) - 9, 10)]
            batch = pa.table({"text": docs, "lang": [lang] * len(docs)})
            frac = stage.measure(batch)[0].column("gopher_stop_words_frac").to_numpy(zero_copy_only=False)
            cut = round(FACTOR * float(np.nanpercentile(frac, QUANTILE)), 3)
            langs[lang] = {"gopher_quality": {"min_stop_words_frac": cut}}
    if "nb" in langs:
        langs["no"] = langs["nb"]  # CLD2 says "no" for Bokmål, as in fineweb2
    out = {"name": "auto", "base": "fineweb2",
           "source": "fineweb2, plus min_stop_words_frac calibrated on lingua's even-numbered sentences "
                     "(tests/data/lang_rules/make_auto.py)",
           "calibration": {"quantile": QUANTILE, "factor": FACTOR}, "languages": langs}
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1)
    sys.stdout.write("\n")
