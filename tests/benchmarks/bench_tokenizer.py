"""Tokenizer training on ~50 MB of real text: byte-level BPE (tokenizers) vs Unigram
(sentencepiece), vocab 32,000. Prints training seconds, peak RSS and encoding speed.

The corpus is built from ../shared/data (see its README): Wikipedia (WikiText-2), web pages
(trafilatura / readability / article-extraction / postlight pages run through resiliparse,
DCLM and CCNet text, English Web Treebank), books (Botchan, 吾輩は猫である), math (GSM8K,
MATH), code (HumanEval) and 75 languages of Leipzig sentences: about 30 MB of distinct text,
replicated to 50 MB for training. Each kind trains in its own process so its peak RSS is its own.

    python tests/benchmarks/bench_tokenizer.py [--work runs/bench] [--mb 50] [--vocab 32000]
"""

from __future__ import annotations

import argparse
import gzip
import io
import json
import lzma
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[2]
SHARED = Path(os.environ.get("REFINERY_DATA", REPO.parent / "shared" / "data"))
sys.path.insert(0, str(REPO))


def _wikitext() -> list[str]:
    docs = []
    for name in ("wikitext-2_valid.txt.xz", "wikitext-2_test.txt.xz"):
        text = lzma.open(SHARED / "text" / name, "rt", encoding="utf-8").read()
        # articles start at top-level headings " = Title = " (sections are " = = ... = = ")
        parts = re.split(r"\n (?== [^=])", text)
        docs += [p.strip() for p in parts if len(p.strip()) > 200]
    return docs


def _ewt() -> list[str]:
    docs, cur, para = [], [], []
    for name in ("ud_english_ewt-dev.conllu.xz", "ud_english_ewt-test.conllu.xz"):
        for line in lzma.open(SHARED / "text" / name, "rt", encoding="utf-8"):
            if line.startswith("# newdoc") and cur:
                docs.append("\n".join(cur + [" ".join(para)] if para else cur).strip())
                cur, para = [], []
            elif line.startswith("# newpar") and para:
                cur.append(" ".join(para))
                para = []
            elif line.startswith("# text = "):
                para.append(line[9:].strip())
    if cur or para:
        docs.append("\n".join(cur + [" ".join(para)]).strip())
    return [d for d in docs if d]


def _book(name: str, lines_per_doc: int = 60) -> list[str]:
    lines = lzma.open(SHARED / "text" / name, "rt", encoding="utf-8").read().splitlines()
    return ["\n".join(lines[i:i + lines_per_doc]) for i in range(0, len(lines), lines_per_doc)]


def _lingua() -> tuple[list[str], list[str]]:
    docs, langs = [], []
    with tarfile.open(SHARED / "text" / "lingua_language_testdata_sentences.tar.xz") as tf:
        for m in sorted(tf.getmembers(), key=lambda m: m.name):
            if not m.name.endswith(".txt"):
                continue
            lang = Path(m.name).stem
            sents = tf.extractfile(m).read().decode("utf-8").splitlines()
            sep = "" if lang in ("zh", "ja", "th") else " "
            for i in range(0, len(sents), 10):
                docs.append(sep.join(sents[i:i + 10]))
                langs.append(lang)
    return docs, langs


def _html_pages() -> list[str]:
    from curation.extract.engines import _resiliparse, decode_html

    docs = []
    for name, keep in (("trafilatura_eval_and_cache_pages.tar.xz", lambda n: "/eval/" in n or "/cache/" in n),
                       ("mozilla_readability_test_pages.tar.xz", lambda n: n.endswith("/source.html")),
                       ("article_extraction_benchmark_pages.tar.xz", lambda n: n.endswith(".html")),
                       ("postlight_parser_fixtures.tar.xz", lambda n: n.endswith(".html")),
                       ("dclm_enricher_test_pages.tar.xz", lambda n: n.endswith(".html"))):
        with tarfile.open(SHARED / "html" / name) as tf:
            for m in sorted(tf.getmembers(), key=lambda m: m.name):
                if not m.isfile() or not keep(m.name):
                    continue
                text = _resiliparse(decode_html(tf.extractfile(m).read(), None)).strip()
                if len(text) > 200:
                    docs.append(text)
    return docs


def _jsonl(name: str, fn) -> list[str]:
    with gzip.open(SHARED / "jsonl" / name, "rt", encoding="utf-8") as f:
        return [fn(json.loads(line)) for line in f if line.strip()]


