"""Dedup benchmark: ``exact_dedup`` then ``minhash_dedup`` on Ray over a corpus grown from
real text, at two sizes (default 100k and 200k documents), each in its own process and Ray
session; plus precision / recall on a labelled near-duplicate set beside datasketch.

Corpus: real English documents from shared/data (``bench_minhash.load_real_documents``)
are cut into sentences; 65% of the corpus are new documents spliced from 4-24 real
sentences in paragraphs, 20% are near-duplicates of an earlier document (the realistic
edits of tests/data/dedup/build_fixtures.py: inserted or deleted sentences, boilerplate
header/footer, swapped paragraphs, typos), 15% exact copies (verbatim or with other
spacing / capitals). Ids are shuffled, so the copy with the lowest id is not always the
first one generated.

Printed per size: docs/s of every phase (from the stages' reports), the peak RSS of the
largest process (driver and every Ray worker, sampled from /proc, plus the tasks' own
``getrusage`` figures), the largest edge set any one task held against all edges, and the
growth from the smaller to the larger size. Asserts nothing.

With ``--partner-rounds R`` each size then runs ``minhash_dedup`` again 2R times over the same
exact-deduplicated shards, alternating without and with ``partner_check`` (off, on, off, on...,
each in its own run folder, one Ray session), and prints both docs/s (each round and the
median), the rescued count and the partner phases' seconds; the quality section then also
scores the stage with the check (slack 0 and 0.05).

Run: ``.venv/bin/python tests/benchmarks/bench_dedup.py [--sizes 100000 200000] [--workers 2]
[--partner-rounds 2]``
The machine may be shared with other jobs: wall-clock figures move with its load.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(REPO / "tests"))  # dedup_helpers: datasketch's pipeline as the reference

from bench_minhash import fixture_edits, load_real_documents  # noqa: E402
from dedup_helpers import datasketch_removals  # noqa: E402

_SENT = re.compile(r"(?<=[.!?])\s+")


# ---------------------------------------------------------------------------------------------
# corpus


def make_corpus(n: int, seed: int = 0) -> list[dict]:
    """``n`` documents grown from real sentences (module docstring)."""
    edits = fixture_edits()
    pool = load_real_documents()
    sentences = [s for t in pool for line in t.split("\n") for s in _SENT.split(line) if len(s.split()) >= 4]
    rng = random.Random(seed)
    kinds = list(edits.EDITS)
    texts: list[str] = []
    for i in range(n):
        r = rng.random()
        if i < 100 or r < 0.65:
            k = rng.randint(4, 24)
            picked = [sentences[rng.randrange(len(sentences))] for _ in range(k)]
            paras, j = [], 0
            while j < k:
                step = rng.randint(1, 5)
                paras.append(" ".join(picked[j:j + step]))
                j += step
            texts.append("\n".join(paras))
        elif r < 0.85:
            src = texts[rng.randrange(i)]
            texts.append(edits.near_duplicate(src, rng.choice(kinds), rng, pool[rng.randrange(len(pool))]))
        else:
            src = texts[rng.randrange(i)]
            texts.append(src if rng.random() < 0.5 else edits.whitespace_and_case(src, rng))
    ids = np.random.default_rng(seed).permutation(n)
    qual = np.random.default_rng(seed + 1).random(n)
    return [{"id": f"doc-{int(ids[i]):08d}", "text": t, "quality": float(qual[i])} for i, t in enumerate(texts)]


def write_shards(docs: list[dict], root: Path, shards: int) -> list[tuple[str, str]]:
    out = []
    per = -(-len(docs) // shards)
    for s in range(shards):
        part = docs[s * per:(s + 1) * per]
        t = pa.table({"id": [d["id"] for d in part], "text": [d["text"] for d in part],
                      "source": ["web"] * len(part), "quality": [d["quality"] for d in part]})
        path = root / "corpus" / f"crawl-{s:04d}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(t, path, compression="zstd")
        out.append((f"crawl-{s:04d}", str(path)))
    return out


# ---------------------------------------------------------------------------------------------
# peak RSS of this process tree


def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            kids.setdefault(ppid, []).append(int(d))
        except (OSError, IndexError, ValueError):
            continue
    return kids


def _hwm_mb(pid: int) -> float:
    with contextlib.suppress(OSError):  # no /proc: report 0
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    return 0.0


class TreeRSS:
    """Samples the peak RSS (VmHWM) of every process descended from this one (the Ray head
    node and its workers are), once a second; ``peak`` = the largest process's peak."""

    def __init__(self) -> None:
        self.peak: dict[int, float] = {}
        self.name: dict[int, str] = {}
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(1.0)

    def sample(self) -> None:
        kids = _children()
        todo = [os.getpid()]
        while todo:
            p = todo.pop()
            hwm = _hwm_mb(p)
            if hwm > self.peak.get(p, 0.0):
                self.peak[p] = hwm
                self.name[p] = "driver" if p == os.getpid() else _cmdline(p)
            todo += kids.get(p, [])

    def __enter__(self) -> TreeRSS:
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join()
        self.sample()


