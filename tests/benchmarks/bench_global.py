"""Global-stage scale benchmark: synthetic documents made of short real-text snippets (so
dedup sees real shingles), through ``exact_dedup``, ``minhash_dedup``, ``quality_top`` (a
precomputed ``quality`` column), ``mix`` and ``pack`` (precomputed ``input_ids``/``num_tokens``),
each size in its own process and Ray session.

Printed per size and stage: per-phase docs/s, peak RSS of the driver (VmHWM of this process,
so one process per size) and of the largest worker (the tasks' own getrusage), files and bytes
written (output shards, rejected shards and the work folder before its removal), and the
bound the issue sets: files <= 2 x (map tasks + partitions + output shards). Then the driver's
growth from the smallest to the largest size. Asserts nothing.

Corpus: 12% exact copies, 8% near copies (a few words changed) of earlier documents, the rest
new documents of 3-8 real sentences; three sources (web 70%, code 20%, math 10%); ~24 tokens
per document (random ids: the token values do not matter to mix or pack).

Shards are a scale axis too: ``--shard-docs 5000 500`` runs each size with the same documents in
10x more shards and prints every stage's seconds and the driver's peak as ratios. On a shared
machine one run of each drifts more than the effect (x2 on the same stage between runs), so the
settings run ``--rounds`` times (default 2) in alternating order (5000, 500, then 500, 5000, ...)
and the ratios are of the medians, with each round's own ratio beside them. Mix's output
shards follow ``--shard-docs`` (as many outputs as inputs: the gather the issue measured);
pack's window stays at its default (10,000 documents) at every ``--shard-docs``: it is how many
documents best-fit packs together, a packing parameter, not a property of the upstream's
shards, so the same windows (and output shards) are packed from more, smaller shards.
exact, near and top write a block's shards under 16 MB into shared outputs
(``curation.io.shards.output_groups``): their files follow the bytes, not the shard count (1M
documents in 2,000 shards: top x1.06 of 200 shards, where one output per shard was x1.64).

Run: ``.venv/bin/python tests/benchmarks/bench_global.py [--sizes 1000000 10000000]
[--shard-docs 50000 [500 ...]] [--rounds 2] [--workers 2] [--stages exact near top mix pack]``
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
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PARTITIONS = 16


def sentences() -> list[str]:
    from bench_minhash import load_real_documents

    out = []
    for d in load_real_documents():
        out += [s.strip() for s in d.replace("\n", " ").split(". ") if 30 <= len(s) <= 300]
    return out


def write_corpus(root: Path, n: int, shard_docs: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` documents in shards of ``shard_docs``; built shard by shard (bounded memory)."""
    rng = np.random.default_rng(seed)
    sents = np.array(sentences(), dtype=object)
    upstream = []
    made = 0
    for k in range((n + shard_docs - 1) // shard_docs):
        m = min(shard_docs, n - made)
        nsent = rng.integers(3, 9, m)
        picks = rng.integers(0, len(sents), int(nsent.sum()))
        bounds = np.r_[0, np.cumsum(nsent)]
        texts = [". ".join(sents[picks[bounds[i]:bounds[i + 1]]]) + "." for i in range(m)]
        kind = rng.random(m)
        for i in np.flatnonzero(kind < 0.20).tolist():  # copies of an earlier doc of this shard
            j = int(rng.integers(0, max(1, i)))
            texts[i] = texts[j] if kind[i] < 0.12 else texts[j].replace(" the ", " a ", 2)
        src = np.where(kind < 0.7, "web", np.where(kind < 0.9, "code", "math"))
        ntok = rng.integers(8, 41, m).astype(np.int32)
        ids = rng.integers(3, 30000, int(ntok.sum()), dtype=np.int32)
        tok_off = np.r_[0, np.cumsum(ntok)].astype(np.int32)
        table = pa.table({
            "id": pa.array([f"d{made + i:010d}" for i in range(m)]), "source": pa.array(src.tolist()),
            "text": pa.array(texts, pa.string()), "quality": pa.array(rng.random(m).astype(np.float32)),
            "input_ids": pa.ListArray.from_arrays(pa.array(tok_off), pa.array(ids)),
            "num_tokens": pa.array(ntok)})
        p = root / f"up-{k:05d}.parquet"
        pq.write_table(table, p, row_group_size=1024)
        upstream.append((f"up-{k:05d}", str(p)))
        made += m
    return upstream


def _tree_bytes(paths: list[Path]) -> tuple[int, int]:
    files = [f for p in paths if p.exists() for f in p.rglob("*") if f.is_file()]
    return len(files), sum(f.stat().st_size for f in files)


def run_size(n: int, shard_docs: int, workers: int, stages: list[str], out_json: str) -> None:
    import ray

    from curation.pipeline.context import GlobalContext
    from curation.pipeline.rundir import RunDir
    from curation.stages.exact_dedup import ExactDedup
    from curation.stages.minhash_dedup import MinHashDedup
    from curation.stages.mix import Mix
    from curation.stages.pack import Pack
    from curation.stages.quality_top import QualityTop

    res: dict = {"docs": n, "workers": workers, "stages": {}}
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_TMP")) as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        # in another process: the driver's peak RSS is then the stages' alone
        subprocess.run([sys.executable, __file__, "--gen", str(n), str(root), "--shard-docs", str(shard_docs)],
                       check=True)
        upstream = json.loads((root / "upstream.json").read_text())
        res["generate_s"] = time.perf_counter() - t0
        res["upstream_shards"] = len(upstream)
        res["input_bytes"] = sum(Path(p).stat().st_size for _, p in upstream)
        ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level="ERROR")
        rd = RunDir(root / "run")
        tokens = n * 24
        configs = {
            "exact": ExactDedup(input="up", partitions=PARTITIONS),
            "near": MinHashDedup(input="up", partitions=PARTITIONS),
            "top": QualityTop(input="up", keep_top=0.3),
            "mix": Mix(input="up", weights={"web": 0.5, "code": 0.3, "math": 0.2}, total_tokens=tokens * 0.8,
                       rows_per_shard=shard_docs),
            "pack": Pack(input="up", seq_len=2048, pad_id=0),  # window: its default, whatever the shards
        }
        for name in stages:
            st = configs[name]
            ctx = GlobalContext(rd, name, st.params_hash(["up"]), workers, upstream, st.resources)
            t1 = time.perf_counter()
            st.run(ctx)
            wall = time.perf_counter() - t1
            outs = [Path(rd.stage_dir(name)), Path(rd.root) / "rejected" / name]
            ctx.finish(keep_work=False)
            work = json.loads((Path(rd.stage_dir(name)) / "_phases.json").read_text())["work"]
            files, nbytes = _tree_bytes(outs)
            out_shards = len(list(Path(rd.stage_dir(name)).glob("*.parquet")))
            res["stages"][name] = {
                "seconds": wall, "docs_per_s": n / wall,
                "phases": {k: {"seconds": v["seconds"], "docs_per_s": n / v["seconds"] if v["seconds"] else 0,
                               "peak_worker_rss_mb": v["peak_worker_rss_mb"]} for k, v in ctx.phases.items()},
                "largest_worker_mb": max((v["peak_worker_rss_mb"] for v in ctx.phases.values()), default=0),
                "files_written": files + work["files"], "bytes_written": nbytes + work["bytes"],
                "file_bound": 2 * (len(upstream) + _partitions(rd, name) + out_shards),
                "driver_hwm_mb": _hwm_mb()}
        ray.shutdown()
    res["driver_peak_mb"] = _hwm_mb()
    Path(out_json).write_text(json.dumps(res, indent=1))


