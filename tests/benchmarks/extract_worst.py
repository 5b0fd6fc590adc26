"""Where the blocks engine still fails: the worst WCXB dev pages of a block model's cross-validation
(``refinery extract train --gold wcxb,... --cv`` stores the 20 worst pages of its gold sets in the
model's card, out of fold; those of ``--set`` are printed), each
with its type, its word P / R / F1, the gold's and the decision's word counts and what went wrong,
read off those counts. Prints Markdown; asserts nothing.

    refinery extract train --gold wcxb,aeb,readability,trafilatura --cv --out M.json
    python tests/benchmarks/extract_worst.py M.json [--top 10] [--set wcxb]
"""

from __future__ import annotations

import argparse
import json
import re

from curation.extract.gold import load

_WORD = re.compile(r"\w+")


def what_went_wrong(p: float, r: float, gold_words: int) -> str:
    if gold_words == 0:
        return "no main content by the gold (an empty gold scores 1 only for an empty extraction); kept some"
    if p == 0 and r == 0:
        return "none of the gold's words kept: an empty extraction, or the wrong region"
    if r < 0.3 and p >= 0.5:
        return "kept too little: most of the gold's blocks scored as boilerplate"
    if p < 0.3 and r >= 0.5:
        return "kept too much: the gold's words among many boilerplate blocks"
    return "both: part of the gold lost, boilerplate kept"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--set", default="wcxb", help="the gold set whose worst pages to print (names: WCXB's)")
    a = ap.parse_args()
    card = json.loads(open(a.model).read())["trained_on"]
    worst = [w for w in card.get("cv_worst") or [] if w.get("set", "wcxb") == a.set]
    if not worst:
        raise SystemExit(f"{a.model}: no cv_worst of {a.set} in its card (train it with --cv on {a.set})")
    gold = {p.name: p for p in load(a.set)}
    print("| # | page | type | P | R | F1 | gold words | what went wrong |")
    print("|---|---|---|---|---|---|---|---|")
    for k, w in enumerate(worst[:a.top], 1):
        page = gold.get(w["page"])
        n = len(_WORD.findall((page.text or "").lower())) if page else -1
        print(f"| {k} | {w['page']} {w['url']} | {w['type']} | {w['precision']:.2f} | {w['recall']:.2f} | "
              f"{w['f1']:.2f} | {n} | {what_went_wrong(w['precision'], w['recall'], n)} |")


if __name__ == "__main__":
    main()
