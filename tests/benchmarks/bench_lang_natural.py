"""Per-language rules, measured as a trade-off: natural pages dropped vs unnatural pages caught,
per language, by the Gopher repetition -> Gopher quality -> FineWeb chain. Run by hand:

    .venv/bin/python tests/benchmarks/bench_lang_natural.py [--docs 40] [--json OUT]

Natural pages: lingua's labelled sentences (``shared/data/text/lingua_language_testdata_
sentences.tar.xz``, 75 languages, Leipzig news/web sentences), the odd-numbered sentences only
(the even ones are left for anything that derives words from the data), 10 sentences a page
in paragraphs of 2-4 sentences. The page's ``lang`` is its file's label (the rules are measured,
not the language ID).

Unnatural pages, built per language from the same held-out sentences, in the forms human
raters flag as not natural text (FineWeb-C's "problematic", DCLM's "drop"): ``keywords`` (a
tag cloud: 80 distinct words of the language, comma-separated), ``menu`` (60 lines of 1-3
words), ``salad`` (words drawn uniformly from the language's vocabulary, 12 a line, no
punctuation), ``boilerplate`` (4 short lines repeated 12 times around one sentence),
``repeated`` (one paragraph 6 times), ``teasers`` (25 sentence openings cut with "..."),
``listing`` (40 product rows: words, prices, dates, codes). For Chinese and Japanese a
"word" is two characters.

Configurations: ``english`` (the stages' own rules for every page), ``fineweb2``
(``lang_config: fineweb2``), ``auto`` (``lang_config: auto``: fineweb2 plus the stop-word share
calibrated on lingua's other, even-numbered sentences) where it exists; with ``--fallback`` also ``fallback``: every language judged by
the entry a language without a preset entry gets (``lang_rules.fallback_entry``), given as
``by_lang`` — a leave-one-out check of the fallback on languages whose real entry is known.
Prints one table per language and the totals; ``--json`` writes the figures.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_corpus import SHARED_DATA  # noqa: E402

from curation.stages.fineweb_quality import FineWebQualityFilter  # noqa: E402
from curation.stages.gopher_quality import GopherQualityFilter
from curation.stages.gopher_repetition import GopherRepetitionFilter
from curation.pipeline.evaluate import chain_kept  # noqa: E402
from curation.quality.evaluate import UNNATURAL_FORMS, natural_pages, unnatural_pages  # noqa: E402
from curation.text import lang_rules  # noqa: E402

LINGUA = SHARED_DATA / "text" / "lingua_language_testdata_sentences.tar.xz"
FILTERS = {"gopher_repetition": GopherRepetitionFilter, "gopher_quality": GopherQualityFilter,
           "fineweb_quality": FineWebQualityFilter}
FORMS = UNNATURAL_FORMS
natural, unnatural = natural_pages, unnatural_pages


def lingua() -> dict[str, list[str]]:
    out = {}
    with tarfile.open(LINGUA) as tar:
        for m in sorted((m for m in tar.getmembers() if m.name.endswith(".txt")), key=lambda m: m.name):
            sents = [s.strip() for s in tar.extractfile(m).read().decode("utf-8").splitlines() if s.strip()]
            out[Path(m.name).stem] = sents[1::2]  # held out: odd-numbered sentences
    return out


def configs(fallback: bool, langs: list[str]) -> dict[str, list]:
    out = {"english": [cls() for cls in FILTERS.values()],
           "fineweb2": [cls(lang_config="fineweb2") for cls in FILTERS.values()]}
    if "auto" in lang_rules.presets():
        out["auto"] = [cls(lang_config="auto") for cls in FILTERS.values()]
    if fallback:
        out["fallback"] = [cls(by_lang={lang: lang_rules.fallback_entry(lang)[name] for lang in langs if lang != "en"})
                           for name, cls in FILTERS.items()]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=40, help="natural pages per language (and unnatural pages per form / 5)")
    ap.add_argument("--fallback", action="store_true", help="also judge every language by the no-entry fallback")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = random.Random(0)
    data = lingua()
    ids, texts, langs, labels, forms = [], [], [], [], []
    for lang, sents in data.items():
        for t in natural(lang, sents, args.docs, rng):
            texts.append(t), langs.append(lang), labels.append(1), forms.append("natural")
        for form, t in unnatural(lang, sents, max(1, args.docs // 5), rng):
            texts.append(t), langs.append(lang), labels.append(0), forms.append(form)
    n = len(texts)
    table = pa.table({"id": [str(i) for i in range(n)], "text": texts, "source": ["lingua"] * n,
                      "lang": langs})
    langs_a, labels_a, forms_a = np.array(langs, object), np.array(labels), np.array(forms, object)
    kept = {}
    for name, stages in configs(args.fallback, sorted(data)).items():
        kept[name] = chain_kept(stages, table)
    own = getattr(lang_rules, "has_own_entry", lambda lang: lang in lang_rules.preset("fineweb2"))
    preset = {lang for lang in data if own(lang)}
    names = list(kept)
    print(f"{n} pages, {int(labels_a.sum())} natural, {int((1 - labels_a).sum())} unnatural, {len(data)} languages; "
          f"natural dropped / unnatural caught by {' | '.join(names)}\n")
    print("| lang | entry | " + " | ".join(f"natural dropped {x}" for x in names) + " | "
          + " | ".join(f"unnatural caught {x}" for x in names) + " |")
    print("|" + "---|" * (2 + 2 * len(names)))
    figures = {"languages": {}, "forms": {}, "total": {}}
    for lang in sorted(data) + ["all"]:
        sel = np.ones(n, bool) if lang == "all" else langs_a == lang
        nat, unn = sel & (labels_a == 1), sel & (labels_a == 0)
        row = {x: {"natural_dropped": float(1 - kept[x][nat].mean()), "unnatural_caught": float(1 - kept[x][unn].mean())}
               for x in names}
        (figures["total"] if lang == "all" else figures["languages"]).update({lang: row} if lang != "all" else row)
        entry = "all" if lang == "all" else ("yes" if lang in preset else "no")
        print(f"| {lang} | {entry} | " + " | ".join(f"{row[x]['natural_dropped']:.0%}" for x in names) + " | "
              + " | ".join(f"{row[x]['unnatural_caught']:.0%}" for x in names) + " |")
    print("\nUnnatural pages caught per form, all languages\n")
    print("| form | " + " | ".join(names) + " |")
    print("|" + "---|" * (1 + len(names)))
    for form in FORMS:
        sel = forms_a == form
        figures["forms"][form] = {x: float(1 - kept[x][sel].mean()) for x in names}
        print(f"| {form} | " + " | ".join(f"{figures['forms'][form][x]:.0%}" for x in names) + " |")
    nopre = [lang for lang in data if lang not in preset and lang != "en"]
    if nopre:
        sel = np.isin(langs_a, nopre)
        print(f"\nLanguages without a preset entry ({', '.join(nopre)}): natural dropped "
              + ", ".join(f"{x} {1 - kept[x][sel & (labels_a == 1)].mean():.0%}" for x in names)
              + "; unnatural caught " + ", ".join(f"{x} {1 - kept[x][sel & (labels_a == 0)].mean():.0%}" for x in names))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