def _partitions(rd, name: str) -> int:
    """The stage's shuffle partitions: mix chooses them from the data (its report says how many)."""
    rep = Path(rd.stage_dir(name)) / "_mix_report.json"
    return json.loads(rep.read_text())["partitions"] if rep.exists() else PARTITIONS


def _hwm_mb() -> float:
    from curation.pipeline.tasks import peak_rss_mb  # ru_maxrss: this process's VmHWM

    return peak_rss_mb()


def show(r: dict) -> None:
    print(f"\n== {r['docs']:,} documents in {r['upstream_shards']} shards ({r['input_bytes'] / 1e6:,.0f} MB), "
          f"{r['workers']} workers; corpus generated in {r['generate_s']:.0f} s")
    for name, s in r["stages"].items():
        ok = "ok" if s["files_written"] <= s["file_bound"] else "OVER"
        print(f"{name:6s} {s['seconds']:7.1f} s {s['docs_per_s']:9,.0f} docs/s  largest worker "
              f"{s['largest_worker_mb']:6,.0f} MB  driver so far {s['driver_hwm_mb']:6,.0f} MB  files "
              f"{s['files_written']:5d} (bound {s['file_bound']}: {ok})  bytes {s['bytes_written'] / 1e6:8,.1f} MB")
        for ph, v in s["phases"].items():
            print(f"    {ph:18s} {v['seconds']:7.1f} s {v['docs_per_s']:11,.0f} docs/s  worker {v['peak_worker_rss_mb']:6,.0f} MB")
    print(f"driver peak RSS {r['driver_peak_mb']:,.0f} MB")


