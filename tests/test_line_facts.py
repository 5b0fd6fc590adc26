"""``line_facts``: C4's per-line facts from one compiled pass, held to Python's own ``str``
methods (``splitlines``, ``strip``, ``split``) on texts built from every line break and every
Unicode space, and on real pages."""

from __future__ import annotations

import gzip
import json
import random

import numpy as np
import pyarrow as pa

from conftest import DATA
from curation.text.line_facts import line_facts

SPACES = [chr(c) for c in range(0x110000) if chr(c).isspace()]
BREAKS = ["\n", "\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029"]


def _awkward(n: int = 4000) -> list[str]:
    rng = random.Random(3)
    pieces = ["a", "bc", "[1]", "[", "xxxxx", "é", "日本", "...", ".", "\u2026", "\x1f", "\u00c2", "\u2019"]
    pieces += SPACES + BREAKS
    return ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 40))) for _ in range(n)]


def _check(texts: list[str]) -> int:
    lf = line_facts(pa.array(texts, pa.string()))
    assert lf.offsets[-1] == len(lf.s) == len(lf.doc)
    n_lines = 0
    for d, t in enumerate(texts):
        lines = t.splitlines()
        got = range(lf.offsets[d], lf.offsets[d + 1])
        assert len(got) == len(lines), repr(t)
        for k, line in zip(got, lines):
            assert bytes(lf.b[lf.start[k]:lf.end[k]]).decode() == line, repr(t)
            assert bytes(lf.b[lf.s[k]:lf.e[k]]).decode() == line.strip(), repr(line)
            assert lf.words[k] == len(line.split()), repr(line)
            assert lf.longest[k] == max((len(w.encode()) for w in line.split()), default=0), repr(line)
            assert lf.bracket[k] == ("[" in line), repr(line)
            assert lf.doc[k] == d
        n_lines += len(lines)
    every = np.arange(n_lines)
    stripped = lf.stripped(every).to_pylist()
    assert stripped == [line.strip() for t in texts for line in t.splitlines()]
    table = np.zeros(256, dtype=bool)
    table[[ord(c) for c in ".?!\"'"]] = True
    assert lf.ends_with(every, table).tolist() == [s.endswith((".", "?", "!", '"', "'")) for s in stripped]
    assert lf.ends_with_dots(every).tolist() == [s.endswith("...") for s in stripped]
    assert lf.longest_chars(every).tolist() == [max((len(w) for w in s.split()), default=0) for s in stripped]
    return n_lines


def test_line_facts_equal_python_on_every_line_break_and_space():
    edges = ["", "a", "\n", "a\n", "\na", "\n\n", "a\r\nb\r", "\r", "\r\n\r\n", " \t ", "a\x1fb", "x\u2028",
             "".join(SPACES), "".join(BREAKS), "w" * 2000 + " " + "é" * 1500]
    assert _check(edges + _awkward()) > 10_000


def test_line_facts_equal_python_on_real_pages():
    with gzip.open(DATA / "filters" / "real_docs.jsonl.gz", "rt", encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    assert _check(texts) > 1_000
