"""Extraction benchmarks: print figures, assert nothing.

Section 1, quality: main-text precision / recall / F1 of resiliparse (our settings, plus
variations of its options) and trafilatura (our settings) on the 181 pages with gold
article bodies of scrapinghub/article-extraction-benchmark, with docs/s for each.
Metric (as asked in issue #2): bag of whitespace tokens, multiset intersection,
P = |pred & gold| / |pred|, R = |pred & gold| / |gold|; mean over pages and micro (summed).
The benchmark's own evaluate.py scores 4-gram shingles of ``\\w+`` tokens and takes
F1 = 2PR/(P+R) of the page-mean P and R; that figure is printed too (column "aeb F1").

Section 2, WARC -> text throughput, one process on one core: our FastWARC reader + the
Extract stage (resiliparse / trafilatura) against datatrove's ``WarcReader`` +
``Trafilatura`` extractor on the same records (the real WARCs of the shared data folder,
replicated N times into one file on tmpfs).

Run: ``.venv/bin/python tests/benchmarks/bench_extract.py [--replicas N] [--only quality|throughput]``
(datatrove, warcio, python-magic, faust-cchardet come with the ``bench`` extra).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import statistics
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

SHARED_DATA = Path(os.environ.get("REFINERY_DATA", Path(__file__).resolve().parents[3] / "shared" / "data"))
REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from curation.extract import engines  # noqa: E402
from curation.stages import extract as ex  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------------------------


def bow_counts(pred: str, gold: str) -> tuple[int, int, int]:
    """(|pred & gold|, |pred|, |gold|) over bags of whitespace tokens."""
    p, g = Counter(pred.split()), Counter(gold.split())
    return sum((p & g).values()), sum(p.values()), sum(g.values())


_W = re.compile(r"\w+", re.UNICODE)


def _shingles(text: str, n: int = 4) -> Counter:
    toks = _W.findall(text or "")
    return Counter(tuple(toks[i:i + n]) for i in range(max(1, len(toks) - n + 1)) if toks[i:i + n])


def aeb_pr(pred: str, gold: str) -> tuple[float | None, float | None]:
    """Per-page precision / recall exactly as the benchmark's evaluate.py computes them."""
    t, p = _shingles(gold), _shingles(pred)
    tp = sum((t & p).values())
    fp = sum((p - t).values())
    fn = sum((t - p).values())
    prec = 1.0 if fp == fn == 0 else (0.0 if tp == fp == 0 else tp / (tp + fp))
    rec = 1.0 if fp == fn == 0 else (0.0 if tp == fn == 0 else tp / (tp + fn))
    return (prec if tp + fp > 0 else None), (rec if tp + fn > 0 else None)


def score(outputs: dict[str, str], gold: dict[str, str]) -> dict[str, float]:
    ps, rs, fs, aps, ars = [], [], [], [], []
    TP = NP = NG = 0
    for k, g in gold.items():
        tp, npred, ngold = bow_counts(outputs[k], g)
        TP, NP, NG = TP + tp, NP + npred, NG + ngold
        p = tp / npred if npred else 0.0
        r = tp / ngold if ngold else 0.0
        ps.append(p)
        rs.append(r)
        fs.append(2 * p * r / (p + r) if p + r else 0.0)
        ap, ar = aeb_pr(outputs[k], g)
        if ap is not None:
            aps.append(ap)
        if ar is not None:
            ars.append(ar)
    mp, mr = TP / NP if NP else 0.0, TP / NG if NG else 0.0
    ap, ar = statistics.mean(aps), statistics.mean(ars)
    return {"P": statistics.mean(ps), "R": statistics.mean(rs), "F1": statistics.mean(fs),
            "microP": mp, "microR": mr, "microF1": 2 * mp * mr / (mp + mr) if mp + mr else 0.0,
            "aebF1": 2 * ap * ar / (ap + ar) if ap + ar else 0.0}


# ---------------------------------------------------------------------------------------------
# Section 1: quality
# ---------------------------------------------------------------------------------------------