def compare_shards(rounds: list[list[dict]]) -> None:
    """The same documents in more shards: each stage's median seconds (over rounds run in
    alternating order) and the driver's median peak, as ratios to the first (fewest shards)
    setting; each round's own ratio beside, so the spread shows."""
    med = lambda xs: float(np.median(xs))  # noqa: E731
    base = rounds[0]
    print(f"\n{base[0]['docs']:,} documents: more shards vs {base[0]['upstream_shards']} shards "
          f"(medians of {len(base)} rounds, alternating order; ratio to it, then each round's ratio)")
    for runs in rounds[1:]:
        d, b = med([r["driver_peak_mb"] for r in runs]), med([r["driver_peak_mb"] for r in base])
        print(f"  {runs[0]['upstream_shards']} shards: driver peak {d:,.0f} MB (x{d / b:.2f})")
        for name in runs[0]["stages"]:
            s = [r["stages"][name]["seconds"] for r in runs]
            sb = [r["stages"][name]["seconds"] for r in base]
            per = " ".join(f"x{x / y:.2f}" for x, y in zip(s, sb))
            print(f"    {name:6s} median {med(s):7.1f} s vs {med(sb):7.1f} s (x{med(s) / med(sb):.2f}; rounds {per})  "
                  f"files {runs[0]['stages'][name]['files_written']:6d} (bound {runs[0]['stages'][name]['file_bound']})  "
                  f"largest worker {max(r['stages'][name]['largest_worker_mb'] for r in runs):,.0f} MB")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    ap.add_argument("--shard-docs", type=int, nargs="+", default=[50_000],
                    help="documents per upstream shard; several: the same documents in more shards, compared")
    ap.add_argument("--rounds", type=int, default=2,
                    help="with several --shard-docs: rounds of all settings, order alternating, medians reported")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--stages", nargs="+", default=["exact", "near", "top", "mix", "pack"])
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # internal: SIZE OUT_JSON
    ap.add_argument("--gen", nargs=2, help=argparse.SUPPRESS)  # internal: SIZE DIR
    a = ap.parse_args()
    if a.gen:
        up = write_corpus(Path(a.gen[1]), int(a.gen[0]), a.shard_docs[0])
        (Path(a.gen[1]) / "upstream.json").write_text(json.dumps(up))
        return
    if a.one:
        run_size(int(a.one[0]), a.shard_docs[0], a.workers, a.stages, a.one[1])
        return
    results = []
    rounds = a.rounds if len(a.shard_docs) > 1 else 1
    for n in a.sizes:
        by_shards: dict[int, list[dict]] = {sd: [] for sd in a.shard_docs}
        for rnd in range(rounds):
            order = a.shard_docs if rnd % 2 == 0 else a.shard_docs[::-1]  # drift hits both sides alike
            for sd in order:
                with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
                    out = f.name
                subprocess.run([sys.executable, __file__, "--one", str(n), out, "--shard-docs", str(sd),
                                "--workers", str(a.workers), "--stages", *a.stages], check=True)
                by_shards[sd].append(json.loads(Path(out).read_text()))
                Path(out).unlink()
                if rounds > 1:
                    print(f"\n-- round {rnd + 1} of {rounds}, {sd} documents per shard")
                show(by_shards[sd][-1])
        if len(a.shard_docs) > 1:
            compare_shards([by_shards[sd] for sd in a.shard_docs])
        results.append(by_shards[a.shard_docs[0]][0])
    if len(results) > 1:
        lo, hi = results[0], results[-1]
        print(f"\ndriver peak RSS {lo['driver_peak_mb']:,.0f} MB at {lo['docs']:,} -> {hi['driver_peak_mb']:,.0f} MB "
              f"at {hi['docs']:,} docs: x{hi['driver_peak_mb'] / lo['driver_peak_mb']:.2f} for "
              f"x{hi['docs'] / lo['docs']:.0f} documents")


if __name__ == "__main__":
    main()
