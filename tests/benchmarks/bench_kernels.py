"""The compiled text kernels against what they replaced, on bench_scale's extracted pages
(``default``: every real page; ``long``: the longest and the multilingual ones): microseconds
per document, the fastest of ``--repeat`` passes, both sides in this process, turn by turn
(this machine's speed drifts by 20% over minutes). Prints figures, asserts nothing; the tests
hold each kernel to its reference (``tests/test_compiled_counts.py``, ``test_minhash.py``,
``test_filters.py``).

- exact dedup's key text: ``normalize_collapsed`` against ``collapse_whitespace(normalize_text())``
- Gopher's repeated lines and paragraphs: ``duplicate_lines_and_paragraphs`` against two
  ``duplicate_parts`` calls
- Gopher quality's counts: ``page_tallies`` against ``line_tallies`` + ``hashes_and_ellipses``
- C4's words per line: ``count_py_words`` against ``len(s.split())``, on every line
- the bytes' classes under the word split: ``byte_classes``, ns per byte
- the word split's special cases ("Mr." "don't" ":)"): the compiled matcher
  (``kernels.special_case_cuts`` + ``replace_spans``) against the numpy one it replaced (kept as
  ``split_words(reference=True)``'s), on the word spans of the same batches
- C4's measure: its line rules from one compiled pass (``line_facts``) against the Arrow passes
  they replaced (kept for ``words: chars`` languages), in batches of 300 pages given their
  words as the chain does; the outputs are checked equal first

Run: ``REFINERY_DATA=../shared/data .venv/bin/python tests/benchmarks/bench_kernels.py
[--pages default long] [--repeat 5]``
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench_chain  # noqa: E402  (the pages, extracted as the extract stage does)

from curation.dedup.minhash import collapse_whitespace, normalize_collapsed, normalize_text  # noqa: E402
from curation.text.arrow import text_bytes  # noqa: E402
from curation.text.classes import byte_classes  # noqa: E402
from curation.text.counts import hashes_and_ellipses, line_tallies, page_tallies  # noqa: E402
from curation.text.duplicate_parts import duplicate_lines_and_paragraphs, duplicate_parts  # noqa: E402
from curation.text import words as text_words  # noqa: E402
from curation.text.words import count_py_words  # noqa: E402
from curation.text.state import TextState  # noqa: E402
from curation.stages.c4_quality import C4QualityFilter  # noqa: E402


def best_of(fn, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def compare(label: str, new, old, n: int, repeat: int) -> None:
    new(), old()  # compiled, tables filled
    t_new = t_old = float("inf")
    for _ in range(repeat):  # in turns: a drift in the machine's speed lands on both
        t_new = min(t_new, best_of(new, 1))
        t_old = min(t_old, best_of(old, 1))
    print(f"  {label:<44} {t_old / n * 1e6:8.1f} -> {t_new / n * 1e6:7.1f} us/doc  (x{t_old / t_new:.2f})")


def special_case_inputs(docs: list[tuple[str, int]], batch: int = 300) -> list[tuple]:
    """What the word split hands its special-case step, per batch of ``batch`` pages: the
    bytes, the words' spans and the whole cores."""
    got, real = [], text_words._apply_special_cases
    text_words._apply_special_cases = lambda *x: got.append(x) or real(*x)
    try:
        for i in range(0, len(docs), batch):
            text_words.split_words(pa.array([t for t, _ in docs[i:i + batch]]))
    finally:
        text_words._apply_special_cases = real
    return got


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", nargs="+", choices=["default", "long"], default=["default", "long"])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    for which in a.pages:
        docs, _ = bench_chain.extracted(which)
        texts = pa.array([t for t, _ in docs])
        n = len(texts)
        lines = pa.array([line for t, _ in docs for line in t.split("\n")])
        b, _, _, _ = text_bytes(texts)
        print(f"\n== {which}: {n:,} documents, mean {sum(len(t) for t, _ in docs) / n:,.0f} chars, "
              f"{len(b) / n:,.0f} bytes; {len(lines):,} lines")
        compare("exact key text (normalize_collapsed)", lambda: normalize_collapsed(texts),
                lambda: collapse_whitespace(normalize_text(texts)), n, a.repeat)
        compare("repeated lines + paragraphs (one call)", lambda: duplicate_lines_and_paragraphs(texts),
                lambda: (duplicate_parts(texts, 2, True), duplicate_parts(texts, 1)), n, a.repeat)
        compare("gopher quality counts (page_tallies)", lambda: page_tallies(texts),
                lambda: (line_tallies(texts), hashes_and_ellipses(texts)), n, a.repeat)
        py_lines = lines.to_pylist()
        compare("words per line (count_py_words vs str.split)", lambda: count_py_words(lines),
                lambda: [len(s.split()) for s in py_lines], n, a.repeat)
        spans = special_case_inputs(docs)
        compare("special cases (compiled matcher vs numpy)",
                lambda: [text_words._apply_special_cases(*x) for x in spans],
                lambda: [text_words._apply_special_cases_arrays(*x) for x in spans], n, a.repeat)
        c4 = C4QualityFilter()
        states = []
        for i in range(0, n, 300):
            part = pa.table({"id": [str(k) for k in range(min(300, n - i))], "text": texts[i:i + 300]})
            state = TextState.of(part)
            state.words  # the filters before C4 hand it their split
            states.append((part, state))

        def c4_by(lines):  # each batch's state as C4 gets it: words split, its lines not yet cut
            out = []
            for part, st in states:
                st = copy.copy(st)
                st._cache = {}
                out.append(c4._measure_lines(part, st, lines(st)))
            return out

        for (got, _), (want, _) in zip(c4_by(c4._lines_by_facts), c4_by(c4._lines_by_arrays)):
            assert got.equals(want), "C4: the two line paths differ"
        compare("C4 measure (line_facts vs Arrow line passes)", lambda: c4_by(c4._lines_by_facts),
                lambda: c4_by(c4._lines_by_arrays), n, a.repeat)
        byte_classes(b)
        t = best_of(lambda: byte_classes(b), a.repeat)
        print(f"  {'byte classes':<44} {t / len(b) * 1e9:8.2f} ns/byte = {t / n * 1e6:.1f} us/doc"
              f"  ({float(np.mean(b >= 0x80)):.1%} of bytes non-ASCII)")


if __name__ == "__main__":
    main()
