"""Pipeline benchmarks: print figures, assert nothing.

Section (a), heuristic filters: our four vectorised filter stages against datatrove's
``GopherRepetitionFilter -> GopherQualityFilter -> C4QualityFilter`` on the same real
documents, both on 2 worker processes, reading JSONL and writing Parquet. Prints docs/s,
the speed ratio, the keep/drop agreement and a per-rule table of disagreements.

Run: ``.venv/bin/python tests/benchmarks/bench_pipeline.py [--copies N] [--only ours|datatrove]``
Each of our workers pays ~0.6 s once (numba's runtime, lookup tables); at ``--copies 6`` that is
a quarter of our time, at ``--copies 30`` (46k documents, ~5 min for datatrove) it is noise.
The datatrove side needs ``datatrove[processing]`` (the ``bench`` extra) plus ``spacy`` (its
English word splitter, ``spacy.blank("en")``: no model download) and ``orjson`` (its JSONL
reader). Sections are functions named ``bench_*``; ``main`` runs them in order.

Section (b), toolbox stages: ``normalize``, ``pii``, ``url_filter`` and ``badwords``, each alone
on the same documents in this process, batch by batch as the executor calls them; prints
docs/s per core (CPU time) beside the four heuristic filters chained the same way. The
documents get real URLs (article-extraction benchmark and trafilatura evaluation pages) with a
distinct subdomain each, so every row is a new host (the URL filter's worst case); the
blocklist holds the registered domains of half of those pages. ``--only toolbox`` runs this
section alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from real_corpus import SHARED_DATA, botchan_chapters, jsonl_gz, ud_ewt_documents, wikitext_articles  # noqa: E402


# ---------------------------------------------------------------------------------------------
# Real documents
# ---------------------------------------------------------------------------------------------


def load_real_documents() -> list[dict]:
    """About 1,700 distinct real English documents from shared/data, as ``{id, text, source}``.

    Web pages (DCLM, Dolma CC), news articles (article-extraction gold bodies), Wikipedia
    (WikiText-2), web treebank documents (UD EWT: reviews, emails, blogs) and a novel.
    """
    docs: list[dict] = []
    seen: set[str] = set()

    def add(source: str, text: str) -> None:
        if text in seen:
            return
        seen.add(text)
        docs.append({"id": f"{source}-{len(docs)}", "text": text, "source": source})

    for name in ("dclm_majority_data.jsonl.gz", "dclm_agreement_data.jsonl.gz"):
        for rec in jsonl_gz(SHARED_DATA / "jsonl" / name):
            add("dclm", rec["text"])
    for name in ("dolma_cc_en_head-0091.jsonl.gz", "dolma_cc_en_head-0174.jsonl.gz"):
        for rec in jsonl_gz(SHARED_DATA / "jsonl" / name):
            add("dolma_cc", rec["text"])
    with gzip.open(SHARED_DATA / "html" / "article_extraction_benchmark_ground-truth.json.gz", "rt") as f:
        for rec in json.load(f).values():
            add("news", rec["articleBody"])
    for name in ("wikitext-2_valid.txt.xz", "wikitext-2_test.txt.xz"):
        for text in wikitext_articles(SHARED_DATA / "text" / name):
            add("wikitext", text)
    for name in ("ud_english_ewt-dev.conllu.xz", "ud_english_ewt-test.conllu.xz"):
        for text in ud_ewt_documents(SHARED_DATA / "text" / name):
            add("ud_ewt", text)
    for text in botchan_chapters(SHARED_DATA / "text" / "sentencepiece_botchan.txt.xz"):
        add("botchan", text)
    return docs


# ---------------------------------------------------------------------------------------------
# Section (a): heuristic filters, ours vs datatrove
# ---------------------------------------------------------------------------------------------

#: datatrove's drop reasons -> our rule names (per filter), for the disagreement table.
DATATROVE_RULES = {
    "dup_para_frac": "gopher_repetition:dup_para_frac",
    "dup_para_char_frac": "gopher_repetition:dup_para_char_frac",
    "dup_line_frac": "gopher_repetition:dup_line_frac",
    "dup_line_char_frac": "gopher_repetition:dup_line_char_frac",
    **{f"top_{n}_gram": f"gopher_repetition:top_{n}_gram" for n in (2, 3, 4)},
    **{f"duplicated_{n}_n_grams": f"gopher_repetition:dup_{n}_gram" for n in range(5, 11)},
    "gopher_short_doc": "gopher_quality:too_few_words",
    "gopher_long_doc": "gopher_quality:too_many_words",
    "gopher_below_avg_threshold": "gopher_quality:mean_word_length",
    "gopher_above_avg_threshold": "gopher_quality:mean_word_length",
    "gopher_too_many_hashes": "gopher_quality:symbol_word_ratio",
    "gopher_too_many_ellipsis": "gopher_quality:ellipsis_word_ratio",
    "gopher_too_many_bullets": "gopher_quality:bullet_lines_frac",
    "gopher_too_many_end_ellipsis": "gopher_quality:ellipsis_lines_frac",
    "gopher_below_alpha_threshold": "gopher_quality:alpha_words_frac",
    "gopher_enough_stop_words": "gopher_quality:stop_words",
    "too_few_sentences": "c4_quality:too_few_sentences",
    "curly_bracket": "c4_quality:curly_bracket",
    "lorem_ipsum": "c4_quality:lorem_ipsum",
}
OUR_STAGES = ("gopher_repetition", "gopher_quality", "c4_quality", "fineweb_quality")
BATCH_SIZE = 2000  # the executor's default batch size


def write_shards(docs: list[dict], folder: Path, n_shards: int) -> list[Path]:
    """Documents as ``n_shards`` JSONL files (the input both pipelines read)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for i in range(n_shards):
        path = folder / f"shard-{i:03d}.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for d in docs[i::n_shards]:
                f.write(json.dumps({"id": d["id"], "text": d["text"], "source": d["source"]}) + "\n")
        paths.append(path)
    return paths