def _cmdline(pid: int) -> str:
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()[:80]
    except OSError:
        return "?"


# ---------------------------------------------------------------------------------------------
# one size, in its own process


def run_one(corpus: str, workers: int, partitions: int, out_json: str, partner_rounds: int = 0) -> None:
    import ray

    import curation.stages  # noqa: F401
    from curation.pipeline.context import GlobalContext
    from curation.pipeline.rundir import RunDir
    from curation.stages.exact_dedup import ExactDedup
    from curation.stages.minhash_dedup import MinHashDedup

    meta = json.loads((Path(corpus) / "corpus.json").read_text())
    n, words, gen_s = meta["docs"], meta["mean_words"], meta["generate_s"]
    upstream = [tuple(u) for u in meta["shards"]]
    with tempfile.TemporaryDirectory(prefix="bench_dedup_") as tmp:
        root = Path(tmp)
        ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        res: dict = {"docs": n, "mean_words": words, "generate_s": gen_s, "workers": workers, "partitions": partitions}
        with TreeRSS() as rss:
            exact = ExactDedup(input="corpus", partitions=partitions,
                               bloom={"expected_items": n, "false_positive_rate": 1e-6})
            ctx = GlobalContext(RunDir(root / "run"), "exact", exact.params_hash(["c"]), workers, upstream)
            t1 = time.perf_counter()
            exact.run(ctx)
            res["exact_s"] = time.perf_counter() - t1
            res["exact"] = json.loads((root / "run" / "exact" / "_bloom_report.json").read_text())
            done = RunDir(root / "run").committed("exact", ctx.params_hash)
            up2 = sorted((k, str(root / "run" / e["file"])) for k, e in done.items())
            near = MinHashDedup(input="exact", partitions=partitions)
            ctx2 = GlobalContext(RunDir(root / "run"), "near", near.params_hash(["e"]), workers, up2)
            t1 = time.perf_counter()
            near.run(ctx2)
            res["near_s"] = time.perf_counter() - t1
            res["near"] = json.loads((root / "run" / "near" / "_minhash_report.json").read_text())
            rounds = []
            for i in range(partner_rounds):  # alternating, over the same shards, each in its own run folder
                for on in (False, True):
                    st = MinHashDedup(input="exact", partitions=partitions, partner_check=on)
                    where = RunDir(root / f"near-{i}-{'on' if on else 'off'}")
                    c = GlobalContext(where, "near", st.params_hash(["e"]), workers, up2)
                    t1 = time.perf_counter()
                    st.run(c)
                    sec = time.perf_counter() - t1
                    rep = json.loads(Path(where.report_path("near", "_minhash_report.json")).read_text())
                    rounds.append({"round": i, "partner_check": on, "seconds": sec, "removed": rep["removed"],
                                   "rescued": rep.get("rescued"), "partner": rep.get("partner_check"),
                                   "phase_seconds": rep["phase_seconds"]})
                    shutil.rmtree(where.root, ignore_errors=True)
            res["partner_rounds"] = rounds
        ray.shutdown()
        # VmHWM, not getrusage: ru_maxrss of a forked child starts from its parent's peak
        res["driver_rss_mb"] = rss.peak.get(os.getpid(), 0.0)
        top = max(rss.peak, key=rss.peak.get)
        res["largest_process_rss_mb"] = rss.peak[top]
        res["largest_process"] = rss.name.get(top, "?")
        res["process_count"] = len(rss.peak)
        res["task_rss_mb"] = max(res["near"]["max_rss_mb"], res["exact"]["max_rss_mb"])
    Path(out_json).write_text(json.dumps(res, indent=1, default=str))


