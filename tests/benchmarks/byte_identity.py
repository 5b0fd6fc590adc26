"""Byte identity of a refactor: run the same DAGs with the code of two commits and compare every
committed shard.

    python tests/benchmarks/byte_identity.py --base 6a72000            # base vs this working tree
    python tests/benchmarks/byte_identity.py --base 6a72000 --head HEAD --suites demo,dedup

Each side runs from its own tree (``git worktree add --detach``; the working tree itself for
``--head .``) with this checkout's Python environment and ``PYTHONPATH`` set to that tree, so
``python -m curation.cli`` is that commit's code. Both sides read the same input bytes (input
paths are made absolute into this checkout) and the same shared artifacts: a tokenizer (for
``mix``) and a quality model (for ``quality``), made once with the head's code.

Suites (what they exercise):
- ``demo``: ``pipelines/demo.yaml``: read (WARC, JSONL), extract, unions, the Gopher/C4/FineWeb
  map filters (signals-only shards, the text state handed along);
- ``dedup``: ``pipelines/dedup.yaml``: exact_dedup (bloom, partitions) and minhash_dedup (LSH);
- ``quality``: quality_top keep_top 0.5 over the dedup fixtures (the digit-histogram selection);
- ``mix``: ``pipelines/mix-multi.yaml``: tokenize, mix (token shares, epochs) and pack;
- ``bench``: the web DAG of ``bench_scale.py`` (extract, langid, the four filters, exact and near
  dedup) over its CC-like WARC of ``--bench-mb`` MB built from the real pages in
  ``../shared/data`` (``REFINERY_DATA``), made once and read by both sides.

For every stage of every run the manifests are compared line by line (key, rows, sha256 of the
kept and rejected files, params hash) and every committed file's bytes are hashed on disk. The
stage reports (``_*.json`` except timings) are compared too and listed when they differ. Exit
status 0 when every committed shard is byte-identical.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
PY = sys.executable
SUITES = ("demo", "dedup", "quality", "mix", "bench")
#: files of a run that hold timings or live state, not outputs
NOT_OUTPUTS = {"progress.json", "_phases.json"}


def sh(cmd: list[str], cwd: Path, log: Path | None = None, env: dict | None = None) -> float:
    t0 = time.time()
    res = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if log is not None:
        log.write_text(res.stdout + res.stderr)
    if res.returncode:
        raise SystemExit(f"failed ({cwd}): {' '.join(cmd)}\n{(res.stderr or res.stdout)[-3000:]}")
    return time.time() - t0


def tree_of(rev: str, out: Path) -> tuple[Path, str]:
    """(source tree, label) for ``rev``: the working tree for ``.``, else a detached worktree."""
    if rev == ".":
        return REPO, "worktree"
    sha = subprocess.run(["git", "rev-parse", "--short", rev], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout.strip()
    tree = out / f"tree-{sha}"
    if not (tree / ".git").exists():
        sh(["git", "worktree", "add", "--detach", str(tree), sha], REPO)
    return tree, sha


class Side:
    def __init__(self, name: str, tree: Path, label: str, out: Path):
        self.name, self.tree, self.label = name, tree, label
        self.runs = out / f"runs-{name}-{label}"
        self.runs.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "PYTHONPATH": str(tree), "RAY_DEDUP_LOGS": "0"}

    def cli(self, *args: str, log: Path | None = None) -> float:
        return sh([PY, "-m", "curation.cli", *args], self.tree, log, self.env)


def absolute(dag: dict, runs: Path, shared: dict[str, str]) -> dict:
    """The DAG with input paths made absolute into this checkout, ``runs/NAME`` pointing at
    the side's runs (or a shared artifact)."""

    def fix(v):
        if isinstance(v, dict):
            return {k: fix(x) for k, x in v.items()}
        if isinstance(v, list):
            return [fix(x) for x in v]
        if isinstance(v, str) and v.startswith("runs/"):
            name = v.split("/")[1]
            return shared.get(name) or str(runs / v[len("runs/"):])
        return v

    dag = fix(dag)
    for spec in dag.get("inputs", {}).values():
        spec["paths"] = [p if os.path.isabs(p) else str(REPO / p) for p in spec.get("paths", [])]
    return dag


