"""Quality-classifier benchmarks: print figures, assert nothing.

Section ``auc``: build a crawl and a reference corpus from the team's shared real data, label
the crawl with each teacher, train a fastText classifier per teacher, and report ROC AUC on the
DCLM human judgements (``jsonl/dclm_majority_data.jsonl.gz``, 499 docs, and the annotators'
agreement subset, 281 docs) beside the length-only baseline and each classifier's AUC on a
held-out split of its own labels. The DCLM files are read for evaluation only: nothing is
trained or thresholded on them.

- crawl: full-page text (resiliparse ``main_content=False``: navigation, footers, cookie
  notices and all) of every English page of the html/ sets (article benchmark, readability,
  postlight, trafilatura, dclm enricher), ~560 pages. DCLM's pool was extracted the same way.
- reference: clean English article bodies written by people: the article benchmark's gold
  ``articleBody`` (161 English), readability's ``expected.html`` main content (80 English)
  and the 20 CCNet "head" (low perplexity) documents: 261 documents.
- teachers: ``reference`` (reference vs an equal random sample of the crawl), ``perplexity``
  (byte GRU trained on the reference; top/bottom 30% of the crawl), ``callable`` with
  ``curation.quality.teachers:prose_line_share`` (top/bottom 30% of the crawl).

Section ``throughput``: scoring docs/s of ~500-word documents (wikitext-2), one process, one
core, CPU time (``time.process_time``: on a shared machine wall time measures the neighbours):
our compiled (numba) ``FastTextScorer`` against fastText's own C++ ``predict``, and the whole quality
stage (Arrow batch in, column out).

Run: ``.venv/bin/python tests/benchmarks/bench_quality.py [--only auc|throughput] [--out DIR]``
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")

import argparse  # noqa: E402
import glob  # noqa: E402
import gzip  # noqa: E402
import json  # noqa: E402
import lzma  # noqa: E402
import sys  # noqa: E402
import tarfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

SHARED_DATA = Path(os.environ.get("REFINERY_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

HTML_SETS = ["article_extraction_benchmark_pages", "mozilla_readability_test_pages", "postlight_parser_fixtures",
             "trafilatura_eval_and_cache_pages", "dclm_enricher_test_pages"]


def _is_english(text: str) -> bool:
    import pyarrow as pa

    from curation.stages.langid import LanguageId

    res = LanguageId(type="langid", keep=["en"]).process(pa.table({"id": ["x"], "text": [text]}))
    return res.reasons is None


def _html_text(data: bytes, main: bool) -> str:
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.encoding import bytes_to_str, detect_encoding

    return extract_plain_text(bytes_to_str(data, detect_encoding(data)), main_content=main, alt_texts=False,
                              links=False, list_bullets=True)


def build_corpora(work: Path) -> dict[str, Path]:
    """crawl.jsonl (full-page text) and reference.jsonl (gold article bodies) under ``work``."""
    work.mkdir(parents=True, exist_ok=True)
    out = {"crawl": work / "crawl.jsonl", "reference": work / "reference.jsonl"}
    if all(p.exists() for p in out.values()):
        return out
    crawl, reference = [], []
    for name in HTML_SETS:
        with tarfile.open(SHARED_DATA / "html" / f"{name}.tar.xz") as tar:
            for m in sorted(tar.getmembers(), key=lambda m: m.name):
                if not m.isfile():
                    continue
                base = Path(m.name).name
                if name == "mozilla_readability_test_pages":
                    if base == "expected.html":
                        text = _html_text(tar.extractfile(m).read(), False)
                        if text.strip() and _is_english(text):
                            reference.append({"id": f"readability:{m.name}", "text": text})
                        continue
                    if base != "source.html":
                        continue
                elif not (base.endswith(".html") or name.startswith("trafilatura")):
                    continue
                try:
                    text = _html_text(tar.extractfile(m).read(), False)
                except Exception:  # a page resiliparse cannot read is simply not in the crawl
                    continue
                if text.strip() and _is_english(text):
                    crawl.append({"id": f"{name}:{m.name}", "text": text})
    gt = json.load(gzip.open(SHARED_DATA / "html" / "article_extraction_benchmark_ground-truth.json.gz"))
    for key, v in sorted(gt.items()):
        if v.get("articleBody") and _is_english(v["articleBody"]):
            reference.append({"id": f"aeb-gold:{key}", "text": v["articleBody"]})
    for f in sorted(glob.glob(str(SHARED_DATA / "jsonl" / "dolma_cc_en_head-*.jsonl.gz"))):
        for i, line in enumerate(gzip.open(f, "rt")):
            reference.append({"id": f"ccnet:{Path(f).name}:{i}", "text": json.loads(line)["text"]})
    for key, rows in (("crawl", crawl), ("reference", reference)):
        with open(out[key], "w") as fh:
            for r in rows:
                fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    return out


def section_auc(work: Path, steps: int) -> None:
    from curation.quality.classifier import quality_eval, roc_auc, train_quality_classifier
    from curation.quality.labels import quality_label

    corpora = build_corpora(work)
    n_crawl = sum(1 for _ in open(corpora["crawl"]))
    n_ref = sum(1 for _ in open(corpora["reference"]))
    print(f"crawl: {n_crawl} English full-page texts; reference: {n_ref} clean English article bodies")
    majority = SHARED_DATA / "jsonl" / "dclm_majority_data.jsonl.gz"
    agreement = SHARED_DATA / "jsonl" / "dclm_agreement_data.jsonl.gz"
    teachers = [
        ("reference", "reference", {}),
        ("perplexity", "perplexity", {"steps": steps}),
        ("callable:prose_line_share", "curation.quality.teachers:prose_line_share", {}),
    ]
    rows = []
    for label, kind, opts in teachers:
        t0 = time.perf_counter()
        lab = work / f"labels-{kind.split(':')[-1]}.txt"
        meta = quality_label(corpora["crawl"], corpora["reference"], kind, lab, fraction=0.3, seed=0,
                             teacher_options=opts, log=lambda m: print("  " + m, file=sys.stderr))
        model = work / f"quality-{kind.split(':')[-1]}.bin"
        card = train_quality_classifier(lab, model, seed=0)
        ev_m, ev_a = quality_eval(model, majority), quality_eval(model, agreement)
        rows.append((label, meta["labels"]["positives"], meta["labels"]["negatives"], card["heldout"].get("auc"),
                     ev_m["auc"], ev_a["auc"], time.perf_counter() - t0))
        print(f"  {label}: done in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    texts_m = [json.loads(x) for x in gzip.open(majority, "rt")]
    texts_a = [json.loads(x) for x in gzip.open(agreement, "rt")]
    len_m = roc_auc([d["label"] for d in texts_m], [len(d["text"]) for d in texts_m])
    len_a = roc_auc([d["label"] for d in texts_a], [len(d["text"]) for d in texts_a])
    print("\nROC AUC on DCLM human judgements (evaluation only)")
    print(f"{'teacher':28s}{'pos':>6s}{'neg':>6s}{'own held-out':>14s}{'majority':>10s}{'agreement':>11s}{'s':>6s}")
    for label, p, n, own, m, a, s in rows:
        print(f"{label:28s}{p:6d}{n:6d}{own:14.3f}{m:10.3f}{a:11.3f}{s:6.0f}")
    print(f"{'length only (chars)':28s}{'':6s}{'':6s}{'':14s}{len_m:10.3f}{len_a:11.3f}")
    print(f"models, labels and cards: {work}")


def section_throughput(work: Path, n_docs: int) -> None:
    import numpy as np
    import pyarrow as pa

    from curation.quality.classifier import FastTextScorer, load_fasttext, prepare_text
    from curation.stages.quality import QualityScore

    model_path = work / "quality-reference.bin"
    if not model_path.exists():
        print(f"throughput: train a model first (section auc), {model_path} is missing")
        return
    text = lzma.open(SHARED_DATA / "text" / "wikitext-2_valid.txt.xz", "rt").read()
    words = [w for w in text.split() if w != "@-@"]
    docs = []
    for i in range(0, len(words) - 500, 500):
        chunk = words[i:i + 500]
        # paragraphs of ~100 words, as web text has
        docs.append("\n".join(" ".join(chunk[j:j + 100]) for j in range(0, 500, 100)))
    docs = (docs * (n_docs // len(docs) + 1))[:n_docs]
    arr = pa.array(docs, pa.string())
    model = load_fasttext(model_path)
    t0 = time.perf_counter()
    scorer = FastTextScorer(model)
    scorer.score(arr.slice(0, 1))
    setup_s = time.perf_counter() - t0  # table build + numba compile (or load from its cache)
    prepared = [prepare_text(d) + "\n" for d in docs]
    stage = QualityScore(type="quality", model=str(model_path))
    stage.setup()
    table = pa.table({"id": [str(i) for i in range(len(docs))], "text": arr})
    best = {"compiled scorer (numba)": 0.0, "fastText C++ predict": 0.0, "quality stage (batches of 2000)": 0.0}
    for _ in range(3):
        t0 = time.process_time()
        ours = scorer.score(arr)
        best["compiled scorer (numba)"] = max(best["compiled scorer (numba)"], len(docs) / (time.process_time() - t0))
        t0 = time.process_time()
        labels, probs = model.f.multilinePredict(prepared, -1, 0.0, "strict")
        best["fastText C++ predict"] = max(best["fastText C++ predict"], len(docs) / (time.process_time() - t0))
        t0 = time.process_time()
        for lo in range(0, len(docs), 2000):
            stage.process(table.slice(lo, 2000))
        best["quality stage (batches of 2000)"] = max(best["quality stage (batches of 2000)"],
                                                      len(docs) / (time.process_time() - t0))
    ref = np.array([dict(zip(ls, ps)).get("__label__hq", 0.0) for ls, ps in zip(labels, probs)])
    print(f"\n{len(docs)} documents of 500 words ({sum(map(len, docs)) / len(docs):.0f} chars), best of 3, CPU time "
          f"of this process (the machine was shared with other engineers' jobs while measuring)")
    for k, v in best.items():
        print(f"  {k:36s}{v:10,.0f} docs/s per core")
    print(f"  scorer set-up once per process (hash table, numba compile or cache load): {setup_s:.2f} s")
    print(f"  max |ours - fastText| probability: {float(np.abs(ours - ref).max()):.2e}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", choices=["auc", "throughput"], default=None)
    ap.add_argument("--out", default="/tmp/refinery-bench-quality")
    ap.add_argument("--lm-steps", type=int, default=300, help="perplexity teacher: training steps of the byte LM")
    ap.add_argument("--docs", type=int, default=10000, help="throughput: documents scored")
    args = ap.parse_args()
    work = Path(args.out)
    if args.only in (None, "auc"):
        section_auc(work, args.lm_steps)
    if args.only in (None, "throughput"):
        section_throughput(work, args.docs)


if __name__ == "__main__":
    main()