def _our_shard(task: tuple[str, str]) -> list[tuple[str, str | None]]:
    """One worker task: JSONL shard -> our four filters -> kept and rejected Parquet.

    Stages run as the executor runs them: over batches, each stage on what the previous
    one kept. Returns (id, reason) for every document, reason None when kept.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.json as pj
    import pyarrow.parquet as pq

    from curation.stages.c4_quality import C4QualityFilter
    from curation.stages.fineweb_quality import FineWebQualityFilter
    from curation.stages.gopher_quality import GopherQualityFilter
    from curation.stages.gopher_repetition import GopherRepetitionFilter

    src, out_dir = task
    table = pj.read_json(src)
    n = table.num_rows
    table = table.append_column("url", pa.array([""] * n)).append_column("meta", pa.array(["{}"] * n))
    outcome: list[tuple[str, str | None]] = []
    rejected = []
    stages = (GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(), FineWebQualityFilter())
    kept_all = []
    for i in range(0, max(n, 1), BATCH_SIZE):
        # one batch through the chain, each stage handed the previous one's text state (words
        # split once), as the executor's fused task does
        batch, text = table.slice(i, BATCH_SIZE), None
        for stage in stages:
            res = stage.process(batch, text)
            drop = pc.is_valid(res.reasons)
            keep = pc.invert(drop)
            rej = res.table.filter(drop)
            rej = rej.append_column("reason", res.reasons.filter(drop))
            rejected.append(rej.select(["id", "text", "reason"]))
            outcome += zip(rej.column("id").to_pylist(), rej.column("reason").to_pylist())
            batch = res.table.filter(keep)
            text = res.text.take(np.flatnonzero(keep.to_numpy(zero_copy_only=False))) if res.text is not None else None
        kept_all.append(batch)
    table = pa.concat_tables(kept_all, promote_options="default")
    outcome += [(i, None) for i in table.column("id").to_pylist()]
    name = Path(src).stem
    pq.write_table(table, Path(out_dir) / f"{name}.parquet")
    pq.write_table(pa.concat_tables(rejected), Path(out_dir) / f"{name}.rejected.parquet")
    return outcome


def _children_cpu() -> float:
    """CPU seconds used by finished child processes so far (the machine is shared, so wall
    time alone says little)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_ours(shards: list[Path], out_dir: Path, workers: int) -> tuple[float, float, dict[str, str | None]]:
    """Our filters on ``workers`` processes (one task per shard). Returns wall seconds, CPU
    seconds of the workers, decisions."""
    import multiprocessing as mp

    import curation.stages  # noqa: F401  (imported once; forked workers inherit it)

    out_dir.mkdir(parents=True, exist_ok=True)
    cpu0, t0 = _children_cpu(), time.perf_counter()
    pool = mp.get_context("fork").Pool(workers)  # like datatrove's workers below
    results = pool.map(_our_shard, [(str(p), str(out_dir)) for p in shards], chunksize=1)
    pool.close()
    pool.join()
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    return seconds, cpu, {doc_id: reason for part in results for doc_id, reason in part}


