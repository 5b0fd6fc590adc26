"""Rebuild ``fineweb2.json`` from a checkout of github.com/huggingface/fineweb-2 (run by hand).

    .venv/bin/python tests/data/lang_rules/make_fineweb2.py PATH/TO/fineweb-2 \
        > curation/text/data/lang_rules/fineweb2.json

Reads ``configs/{iso639-3}_{script}.yml`` (FineWeb-2's per-language thresholds and stop
words) and the constants of ``fineweb-2-pipeline.py`` (written out below), maps each config
to the code our ``lang`` column holds (``langid.normalize_lang``: ``deu_Latn`` -> ``de``,
``cmn_Hani`` -> ``zh``), keeps for each code the subset with the most words
(``fineweb2-language-distribution.csv``) and writes, per language, the fields of each stage
that FineWeb-2 sets: for every code the ``langid`` stage can write (CLD2's languages and every
ISO 639-1 code, ``CODES``) that has a FineWeb-2 config. Stop words only where they work with
our word splitting (``NO_STOP_WORDS``: the README says how that was checked); the other
thresholds everywhere. ``fallback``: what a code without a config gets (``lang_rules``).
For the languages split into characters (zh, ja) the thresholds that count words are scaled
by ``CHAR_WORDS`` (see the README).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from curation.quality.langid import normalize_lang  # noqa: E402

#: Languages whose stop words were checked: FineWeb-2 has a config, CLD2 reports the code, and
#: the stop words pass the sanity check of tests/benchmarks/bench_lang_rules.py on lingua's
#: sentences (see curation/text/data/lang_rules/README.md). The fallback's thresholds are
#: their medians.
LANGS = ("af ar az be bg bn bs ca cs cy da de el eo es et eu fa fi fr ga gu he hi hr hu hy id is it ja ka "
         "kk lg lt lv mi mk mn mr ms nb nl nn pa pl pt ro ru sk sl so sq sr st sv sw ta tn tr ts uk ur vi xh "
         "yo zh").split()

#: Stop-word lists that do not work with words split at spaces: the sanity check's failures
#: (ko 26%, te 34%, th 22%, sn 70%, zu 90%, la 93% of lingua's documents with 2 stop words) and
#: the languages written without spaces between words (Thai, Lao, Khmer, Burmese, Tibetan,
#: Dzongkha). Their other thresholds are FineWeb-2's; the stop-word rule is off.
NO_STOP_WORDS = frozenset("ko te th sn zu la lo km my bo dz".split())

#: Written without spaces between words: our words there are space-separated phrases, not
#: FineWeb-2's segmenter's words (and Thai's split at its combining vowels makes most of them
#: letterless), so the rules on word length, word count and alphabetic words are off.
NO_SPACES = frozenset("th lo km my bo dz".split())

#: Codes a fallback is written for, besides those with an entry: never English (the stage's own
#: rules) nor CLD2's "xx" (unknown) and "zzp" / "tlh" (not natural languages).
NOT_LANGUAGES = frozenset({"en", "xx", "zzp", "tlh"})

#: zh and ja: words are characters here, not jieba / SudachiPy words. Characters per
#: dictionary word, measured on real text (README, "Chinese and Japanese"): word-count bounds
#: scale by it, newlines per word by its inverse, duplicated n-grams of n words become
#: duplicated n-grams of round(n * k) characters (same thresholds); top n-grams, mean word
#: length, alpha words and the line rules keep FineWeb-2's values.
CHAR_WORDS = {"zh": 1.7, "ja": 1.6}

#: Codes our langid writes for a language FineWeb-2 files under another: CLD2 says "no" for
#: Norwegian (Bokmål, FineWeb-2's nob_Latn = "nb").
ALIASES = {"no": "nb"}

# fineweb-2-pipeline.py, step 5: the values every language shares
REPETITION_FIXED = {"dup_para_frac": None, "dup_para_char_frac": None, "dup_line_char_frac": None}  # 0 = off
FINEWEB_FIXED = {"short_line_thr": None, "char_duplicates_ratio": 0.1}  # 999 = off; 0.01 in FineWeb
QUALITY_FIXED = {"min_stop_words": 2}


def entry(cfg: dict, lang: str) -> dict:
    q = {**QUALITY_FIXED, "stop_words": list(cfg["stopwords"]),
         "min_avg_word_length": cfg["min_avg_word_length"], "max_avg_word_length": cfg["max_avg_word_length"],
         "min_alpha_words_ratio": cfg["max_non_alpha_words_ratio"]}
    r = {**REPETITION_FIXED, "dup_line_frac": cfg["dup_line_frac"],
         "top_n_grams": {str(n): v for n, v in cfg["top_n_grams"]},
         "dup_n_grams": {str(n): v for n, v in cfg["dup_n_grams"]}}
    # -1 (most of FineWeb-2's smaller languages): the rule never fires, i.e. off
    punct = None if cfg["line_punct_thr"] < 0 else cfg["line_punct_thr"]
    f = {**FINEWEB_FIXED, "line_punct_thr": punct, "new_line_ratio": cfg["new_line_ratio"]}
    if lang in CHAR_WORDS:
        k = CHAR_WORDS[lang]
        for st in (q, r, f):
            st["words"] = "chars"
        q["min_doc_words"] = round(50 * k)
        q["max_doc_words"] = round(100_000 * k)
        r["dup_n_grams"] = {str(round(n * k)): v for n, v in cfg["dup_n_grams"]}
        f["new_line_ratio"] = round(cfg["new_line_ratio"] / k, 3)
    return {"gopher_quality": q, "gopher_repetition": r, "fineweb_quality": f}


def codes() -> list[str]:
    """Every code our langid can write for a language: CLD2's, and every ISO 639-1 code."""
    import pycld2

    from curation.quality.langid import _ISO3_TO_1

    cld2 = {normalize_lang(c) for name, c in pycld2.LANGUAGES if name in pycld2.DETECTED_LANGUAGES}
    return sorted((cld2 | set(_ISO3_TO_1.values())) - {None} - NOT_LANGUAGES)