def bench_dag(size_mb: int, workers: int) -> dict:
    """bench_scale.py's whole web DAG over its cached CC-like WARC of ``size_mb``."""
    sys.path.insert(0, str(REPO / "tests" / "benchmarks"))
    import bench_scale

    facts = bench_scale.cached_warc(size_mb)
    return bench_scale.dag_spec(facts["path"], "full", 4, facts["responses"], workers)


def suite_dags(shared: dict[str, str], bench_mb: int = 16, workers: int = 2) -> dict[str, dict]:
    load = lambda p: yaml.safe_load((REPO / p).read_text())  # noqa: E731
    quality = {"name": "quality",
               "inputs": {"docs": {"format": "jsonl", "paths": ["tests/data/dedup/*.jsonl.gz"], "source": "web",
                                   "id_field": "id", "split_bytes": 60000}},
               "stages": {"top": {"type": "quality", "input": "docs", "model": shared.get("quality.bin", ""),
                                  "keep_top": 0.5}},
               "output": "top"}
    dags = {"demo": load("pipelines/demo.yaml"), "dedup": load("pipelines/dedup.yaml"), "quality": quality,
            "mix": load("pipelines/mix-multi.yaml")}
    return dags | ({"bench": bench_dag(bench_mb, workers)} if bench_mb else {})


def file_sha(p: Path) -> str:
    with open(p, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def manifests(run: Path) -> dict[str, dict[str, dict]]:
    out = {}
    for m in sorted(run.glob("*/_manifest.jsonl")):
        entries = {}
        for line in m.read_text().splitlines():
            if line.strip():
                e = json.loads(line)
                entries[e["shard"]] = e
        out[m.parent.name] = entries
    return out


def compare(a: Path, b: Path) -> dict:
    """Per stage: shards, identical, differing (with why); reports that differ."""
    ma, mb = manifests(a), manifests(b)
    stages = {}
    for stage in sorted(set(ma) | set(mb)):
        ea, eb = ma.get(stage, {}), mb.get(stage, {})
        diff, same, files = [], 0, 0
        params = sorted({e.get("params_hash") for e in ea.values()} ^ {e.get("params_hash") for e in eb.values()})
        for key in sorted(set(ea) | set(eb)):
            x, y = ea.get(key), eb.get(key)
            if x is None or y is None:
                diff.append(f"{key}: only in {'head' if x is None else 'base'}")
                continue
            why = []
            for f in ("file", "rejected_file"):
                if bool(x.get(f)) != bool(y.get(f)):
                    why.append(f"{f} present in one only")
                elif x.get(f):
                    files += 1
                    ha, hb = file_sha(a / x[f]), file_sha(b / y[f])
                    if ha != hb:
                        why.append(f"{x[f]} bytes differ")
            for k in ("rows", "rows_in", "rejected_rows"):
                if x.get(k) != y.get(k):
                    why.append(f"{k} {x.get(k)} != {y.get(k)}")
            if why:
                diff.append(f"{key}: {'; '.join(why)}")
            else:
                same += 1
        reports = []
        for side_a in sorted((a / stage).glob("_*.json")):
            if side_a.name in NOT_OUTPUTS:
                continue
            side_b = b / stage / side_a.name
            if not side_b.exists():
                reports.append(f"{side_a.name} (base only)")
            elif (keys := _differing(_report(side_a), _report(side_b))):
                reports.append(f"{side_a.name} ({', '.join(keys[:4])}{', ...' if len(keys) > 4 else ''})")
        stages[stage] = {"shards": len(set(ea) | set(eb)), "identical": same, "files_hashed": files,
                         "differ": diff, "params_hash_changed": bool(params), "reports_differ": reports}
    return stages


#: report fields that are timings, memory, process ids or the run's own location, not outputs
VOLATILE = ("seconds", "per_s", "rss_mb", "time", "_dir", "per_worker_process")


def _report(p: Path):
    """A report without its timings, memory figures, process ids and paths."""
    def strip(v):
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if not any(t in k for t in VOLATILE)}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v
    return strip(json.loads(p.read_text()))