def build_corpus(work: Path) -> Path:
    """Distinct real documents as Parquet shards (id, text, source, lang) in ``work/corpus``."""
    out = work / "corpus"
    if (out / "_done").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    sources: dict[str, tuple[list[str], list[str] | None]] = {
        "wiki": (_wikitext(), None),
        "web": (_html_pages() + _jsonl("dclm_majority_data.jsonl.gz", lambda o: o["text"])
                + _jsonl("dclm_agreement_data.jsonl.gz", lambda o: o["text"])
                + _jsonl("dolma_cc_en_head-0091.jsonl.gz", lambda o: o["text"])
                + _jsonl("dolma_cc_en_head-0174.jsonl.gz", lambda o: o["text"]) + _ewt(), None),
        "books": (_book("sentencepiece_botchan.txt.xz") + _book("sentencepiece_wagahaiwa_nekodearu.txt.xz"), None),
        "math": (_jsonl("gsm8k_train.jsonl.gz", lambda o: o["question"] + "\n" + o["answer"])
                 + _jsonl("gsm8k_test.jsonl.gz", lambda o: o["question"] + "\n" + o["answer"])
                 + _jsonl("math_hendrycks_test_subset1000.jsonl.gz", lambda o: o["problem"] + "\n" + o["solution"]), None),
        "code": (_jsonl("humaneval.jsonl.gz", lambda o: o["prompt"] + o["canonical_solution"]), None),
        "multilingual": _lingua(),
    }
    for source, (docs, langs) in sources.items():
        n_shards = max(1, sum(len(d) for d in docs) // (2 << 20))  # ~2 MB shards
        for k in range(n_shards):
            idx = range(k, len(docs), n_shards)
            pq.write_table(pa.table({"id": [f"{source}/{i}" for i in idx], "text": [docs[i] for i in idx],
                                     "source": [source] * len(idx),
                                     "lang": [langs[i] if langs else "-" for i in idx]}),
                           out / f"{source}-{k:03d}.parquet")
    (out / "_done").write_text(f"{time.perf_counter() - t0:.1f}s\n")
    return out


def replicate(corpus: Path, work: Path, mb: float) -> Path:
    """``corpus`` repeated (whole shards, then part of one) up to ``mb`` MB of text."""
    out = work / f"corpus-{mb:g}mb"
    if (out / "_done").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    files = sorted(corpus.glob("*.parquet"))
    target, size, rep = mb * 1e6, 0, 0
    while size < target:
        for f in files:
            t = pq.read_table(f)
            texts = t.column("text").to_pylist()
            keep, nbytes = [], 0
            for s in texts:
                if size + nbytes >= target:
                    break
                keep.append(s)
                nbytes += len(s.encode())
            if keep:
                pq.write_table(t.slice(0, len(keep)), out / f"r{rep}-{f.name}")
            size += nbytes
            if size >= target:
                break
        rep += 1
    (out / "_done").write_text(f"{size}\n")
    return out


def _train_child(kind: str, corpus: str, out: str, vocab: int) -> None:
    from curation.tokenizer.model import train_tokenizer

    import resource

    tok = train_tokenizer(corpus, out, kind=kind, vocab_size=vocab, progress=False)
    ru = resource.getrusage(resource.RUSAGE_SELF)  # CPU seconds: comparable on a busy machine
    print(json.dumps(tok.card["training"] | {"vocab_size": tok.vocab_size, "cpu_seconds": ru.ru_utime + ru.ru_stime}))


def _encode_speed(tok_dir: Path, corpus: Path) -> tuple[float, int]:
    from curation.tokenizer.model import ParquetCorpus, Tokenizer

    tok = Tokenizer.load(tok_dir)
    texts = [t for b in ParquetCorpus.resolve(corpus).iter_batches(["text"]) for t in b.column(0).to_pylist()]
    t0, c0 = time.perf_counter(), time.process_time()
    n = sum(len(a) for i in range(0, len(texts), 1000) for a in tok.encode_batch(texts[i:i + 1000]))
    return n / (time.perf_counter() - t0), n / (time.process_time() - c0), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default=str(REPO / "runs" / "bench"))
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--kinds", default="bpe,unigram")
    ap.add_argument("--child", nargs=3, metavar=("KIND", "CORPUS", "OUT"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        _train_child(a.child[0], a.child[1], a.child[2], a.vocab)
        return
    work = Path(a.work)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall times stretch with it)")
    corpus = build_corpus(work)
    distinct = sum(len(t.encode()) for f in sorted(corpus.glob("*.parquet")) for t in pq.read_table(f, columns=["text"])["text"].to_pylist())
    big = replicate(corpus, work, a.mb)
    print(f"corpus: {distinct / 1e6:.1f} MB distinct text in {corpus}, replicated to {a.mb:g} MB in {big}", flush=True)
    results = {}
    for kind in a.kinds.split(","):
        out = work / f"tok-{kind}-{a.vocab}"
        r = subprocess.run([sys.executable, __file__, "--vocab", str(a.vocab), "--child", kind, str(big), str(out)],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit(f"{kind} training failed:\n{r.stderr[-3000:]}")
        card = json.loads(r.stdout.strip().splitlines()[-1])
        speed, cpu_speed, n = _encode_speed(out, corpus)
        results[kind] = card | {"encode_tokens_per_s": speed, "encode_tokens_per_cpu_s": cpu_speed,
                                "distinct_tokens": n, "dir": str(out)}
        print(f"{kind:8s} vocab {card['vocab_size']:,}: trained in {card['seconds']:.1f} s wall / "
              f"{card['cpu_seconds']:.1f} s CPU on {card['bytes'] / 1e6:.1f} MB ({card['docs']:,} docs), "
              f"peak RSS {card['peak_rss_mb']:,.0f} MB; encodes {speed / 1e6:.2f}M tokens/s wall, "
              f"{cpu_speed / 1e6:.2f}M tokens per CPU-second ({n:,} tokens, {distinct / n:.2f} bytes/token "
              "on the distinct corpus)", flush=True)
    (work / "bench_tokenizer.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
