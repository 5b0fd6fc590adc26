"""Redo what you keep: the cost of ``reextract`` over 10% survivors against the first pass.
Prints figures, asserts nothing. Run by hand (under the bench lock):

    flock /tmp/refinery-bench.lock .venv/bin/python tests/benchmarks/bench_reextract.py [--size-mb 256]
        [--workers 2] [--rounds 2] [--keep-mod 10]

On a Common-Crawl-like WARC (``bench_scale.cached_warc``: request, response and metadata
records, each its own gzip member, real pages of shared/data/html), per round and through the
executor (``run_dag``, what ``refinery run`` calls), in one Ray:

1. **first pass**: ``crawl -> extract`` (resiliparse, text) ``-> top`` (a ``select`` keeping the
   documents whose URL hash is 0 mod ``--keep-mod``: ~10%, spread over the whole file as
   quality survivors are);
2. **reextract, same engine**: a second DAG over ``{format: run, stage: top}`` re-reading the
   survivors' records by byte range and extracting them with resiliparse again: the cost of
   coming back for them (reads, inflate, parse, the framework);
3. **reextract, trafilatura markdown**: the same with the better, slower engine (what one comes
   back for), beside the first pass's per-document cost.

Bytes read: the first pass's from its input manifest lines (what the reader took from storage);
the second passes' are the ranges the stage fetches for those rows (``records.read_records``
with the stage's ``max_gap``, run here in this process on the survivors: the stage reads
exactly these, ``tests/test_reextract.py`` checks it through a counting filesystem). Rounds
alternate the order of the second passes; the ratios are per round, with their median.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

from bench_scale import MiB, bench_root, cached_warc  # noqa: E402


def first_dag(warc: str, keep_mod: int) -> dict:
    return {"name": "bench-reextract-first",
            "inputs": {"crawl": {"format": "warc", "source": "web", "paths": [warc]}},
            "stages": {"extract": {"type": "extract", "input": "crawl"},
                       "top": {"type": "select", "input": "extract", "where": f"hash(url) % {keep_mod} = 0"}},
            "output": "top"}


def second_dag(first: str, engine: str, fmt: str) -> dict:
    return {"name": f"bench-reextract-{engine}-{fmt}",
            "inputs": {"kept": {"format": "run", "run": first, "stage": "top"}},
            "stages": {"again": {"type": "reextract", "input": "kept", "engine": engine, "format": fmt}},
            "output": "again"}


def _run(spec: dict, out: Path, workers: int) -> float:
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag

    dag = parse_dag(spec, f"{spec['name']}.yaml")
    t0 = time.perf_counter()
    state = run_dag(dag, out, workers=workers, quiet=True)
    wall = time.perf_counter() - t0
    if state.get("state") != "done":
        raise SystemExit(f"{spec['name']}: ended {state.get('state')}")
    return wall


def _first_pass_bytes(run: Path) -> tuple[int, int]:
    from curation.pipeline.rundir import RunDir

    entries = RunDir(run).entries("crawl").values()
    return sum(int(e.get("bytes_read") or 0) for e in entries), sum(int(e.get("rows") or 0) for e in entries)


def _survivors(run: Path):
    from curation.pipeline.rundir import RunDir

    con = RunDir(run).connect(["top"])
    return con.execute("select origin_file, origin_offset, origin_length, meta from top").fetchall()


def _reads(rows, max_gap: int) -> tuple[int, int, float]:
    """(bytes, reads, seconds) of fetching and parsing the survivors' records here."""
    from curation.io.records import Wanted, read_records

    wanted = [Wanted(f, o, n, json.loads(m).get("warc_record_id") if m else None) for f, o, n, m in rows]
    t0 = time.perf_counter()
    pages, stats = read_records(wanted, max_gap)
    bad = sum(p.html is None for p in pages)
    if bad:
        print(f"  ({bad} survivors not re-read)")
    return stats.bytes_read, stats.reads, time.perf_counter() - t0


def _rows_of(run: Path, node: str) -> int:
    from curation.pipeline.rundir import RunDir

    return sum(int(e.get("rows") or 0) for e in RunDir(run).entries(node).values())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=256, help="compressed WARC size (default 256)")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--keep-mod", type=int, default=10, help="keep 1 in N documents (default 10: ~10%%)")
    args = ap.parse_args()

    import ray

    from curation.stages.reextract import Reextract

    facts = cached_warc(args.size_mb)
    size = facts["bytes"]
    print(f"WARC {facts['path']}: {size / MiB:,.1f} MiB, {facts['responses']:,} responses, "
          f"{facts['records']:,} records; {args.workers} workers, {args.rounds} rounds")
    ray.init(address="local", num_cpus=args.workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    max_gap = Reextract().max_gap
    ratios: dict[str, list[float]] = {"same": [], "trafilatura": []}
    with tempfile.TemporaryDirectory(dir=bench_root()) as tmp:
        for r in range(args.rounds):
            first = Path(tmp) / f"first-{r}"
            t_first = _run(first_dag(facts["path"], args.keep_mod), first, args.workers)
            b_first, docs = _first_pass_bytes(first)
            kept = _rows_of(first, "top")
            rows = _survivors(first)
            b_again, n_reads, t_reads = _reads(rows, max_gap)
            print(f"\nround {r + 1}: first pass (read + extract {docs:,} docs + select) {t_first:7.1f} s, "
                  f"{b_first / MiB:,.1f} MiB read ({b_first / size:.3f}x the file); survivors {kept:,} "
                  f"({kept / docs:.1%})")
            own = sum(n for _, _, n, _ in rows)
            print(f"  survivors' records: {b_again / MiB:,.1f} MiB in {n_reads:,} reads (ranges less than "
                  f"{max_gap >> 10} KiB apart joined; their own bytes {own / MiB:,.1f} MiB = {own / b_first:.3f}x) "
                  f"= {b_again / b_first:.3f}x the first pass's bytes; {t_reads:.2f} s to fetch and parse them here")
            order = [("resiliparse", "text", "same"), ("trafilatura", "markdown", "trafilatura")]
            for engine, fmt, key in order if r % 2 == 0 else order[::-1]:
                t = _run(second_dag(str(first), engine, fmt), Path(tmp) / f"{key}-{r}", args.workers)
                ratios[key].append(t / t_first)
                print(f"  reextract {engine:11s} {fmt:8s} {t:7.1f} s = {t / t_first:.3f}x the first pass's wall "
                      f"({_rows_of(Path(tmp) / f'{key}-{r}', 'again'):,} docs; per doc {t / max(kept, 1) * 1e3:,.1f} ms "
                      f"against the first pass's {t_first / docs * 1e3:,.1f} ms)")
            ratios.setdefault("bytes", []).append(b_again / b_first)
    print("\nmedians over rounds: bytes {:.3f}x, wall (same engine) {:.3f}x, wall (trafilatura markdown) {:.3f}x "
          "the first pass".format(statistics.median(ratios["bytes"]), statistics.median(ratios["same"]),
                                  statistics.median(ratios["trafilatura"])))


if __name__ == "__main__":
    main()
