"""The web DAG's post-extraction chain, stage by stage, against extraction itself: CPU
microseconds per document on the pages ``bench_scale.py`` builds its WARCs from (``default``:
every real page; ``long``: the longest and the multilingual ones, ``bench_scale.long_pages``).

Prints, per corpus: the mean extracted length; extraction's cost per page (decode +
resiliparse, what extract-only spends beside reading and inflating); each chain stage's cost
(its ``run_batch`` over batches cut as the executor joins extract's kept rows, 4 MB or 2,000
rows, with the kept rows and their text state handed down as ``_Step`` does: a later stage sees
only what the earlier ones kept); and the ratio the chain allows, extract / (extract + chain):
the ceiling of bench_scale's full-DAG / extract-only before dedup and I/O. Asserts nothing;
The allocator is set as a worker sets it (``allocator.keep_batch_blocks``;
``--glibc-default`` leaves glibc's). ``--profile`` adds the chain's top functions by own time. ``--batch-mb 4`` with small batches
(``--batch-rows 30``) shows what per-batch costs would be without the executor's joining.
``--interleave`` times extraction alone against extraction with a chain batch run (untimed) after
every 50 pages, as a worker of the full DAG alternates them: whether the chain's working set (CLD2's
tables, the kernels') slows the parser in the same process.

Run: ``REFINERY_DATA=../shared/data .venv/bin/python tests/benchmarks/bench_chain.py
[--pages default long] [--copies 3] [--repeat 3] [--batch-mb 4] [--batch-rows 2000] [--profile]``
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


def pages_of(which: str) -> list:
    """bench_scale's pages: every one (``default``) or the long and multilingual ones (``long``)."""
    pages = bench_scale.load_pages()
    return bench_scale.long_pages(pages) if which == "long" else pages


extract_text = bench_scale.page_text  # a page's text as the extract stage makes it; None if refused


def extracted(which: str, repeat: int = 1) -> tuple[list[tuple[str, int]], float]:
    """Every page's extracted text and HTML size (pages without text left out), and
    extraction's CPU s per page (the fastest of ``repeat`` passes: the machine's speed moves)."""
    pages = pages_of(which)
    best = float("inf")
    for _ in range(max(1, repeat)):
        out, t0 = [], time.process_time()
        for _, html in pages:
            out.append((extract_text(html) or "", len(html)))
        best = min(best, (time.process_time() - t0) / max(1, len(pages)))
    return [x for x in out if x[0]], best


#: an extracted row's columns besides its text (id, url, WARC record id and date, content type,
#: source), in Arrow bytes: what ``_Coalesced`` counts toward a batch
ROW_BYTES = 200


def batches(docs: list[tuple[str, int]], batch_bytes: int, batch_rows: int) -> list[pa.Table]:
    """The documents in the batches the chain sees in a run: the executor joins extract's kept
    rows back to ``dag.batch_bytes`` (4 MB) or ``dag.batch_size`` (2,000) rows (``_Coalesced``),
    so per-batch costs count as they do there."""
    out, cur, size = [], [], 0
    for i, (text, _html_bytes) in enumerate(docs):
        cur.append((i, text))
        size += len(text.encode()) + ROW_BYTES
        if size >= batch_bytes or len(cur) >= batch_rows:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return [pa.table({"id": [f"d{i}" for i, _ in b], "url": [f"https://example.com/{i}" for i, _ in b],
                      "text": [t for _, t in b]}) for b in out]


def chain_stages() -> list:
    import curation.stages  # noqa: F401  (registers the filter stages)
    import curation.stages.langid  # noqa: F401
    from curation.stages.base import registry

    stages = [registry.resolve(t)(type=t, input="x") for t in CHAIN]
    for s in stages:
        s.setup()
    return stages


def run_chain(stages: list, tables: list[pa.Table]) -> dict[str, float]:
    """CPU seconds of each stage's ``run_batch`` and hand-off over all batches, as the
    executor's ``_Step`` does: the kept rows and their text state go on to the next stage."""
    out = dict.fromkeys(CHAIN, 0.0)
    for batch in tables:
        text = None
        for name, st in zip(CHAIN, stages):
            t0 = time.process_time()
            r = st.run_batch(batch, text)
            kept, _ = split_kept_rejected(r.table, r.reasons, name)
            if r.text is not None and r.reasons is not None:
                text = r.text.take(np.flatnonzero(pc.is_null(r.reasons).to_numpy(zero_copy_only=False)),
                                   kept.column("text"))
            else:
                text = r.text
            out[name] += time.process_time() - t0
            batch = kept
    return out