def run_datatrove(shard_dir: Path, out_dir: Path, workers: int) -> tuple[float, float, dict[str, str | None]]:
    """datatrove's GopherRepetition -> GopherQuality -> C4Quality on ``workers`` processes
    (``LocalPipelineExecutor(tasks=workers, workers=workers)``), writing kept documents as
    Parquet and dropped ones (with datatrove's reason) as JSONL. Returns wall seconds, CPU
    seconds of the workers, decisions."""
    for module, package in (("datatrove", "datatrove[processing]"), ("spacy", "spacy"), ("orjson", "orjson")):
        try:
            __import__(module)
        except ImportError:
            raise SystemExit(f"the datatrove side needs {package}: .venv/bin/pip install '{package}'") from None
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.filters import C4QualityFilter, GopherQualityFilter, GopherRepetitionFilter
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter, ParquetWriter

    def excluded(name: str) -> JsonlWriter:
        return JsonlWriter(str(out_dir / "excluded" / name), compression=None)

    executor = LocalPipelineExecutor(
        pipeline=[
            JsonlReader(str(shard_dir), compression=None),
            GopherRepetitionFilter(exclusion_writer=excluded("repetition")),
            GopherQualityFilter(exclusion_writer=excluded("quality")),
            C4QualityFilter(exclusion_writer=excluded("c4")),
            ParquetWriter(str(out_dir / "kept")),
        ],
        tasks=workers,
        workers=workers,
        logging_dir=str(out_dir / "logs"),
        start_method="fork",  # workers are our children, so their CPU time is counted
    )
    cpu0, t0 = _children_cpu(), time.perf_counter()
    executor.run()
    seconds, cpu = time.perf_counter() - t0, _children_cpu() - cpu0
    decisions: dict[str, str | None] = {}
    for path in (out_dir / "excluded").rglob("*.jsonl"):
        for line in path.open(encoding="utf-8"):
            rec = json.loads(line)
            decisions[rec["id"]] = rec["metadata"]["filter_reason"]
    import pyarrow.parquet as pq

    for path in (out_dir / "kept").rglob("*.parquet"):
        for doc_id in pq.read_table(path, columns=["id"]).column("id").to_pylist():
            decisions[doc_id] = None
    return seconds, cpu, decisions


def agreement(ours: dict[str, str | None], theirs: dict[str, str | None]) -> tuple[float, Counter]:
    """Keep/drop agreement over the documents both decided on, and the disagreements as
    (datatrove's verdict, ours) -> count. Our FineWeb drops count as kept here: datatrove's
    pipeline has no FineWeb step."""
    common = sorted(set(ours) & set(theirs))

    def ours_3(r):
        return None if r is None or r.startswith("fineweb_quality:") else r

    same = sum((ours_3(ours[i]) is None) == (theirs[i] is None) for i in common)
    table: Counter = Counter()
    for i in common:
        o, t = ours_3(ours[i]), theirs[i]
        if (o is None) != (t is None):
            table[(DATATROVE_RULES.get(t, t) if t else "kept", o or "kept")] += 1
    return same / max(len(common), 1), table


