"""The filter chain with glibc's default allocator against ``allocator.keep_batch_blocks``
(freed batch arrays kept in the heap), in two fresh processes per round, in turns: page faults,
system and user CPU per document, and the process's peak RSS, on bench_scale's pages cut into
the executor's 4 MB batches (``bench_chain.py``). Prints figures, asserts nothing; the test
(``tests/test_allocator.py``) holds the setting to its effect on a probe.

Run: ``REFINERY_DATA=../shared/data .venv/bin/python tests/benchmarks/bench_allocator.py
[--pages default long] [--rounds 2]``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


def one(which: str, keep: bool) -> dict:
    """The chain over the pages (3 copies) three times after a warm-up, in this process."""
    import resource

    sys.path.insert(0, str(HERE))
    sys.path.insert(0, str(REPO))
    from curation.pipeline.allocator import keep_batch_blocks

    took = keep_batch_blocks() if keep else False
    import bench_chain

    docs, _ = bench_chain.extracted(which)
    tables = bench_chain.batches(docs * 3, 4 << 20, 2000)
    stages = bench_chain.chain_stages()
    bench_chain.run_chain(stages, tables)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(3):
        bench_chain.run_chain(stages, tables)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    n = 3 * 3 * len(docs)
    return {"took": took, "faults": (r1.ru_minflt - r0.ru_minflt) / n, "sys_us": (r1.ru_stime - r0.ru_stime) / n * 1e6,
            "user_us": (r1.ru_utime - r0.ru_utime) / n * 1e6, "maxrss_mb": r1.ru_maxrss / 1024}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", nargs="+", choices=["default", "long"], default=["default", "long"])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(one(a.child[0], a.child[1] == "keep")))
        return
    for which in a.pages:
        print(f"== {which}: the chain, per document")
        for r in range(a.rounds):
            for mode in ("default", "keep"):
                out = subprocess.run([sys.executable, __file__, "--child", which, mode], capture_output=True,
                                     text=True, check=True)
                got = json.loads(out.stdout.strip().splitlines()[-1])
                label = "glibc default" if mode == "default" else "keep_batch_blocks"
                print(f"  round {r + 1} {label:<18} {got['faults']:5.1f} page faults  sys {got['sys_us']:5.1f} us  "
                      f"user {got['user_us']:6.1f} us  peak RSS {got['maxrss_mb']:5.0f} MB"
                      + ("" if mode == "default" or got["took"] else "  (allocator did not take the setting)"))


if __name__ == "__main__":
    main()