def fallback(entries: dict) -> dict:
    """The entry of a language without a FineWeb-2 config: per threshold, the median over the
    checked languages split at spaces; no stop-word rule (no list)."""
    import statistics

    base = [entries[lang] for lang in LANGS if lang not in CHAR_WORDS]
    out = {}
    for stage, fields in base[0].items():
        out[stage] = {}
        for field, value in fields.items():
            if field == "stop_words":
                out[stage][field] = []
            elif field == "min_stop_words":
                out[stage][field] = None
            elif isinstance(value, dict):
                out[stage][field] = {k: round(statistics.median(e[stage][field][k] for e in base), 3) for k in value}
            elif isinstance(value, (int, float)) and value not in (None, True, False) and field not in QUALITY_FIXED:
                med = statistics.median(e[stage][field] for e in base if e[stage][field] is not None)
                out[stage][field] = round(med, 3) if isinstance(value, float) else int(round(med))
            else:
                out[stage][field] = value
    return out


def main(repo: Path) -> None:
    words = {}
    with open(repo / "fineweb2-language-distribution.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["split"] == "train" and row["words"] not in ("", "-"):
                words[row["subset"]] = int(row["words"])
    all_codes = codes()
    wanted = set(all_codes) | set(LANGS)
    best: dict[str, str] = {}
    for path in sorted((repo / "configs").glob("*.yml")):
        subset = path.stem
        lang = normalize_lang(subset)
        if lang in wanted and words.get(subset, 0) > words.get(best.get(lang, ""), -1):
            best[lang] = subset
    missing = sorted(set(LANGS) - set(best))
    if missing:
        raise SystemExit(f"no FineWeb-2 config for {missing}")
    out = {
        "name": "fineweb2",
        "source": "https://github.com/huggingface/fineweb-2 configs/*.yml and fineweb-2-pipeline.py",
        "licence": "Apache-2.0 (the repository); FineWeb-2 data: ODC-By 1.0",
        "subsets": {lang: best[lang] for lang in sorted(best)},
        "char_words": CHAR_WORDS,
        "codes": all_codes,
        "no_stop_words": sorted(NO_STOP_WORDS),
        "languages": {},
    }
    for alias, lang in ALIASES.items():
        best[alias] = best[lang]
    out["subsets"] = {lang: best[lang] for lang in sorted(best)}
    for lang in sorted(best):
        cfg = yaml.safe_load((repo / "configs" / f"{best[lang]}.yml").read_text(encoding="utf-8"))
        out["languages"][lang] = entry(cfg, lang)
        if lang in NO_STOP_WORDS:
            out["languages"][lang]["gopher_quality"].update(stop_words=[], min_stop_words=None)
        if lang in NO_SPACES:
            out["languages"][lang]["gopher_quality"].update(min_avg_word_length=None, max_avg_word_length=None,
                                                            min_doc_words=None, min_alpha_words_ratio=None)
    out["fallback"] = fallback(out["languages"])
    json.dump(out, sys.stdout, ensure_ascii=False, indent=1, sort_keys=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