def bench_filters(copies: int, workers: int, only: str | None) -> None:
    """Section (a): read JSONL -> filters -> write Parquet, ours vs datatrove."""
    docs = load_real_documents()
    sources = Counter(d["source"] for d in docs)
    docs = [dict(d, id=f"{d['id']}-c{c}") for c in range(copies) for d in docs]
    total_mb = sum(len(d["text"].encode()) for d in docs) / 1e6
    print(f"(a) heuristic filters: {len(docs)} documents ({copies} x {sum(sources.values())} distinct real "
          f"docs: {dict(sources)}), {total_mb:.1f} MB of text, {workers} worker processes")
    with tempfile.TemporaryDirectory(prefix="bench-filters-") as tmp:
        tmp = Path(tmp)
        shards = write_shards(docs, tmp / "input", n_shards=4 * workers)
        ours = theirs = None
        if only in (None, "ours"):
            sec, cpu, ours = run_ours(shards, tmp / "ours", workers)
            print(f"  ours (gopher_repetition -> gopher_quality -> c4_quality -> fineweb_quality): "
                  f"{sec:.1f} s wall = {len(docs) / sec:,.0f} docs/s; {cpu:.1f} CPU s = "
                  f"{len(docs) / cpu:,.0f} docs/s per busy core")
            kept = sum(r is None for r in ours.values())
            print(f"    kept {kept}, dropped {len(ours) - kept}: "
                  f"{dict(Counter(r.split(':')[0] for r in ours.values() if r).most_common())}")
        if only in (None, "datatrove"):
            dsec, dcpu, theirs = run_datatrove(tmp / "input", tmp / "datatrove", workers)
            print(f"  datatrove (GopherRepetition -> GopherQuality -> C4Quality): {dsec:.1f} s wall = "
                  f"{len(docs) / dsec:,.0f} docs/s; {dcpu:.1f} CPU s = {len(docs) / dcpu:,.0f} docs/s "
                  f"per busy core")
        if ours is not None and theirs is not None:
            print(f"  speed ratio (ours with 4 filters / datatrove with 3): {dsec / sec:.1f}x wall, "
                  f"{dcpu / cpu:.1f}x CPU")
            agree, table = agreement(ours, theirs)
            print(f"  keep/drop agreement on the 3 shared filters: {100 * agree:.2f}% "
                  f"of {len(set(ours) & set(theirs))} documents")
            print("  disagreements (datatrove verdict -> ours):" + ("" if table else " none"))
            for (t, o), count in table.most_common():
                print(f"    {count:6d}  {t:45s} -> {o}")


# ---------------------------------------------------------------------------------------------
# Section (b): toolbox stages, each alone, docs/s per core
# ---------------------------------------------------------------------------------------------


def real_urls() -> list[str]:
    """Real page URLs: the article-extraction benchmark's and trafilatura's evaluation pages."""
    with gzip.open(SHARED_DATA / "html" / "article_extraction_benchmark_ground-truth.json.gz", "rt") as f:
        urls = [rec["url"] for rec in json.load(f).values()]
    with gzip.open(SHARED_DATA / "html" / "trafilatura_evaldata.json.gz", "rt") as f:
        urls += list(json.load(f))
    return [u for u in urls if u.startswith(("http://", "https://"))]


def _cpu_docs_per_s(stage, batches, reset=None) -> tuple[float, int]:
    """Run ``stage`` over the batches as the executor does (``run_batch``); CPU seconds of this
    process -> docs/s per core, and the rows it would drop."""
    stage.setup()
    n = dropped = 0
    cpu = 0.0
    for batch in batches:
        if reset is not None:
            reset(stage)
        t0 = time.process_time()
        res = stage.run_batch(batch, None)
        cpu += time.process_time() - t0
        n += batch.num_rows
        dropped += 0 if res.reasons is None else len(res.reasons) - res.reasons.null_count
    return n / max(cpu, 1e-9), dropped