def load_aeb() -> tuple[dict[str, bytes], dict[str, str]]:
    pages = {}
    with tarfile.open(SHARED_DATA / "html/article_extraction_benchmark_pages.tar.xz") as tf:
        for m in tf:
            if m.isfile() and m.name.endswith(".html"):
                pages[Path(m.name).name.split(".")[0]] = tf.extractfile(m).read()
    with gzip.open(SHARED_DATA / "html/article_extraction_benchmark_ground-truth.json.gz", "rt", encoding="utf-8") as f:
        gt = json.load(f)
    gold = {k: v.get("articleBody", "") for k, v in gt.items()}
    assert gold.keys() == pages.keys(), "pages and ground truth disagree"
    return pages, gold


def _resiliparse(**kw):
    from resiliparse.extract.html2text import extract_plain_text

    args = {"main_content": True, "alt_texts": False, **kw}
    return lambda h: extract_plain_text(h, **args)


def _trafilatura(**kw):
    import trafilatura

    args = {"include_comments": False, "include_tables": False, "favor_precision": False, "deduplicate": False, **kw}
    return lambda h: trafilatura.extract(h, **args) or ""


SKIP = ["figure", "figcaption", "aside", "nav", "footer", "form", "button"]

#: (name, what it is, function). The first two are exactly what extract.py runs.
VARIANTS = [
    ("resiliparse", "ours: main_content=True, alt_texts=False", engines.ENGINES["resiliparse"]),
    ("trafilatura", "ours: include_comments/tables=False, favor_precision=False, deduplicate=False",
     engines.ENGINES["trafilatura"]),
    ("r:alt_texts", "resiliparse main_content=True (alt_texts left on)", _resiliparse(alt_texts=True)),
    ("r:fmt=False", "ours + preserve_formatting=False", _resiliparse(preserve_formatting=False)),
    ("r:bullets=False", "ours + list_bullets=False", _resiliparse(list_bullets=False)),
    ("r:comments=False", "ours + comments=False", _resiliparse(comments=False)),
    ("r:post_meta=False", "ours + post_meta=False", _resiliparse(post_meta=False)),
    ("r:c+pm=False", "ours + comments=False, post_meta=False", _resiliparse(comments=False, post_meta=False)),
    ("r:c+pm+b=False", "ours + comments=False, post_meta=False, list_bullets=False",
     _resiliparse(comments=False, post_meta=False, list_bullets=False)),
    ("r:c+pm+b+skip", f"previous + skip_elements={SKIP}",
     _resiliparse(comments=False, post_meta=False, list_bullets=False, skip_elements=SKIP)),
    ("r:no_main", "resiliparse main_content=False (whole page text, baseline)", _resiliparse(main_content=False)),
    ("t:favor_precision", "trafilatura ours + favor_precision=True (datatrove's default)",
     _trafilatura(favor_precision=True)),
]


def _timed(fn, htmls: dict[str, str], min_seconds: float = 2.0) -> tuple[dict[str, str], float]:
    """Outputs and docs/s (best of repeated passes until ``min_seconds`` of work, after a warm-up)."""
    for h in list(htmls.values())[:5]:
        fn(h)
    best, spent, outputs = float("inf"), 0.0, {}
    while spent < min_seconds or not outputs:
        t0 = time.perf_counter()
        outputs = {k: fn(h) or "" for k, h in htmls.items()}
        dt = time.perf_counter() - t0
        best, spent = min(best, dt), spent + dt
    return outputs, len(htmls) / best


