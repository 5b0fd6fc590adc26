"""Compiled text kernels of this tree against the same kernels at an earlier commit, in one
process, in turns, on bench_scale's extracted pages: the earlier modules are read with
``git show COMMIT:path`` and loaded beside the current ones (they import the rest of
``curation`` from this tree). Each pair's outputs are compared before it is timed. Prints
microseconds per document, fastest of ``--repeat``; asserts only that the outputs agree.

- ``repetition_chars`` (Gopher's n-gram signals, ``curation/text/repetition.py``)
- ``duplicate_lines_and_paragraphs`` (``curation/text/duplicate_parts.py``)
- ``replace_spans`` (``curation/text/kernels.py``) on the special-case replacements the word
  split makes on these pages
- exact dedup's key text (``normalize_collapsed``, ``curation/dedup/minhash.py`` with its
  ``curation/dedup/kernels.py``) in batches of 300 pages
- the whole word split (``split_words``, ``curation/text/words.py`` with its ``kernels.py``)
  in batches of 300 pages, and the words of nine pages in ten moved to the next stage's batch
  (``Words.take_docs``, what the hand-off from gopher_repetition to gopher_quality does)
- the words' measures and ids (``word_measures_and_keys``: characters, symbol/letter/
  punctuation flags and the 64-bit id per word) on those batches' words
- the langid stage (``LanguageId.measure``, ``curation/stages/langid.py``: CLD2 on the windows
  it samples) in batches of 300 pages
- the extract stage (``Extract.process``, ``curation/stages/extract.py``) on the pages' HTML
  in batches of 100: whole, and besides the parser (resiliparse replaced in both by a slice
  of its input, so what the stage adds per page shows: decoding, time limits, Arrow)

Run: ``REFINERY_DATA=../shared/data .venv/bin/python tests/benchmarks/bench_kernels_vs_commit.py
--base 1872e3f [--pages default long] [--repeat 7]``
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import bench_chain  # noqa: E402  (the pages, extracted as the extract stage does)

from curation.text import kernels, words as text_words  # noqa: E402
from curation.text.arrow import text_bytes  # noqa: E402
from curation.text.duplicate_parts import duplicate_lines_and_paragraphs  # noqa: E402
from curation.text.repetition import repetition_chars  # noqa: E402


def at_commit(commit: str, path: str, name: str, tmp: Path):
    """The module ``path`` as it was at ``commit``, loaded as ``name``."""
    src = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    f = tmp / f"{name}.py"
    f.write_text(src)
    spec = importlib.util.spec_from_file_location(name, f)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # pydantic resolves a model's annotations through its module
    spec.loader.exec_module(mod)
    return mod


def _old_stage(commit: str, tmp: Path, module: str):
    """A stage's module ``curation/stages/MODULE.py`` at ``commit`` (its class registers under
    the same type: the current one is set aside while it loads)."""
    import importlib

    from curation.stages.base import registry

    before = dict(registry)
    importlib.import_module(f"curation.stages.{module}")  # registered first
    mine = {k: v for k, v in registry.items() if v.__module__ == f"curation.stages.{module}"}
    for k in mine:
        registry.pop(k)
    try:
        return at_commit(commit, f"curation/stages/{module}.py", f"old_{module}", tmp)
    finally:
        registry.clear()
        registry.update({**before, **mine})


def compare_langid(old_lid, texts: list[str], repeat: int) -> None:
    """The langid stage (CLD2 on its sampled windows) on batches of 300 pages."""
    from curation.stages import langid as new_lid

    batches = [pa.table({"id": [str(i) for i in range(lo, lo + 300)][:len(texts[lo:lo + 300])],
                         "text": pa.array(texts[lo:lo + 300], pa.string())}) for lo in range(0, len(texts), 300)]
    new_stage, old_stage = new_lid.LanguageId(), old_lid.LanguageId()
    new_stage.setup()
    old_stage.setup()

    def run(stage):
        return [(t.column("lang").to_pylist(), t.column("lang_score").to_pylist())
                for t, _ in (stage.measure(b) for b in batches)]

    compare("langid stage (CLD2 on windows)", lambda: run(new_stage), lambda: run(old_stage), len(texts), repeat)


def compare_extract(old_ex, which: str, repeat: int) -> None:
    """The extract stage on the pages' HTML, whole and with the parser replaced in both."""
    from curation.stages import extract as new_ex

    pages = bench_chain.pages_of(which)
    html = [h for _, h in pages]
    batches = []
    for lo in range(0, len(html), 100):
        part = html[lo:lo + 100]
        batches.append(pa.table({"id": [str(i) for i in range(lo, lo + len(part))], "html": pa.array(part, pa.binary()),
                                 "charset": pa.nulls(len(part), pa.string()), "text": pa.nulls(len(part), pa.string())}))
    new_stage, old_stage = new_ex.Extract(), old_ex.Extract()

    def run(stage):
        return [(r.table.column("text").to_pylist(), r.reasons.to_pylist()) for r in map(stage.process, batches)]

    compare("extract stage (resiliparse)", lambda: run(new_stage), lambda: run(old_stage), len(html), repeat)
    from curation.extract import engines as new_engines

    # the engine table: curation.extract.engines (an old stage module imports this tree's, or
    # re-exports its own ENGINES, as commits before the extract package did)
    tables = [new_engines.ENGINES] + ([old_ex.ENGINES] if hasattr(old_ex, "ENGINES") else [])
    real = [t["resiliparse"] for t in tables]
    for t in tables:
        t["resiliparse"] = lambda s: s[:200]
    try:
        compare("extract stage besides the parser", lambda: run(new_stage), lambda: run(old_stage), len(html), repeat)
    finally:
        for t, r in zip(tables, real):
            t["resiliparse"] = r


