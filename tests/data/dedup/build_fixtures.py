"""Rebuild the near-duplicate fixtures of this folder from real documents.

    .venv/bin/python tests/data/dedup/build_fixtures.py [--shared ../shared/data]

- ``dclm_docs_150.jsonl.gz``: 150 real Common Crawl documents (``{id, text}``), the first
  150 of DCLM's ``majority_data.jsonl`` with 80 to 1,200 words (ids keep the line number).
- ``near_dups.jsonl.gz``: planted near-duplicates of the first 100 of them
  (``{id, text, origin, edit}``): the real text with realistic edits (``EDITS``).

The edit functions are also used by ``tests/benchmarks/bench_dedup.py`` to grow real text to
a corpus of any size.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent

# Navigation and sharing boilerplate of the kind crawled pages carry around their content.
HEADERS = [
    "Skip to main content\nHome | News | Sport | Business | Contact Us",
    "Menu\nHome About Blog Shop Contact\nSearch this site",
    "You are here: Home » Articles » Archive",
    "Sign in | Register\nFree shipping on orders over $50",
]
FOOTERS = [
    "Share this: Facebook Twitter Pinterest Email\nRelated Posts",
    "© 2019 All rights reserved. Privacy Policy | Terms of Use | Cookie Settings",
    "Leave a Reply\nYour email address will not be published. Required fields are marked *",
    "This entry was posted in Uncategorized. Bookmark the permalink.",
]

_SENT = re.compile(r"(?<=[.!?])\s+")


def sentences(text: str) -> list[str]:
    return [s for s in _SENT.split(text) if s.strip()]


def insert_sentences(text: str, rng: random.Random, donor: str) -> str:
    """1-2 sentences of another document inserted between lines or sentences."""
    lines = text.split("\n")
    extra = sentences(donor)
    for _ in range(rng.randint(1, 2)):
        if not extra:
            break
        s = rng.choice(extra)
        i = rng.randrange(len(lines))
        parts = sentences(lines[i]) or [lines[i]]
        j = rng.randint(0, len(parts))
        lines[i] = " ".join(parts[:j] + [s] + parts[j:])
    return "\n".join(lines)


def delete_sentence(text: str, rng: random.Random) -> str:
    """One sentence (of a line with several) removed, as an editor's cut."""
    lines = text.split("\n")
    cands = [i for i, line in enumerate(lines) if len(sentences(line)) >= 2] or list(range(len(lines)))
    i = rng.choice(cands)
    parts = sentences(lines[i])
    if len(parts) >= 2:
        del parts[rng.randrange(len(parts))]
        lines[i] = " ".join(parts)
    else:
        words = lines[i].split()
        k = max(1, len(words) // 10)
        j = rng.randrange(max(1, len(words) - k))
        lines[i] = " ".join(words[:j] + words[j + k:])
    return "\n".join(lines)


def boilerplate(text: str, rng: random.Random) -> str:
    """A navigation header and/or a footer around the content."""
    kind = rng.choice(["header", "footer", "both"])
    out = text
    if kind in ("header", "both"):
        out = rng.choice(HEADERS) + "\n" + out
    if kind in ("footer", "both"):
        out = out + "\n" + rng.choice(FOOTERS)
    return out


def reorder_paragraphs(text: str, rng: random.Random) -> str:
    """Two paragraphs swapped (or one moved to the end when there are only two)."""
    lines = text.split("\n")
    if len(lines) < 2:
        parts = sentences(text)
        if len(parts) < 2:
            return text
        i, j = rng.sample(range(len(parts)), 2)
        parts[i], parts[j] = parts[j], parts[i]
        return " ".join(parts)
    i, j = rng.sample(range(len(lines)), 2)
    lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def typos(text: str, rng: random.Random, rate: float = 0.01) -> str:
    """About ``rate`` of the words changed: a letter dropped or doubled, a digit bumped."""
    def change(w: str) -> str:
        if rng.random() >= rate or len(w) < 3:
            return w
        i = rng.randrange(len(w))
        if w[i].isdigit():
            return w[:i] + str((int(w[i]) + 1) % 10) + w[i + 1:]
        return w[:i] + w[i + 1:] if rng.random() < 0.5 else w[:i] + w[i] + w[i:]
    return "\n".join(" ".join(change(w) for w in line.split(" ")) for line in text.split("\n"))


def whitespace_and_case(text: str, rng: random.Random) -> str:
    """The same words with other spacing and capitalisation (an exact duplicate after
    normalisation)."""
    out = text.replace(" ", "  ") if rng.random() < 0.5 else text.replace("\n", " \n ")
    return out.upper() if rng.random() < 0.5 else out


EDITS = {
    "insert": lambda t, rng, donor: insert_sentences(t, rng, donor),
    "delete": lambda t, rng, donor: delete_sentence(t, rng),
    "boilerplate": lambda t, rng, donor: boilerplate(t, rng),
    "reorder": lambda t, rng, donor: reorder_paragraphs(t, rng),
    "typos": lambda t, rng, donor: typos(t, rng),
    "boilerplate+typos": lambda t, rng, donor: typos(boilerplate(t, rng), rng),
}


def near_duplicate(text: str, kind: str, rng: random.Random, donor: str) -> str:
    """``text`` with the edit ``kind`` (a key of ``EDITS``)."""
    return EDITS[kind](text, rng, donor)


def score_removals(group_of: dict[str, str], removed: set[str]) -> dict[str, float]:
    """Precision and recall of removed near-duplicates against planted groups.

    ``group_of`` maps every document id to its group (the original's id for the original and
    its copies). Within a group of n documents, n - 1 removals are right; a removal that
    leaves a group with no document kept is wrong (content lost), and so is every removal of
    a document from a group of one.
    """
    members: dict[str, list[str]] = {}
    for i, g in group_of.items():
        members.setdefault(g, []).append(i)
    tp = fp = fn = 0
    for ids in members.values():
        gone = sum(i in removed for i in ids)
        kept = len(ids) - gone
        if kept == 0:
            tp += len(ids) - 1
            fp += 1
        else:
            tp += gone
            fn += kept - 1
    return {"precision": tp / (tp + fp) if tp + fp else 1.0, "recall": tp / (tp + fn) if tp + fn else 1.0,
            "true_removals": tp, "false_removals": fp, "missed": fn}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=str(Path(__file__).resolve().parents[4] / "shared" / "data"))
    args = ap.parse_args()
    src = Path(args.shared) / "jsonl" / "dclm_majority_data.jsonl.gz"
    docs = []
    with gzip.open(src, "rt", encoding="utf-8") as f:
        for line_no, line in enumerate(f):
            text = json.loads(line)["text"]
            if 80 <= len(text.split()) <= 1200:
                docs.append({"id": f"dclm-majority-{line_no:04d}", "text": text})
            if len(docs) == 150:
                break
    with gzip.open(HERE / "dclm_docs_150.jsonl.gz", "wt", encoding="utf-8", compresslevel=9) as f:
        for d in docs:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    rng = random.Random(20240607)
    kinds = list(EDITS)
    out = []
    for i, d in enumerate(docs[:100]):
        for v in range(1 + (i % 2)):  # 1 or 2 variants
            kind = kinds[(i + 3 * v) % len(kinds)]
            donor = docs[(i * 7 + 11 + v) % len(docs)]["text"]
            out.append({"id": f"{d['id']}-v{v}", "text": near_duplicate(d["text"], kind, rng, donor),
                        "origin": d["id"], "edit": kind})
    with gzip.open(HERE / "near_dups.jsonl.gz", "wt", encoding="utf-8", compresslevel=9) as f:
        for d in out:
            f.write(json.dumps(d, ensure_ascii=False) + "\n")
    print(f"{len(docs)} documents, {len(out)} near-duplicates")


if __name__ == "__main__":
    main()
