"""An incremental corpus (issue 31): a base snapshot deduplicated (exact_dedup -> minhash_dedup)
and indexed (``refinery index build``'s code path), then a new snapshot of 10% its size
deduplicated ``against`` the index, compared with deduplicating base + new from scratch.

Corpus: ``bench_global``'s generator (real-text snippets; 12% exact and 8% near copies inside
each shard) for the base; the new snapshot is 70% fresh documents, 15% exact copies of random
base documents (other spacing and case) and 15% near copies of random base documents (a word or
two changed: " the " -> " a "), the planted cross-snapshot duplicates.

Printed: wall time and bytes read (``rchar`` of the driver and every process below it: Ray's
workers; each mode in its own process) of ``against`` vs from scratch; planted cross-snapshot
exact and near duplicates found (by ``against``, and by the from-scratch run: the in-run
recall); fresh documents dropped; index size on disk per million documents; driver and worker
peak RSS during ``against``; the index build's seconds.

Run: ``.venv/bin/python tests/benchmarks/bench_incremental.py --base 3000000 [--workers 2]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PARTITIONS = 16


def write_new(root: Path, base: list[tuple[str, str]], n: int, shard_docs: int, seed: int = 1) -> dict:
    """The new snapshot: ``n`` documents, 15% exact and 15% near copies of base documents."""
    from bench_global import write_corpus

    rng = np.random.default_rng(seed)
    (root / "fresh").mkdir()
    fresh = write_corpus(root / "fresh", n, shard_docs, seed=seed + 100)  # only fresh texts (in-shard copies too)
    counts = [pq.ParquetFile(p).metadata.num_rows for _, p in base]
    offsets = np.r_[0, np.cumsum(counts)]
    planted: dict[str, list[str]] = {"exact": [], "near": [], "fresh": []}
    out = []
    for k, (_, path) in enumerate(fresh):
        t = pq.read_table(path)
        m = t.num_rows
        kind = rng.random(m)
        texts = t.column("text").to_pylist()
        ids = [f"n{k:05d}-{i:06d}" for i in range(m)]  # after the base's "d..." ids (exact keeps the lowest)
        copy = np.flatnonzero(kind < 0.30)
        src = np.sort(rng.integers(0, offsets[-1], len(copy)))
        shard = np.searchsorted(offsets, src, side="right") - 1
        for s in np.unique(shard).tolist():
            rows = src[shard == s] - offsets[s]
            got = pq.read_table(base[s][1], columns=["text"]).column("text").take(pa.array(rows)).to_pylist()
            for i, text in zip(copy[shard == s].tolist(), got):
                if kind[i] < 0.15:
                    texts[i] = "  " + text.upper() + " "
                    planted["exact"].append(ids[i])
                else:
                    edited = text.replace(" the ", " a ", 2)
                    texts[i] = edited
                    planted["near" if edited != text else "exact"].append(ids[i])
        planted["fresh"] += [ids[i] for i in np.flatnonzero(kind >= 0.30).tolist()]
        t = t.set_column(t.schema.get_field_index("id"), "id", pa.array(ids))
        t = t.set_column(t.schema.get_field_index("text"), "text", pa.array(texts, pa.string()))
        p = root / f"up-n{k:05d}.parquet"  # keys after the base's up-00000...: its documents come first
        pq.write_table(t, p, row_group_size=1024)
        out.append((f"up-n{k:05d}", str(p)))
        Path(path).unlink()
    (root / "planted.json").write_text(json.dumps(planted))
    return {"upstream": out, "planted": {k: len(v) for k, v in planted.items()}}


def _descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += kids.get(p, [])
    return out


def _rchar() -> dict[int, int]:
    out = {}
    for p in _descendants(os.getpid()):
        try:
            for line in Path(f"/proc/{p}/io").read_text().splitlines():
                if line.startswith("rchar:"):
                    out[p] = int(line.split()[1])
        except OSError:
            pass
    return out


def _read_since(before: dict[int, int]) -> int:
    now = _rchar()
    return sum(v - before.get(p, 0) for p, v in now.items())


def run_mode(mode: str, root: Path, workers: int, out_json: str) -> None:
    import ray

    from curation.pipeline.context import GlobalContext
    from curation.pipeline.corpus_index import IndexedStage, add_run
    from curation.pipeline.rundir import RunDir
    from curation.pipeline.tasks import peak_rss_mb
    from curation.stages.exact_dedup import ExactDedup
    from curation.stages.minhash_dedup import MinHashDedup

    base = [tuple(x) for x in json.loads((root / "base.json").read_text())]
    new = [tuple(x) for x in json.loads((root / "new.json").read_text())]
    index = str(root / "index")
    upstream = {"base": base, "scratch": base + new, "against": new}[mode]
    against = [index] if mode == "against" else []
    ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level="ERROR")
    rd = RunDir(root / f"run-{mode}")
    res: dict = {"mode": mode, "docs": sum(pq.ParquetFile(p).metadata.num_rows for _, p in upstream),
                 "input_bytes": sum(Path(p).stat().st_size for _, p in upstream), "stages": {}}
    exact = ExactDedup(input="up", partitions=PARTITIONS, against=against,
                       bloom={"expected_items": res["docs"], "false_positive_rate": 1e-6})
    near = MinHashDedup(input="exact", partitions=PARTITIONS, against=against)
    before = _rchar()
    t0 = time.perf_counter()
    ctx = GlobalContext(rd, "exact", exact.params_hash(["up"]), workers, upstream, exact.resources)
    exact.run(ctx)
    ctx.finish()
    res["stages"]["exact"] = {"seconds": time.perf_counter() - t0, "worker_peak_mb": max(
        v["peak_worker_rss_mb"] for v in ctx.phases.values())}
    t1 = time.perf_counter()
    near_up = sorted((k, rd.path(e["file"])) for k, e in rd.committed("exact", ctx.params_hash).items() if e.get("file"))
    nctx = GlobalContext(rd, "near", near.params_hash([ctx.params_hash]), workers, near_up, near.resources)
    near.run(nctx)
    nctx.finish()
    res["stages"]["near"] = {"seconds": time.perf_counter() - t1, "worker_peak_mb": max(
        v["peak_worker_rss_mb"] for v in nctx.phases.values()),
        "phases": {k: v["seconds"] for k, v in nctx.phases.items()}}
    res["seconds"] = time.perf_counter() - t0
    res["bytes_read"] = _read_since(before)
    res["driver_peak_mb"] = peak_rss_mb()
    res["worker_peak_mb"] = max(s["worker_peak_mb"] for s in res["stages"].values())
    res["exact_report"] = {k: v for k, v in json.loads((Path(rd.stage_dir("exact")) / "_bloom_report.json").read_text()).items()
                           if k in ("keys", "duplicates", "in_run_duplicates", "index_duplicates")}
    ray.shutdown()
    if mode in ("base", "against"):
        t2 = time.perf_counter()
        before = _rchar()
        r = add_run(index, rd, {"exact": IndexedStage("exact", exact, ctx.params_hash),
                                "near": IndexedStage("near", near, nctx.params_hash)}, "snap-" + mode)
        res["index_add_seconds"] = time.perf_counter() - t2
        res["index_add_bytes_read"] = _read_since(before)
        res["index_member"] = r["member"]
    rej = {}
    for stage in ("exact", "near"):
        files = sorted((Path(rd.root) / "rejected" / stage).glob("*.parquet"))
        if files:
            t = pa.concat_tables([pq.read_table(f, columns=["id", "reason"]) for f in files])
            rej.update(zip(t.column("id").to_pylist(), t.column("reason").to_pylist()))
    if mode != "base":
        planted = json.loads((root / "new" / "planted.json").read_text())
        for kind, ids in planted.items():
            reasons = [rej.get(i) for i in ids]
            res[f"{kind}_dropped"] = sum(r is not None for r in reasons)
            res[f"{kind}_planted"] = len(ids)
            res[f"{kind}_dropped_in_index"] = sum(r is not None and ("in_index=" in r or "=snap-" in r) for r in reasons)
            res[f"{kind}_dropped_ids"] = sorted(i for i, r in zip(ids, reasons) if r is not None)
    Path(out_json).write_text(json.dumps(res, indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", type=int, default=3_000_000)
    ap.add_argument("--shard-docs", type=int, default=50_000)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--mode", nargs=3, help=argparse.SUPPRESS)  # internal: MODE ROOT OUT_JSON
    a = ap.parse_args()
    if a.mode:
        run_mode(a.mode[0], Path(a.mode[1]), a.workers, a.mode[2])
        return
    from bench_global import write_corpus

    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        (root / "base").mkdir()
        base = write_corpus(root / "base", a.base, a.shard_docs, seed=0)
        (root / "base.json").write_text(json.dumps(base))
        (root / "new").mkdir()
        gen = write_new(root / "new", base, a.base // 10, a.shard_docs)
        (root / "new.json").write_text(json.dumps(gen["upstream"]))
        print(f"generated {a.base:,} + {a.base // 10:,} documents in {time.perf_counter() - t0:.0f} s; planted in "
              f"the new snapshot: {gen['planted']}", flush=True)
        res = {}
        for mode in ("base", "against", "scratch"):
            out = str(root / f"result-{mode}.json")
            subprocess.run([sys.executable, __file__, "--mode", mode, str(root), out, "--workers", str(a.workers)],
                           check=True)
            res[mode] = json.loads(Path(out).read_text())
            r = res[mode]
            print(f"{mode:8s} {r['docs']:>10,} docs {r['seconds']:8.1f} s  read {r['bytes_read'] / 1e9:7.2f} GB  "
                  f"driver {r['driver_peak_mb']:6,.0f} MB  worker {r['worker_peak_mb']:6,.0f} MB  "
                  f"stages {json.dumps({k: round(v['seconds'], 1) for k, v in r['stages'].items()})}", flush=True)
        from curation.dedup.index import CorpusIndex

        idx = CorpusIndex(str(root / "index"))
        size = idx.size()
        b, ag, sc = res["base"], res["against"], res["scratch"]
        base_member = b["index_member"]
        indexed = base_member["near"]["docs"]
        print(f"\nindex build from the base run: {b['index_add_seconds']:.1f} s, read {b['index_add_bytes_read'] / 1e9:.2f} GB "
              f"(no text); base member: {base_member['exact']['keys']:,} exact keys, {indexed:,} near docs, "
              f"{base_member['near']['band_rows']:,} band rows")
        mem = base_member["exact"]["bytes"] + base_member["near"]["bytes"]
        print(f"index size (base member): {mem / 1e6:,.1f} MB = {mem / 1e6 / (b['docs'] / 1e6):,.1f} MB per million "
              f"base documents (exact {base_member['exact']['bytes'] / 1e6:,.1f} MB, near "
              f"{base_member['near']['bytes'] / 1e6:,.1f} MB); whole index after adding the new run: "
              f"{size['bytes'] / 1e6:,.1f} MB in {size['files']} files")
        print(f"\nnew snapshot against the index vs base + new from scratch: {ag['seconds']:.1f} s vs {sc['seconds']:.1f} s "
              f"(x{sc['seconds'] / ag['seconds']:.1f}); bytes read {ag['bytes_read'] / 1e9:.2f} vs "
              f"{sc['bytes_read'] / 1e9:.2f} GB (x{sc['bytes_read'] / max(1, ag['bytes_read']):.1f})")
        print(f"  planted exact copies found: against {ag['exact_dropped_in_index']:,}/{ag['exact_planted']:,} named in "
              f"the index ({ag['exact_dropped']:,} dropped in all); from scratch {sc['exact_dropped']:,}")
        print(f"  planted near copies found: against {ag['near_dropped']:,}/{ag['near_planted']:,} "
              f"({ag['near_dropped'] / max(1, ag['near_planted']):.2%}, {ag['near_dropped_in_index']:,} named in the index);"
              f" from scratch (in-run recall) {sc['near_dropped']:,} ({sc['near_dropped'] / max(1, sc['near_planted']):.2%})")
        extra = {k: len(set(ag[f"{k}_dropped_ids"]) - set(sc[f"{k}_dropped_ids"])) for k in ("fresh", "exact", "near")}
        missed = {k: len(set(sc[f"{k}_dropped_ids"]) - set(ag[f"{k}_dropped_ids"])) for k in ("fresh", "exact", "near")}
        print(f"  fresh documents dropped: against {ag['fresh_dropped']:,}, from scratch {sc['fresh_dropped']:,} "
              f"(of {ag['fresh_planted']:,}: the generator's own in-shard copies); dropped by against but kept "
              f"from scratch: {extra}; kept by against but dropped from scratch: {missed}")
        print(f"  during against: driver peak {ag['driver_peak_mb']:,.0f} MB, worker peak {ag['worker_peak_mb']:,.0f} MB "
              f"(base run: driver {b['driver_peak_mb']:,.0f}, worker {b['worker_peak_mb']:,.0f})")
        print(json.dumps({k: {kk: vv for kk, vv in v.items() if kk != "index_member" and not kk.endswith("_ids")}
                          for k, v in res.items()}))


if __name__ == "__main__":
    main()
