"""Does every core of this machine run at one speed? The same extraction loop (decode +
resiliparse over the bench's real pages, the extract stage's work) pinned to each core at once,
timed per pass. Prints each core's seconds per pass side by side. Asserts nothing.

On this 2-core VM (2026-11-28) one core took 1.9-2.1 s a pass while the other took 3.1-3.5 s, and
which one was slow changed from one pass to the next (both were slow at times): a host core shared
with another guest's work. Two runs of a benchmark one after the other, or two runs at once left
where the scheduler puts them, each see their own cores' luck; ``bench_scale.py --side-by-side``
swaps the two runs between the cores every second instead.

Run: ``REFINERY_DATA=../shared/data .venv/bin/python tests/benchmarks/bench_cores.py [--passes 6]
[--pages 600]``
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import bench_scale  # noqa: E402  (the pages)


def loop(cpu: int, pages: list[bytes], passes: int, start, out) -> None:
    os.sched_setaffinity(0, {cpu})
    start.wait()  # every core begins together
    times = []
    for _ in range(passes):
        t0 = time.perf_counter()
        for html in pages:
            bench_scale.page_text(html)
        times.append(time.perf_counter() - t0)
    out.put((cpu, times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--passes", type=int, default=6)
    ap.add_argument("--pages", type=int, default=600, help="pages a pass (of bench_scale's real pages)")
    a = ap.parse_args()
    pages = [html for _, html in bench_scale.load_pages()][: a.pages]
    cpus = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")
    start, out = ctx.Barrier(len(cpus)), ctx.Queue()
    procs = [ctx.Process(target=loop, args=(c, pages, a.passes, start, out)) for c in cpus]
    for p in procs:
        p.start()
    got = dict(out.get() for _ in procs)
    for p in procs:
        p.join()
    print(f"{len(pages)} pages a pass, every core at once; seconds a pass per core:")
    print("pass  " + "  ".join(f"cpu{c:<4d}" for c in cpus) + "  slowest/fastest")
    for i in range(a.passes):
        row = [got[c][i] for c in cpus]
        print(f"{i:4d}  " + "  ".join(f"{t:7.2f}" for t in row) + f"  x{max(row) / min(row):.2f}")
    every = [t for c in cpus for t in got[c]]
    print(f"all passes: fastest {min(every):.2f} s, slowest {max(every):.2f} s (x{max(every) / min(every):.2f})")


if __name__ == "__main__":
    main()