def section_quality() -> None:
    pages, gold = load_aeb()
    print(f"== 1. Extraction quality: article-extraction-benchmark, {len(pages)} pages with gold articleBody ==")
    t0 = time.perf_counter()
    htmls = {k: engines.decode_html(b, None) for k, b in pages.items()}
    print(f"decode_html (charset detection + decode): {len(pages) / (time.perf_counter() - t0):.0f} docs/s "
          f"(not included below; engines get the decoded str)")
    print("P/R/F1 = mean over pages of per-page bag-of-whitespace-token scores; micro = summed counts; "
          "aeb F1 = the benchmark's own metric (4-gram \\w+ shingles)")
    head = f"{'engine':<18} {'P':>6} {'R':>6} {'F1':>6} | {'microP':>6} {'microR':>6} {'microF1':>7} | {'aeb F1':>6} | {'docs/s':>7}"
    print(head)
    print("-" * len(head))
    res = {}
    for name, _desc, fn in VARIANTS:
        outputs, dps = _timed(fn, htmls)
        m = score(outputs, gold)
        res[name] = (m, dps)
        print(f"{name:<18} {m['P']:6.3f} {m['R']:6.3f} {m['F1']:6.3f} | {m['microP']:6.3f} {m['microR']:6.3f} "
              f"{m['microF1']:7.3f} | {m['aebF1']:6.3f} | {dps:7.1f}", flush=True)
    print()
    for name, desc, _ in VARIANTS:
        print(f"  {name:<18} {desc}")
    print()
    (rm, rdps), (tm, tdps) = res["resiliparse"], res["trafilatura"]
    gap = tm["F1"] - rm["F1"]
    print(f"resiliparse (ours) vs trafilatura (ours): F1 {rm['F1']:.3f} vs {tm['F1']:.3f} (gap {gap:+.3f}), "
          f"speed {rdps:.0f} vs {tdps:.0f} docs/s ({rdps / tdps:.1f}x)")
    if gap <= 0.02:
        print("=> resiliparse is within 0.02 F1 of trafilatura: it stays the default.")
    else:
        print("=> with the current settings resiliparse is MORE than 0.02 F1 below trafilatura: "
              "by the issue's rule trafilatura should be the default.")
    rvars = [n for n, _, _ in VARIANTS if n == "resiliparse" or n.startswith("r:")]
    best = max(rvars, key=lambda n: res[n][0]["F1"])
    bm, bdps = res[best]
    print(f"best resiliparse variant: {best} F1 {bm['F1']:.3f} (micro {bm['microF1']:.3f}, aeb {bm['aebF1']:.3f}) "
          f"at {bdps:.0f} docs/s; gap to trafilatura {tm['F1'] - bm['F1']:+.3f} -> "
          + ("within 0.02: keep resiliparse as default with these settings"
             if tm["F1"] - bm["F1"] <= 0.02 else "still more than 0.02 below trafilatura"))
    print()
    section_heldout(["resiliparse", "r:comments=False", "r:post_meta=False", "r:bullets=False", "r:c+pm=False", best,
                     "trafilatura"])


def section_heldout(names: list[str]) -> None:
    """The chosen resiliparse options were picked on 181 pages: check them on other pages.

    trafilatura's own evaluation set (990 pages, mostly German news/blogs/shops): per page a few
    snippets that must be in the main text (``with``) and boilerplate that must not (``without``);
    scored like trafilatura's tests/comparison script (TP = with-snippet found, FP = without-snippet
    found). Built by trafilatura's author, so it favours trafilatura: compare resiliparse settings
    with each other first.
    """
    with gzip.open(SHARED_DATA / "html/trafilatura_evaldata.json.gz", "rt", encoding="utf-8") as f:
        evaldata = json.load(f)
    wanted = {v["file"] for v in evaldata.values()}
    pages = {}
    with tarfile.open(SHARED_DATA / "html/trafilatura_eval_and_cache_pages.tar.xz") as tf:
        for m in tf:
            if m.isfile() and Path(m.name).name in wanted:
                pages[Path(m.name).name] = tf.extractfile(m).read()
    items = [v for v in evaldata.values() if v["file"] in pages]
    htmls = {v["file"]: engines.decode_html(pages[v["file"]], None) for v in items}
    norm = lambda s: " ".join(s.split())  # noqa: E731
    print(f"== 1b. Held-out check: trafilatura eval set, {len(items)} pages with must-have / must-not snippets ==")
    head = f"{'engine':<18} {'prec':>6} {'recall':>6} {'F1':>6} {'acc':>6} | {'docs/s':>7}"
    print(head)
    print("-" * len(head))
    by_name = {n: f for n, _, f in VARIANTS}
    for name in dict.fromkeys(names):
        outputs, dps = _timed(by_name[name], htmls, min_seconds=1.0)
        tp = fp = tn = fn = 0
        for v in items:
            out = norm(outputs[v["file"]])
            for s in v.get("with", []):
                tp, fn = (tp + 1, fn) if norm(s) in out else (tp, fn + 1)
            for s in v.get("without", []):
                fp, tn = (fp + 1, tn) if norm(s) in out else (fp, tn + 1)
        p, r = tp / (tp + fp), tp / (tp + fn)
        print(f"{name:<18} {p:6.3f} {r:6.3f} {2 * p * r / (p + r):6.3f} {(tp + tn) / (tp + tn + fp + fn):6.3f} | "
              f"{dps:7.1f}", flush=True)
    print()


