"""Packing real tokenized documents into rows of 2,049 tokens: best-fit decreasing vs concat,
and the tokenize stage's throughput on 2 Ray workers.

Documents: the real corpus of bench_tokenizer.py (web pages, DCLM/CCNet text, English Web
Treebank, GSM8K + MATH, HumanEval, Leipzig sentences in 75 languages, WikiText articles,
novels in 60-line parts), one DAG input per source, tokenized with the 32k BPE trained there
(trained here if missing). Prints both packers side by side, overall and per source.

A document longer than a row must be cut whatever the packer; best-fit cuts nothing else, so
its split count is the number of long documents, while concat also cuts about one short
document per row. The ratio therefore depends on how many documents are longer than a row;
"avoidable splits" (documents that would fit one row but were cut) is the packer's own cost.

    python tests/benchmarks/bench_pack.py [--work runs/bench] [--seq-len 2048] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from bench_tokenizer import REPO, build_corpus  # noqa: E402

sys.path.insert(0, str(REPO))
from curation.pipeline.dag import parse_dag  # noqa: E402
from curation.pipeline.executor import run_dag  # noqa: E402
from curation.sampling.packing import pack_window  # noqa: E402


def dag(corpus: Path, tokenizer: Path, stages: dict, sources: list[str]) -> dict:
    inputs = {s: {"format": "parquet", "paths": [str(corpus / f"{s}-*.parquet")], "source": s, "id_field": "id"}
              for s in sources}
    return {"name": "bench-pack", "inputs": inputs,
            "stages": {"docs": {"type": "union", "inputs": sources}, **stages}, "batch_size": 1000}


def avoidable_splits(run: Path, stage: str, seq_len: int) -> int:
    """Documents no longer than a row that were still cut across rows."""
    length: dict[str, int] = {}
    for p in sorted((run / stage).glob("*.parquet")):
        t = pq.read_table(p, columns=["doc_ids", "doc_lens"])
        for names, lens in zip(t.column("doc_ids").to_pylist(), t.column("doc_lens").to_pylist()):
            for name, n in zip(names, lens):
                doc, piece = name.rsplit("@", 1)
                if not piece.endswith("/1"):
                    length[doc] = length.get(doc, 0) + n
    return sum(1 for n in length.values() if n <= seq_len + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(REPO / "runs" / "bench"))
    ap.add_argument("--seq-len", type=int, default=2048)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=32000)
    a = ap.parse_args()
    import ray

    work = Path(a.work)
    corpus = build_corpus(work)
    sources = sorted({f.name.rsplit("-", 1)[0] for f in corpus.glob("*.parquet")})
    tok = work / f"tok-bpe-{a.vocab}"
    if not (tok / "card.json").exists():
        from curation.tokenizer.model import train_tokenizer

        print(f"training a {a.vocab} BPE on {corpus} ...", flush=True)
        train_tokenizer(corpus, tok, kind="bpe", vocab_size=a.vocab, progress=False)
    ray.init(address="local", num_cpus=a.workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False)

    # 1. tokenize throughput: the same DAG with and without the tokenize stage (reading,
    #    parsing and writing the inputs cost the same in both)
    times = {}
    for name, stages in (("read", {}), ("tokenize", {"tokenize": {"type": "tokenize", "input": "docs",
                                                                    "tokenizer": str(tok), "keep_text": False}})):
        out = work / f"run-{name}"
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        run_dag(parse_dag(dag(corpus, tok, stages, sources), "bench"), out, workers=a.workers, quiet=True)
        times[name] = time.perf_counter() - t0
    run = work / "run-tokenize"
    n_tokens = sum(pq.read_table(p, columns=["num_tokens"])["num_tokens"].to_numpy().sum()
                   for p in (run / "tokenize").glob("*.parquet"))
    n_docs = sum(pq.read_metadata(p).num_rows for p in (run / "tokenize").glob("*.parquet"))
    stage_s = times["tokenize"] - times["read"]
    print(f"tokenize stage, {a.workers} workers: {n_tokens:,} tokens from {n_docs:,} docs; run {times['tokenize']:.1f} s "
          f"(read+write only: {times['read']:.1f} s) -> {n_tokens / stage_s / 1e6:.2f}M tokens/s for the stage, "
          f"{n_tokens / times['tokenize'] / 1e6:.2f}M tokens/s end to end", flush=True)

    # 2. both packers over the same tokenized documents
    packs = {alg: {"type": "pack", "input": "tokenize", "seq_len": a.seq_len, "algorithm": alg}
             for alg in ("best_fit", "concat")}
    stages = {"tokenize": {"type": "tokenize", "input": "docs", "tokenizer": str(tok), "keep_text": False},
              "pack_best_fit": packs["best_fit"], "pack_concat": packs["concat"]}
    t0 = time.perf_counter()
    run_dag(parse_dag(dag(corpus, tok, stages, sources), "bench"), run, workers=a.workers, quiet=True, overwrite=True)
    pack_s = time.perf_counter() - t0
    rep = {alg: json.loads((run / f"pack_{alg}" / "_pack_report.json").read_text()) for alg in packs}
    for alg in packs:
        rep[alg]["avoidable_splits"] = avoidable_splits(run, f"pack_{alg}", a.seq_len)
    bf, cc = rep["best_fit"], rep["concat"]
    rows = [("rows", "rows", "{:,}"), ("non-padding tokens", "non_padding_fraction", "{:.4%}"),
            ("docs split across rows", "docs_split", "{:,}"), ("  of which fit one row (avoidable)", "avoidable_splits", "{:,}"),
            ("truncations (cuts)", "truncations", "{:,}"), ("docs longer than a row", "long_docs", "{:,}"),
            ("rows with padding", "rows_padded", "{:,}")]
    print(f"\npacking {bf['docs']:,} docs, {bf['tokens']:,} tokens, seq_len {a.seq_len} (+1), window 10,000 docs "
          f"(both packers: {pack_s:.1f} s on {a.workers} workers)")
    print(f"{'':38s}{'best_fit':>14s}{'concat':>14s}")
    for label, key, fmt in rows:
        print(f"{label:38s}{fmt.format(bf[key]):>14s}{fmt.format(cc[key]):>14s}")
    ratio = cc["docs_split"] / max(bf["docs_split"], 1)
    print(f"concat splits {ratio:.1f}x more documents than best_fit; no packer can split fewer than the "
          f"{bf['long_docs']:,} documents longer than a row, so {cc['docs_split'] / max(bf['long_docs'], 1):.1f}x is the "
          f"most possible on this corpus")

    # per source: the ratio depends on how many documents are longer than a row
    print(f"\n{'source':14s}{'docs':>8s}{'>row':>7s}{'split bf':>10s}{'split cc':>10s}{'ratio':>8s}{'non-pad bf':>12s}")
    for s in sources:
        files = sorted((run / "tokenize").glob(f"{s}-*.parquet"))
        t = pa.concat_tables(pq.read_table(f, columns=["id", "source", "input_ids"]) for f in files)
        _, b = pack_window(t, a.seq_len, "best_fit", 1)
        _, c = pack_window(t, a.seq_len, "concat", 1)
        r = f"{c['docs_split'] / b['docs_split']:.1f}" if b["docs_split"] else "inf"
        print(f"{s:14s}{b['docs']:>8,}{b['long_docs']:>7,}{b['docs_split']:>10,}{c['docs_split']:>10,}{r:>8s}"
              f"{b['tokens'] / (b['rows'] * (a.seq_len + 1)):>12.4%}")
    (work / "bench_pack.json").write_text(json.dumps({"tokenize": {"tokens": int(n_tokens), "docs": n_docs, **times},
                                                      "pack": rep}, indent=2) + "\n")
    ray.shutdown()
    failed = []
    if bf["non_padding_fraction"] < 0.995:
        failed.append(f"best_fit non-padding {bf['non_padding_fraction']:.4%} < 99.5%")
    if bf["avoidable_splits"]:
        failed.append(f"best_fit cut {bf['avoidable_splits']} documents that fit one row")
    if failed:
        sys.exit("FAILED: " + "; ".join(failed))


if __name__ == "__main__":
    main()