def print_partner(r: dict) -> None:
    rounds = r.get("partner_rounds") or []
    if not rounds:
        return
    n = r["near"]["documents"]
    print(f"   partner_check, alternating off/on over the same {n:,} documents ({len(rounds) // 2} rounds each):")
    for on in (False, True):
        mine = [x for x in rounds if x["partner_check"] is on]
        rates = [n / x["seconds"] for x in mine]
        print(f"      {'on ' if on else 'off'}  docs/s {', '.join(f'{v:,.0f}' for v in rates)}  "
              f"(median {statistics.median(rates):,.0f}); removed {mine[0]['removed']:,}"
              + (f", rescued {mine[0]['rescued']:,}" if on else ""))
        if on:
            p = mine[0]["partner"]
            ph = {k: statistics.median(x["phase_seconds"].get(k, 0.0) for x in mine)
                  for k in ("partner_members", "partners", "apply")}
            print(f"           partner phases (median s): members {ph['partner_members']:.1f}, "
                  f"check {ph['partners']:.1f}; {p['checked']:,} removals checked in {p['components']:,} "
                  f"components, {p['jaccard_pairs']:,} exact Jaccards, {p['components_split']:,} components split, "
                  f"largest component {p['largest_component']:,}, min partner Jaccard {p['min_partner_jaccard']}")
    off = statistics.median(n / x["seconds"] for x in rounds if not x["partner_check"])
    on_ = statistics.median(n / x["seconds"] for x in rounds if x["partner_check"])
    print(f"      stage cost of the check: {100 * (off / on_ - 1):+.1f}% time (median docs/s {off:,.0f} -> {on_:,.0f})")


def print_size(r: dict) -> None:
    n = r["docs"]
    ex, ne = r["exact"], r["near"]
    print(f"\n== {n:,} documents (mean {r['mean_words']:.0f} words), {r['workers']} Ray workers, "
          f"{r['partitions']} partitions; corpus generated in {r['generate_s']:.0f} s")
    print(f"exact_dedup   {r['exact_s']:7.1f} s  {n / r['exact_s']:9,.0f} docs/s   removed {ex['duplicates']:,}; "
          f"Bloom fill {ex['fill_ratio']:.4f}, predicted FP {ex['predicted_false_positive_rate']:.1e}")
    for ph, s in ex["phase_seconds"].items():
        print(f"   {ph:12s} {s:7.1f} s  {n / s:9,.0f} docs/s")
    print(f"minhash_dedup {r['near_s']:7.1f} s  {ne['documents'] / r['near_s']:9,.0f} docs/s   removed {ne['removed']:,} "
          f"(b={ne['bands']}, r={ne['rows']})")
    for ph, s in ne["phases"].items():
        print(f"   {ph:12s} {s['seconds']:7.1f} s  {ne['docs_per_s'].get(ph, 0):9,.0f} docs/s")
    c = ne["components"]
    print(f"   candidate edges {ne['candidate_edges']:,}; components: {c['steps']} star steps; "
          f"largest edge set one task held {c['largest_task_edges']:,} of {c['input_directed_edges']:,} directed edges "
          f"({100 * c['largest_task_edges'] / max(1, c['input_directed_edges']):.1f}%); "
          f"largest bucket set {ne['largest_task_bucket_rows']:,} of {ne['bucket_rows']:,} rows")
    print(f"   peak RSS: largest process {r['largest_process_rss_mb']:.0f} MB ({r['largest_process']}), "
          f"largest task (worker getrusage) {r['task_rss_mb']:.0f} MB, driver {r['driver_rss_mb']:.0f} MB, "
          f"{r['process_count']} processes")
    print_partner(r)


# ---------------------------------------------------------------------------------------------
# precision / recall on a labelled set, beside datasketch


