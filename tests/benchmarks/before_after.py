"""One benchmark with two commits' code, in one sitting: each side runs that commit's own copy of
the benchmark script from its own tree (``git worktree add --detach``; ``.`` is this working
tree) with this checkout's Python environment and ``PYTHONPATH`` set to that tree, one after
the other, ``--rounds`` times alternating (base, head, base, head...), so load on the machine
lands on both sides. Prints each side's output as it comes; asserts nothing.

    .venv/bin/python tests/benchmarks/before_after.py --base 6a72000 bench_minhash.py -- --seeds 3
    BENCH_TMP=/big/tmp .venv/bin/python tests/benchmarks/before_after.py --base 6a72000 bench_scale.py

Compare the ratios each side prints against its own peer (rensa, datatrove, extract-only):
machine speed moves between runs, a ratio within one run does not. Each tree's compiled kernels
are warmed up (``refinery warmup``) before its first timed run.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from byte_identity import tree_of  # the same detached worktrees (this folder is on sys.path)

REPO = Path(__file__).resolve().parents[2]
TREES = Path(os.environ.get("BENCH_TMP", "/tmp")) / "refinery-trees"
DATA = Path(os.environ.get("REFINERY_DATA", REPO.parent / "shared" / "data"))


def run(where: Path, script: str, args: list[str], label: str) -> int:
    env = {**os.environ, "PYTHONPATH": str(where), "REFINERY_DATA": str(DATA)}
    print(f"\n######## {label}: {where} ########", flush=True)
    return subprocess.run([sys.executable, str(where / "tests" / "benchmarks" / script), *args], cwd=where,
                          env=env).returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="git revision of the 'before' side")
    ap.add_argument("--head", default=".", help="git revision of the 'after' side (default: this working tree)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("script", help="a file name under tests/benchmarks/")
    ap.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script (after --)")
    a = ap.parse_args()
    args = a.args[1:] if a.args[:1] == ["--"] else a.args
    TREES.mkdir(parents=True, exist_ok=True)
    sides = [("before", tree_of(a.base, TREES)[0]), ("after", tree_of(a.head, TREES)[0])]
    for _, where in sides:  # numba caches live in each tree: compile before anything is timed
        subprocess.run([sys.executable, "-m", "curation.cli", "warmup"], cwd=where,
                       env={**os.environ, "PYTHONPATH": str(where)}, check=True, capture_output=True)
    for r in range(a.rounds):
        for label, where in sides:
            rc = run(where, a.script, args, f"{label} (round {r + 1})")
            if rc:
                sys.exit(rc)


if __name__ == "__main__":
    main()