def same(a, b) -> bool:
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return np.array_equal(a, b)


def compare(label: str, new, old, n: int, repeat: int) -> None:
    assert same(new(), old()), f"{label}: outputs differ"
    t_new = t_old = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        new()
        t_new = min(t_new, time.perf_counter() - t0)
        t0 = time.perf_counter()
        old()
        t_old = min(t_old, time.perf_counter() - t0)
    print(f"  {label:<36} {t_old / n * 1e6:8.1f} -> {t_new / n * 1e6:7.1f} us/doc  (x{t_old / t_new:.2f}), same outputs")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True, help="the earlier commit")
    ap.add_argument("--pages", nargs="+", choices=["default", "long"], default=["default", "long"])
    ap.add_argument("--repeat", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        old_rep = at_commit(a.base, "curation/text/repetition.py", "old_repetition", Path(tmp))
        old_dp = at_commit(a.base, "curation/text/duplicate_parts.py", "old_duplicate_parts", Path(tmp))
        old_k = at_commit(a.base, "curation/text/kernels.py", "old_kernels", Path(tmp))
        old_dk = at_commit(a.base, "curation/dedup/kernels.py", "old_dedup_kernels", Path(tmp))
        old_w = at_commit(a.base, "curation/text/words.py", "old_words", Path(tmp))
        old_w.kernels = old_k  # the old split on the old kernels
        old_ex = _old_stage(a.base, Path(tmp), "extract")
        old_lid = _old_stage(a.base, Path(tmp), "langid")
        old_mh = at_commit(a.base, "curation/dedup/minhash.py", "old_minhash", Path(tmp))
        old_mh._k = old_dk  # the old key text on the old kernels
        for which in a.pages:
            texts = [t for t, _ in bench_chain.extracted(which)[0]]
            n = len(texts)
            arr = pa.array(texts)
            words = text_words.split_words(arr)
            print(f"\n== {which}: {n:,} documents, {len(words.start) / n:,.0f} words each; {a.base} -> this tree")
            args = (words.hash, words.lengths.astype(np.int64), words.offsets, 2, 10, [2, 3, 4], [5, 6, 7, 8, 9, 10])
            compare("repetition_chars (Gopher's n-grams)", lambda: repetition_chars(*args),
                    lambda: old_rep.repetition_chars(*args), n, a.repeat)
            compare("lines + paragraphs", lambda: duplicate_lines_and_paragraphs(arr),
                    lambda: old_dp.duplicate_lines_and_paragraphs(arr), n, a.repeat)
            got, real = [], kernels.replace_spans
            kernels.replace_spans = lambda *x: got.append(x) or real(*x)
            try:
                for i in range(0, n, 300):
                    text_words.split_words(arr[i:i + 300])
            finally:
                kernels.replace_spans = real
            compare("replace_spans (special cases)", lambda: [real(*x) for x in got],
                    lambda: [old_k.replace_spans(*x) for x in got], n, a.repeat)
            parts = [arr[i:i + 300] for i in range(0, n, 300)]

            def split_by(mod):
                return [(w.offsets, w.start, w.end) for w in (mod.split_words(p) for p in parts)]

            compare("word split (split_words)", lambda: split_by(text_words), lambda: split_by(old_w), n, a.repeat)
            kept = [np.flatnonzero(np.arange(len(p)) % 10 != 0) for p in parts]
            moved = []
            for p, k in zip(parts, kept):
                b, doff, buf, base = text_bytes(p.take(pa.array(k)))
                moved.append((k, b, doff, buf, base))
            new_w = [text_words.split_words(p) for p in parts]
            old_words = [old_w.split_words(p) for p in parts]

            def take_by(split):
                return [(t.offsets, t.start, t.end) for t in (w.take_docs(*m) for w, m in zip(split, moved))]

            measured = [(w._b, w._cls, w.start, w.end) for w in new_w]
            compare("word measures and ids", lambda: [kernels.word_measures_and_keys(*x) for x in measured],
                    lambda: [old_k.word_measures_and_keys(*x) for x in measured], n, a.repeat)
            compare("moving words on (take_docs)", lambda: take_by(new_w), lambda: take_by(old_words), n, a.repeat)
            from curation.dedup.minhash import normalize_collapsed

            compare("exact dedup's key text", lambda: [normalize_collapsed(p) for p in parts],
                    lambda: [old_mh.normalize_collapsed(p) for p in parts], n, a.repeat)
            compare_langid(old_lid, texts, a.repeat)
            compare_extract(old_ex, which, a.repeat)


if __name__ == "__main__":
    main()