def bench_toolbox(copies: int) -> None:
    """Section (b): each toolbox stage alone on the real documents, docs/s per core."""
    import numpy as np
    import pyarrow as pa

    from curation.stages.c4_quality import C4QualityFilter
    from curation.stages.fineweb_quality import FineWebQualityFilter
    from curation.stages.gopher_quality import GopherQualityFilter
    from curation.stages.gopher_repetition import GopherRepetitionFilter
    from curation.stages.badwords import BadWordsFilter
    from curation.stages.normalize import Normalize
    from curation.stages.pii import PiiScrub
    from curation.stages.url_filter import UrlFilter
    from curation.text.urls import canonical_host, host_candidates

    docs = load_real_documents()
    docs = [dict(d, id=f"{d['id']}-c{c}") for c in range(copies) for d in docs]
    urls = real_urls()
    # a distinct host per document: a new subdomain of a real page's host
    doc_urls = []
    for i in range(len(docs)):
        u = urls[i % len(urls)]
        scheme, rest = u.split("://", 1)
        doc_urls.append(f"{scheme}://d{i}.{rest}")
    hosts = sorted({canonical_host(u.split("://", 1)[1].split("/", 1)[0].split(":", 1)[0]) for u in urls})
    blocked = sorted({host_candidates(h)[-1] for h in hosts[::2]})
    table = pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs],
                      "source": [d["source"] for d in docs], "url": doc_urls, "meta": ["{}"] * len(docs),
                      "lang": ["en"] * len(docs)})
    batches = [table.slice(i, BATCH_SIZE) for i in range(0, table.num_rows, BATCH_SIZE)]
    print(f"(b) toolbox stages, each alone in one process on the same {len(docs)} documents "
          f"(batches of {BATCH_SIZE}), docs/s per core (CPU time):")

    def clear_memo(stage) -> None:  # every batch meets its hosts for the first time
        stage._blocker._memo.clear()

    rows = [
        ("normalize", Normalize(), None, "ftfy repair, symbol lines, whitespace"),
        ("pii", PiiScrub(), None, "e-mails, IPv4/IPv6"),
        ("url_filter", UrlFilter(blocklists=[{"name": "bench", "entries": blocked}],
                                 url_regexes=[r"^https?://[^/]*\.xxx(?:[:/]|$)", r"/wp-login\.php"],
                                 url_subwords=["casino", "porn", "viagra"]), clear_memo,
         f"{len(blocked)} listed domains + 2 regexes + 3 sub-words, every host new"),
        ("badwords", BadWordsFilter(), None, "C4's English list"),
    ]
    for name, stage, reset, what in rows:
        rate, dropped = _cpu_docs_per_s(stage, batches, reset)
        print(f"    {name:12s} {rate:10,.0f} docs/s per core   drops {dropped:5d}   ({what})")
    # the heuristic filters of section (a), chained as there, in the same loop, for scale
    chain = (GopherRepetitionFilter(), GopherQualityFilter(), C4QualityFilter(), FineWebQualityFilter())
    cpu = 0.0
    for batch in batches:
        t0 = time.process_time()
        text = None
        for stage in chain:
            res = stage.process(batch, text)
            keep = np.asarray(res.reasons.is_null().to_numpy(zero_copy_only=False))
            batch = res.table.filter(pa.array(keep))
            text = res.text.take(np.flatnonzero(keep)) if res.text is not None else None
        cpu += time.process_time() - t0
    print(f"    {'4 filters':12s} {table.num_rows / cpu:10,.0f} docs/s per core   "
          f"(gopher_repetition -> gopher_quality -> c4_quality -> fineweb_quality, chained, no I/O)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--copies", type=int, default=3, help="replicate the real documents this many times")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", choices=["ours", "datatrove", "toolbox"], help="run one side (or section) only")
    args = parser.parse_args()
    if args.only != "toolbox":
        bench_filters(args.copies, args.workers, args.only)
    if args.only in (None, "ours", "toolbox"):
        bench_toolbox(args.copies)


if __name__ == "__main__":
    main()
