"""Export throughput: MB of tokens written per second on 2 Ray workers, per format, next to
plainly reading the same shards (the same tasks decoding ``input_ids`` into numpy, writing
nothing), printed as figures and a ratio. An I/O-bound export runs near the read.

The shards: a run directory made here through ``RunDir`` holding a committed tokenize stage
(``--shards`` shards of documents with lognormal lengths, median ~400 tokens, ids drawn from a
Zipf law over the vocabulary of a BPE trained on the test fixtures, three sources), so the figures
measure the export and not tokenization. A first read pass warms the page cache and the workers;
every figure after it is warm.

    python tests/benchmarks/bench_export.py [--work runs/bench-export] [--tokens 30e6] [--shards 16]
        [--workers 2] [--formats megatron,nanotron,olmo,mds]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))

from curation.formats.packed import TOKENIZER_METADATA  # noqa: E402
from curation.pipeline.dag import parse_dag  # noqa: E402
from curation.pipeline.export import export_stage  # noqa: E402
from curation.pipeline.rundir import RunDir  # noqa: E402
from curation.pipeline.tasks import run_bounded  # noqa: E402
from curation.stages.base import Resources  # noqa: E402
from curation.stages.export import BATCH_ROWS, DOC_COLUMNS, docs_of  # noqa: E402
from curation.stages.tokenize import int32_lists  # noqa: E402
from curation.tokenizer.model import Tokenizer, train_tokenizer  # noqa: E402

TOKEN_FILES = {"megatron": ".bin", "nanotron": ".ds", "olmo": ".npy", "mds": ".mds"}
SOURCES = ["web", "code", "math"]


def make_run(work: Path, tokens: float, shards: int) -> tuple[Path, int]:
    """A run whose ``tokenize`` stage holds ~``tokens`` tokens in ``shards`` committed shards."""
    run = work / "run"
    tok_dir = work / "tok"
    if not (tok_dir / "card.json").exists():
        from test_tokenize import fixture_corpus

        train_tokenizer(fixture_corpus(work / "corpus" / "texts.parquet"), tok_dir, vocab_size=4096, progress=False)
    tok = Tokenizer.load(tok_dir)
    inp = work / "input" / "docs.parquet"
    inp.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"id": ["x"], "text": ["x"]}), inp)
    dag = parse_dag({"name": "bench-export", "inputs": {"docs": {"format": "parquet", "paths": [str(inp)], "source": "web"}},
                     "stages": {"tokenize": {"type": "tokenize", "input": "docs", "tokenizer": str(tok_dir)}}},
                    "bench-export", base_dir=str(work))
    rd = RunDir(run)
    if run.exists():
        shutil.rmtree(run)
    rd.prepare(dag, overwrite=True)
    ph = dag.hashes()["tokenize"]
    rng = np.random.default_rng(0)
    ranks = np.arange(1, tok.vocab_size + 1, dtype=np.float64)
    p = 1 / ranks ** 1.1
    p /= p.sum()
    meta = {TOKENIZER_METADATA: json.dumps(tok.describe(), sort_keys=True).encode()}
    per_shard, total = tokens / shards, 0
    for s in range(shards):
        lens = []
        while sum(lens) < per_shard:
            lens.append(int(np.clip(rng.lognormal(6.0, 1.0), 8, 32_000)))
        ids = rng.choice(tok.vocab_size, size=sum(lens), p=p).astype(np.int32)
        ids[np.cumsum(lens) - 1] = tok.eos_id
        docs = np.split(ids, np.cumsum(lens)[:-1])
        t = pa.table({"id": [f"s{s}-d{i}" for i in range(len(lens))],
                      "source": [SOURCES[s % len(SOURCES)]] * len(lens),
                      "input_ids": int32_lists(docs), "num_tokens": pa.array(lens, pa.int32())})
        rd.commit([rd.write_stage_shard("tokenize", f"docs-{s:05d}", t.replace_schema_metadata(meta), None,
                                        len(lens), ph)])
        total += sum(lens)
    return run, total


def read_task(path: str) -> int:
    """What an export task reads, without the writing: every batch's tokens as numpy."""
    n = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH_ROWS, columns=DOC_COLUMNS):
        docs = docs_of(batch)
        if len(docs.tokens):
            docs.tokens.max()  # touch every token once, as the export's range check does
        n += len(docs.tokens)
    return n


def read_all(run: Path, workers: int) -> tuple[int, float]:
    rd = RunDir(run)
    dag = rd.load_dag()
    paths = [p for _, p in rd.shard_files(dag, "tokenize", dag.hashes())]
    got: list[int] = []
    t0 = time.perf_counter()
    run_bounded(read_task, [(p,) for p in paths], workers, Resources(cpus=1), lambda i, n: got.append(n),
                lambda i, msg: sys.exit(f"read failed: {msg}"))
    return sum(got), time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(REPO / "runs" / "bench-export"))
    ap.add_argument("--tokens", type=float, default=30e6)
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--formats", default="megatron,nanotron,olmo,mds")
    a = ap.parse_args()
    import ray

    work = Path(a.work)
    t0 = time.perf_counter()
    run, total = make_run(work, a.tokens, a.shards)
    disk = sum(f.stat().st_size for f in (run / "tokenize").glob("*.parquet"))
    print(f"shards: {a.shards} x tokenize, {total / 1e6:.1f} M tokens, {disk / 1e6:.0f} MB of Parquet "
          f"(built in {time.perf_counter() - t0:.0f} s)", flush=True)
    ray.init(address="local", num_cpus=a.workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    read_all(run, a.workers)  # warm: page cache, workers, imports
    n, secs = read_all(run, a.workers)
    assert n == total
    read_tps = n / secs
    print(f"\n{'':10} {'tokens':>8} {'MB tok':>8} {'seconds':>8} {'MB/s':>8} {'Mtok/s':>8} {'vs read':>8}")
    print(f"{'read':10} {n / 1e6:7.1f}M {n * 4 / 1e6:8.0f} {secs:8.2f} {n * 4 / 1e6 / secs:8.0f} "
          f"{read_tps / 1e6:8.1f} {'1.00':>8}   (int32 tokens decoded)")
    for fmt in a.formats.split(","):
        out = work / f"out-{fmt}"
        shutil.rmtree(out, ignore_errors=True)
        t1 = time.perf_counter()
        m = export_stage(run / "tokenize", fmt, out, workers=a.workers)
        secs = time.perf_counter() - t1
        tok_bytes = sum(f["bytes"] for f in m["files"] if f["path"].endswith(TOKEN_FILES[fmt]))
        all_bytes = sum(f["bytes"] for f in m["files"])
        print(f"{fmt:10} {m['tokens'] / 1e6:7.1f}M {tok_bytes / 1e6:8.0f} {secs:8.2f} {tok_bytes / 1e6 / secs:8.0f} "
              f"{m['tokens'] / secs / 1e6:8.1f} {m['tokens'] / secs / read_tps:8.2f}   "
              f"({m['token_dtype']}; {all_bytes / 1e6:.0f} MB with index files)", flush=True)
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