def interleave(which: str, stages: list, tables: list[pa.Table], repeat: int) -> None:
    """Extraction's CPU per page alone, and with a chain batch (untimed) after every 50 pages."""
    pages = pages_of(which)
    chunks = [[h for _, h in pages[i:i + 50]] for i in range(0, len(pages), 50)]

    refused = [0, 0]  # pages the extractor refuses (extract rejects them): alone, between

    def extract(between: bool) -> float:
        spent = 0.0
        for k, chunk in enumerate(chunks):
            t0 = time.process_time()
            for html in chunk:
                refused[between] += extract_text(html) is None
            spent += time.process_time() - t0
            if between:
                run_chain(stages, [tables[k % len(tables)]])
        return spent / len(pages) * 1e6

    alone, mixed = [], []
    for _ in range(max(3, repeat)):
        alone.append(extract(False))
        mixed.append(extract(True))
    print(f"  extraction alone {np.median(alone):,.0f} us/page, between chain batches {np.median(mixed):,.0f} "
          f"(medians of {len(alone)}, alternating): x{np.median(mixed) / np.median(alone):.3f}; pages refused "
          f"{refused[0] // len(alone)} / {refused[1] // len(mixed)}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", nargs="+", choices=["default", "long"], default=["default", "long"])
    ap.add_argument("--copies", type=int, default=3, help="each page's text this many times")
    ap.add_argument("--batch-mb", type=float, default=4, help="the DAG's batch_bytes in MiB (default 4)")
    ap.add_argument("--batch-rows", type=int, default=2000, help="the DAG's batch_size (default 2000)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="extraction passes and chain runs; the fastest of each is printed")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--callers", default="", help="with --profile: print the callers of functions matching this")
    ap.add_argument("--interleave", action="store_true",
                    help="extraction alone vs between chain batches, same process, alternating rounds")
    ap.add_argument("--glibc-default", action="store_true",
                    help="leave the allocator as glibc sets it (workers set keep_batch_blocks before their first batch)")
    a = ap.parse_args()
    if not a.glibc_default:  # as a worker does (executor._root_entries): no page faults for freed batch arrays
        from curation.pipeline.allocator import keep_batch_blocks

        print(f"allocator: keep_batch_blocks {'set' if keep_batch_blocks() else 'not available here'}")
    stages = chain_stages()
    for which in a.pages:
        docs, _ = extracted(which)
        docs = docs * a.copies
        n = len(docs)
        tables = batches(docs, int(a.batch_mb * 2**20), a.batch_rows)
        run_chain(stages, tables[:2])  # warm: compiled kernels, tables
        # Extraction and the chain timed in turns, a pass of each per round: this machine's
        # speed drifts by 20% over minutes, and a ratio of two figures taken minutes apart
        # moved by as much as the changes it was to show.
        runs, ratios, extract_runs = [], [], []
        for _ in range(a.repeat):
            extract_runs.append(extracted(which)[1])
            runs.append(run_chain(stages, tables))
            chain_round = sum(runs[-1].values()) / n
            ratios.append(extract_runs[-1] / (extract_runs[-1] + chain_round))
        best = {k: min(r[k] for r in runs) for k in CHAIN}
        chain_us = sum(best.values()) / n * 1e6
        extract_us = min(extract_runs) * 1e6
        mean_chars = sum(len(t) for t, _ in docs) / n
        print(f"\n== {which}: {n:,} documents in {len(tables)} batches, mean extracted text {mean_chars:,.0f} chars")
        print(f"  extract (decode + resiliparse)  {extract_us:8,.0f} us/page")
        for k in CHAIN:
            print(f"  {k:<31} {best[k] / n * 1e6:8,.0f} us/doc  ({best[k] / sum(best.values()):.0%} of the chain)"
                  "  [per document entering the chain]")
        print(f"  chain                           {chain_us:8,.0f} us/doc = {chain_us / extract_us:.0%} of extract")
        print(f"  ceiling of full/extract-only: {extract_us / (extract_us + chain_us):.1%} from the best of each, "
              f"{float(np.median(ratios)):.1%} median of {len(ratios)} rounds "
              f"(85% needs the chain <= {extract_us * 0.15 / 0.85:,.0f} us/doc)")
        if a.interleave:
            interleave(which, stages, tables, a.repeat)
        if a.profile:
            pr = cProfile.Profile()
            pr.enable()
            run_chain(stages, tables)
            pr.disable()
            st = pstats.Stats(pr).sort_stats("tottime")
            st.print_stats(15)
            if a.callers:  # who calls the top functions (e.g. which Arrow kernels and from where)
                st.print_callers(a.callers)


if __name__ == "__main__":
    main()