def _differing(x, y, path: str = "") -> list[str]:
    """Where two reports differ: field paths (``a.b``; a list by its field)."""
    if isinstance(x, dict) and isinstance(y, dict):
        return [p for k in sorted(set(x) | set(y), key=str)
                for p in (_differing(x.get(k), y.get(k), f"{path}.{k}" if path else str(k))
                          if k in x and k in y else [f"{path}.{k}" if path else str(k)])]
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        return list(dict.fromkeys(p for u, v in zip(x, y) for p in _differing(u, v, f"{path}[]")))
    return [] if x == y else [path]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="6a72000", help="the commit before the change")
    ap.add_argument("--head", default=".", help="the commit after it ('.': this working tree)")
    ap.add_argument("--suites", default=",".join(SUITES), help=f"comma-separated, of {', '.join(SUITES)}")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--bench-mb", type=int, default=16, help="size of the bench suite's CC-like WARC")
    ap.add_argument("--out", default="/tmp/refinery-byte-identity", help="trees, runs and shared artifacts")
    ap.add_argument("--json", help="write the comparison here")
    ap.add_argument("--no-run", action="store_true", help="compare the runs already under --out")
    args = ap.parse_args()
    suites = [s for s in args.suites.split(",") if s]
    unknown = set(suites) - set(SUITES)
    if unknown:
        raise SystemExit(f"unknown suites {sorted(unknown)} (known: {', '.join(SUITES)})")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    base = Side("base", *tree_of(args.base, out), out)
    head = Side("head", *tree_of(args.head, out), out)
    print(f"base {base.label} ({base.tree})\nhead {head.label} ({head.tree})")

    shared: dict[str, str] = {}
    shared_dir = out / f"shared-{head.label}"
    shared_dir.mkdir(exist_ok=True)
    if "quality" in suites and not args.no_run:  # one model for both sides, made with the head's code
        model = shared_dir / "quality.bin"
        if not model.exists():
            q = REPO / "tests/data/quality"
            head.cli("quality", "label", str(q / "crawl_sample.jsonl.gz"), "--positive",
                     str(q / "reference_sample.jsonl.gz"), "--teacher", "reference", "--out", str(shared_dir / "labels.txt"))
            head.cli("quality", "train", str(shared_dir / "labels.txt"), "--out", str(model), "--dim", "32", "--epoch", "10")
        shared["quality.bin"] = str(model)
    order = [s for s in SUITES if s in suites]
    if "mix" in suites and "demo" not in order:
        order.insert(0, "demo")  # the tokenizer is trained on the demo's output
    for suite in order if not args.no_run else ():
        if suite == "mix":
            tok = shared_dir / "demo-tok"
            if not (tok / "card.json").exists():
                head.cli("tokenizer", "train", str(head.runs / "demo" / "fineweb"), "--kind", "bpe",
                         "--vocab-size", "4096", "--out", str(tok))
            shared["demo-tok"] = str(tok)
        dag = suite_dags(shared, args.bench_mb if suite == "bench" else 0, args.workers)[suite]
        for side in (base, head):
            f = side.runs / f"{suite}.yaml"
            f.write_text(yaml.safe_dump(absolute(dag, side.runs, shared), sort_keys=False))
            shutil.rmtree(side.runs / suite, ignore_errors=True)  # a fresh run, never a resumed one
            secs = side.cli("run", str(f), "--out", str(side.runs / suite), "--workers", str(args.workers), "-q",
                            log=side.runs / f"{suite}.log")
            print(f"  {suite:8s} {side.name} ({side.label}): {secs:6.1f} s")
    results = {suite: compare(base.runs / suite, head.runs / suite) for suite in suites}
    empty = [s for s, stages in results.items() if not stages]
    if empty:
        raise SystemExit(f"no committed shards to compare for {', '.join(empty)} (run without --no-run)")

    ok = True
    print(f"\n{'suite':8s} {'stage':14s} {'shards':>6s} {'identical':>9s} {'files':>6s}  params hash  notes")
    for suite, stages in results.items():
        for stage, r in stages.items():
            ok &= not r["differ"]
            notes = "; ".join(r["differ"][:3]) + (f" (+{len(r['differ']) - 3})" if len(r["differ"]) > 3 else "")
            if r["reports_differ"]:
                notes += f" reports differ: {', '.join(r['reports_differ'])}"
            print(f"{suite:8s} {stage:14s} {r['shards']:6d} {r['identical']:9d} {r['files_hashed']:6d}  "
                  f"{'changed' if r['params_hash_changed'] else 'same':11s}  {notes}")
    total = sum(r["files_hashed"] for s in results.values() for r in s.values())
    print(f"\n{'IDENTICAL' if ok else 'DIFFERENT'}: {total} committed files hashed, base {base.label} vs head {head.label}")
    if args.json:
        Path(args.json).write_text(json.dumps({"base": base.label, "head": head.label, "identical": ok,
                                               "suites": results}, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