# ---------------------------------------------------------------------------------------------
# Section 2: WARC -> text throughput
# ---------------------------------------------------------------------------------------------

#: Files our reader reads completely today. Left out: resiliparse_clipped (truncated on purpose:
#: concatenated it would end the stream) and resiliparse_clueweb-quirk (LF-only HTTP headers: our
#: reader rejects its 29 pages as non_html until quirks_mode is on, see the report).
WARC_FILES = ["dolma_sample-0000.warc.gz", "dolma_sample-0001.warc.gz", "resiliparse_warcfile.warc.gz",
              "whirlwind.warc.gz", "warcio_example.warc.gz"]


def build_replicated(dirpath: Path, replicas: int) -> Path:
    blob = b"".join((SHARED_DATA / "warc" / f).read_bytes() for f in WARC_FILES)
    out = dirpath / "replicated.warc.gz"  # gzip members concatenate into a valid multi-member file
    with open(out, "wb") as f:
        for _ in range(replicas):
            f.write(blob)
    return out


def run_ours(path: Path, engine: str, **params) -> dict:
    from curation.io.inputs import InputSpec, plan_input
    from curation.io.read import read_shard

    spec = InputSpec(format="warc", paths=[str(path)], source="web", split_bytes=1 << 40)
    stage = ex.Extract(engine=engine, **params)
    t0 = time.perf_counter()
    tables = []
    n_read = 0
    for shard in plan_input("bench", spec):
        docs, _rej = read_shard(shard, spec).tables()
        n_read += docs.num_rows
        tables.append(docs)
    t_read = time.perf_counter() - t0
    n_out, reasons = 0, Counter()
    for t in tables:
        for off in range(0, t.num_rows, 1000):  # executor-sized batches
            r = stage.process(t.slice(off, 1000))
            rs = r.reasons.to_pylist() if r.reasons is not None else [None] * r.table.num_rows
            n_out += sum(x is None for x in rs)
            reasons.update(x for x in rs if x)
    total = time.perf_counter() - t0
    return {"docs": n_read, "out": n_out, "read_s": t_read, "total_s": total, "extra": dict(reasons)}


def run_datatrove(path: Path, **trafilatura_kw) -> dict:
    import logging

    from datatrove.pipeline.extractors import Trafilatura
    from datatrove.pipeline.readers import WarcReader
    from datatrove.utils.logging import logger as dt_logger

    dt_logger.remove()  # its per-document warnings would dominate the output
    logging.getLogger("trafilatura").setLevel(logging.CRITICAL)
    folder = str(path.parent)
    # reader alone
    t0 = time.perf_counter()
    n_read = sum(1 for _ in WarcReader(folder, glob_pattern=path.name).run(None, 0, 1))
    t_read = time.perf_counter() - t0
    # reader + extractor (datatrove's defaults: favour_precision=True, deduplicate=True, timeout=1 s;
    # the extractor runs trafilatura in a helper process it keeps alive, as datatrove does)
    t0 = time.perf_counter()
    ext = Trafilatura(**trafilatura_kw)
    n_out = sum(1 for _ in ext.run(WarcReader(folder, glob_pattern=path.name).run(None, 0, 1), 0, 1))
    total = time.perf_counter() - t0
    stats = {k: v.total for k, v in ext.stats.stats.items() if k in ("timeout", "clean_error", "dropped", "broken_process")}
    return {"docs": n_read, "out": n_out, "read_s": t_read, "total_s": total, "extra": stats}