def quality(workers: int, partner: bool = False) -> None:
    import ray

    import curation.stages  # noqa: F401
    from curation.pipeline.context import GlobalContext
    from curation.pipeline.rundir import RunDir
    from curation.stages.minhash_dedup import MinHashDedup

    edits = fixture_edits()
    pool = [t for t in load_real_documents() if len(t.split()) >= 50]
    rng = random.Random(7)
    kinds = list(edits.EDITS)
    docs, group = [], {}
    for i, t in enumerate(pool):
        docs.append({"id": f"orig-{i:05d}", "text": t})
        group[f"orig-{i:05d}"] = f"orig-{i:05d}"
        for v in range(i % 2 + (i % 5 == 0)):  # 0, 1 or 2 copies
            vid = f"copy-{i:05d}-{v}"
            docs.append({"id": vid, "text": edits.near_duplicate(t, kinds[(i + v) % len(kinds)], rng,
                                                                  pool[rng.randrange(len(pool))])})
            group[vid] = f"orig-{i:05d}"
    rng.shuffle(docs)
    with tempfile.TemporaryDirectory(prefix="bench_dedup_q_") as tmp:
        root = Path(tmp)
        t = pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs]})
        up = []
        for s in range(4):
            p = root / f"q-{s}.parquet"
            pq.write_table(t.slice(s * (len(docs) // 4 + 1), len(docs) // 4 + 1), p)
            up.append((f"q-{s}", str(p)))
        ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        variants = [("ours (minhash_dedup)", {})]
        if partner:
            variants += [("ours + partner_check", {"partner_check": True}),
                         ("ours + partner, slack .05", {"partner_check": True, "partner_slack": 0.05})]
        scored, rescued = [], {}
        for k, (name, extra) in enumerate(variants):
            stage = MinHashDedup(input="q", threshold=0.8, num_perm=128, ngram=5, partitions=8, **extra)
            run = root / f"run-{k}"
            ctx = GlobalContext(RunDir(run), "near", stage.params_hash(["q"]), workers, up)
            stage.run(ctx)
            rej = pq.read_table(list((run / "rejected" / "near").glob("*.parquet"))).column("id").to_pylist() \
                if (run / "rejected" / "near").exists() else []
            scored.append((name, edits.score_removals(group, set(rej))))
            rescued[name] = json.loads((run / "near" / "_minhash_report.json").read_text()).get("rescued")
        ray.shutdown()
    theirs = edits.score_removals(group, datasketch_removals(docs))
    copies = sum(1 for k, g in group.items() if k != g)
    print(f"== precision / recall of removed near-duplicates, threshold 0.8, 128 perms, word 5-grams: "
          f"{len(pool)} real documents + {copies} edited copies")
    for name, s in scored + [("datasketch MinHashLSH", theirs)]:
        print(f"   {name:26s} precision {s['precision']:.3f}  recall {s['recall']:.3f}  "
              f"(removed right {s['true_removals']}, wrong {s['false_removals']}, missed {s['missed']})"
              + (f"; rescued {rescued[name]}" if rescued.get(name) is not None else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000, 200_000])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=16)
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--skip-quality", action="store_true")
    ap.add_argument("--partner-rounds", type=int, default=0,
                    help="per size, rerun minhash_dedup 2R times alternating without / with partner_check")
    args = ap.parse_args()
    if args.one:
        run_one(args.one, args.workers, args.partitions, args.out, args.partner_rounds)
        return
    print("(machine shared with other jobs while measuring: wall-clock figures move with its load)\n")
    if not args.skip_quality:
        quality(args.workers, partner=args.partner_rounds > 0)
    results = []
    for n in args.sizes:
        # the corpus is made here, so the measured process tree holds only the stages' work
        with tempfile.TemporaryDirectory(prefix="bench_dedup_corpus_") as corpus:
            t0 = time.perf_counter()
            docs = make_corpus(n)
            words = sum(len(d["text"].split()) for d in docs) / len(docs)
            shards = write_shards(docs, Path(corpus), shards=max(8, n // 10_000))
            del docs
            (Path(corpus) / "corpus.json").write_text(json.dumps(
                {"docs": n, "mean_words": words, "generate_s": time.perf_counter() - t0, "shards": shards}))
            out = str(Path(corpus) / "result.json")
            subprocess.run([sys.executable, __file__, "--one", corpus, "--out", out, "--workers", str(args.workers),
                            "--partitions", str(args.partitions), "--partner-rounds", str(args.partner_rounds)],
                           check=True)
            r = json.loads(Path(out).read_text())
        print_size(r)
        results.append(r)
    if len(results) >= 2:
        a, b = results[0], results[-1]
        print(f"\n== growth {a['docs']:,} -> {b['docs']:,} documents ({b['docs'] / a['docs']:.1f}x): "
              f"largest-process peak RSS {a['largest_process_rss_mb']:.0f} -> {b['largest_process_rss_mb']:.0f} MB "
              f"({b['largest_process_rss_mb'] / a['largest_process_rss_mb']:.2f}x), largest task edge set "
              f"{a['near']['components']['largest_task_edges']:,} -> {b['near']['components']['largest_task_edges']:,}, "
              f"minhash_dedup docs/s {a['near']['documents'] / a['near_s']:,.0f} -> "
              f"{b['near']['documents'] / b['near_s']:,.0f}")


if __name__ == "__main__":
    main()
