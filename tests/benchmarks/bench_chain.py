"""The web DAG's post-extraction chain, stage by stage, against extraction itself: CPU
microseconds per document on the pages ``bench_scale.py`` builds its WARCs from (``default``:
every real page; ``long``: the longest and the multilingual ones, ``bench_scale.long_pages``).
Prints, per corpus, the mean extracted length, extraction's cost per page (decode + resiliparse,
what extract-only spends beside reading and inflating), each chain stage's cost (its
``run_batch`` on one batch of every page's text, the kept rows and their text state handed
down as the executor does: a later stage sees only what the earlier ones kept), and the ratio the chain allows: extract / (extract + chain), the ceiling of bench_scale's
full-DAG / extract-only before dedup and I/O. Asserts nothing; ``--profile`` adds the chain's
top functions by own time.

Run: ``REFINERY_DATA=../shared/data .venv/bin/python tests/benchmarks/bench_chain.py
[--pages default long] [--copies 3] [--repeat 3] [--profile]``
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench_scale  # noqa: E402  (the pages and the long-page choice)

from curation.io.shards import split_kept_rejected  # noqa: E402

CHAIN = ["langid", "gopher_repetition", "gopher_quality", "c4_quality", "fineweb_quality"]


def extracted(which: str) -> tuple[list[str], float]:
    """Every page's extracted text (empty ones left out) and extraction's CPU s per page."""
    from curation.stages.extract import _resiliparse, decode_html

    pages = bench_scale.load_pages()
    if which == "long":
        pages = bench_scale.long_pages(pages)
    texts, t0 = [], time.process_time()
    for _, html in pages:
        try:
            texts.append(_resiliparse(decode_html(html, None)).strip())
        except Exception:  # a page the extractor refuses: extract rejects it, no text
            texts.append("")
    per_page = (time.process_time() - t0) / max(1, len(pages))
    return [t for t in texts if t], per_page


def chain_stages() -> list:
    import curation.stages.filters  # noqa: F401  (registers the filter stages)
    import curation.stages.langid  # noqa: F401
    from curation.stages.base import registry

    stages = [registry.resolve(t)(type=t, input="x") for t in CHAIN]
    for s in stages:
        s.setup()
    return stages


def run_chain(stages: list, batch: pa.Table) -> dict[str, float]:
    """CPU seconds of each stage's ``run_batch`` and hand-off, as the executor's ``_Step`` does:
    the kept rows and their text state go on to the next stage."""
    out, text = {}, None
    for name, st in zip(CHAIN, stages):
        t0 = time.process_time()
        r = st.run_batch(batch, text)
        kept, _ = split_kept_rejected(r.table, r.reasons, name)
        if r.text is not None and r.reasons is not None:
            text = r.text.take(np.flatnonzero(pc.is_null(r.reasons).to_numpy(zero_copy_only=False)))
        else:
            text = r.text
        out[name] = time.process_time() - t0
        batch = kept
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", nargs="+", choices=["default", "long"], default=["default", "long"])
    ap.add_argument("--copies", type=int, default=3, help="each page's text this many times in the batch")
    ap.add_argument("--repeat", type=int, default=3, help="chain runs; the per-stage minimum is printed")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args()
    stages = chain_stages()
    for which in a.pages:
        texts, extract_s = extracted(which)
        texts = texts * a.copies
        n = len(texts)
        batch = pa.table({"id": [f"d{i}" for i in range(n)], "url": [f"https://example.com/{i}" for i in range(n)],
                          "text": texts})
        run_chain(stages, batch)  # warm: compiled kernels, tables
        runs = [run_chain(stages, batch) for _ in range(a.repeat)]
        best = {k: min(r[k] for r in runs) for k in CHAIN}
        chain_us = sum(best.values()) / n * 1e6
        extract_us = extract_s * 1e6
        mean_chars = sum(map(len, texts)) / n
        print(f"\n== {which}: {n:,} documents, mean extracted text {mean_chars:,.0f} chars")
        print(f"  extract (decode + resiliparse)  {extract_us:8,.0f} us/page")
        for k in CHAIN:
            print(f"  {k:<31} {best[k] / n * 1e6:8,.0f} us/doc  ({best[k] / sum(best.values()):.0%} of the chain)"
                  "  [per document entering the chain]")
        print(f"  chain                           {chain_us:8,.0f} us/doc = {chain_us / extract_us:.0%} of extract")
        print(f"  ceiling of full/extract-only: {extract_us / (extract_us + chain_us):.1%} "
              f"(85% needs the chain <= {extract_us * 0.15 / 0.85:,.0f} us/doc)")
        if a.profile:
            pr = cProfile.Profile()
            pr.enable()
            run_chain(stages, batch)
            pr.disable()
            pstats.Stats(pr).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