def section_throughput(replicas: int) -> None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        dt_version = version("datatrove")
        import warcio  # noqa: F401  (datatrove's WarcReader needs it, with magic and cchardet)
    except (PackageNotFoundError, ImportError):
        dt_version = None
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    with tempfile.TemporaryDirectory(dir=base) as d:
        path = build_replicated(Path(d), replicas)
        print(f"== 2. WARC -> text throughput, 1 process (1 core); {len(WARC_FILES)} real WARC files x {replicas} "
              f"replicas = {path.stat().st_size / 1e6:.1f} MB gz on {'tmpfs' if base else 'disk'} ==")
        print(f"fastwarc {version('fastwarc')}, resiliparse {version('resiliparse')}, trafilatura "
              f"{version('trafilatura')}, datatrove {dt_version}")
        rows = []
        for label, fn in [
            ("ours: FastWARC + resiliparse", lambda: run_ours(path, "resiliparse")),
            ("ours: FastWARC + trafilatura", lambda: run_ours(path, "trafilatura")),
            # like for like: our trafilatura settings do not deduplicate either. datatrove's default
            # deduplicate=True keeps an LRU cache of seen paragraphs, so on a replicated record set
            # every copy after the first comes out empty ("dropped"): a replication artefact.
            ("datatrove: WarcReader + Trafilatura", (lambda: run_datatrove(path, deduplicate=False))
             if dt_version else None),
            ("datatrove, defaults (deduplicate=True)", (lambda: run_datatrove(path)) if dt_version else None),
        ]:
            if fn is None:
                print(f"{label}: datatrove not installed (pip install 'datatrove[processing]' warcio python-magic faust-cchardet)")
                continue
            r = fn()
            rows.append((label, r))
            dps = r["docs"] / r["total_s"]
            frac = (r["total_s"] - r["read_s"]) / r["total_s"]
            print(f"{label:<40} {r['docs']:>5} docs in, {r['out']:>5} with text | read {r['read_s']:6.2f} s "
                  f"({r['docs'] / r['read_s']:7.0f} docs/s) | total {r['total_s']:7.2f} s = {dps:7.1f} docs/s | "
                  f"extraction {100 * frac:4.1f}% of time | {r['extra']}", flush=True)
        by = {label: r["docs"] / r["total_s"] for label, r in rows}
        for dt_label in ("datatrove: WarcReader + Trafilatura", "datatrove, defaults (deduplicate=True)"):
            dt = by.get(dt_label)
            for label in ("ours: FastWARC + resiliparse", "ours: FastWARC + trafilatura"):
                if dt:
                    ratio = by[label] / dt
                    print(f"  {label} / {dt_label} = {ratio:.1f}x  (target >= 10x: {'met' if ratio >= 10 else 'NOT met'})")
        print()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--replicas", type=int, default=40, help="copies of the WARC record set (55 HTML docs each)")
    ap.add_argument("--only", choices=["quality", "throughput"])
    args = ap.parse_args()
    print(f"load average at start: {' '.join(f'{x:.1f}' for x in os.getloadavg())} on {os.cpu_count()} CPUs "
          "(the machine is shared: docs/s are per process, ratios within a section are the robust figures)\n")
    if args.only in (None, "quality"):
        section_quality()
    if args.only in (None, "throughput"):
        section_throughput(args.replicas)
    print(f"load average at end: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
