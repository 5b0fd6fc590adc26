"""Scale benchmark: a Common-Crawl-sized WARC through the whole web DAG. Prints figures,
asserts nothing. Run by hand:

    BENCH_TMP=/big/tmp .venv/bin/python tests/benchmarks/bench_scale.py [--size-mb 1024]
        [--workers N] [--split-mb 128] [--only full|extract] [--rounds N] [--pages long] [--warm-mb 16]
        [--side-by-side [--only full --formats text,markdown]] [--index]

1. Builds (once; cached under ``$BENCH_TMP/refinery-bench-scale/``) a WARC laid out like a
   Common Crawl file: a warcinfo record, then for every page a request, a response and a
   metadata record, each its own gzip member. The pages are the real HTML pages of
   ``shared/data/html`` (trafilatura, readability, article-extraction benchmark, postlight,
   DCLM), each repeated under its own URL and WARC-Record-ID until the file reaches
   ``--size-mb``; one copy in three has its ``<p>`` paragraphs shuffled (near-duplicates for
   MinHash, not exact duplicates), the others are exact copies (exact dedup drops them).
2. Runs the DAG extract -> langid -> gopher_repetition -> gopher_quality -> c4_quality ->
   fineweb_quality -> exact_dedup -> minhash_dedup through the executor (``run_dag``, what
   ``refinery run`` calls), then extract alone on the same file, each in a fresh process.
3. Prints, per run: documents/s per core end to end; per map stage (CPU time of its
   ``run_batch`` calls in the workers, recorded by a Ray worker setup hook) and per global
   stage (its phases' wall time from ``_phases.json``); the reader's bytes read and
   decompressed against the input's size; peak RSS of every Ray worker (a thread samples
   ``/proc`` of the run's process tree) and of the driver; bytes and files written under the
   run directory.
4. With ``--rounds N``: full and extract-only N times each, the order alternating per round, and
   the median of the per-round ratios (one pair moved 71-87% between runs on the same code: the
   extractor's own speed differs between the two runs of a pair), plus the same ratio estimated
   from the workers' CPU clocks of each full run, and per pair how fast the extract-only run's
   read + extract went against the full run's (x0.86-x1.06 on the same pages: the wall ratio's
   noise, shown beside it).

   With ``--side-by-side`` (on 2 cores: ``--workers 1``): each round runs the two modes at the same
   time, each on its own half of the cores, swapped every second (``CoreSwap``), timed from a
   common start, and the one done first keeps its cores extracting until the other is done. This
   VM's cores each change speed by up to 1.7x from one second to the next (``bench_cores.py``); run
   one after the other, the two modes saw different luck (extraction's own speed x0.86-x1.19 between
   the runs of a pair), side by side they see the same (x0.96-x0.98).
   ``--only full --side-by-side --formats text,markdown``: the same, with the two runs being the full
   DAG in each extract format (issue #53's speed target: format: markdown's throughput against
   text's), and per round where the difference lies (each map stage's CPU, each global stage's wall).
   Each stage's line also gives its page faults a document (a zeroed page each, ~4 us of system time
   here), and the workers' line their system time and faults: what the allocators cost.

5. With ``--index`` (issue 63): the full DAG over the WARC, then the same DAG over the records a
   columnar index selects (``format: cc_index``), English and the language nearest 1% of the
   pages; the index is built once beside the WARC by ``refinery index cc``'s builder (Common
   Crawl's schema, the real member offsets and lengths, CLD2 on the HTML bytes) and its cost
   printed against the full scan's extraction. Per selection: bytes read and wall against the
   full scan's, bytes read per kept document, the reads (= GETs on object storage), the
   selected documents' extracted texts held equal to the full scan's for the same records, and
   the core-hours of a snapshot's English-only (``--english-share``, 45%) or 1% corpus: the
   full DAG's measured cost a document, its read replaced by the index read's, times the
   selection's documents, also scaled onto the project's cost line (``--reference-core-hours``).
   At ``--size-mb 64`` (2 workers, this 2-core machine; issue 63's note): English 45.8% of the
   pages, 0.617x the bytes and 0.63x the wall of the full scan (start-up and the global stages'
   fixed costs weigh at this size), 965 of 965 texts equal; Polish 1.1%, 0.019x the bytes and
   0.38x the wall, 23 of 23 equal; 0.451x and 0.0105x the full scan's cost, 2,026 and 47
   core-hours on the 4,488-core-hour cost line; the index built at 0.77x the extract stage's
   CPU a page (CLD2 on the HTML 1.05 ms of its 1.58 ms).

6. With ``--warm-mb 16``: each run first takes its DAG over a 16 MB WARC of the same pages in the
   same Ray workers, left out of every figure: a long run's steady state (per-process start-up such
   as imports and compiled kernels paid once). On the long pages it moved the wall ratio, not the
   CPU share (issue #32's notes).

gzip members are inflated with ISA-L (``isal``); ``REFINERY_INFLATE=zlib`` runs the same with
zlib, the reference (the header line says which): ``--only extract`` both ways shows the gain.

Run at 1 GB and 4 GB (figures in the closing notes of issue #15): worker memory flat in the input
size (~750 MB at both since kept rows are joined back to the batch budget between stages; 600 ->
688 MB before), bytes read 1.00x the input, bytes written 0.14x. The default is 1 GB. The
machine's speed moves by 20-30% between runs: compare the full and extract-only figures of one
run (same process tree, minutes apart), not figures across runs.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import gzip
import hashlib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = Path(os.environ.get("REFINERY_DATA", REPO.parent / "shared" / "data"))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

GEN_VERSION = 1
MiB = 1 << 20
MAP_STAGES = ["extract", "langid", "gopher_rep", "gopher", "c4", "fineweb"]
GLOBAL_STAGES = ["exact", "near"]


def bench_root() -> Path:
    d = Path(os.environ.get("BENCH_TMP") or tempfile.gettempdir()) / "refinery-bench-scale"
    d.mkdir(parents=True, exist_ok=True)
    return d


# ---------------------------------------------------------------------------------------------
# the WARC
# ---------------------------------------------------------------------------------------------


def load_pages() -> list[tuple[str, bytes]]:
    """(name, html bytes) of every real page in shared/data/html."""
    pages: list[tuple[str, bytes]] = []
    sets = {
        "trafilatura_eval_and_cache_pages.tar.xz": lambda n: "/eval/" in n or "/cache/" in n,
        "mozilla_readability_test_pages.tar.xz": lambda n: n.endswith("/source.html"),
        "article_extraction_benchmark_pages.tar.xz": lambda n: n.endswith(".html"),
        "postlight_parser_fixtures.tar.xz": lambda n: n.endswith(".html"),
        "dclm_enricher_test_pages.tar.xz": lambda n: not n.endswith((".json", ".txt", ".md")),
    }
    for tar_name, keep in sets.items():
        with tarfile.open(SHARED_DATA / "html" / tar_name) as tf:
            for m in tf:
                if m.isfile() and keep("/" + m.name):
                    data = tf.extractfile(m).read()
                    if b"<" in data[:4096]:
                        pages.append((m.name, data))
    pages.sort()
    return pages


def page_text(html: bytes) -> str | None:
    """A page's text as the extract stage makes it (decode + resiliparse, same options); None
    when the extractor refuses the page (extract rejects it)."""
    from curation.extract.engines import _resiliparse, decode_html

    try:
        return _resiliparse(decode_html(html, None)).strip()
    except Exception:
        return None


def _extracted_chars(html: bytes) -> int:
    """Characters of main text the extract stage gets from this page."""
    return len(page_text(html) or "")


_LANG = re.compile(rb"<html[^>]*?\slang\s*=\s*[\"']?([a-zA-Z]{2,3})", re.I)


def page_facts() -> dict[str, dict]:
    """Per page of ``load_pages()``: extracted characters and the ``<html lang>`` it declares
    (cached beside the WARCs: extracting 1,500 pages takes a while on a shared machine)."""
    path = bench_root() / f"page-facts-v{GEN_VERSION}.json"
    if path.exists():
        return json.loads(path.read_text())
    out = {}
    for name, html in load_pages():
        m = _LANG.search(html[:4096])
        out[name] = {"chars": _extracted_chars(html), "lang": m.group(1).decode().lower() if m else None}
    path.write_text(json.dumps(out))
    return out


def long_pages(pages: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    """The pages of a long-page corpus: those whose extracted text is longest, plus pages in
    languages other than English and German (declared ``<html lang>``; the default corpus
    is mostly those two), longest first while the mean extracted length stays at least 2x
    that of all pages (issue 32: filter cost grows with text length, extraction's does not)."""
    facts = page_facts()
    chars = {n: facts[n]["chars"] for n, _ in pages}
    overall = sum(chars.values()) / len(chars)
    ranked = sorted(chars, key=lambda n: -chars[n])
    for cut in range(len(ranked), 0, -1):  # the largest top set whose mean reaches 2.6x
        top = ranked[:cut]
        if sum(chars[n] for n in top) / cut >= 2.6 * overall:
            break
    keep = set(top)
    total = sum(chars[n] for n in keep)
    for n in ranked[len(top):]:
        if (facts[n]["lang"] or "en") not in ("en", "de") and chars[n] >= 500:
            if (total + chars[n]) / (len(keep) + 1) < 2.05 * overall:
                break
            keep.add(n)
            total += chars[n]
    return [(n, h) for n, h in pages if n in keep]


def mean_extracted_chars(facts: dict) -> float:
    """Mean extracted characters per response of a bench WARC (pages are written in order,
    cycling, so response i is page i mod P)."""
    pf = page_facts()
    pages = [n for n, _ in load_pages()]
    if facts.get("pages") == "long":
        keep = {n for n, _ in long_pages([(n, b"") for n in pages])}
        pages = [n for n in pages if n in keep]
    lens = [pf[n]["chars"] for n in pages]
    n, p = facts["responses"], len(lens)
    return (sum(lens) * (n // p) + sum(lens[: n % p])) / n


def _slug(name: str) -> str:
    s = re.sub(r"[^a-z0-9]+", "-", Path(name).stem.lower()).strip("-")
    return (s or "page")[:40]


_P = re.compile(rb"(?=<p[\s>])", re.I)


def shuffle_paragraphs(html: bytes, rng: random.Random) -> bytes:
    parts = _P.split(html)
    if len(parts) < 4:
        return html
    head, body, tail = parts[0], parts[1:-1], parts[-1]
    rng.shuffle(body)
    return head + b"".join(body) + tail


def _member(headers: list[tuple[str, str]], block: bytes) -> bytes:
    head = "WARC/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers)
    head += f"Content-Length: {len(block)}\r\n\r\n"
    return gzip.compress(head.encode() + block + b"\r\n\r\n", compresslevel=6, mtime=0)


def _digest(b: bytes) -> str:
    return "sha1:" + base64.b32encode(hashlib.sha1(b).digest()).decode()


def build_warc(path: Path, size_bytes: int, seed: int = 0, which: str = "default") -> dict:
    """Write a CC-like WARC of about ``size_bytes`` (compressed) to ``path``; return its facts."""
    pages = load_pages()
    if which == "long":
        pages = long_pages(pages)
    rng = random.Random(seed)
    urn = lambda: f"<urn:uuid:{uuid.UUID(int=rng.getrandbits(128), version=4)}>"  # noqa: E731
    t0 = datetime(2024, 5, 20, tzinfo=timezone.utc)
    info_id = urn()
    tmp = path.with_suffix(".tmp")
    n_resp = n_shuffled = n_records = 0
    raw_bytes = 0
    with open(tmp, "wb") as f:
        info = b"software: refinery bench_scale\r\nformat: WARC File Format 1.1\r\nisPartOf: BENCH-SCALE\r\n"
        f.write(_member([("WARC-Type", "warcinfo"), ("WARC-Date", t0.strftime("%Y-%m-%dT%H:%M:%SZ")),
                         ("WARC-Record-ID", info_id), ("Content-Type", "application/warc-fields")], info))
        copy = 0
        while f.tell() < size_bytes:
            for name, html in pages:
                if f.tell() >= size_bytes:
                    break
                url = f"https://www.{_slug(name)}.example.org/c{copy}/{_slug(name)}.html"
                shuffled = copy > 0 and rng.random() < 1 / 3
                body = shuffle_paragraphs(html, rng) if shuffled else html
                date = (t0 + timedelta(seconds=n_resp)).strftime("%Y-%m-%dT%H:%M:%SZ")
                req_id, resp_id = urn(), urn()
                host = url.split("/")[2]
                req = (f"GET /{url.split('/', 3)[3]} HTTP/1.1\r\n"
                       "User-Agent: CCBot/2.0 (https://commoncrawl.org/faq/)\r\n"
                       f"Accept: text/html,application/xhtml+xml;q=0.9,*/*;q=0.8\r\nHost: {host}\r\n"
                       "Connection: Keep-Alive\r\nAccept-Encoding: gzip\r\n\r\n").encode()
                http = (f"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {len(body)}\r\n"
                        "Server: nginx\r\nConnection: close\r\n\r\n").encode() + body
                meta = (f"fetchTimeMs: {rng.randint(50, 900)}\r\ncharset-detected: UTF-8\r\n"
                        "languages-cld2: {}\r\n").encode()
                common = [("WARC-Date", date), ("WARC-Target-URI", url), ("WARC-Warcinfo-ID", info_id)]
                f.write(_member([("WARC-Type", "request"), ("WARC-Record-ID", req_id), *common,
                                 ("WARC-IP-Address", f"10.{copy % 250}.{n_resp % 250}.7"),
                                 ("Content-Type", "application/http; msgtype=request")], req))
                f.write(_member([("WARC-Type", "response"), ("WARC-Record-ID", resp_id), *common,
                                 ("WARC-Concurrent-To", req_id),
                                 ("WARC-IP-Address", f"10.{copy % 250}.{n_resp % 250}.7"),
                                 ("Content-Type", "application/http; msgtype=response"),
                                 ("WARC-Payload-Digest", _digest(body)), ("WARC-Block-Digest", _digest(http)),
                                 ("WARC-Identified-Payload-Type", "text/html")], http))
                f.write(_member([("WARC-Type", "metadata"), ("WARC-Record-ID", urn()), *common,
                                 ("WARC-Concurrent-To", resp_id), ("Content-Type", "application/warc-fields")], meta))
                n_resp += 1
                n_shuffled += shuffled
                n_records += 3
                raw_bytes += len(req) + len(http) + len(meta)
            copy += 1
        size = f.tell()
    os.replace(tmp, path)
    facts = {"path": str(path), "bytes": size, "responses": n_resp, "records": n_records + 1,
             "distinct_pages": len(pages), "copies": copy, "shuffled": n_shuffled, "raw_bytes": raw_bytes,
             "version": GEN_VERSION, "pages": which}
    path.with_suffix(".json").write_text(json.dumps(facts, indent=1))
    return facts


def cached_warc(size_mb: int, which: str = "default") -> dict:
    kind = "" if which == "default" else f"{which}-"
    path = bench_root() / f"cc-like-{kind}{size_mb}mb-v{GEN_VERSION}.warc.gz"
    facts_path = path.with_suffix(".json")
    if path.exists() and facts_path.exists():
        facts = json.loads(facts_path.read_text())
    else:
        t0 = time.perf_counter()
        facts = build_warc(path, size_mb * MiB, which=which)
        facts["build_s"] = time.perf_counter() - t0
    if "mean_text_chars" not in facts:
        facts.setdefault("pages", which)
        facts["mean_text_chars"] = mean_extracted_chars(facts)
        facts_path.write_text(json.dumps(facts, indent=1))
    return facts


def cached_index(facts: dict) -> dict:
    """--index: a CC-like columnar index of the bench WARC, built once beside it by the index
    builder (``refinery index cc``: Common Crawl's schema, the real member offsets and lengths,
    CLD2 on the HTML bytes); what building it cost and the primary languages it found."""
    from collections import Counter

    import pyarrow.parquet as pq

    from curation.io.warc_index import build_index

    d = Path(facts["path"][: -len(".warc.gz")] + "-index")
    info = d / "_bench.json"
    if info.exists():
        return json.loads(info.read_text())
    t0 = time.perf_counter()
    rep = build_index([facts["path"]], str(d), crawl="BENCH-SCALE")
    wall = time.perf_counter() - t0
    langs = Counter((x or "").split(",")[0] or None
                    for f in sorted(d.glob("*.parquet")) for x in pq.read_table(f, columns=["content_languages"])
                    .column("content_languages").to_pylist())
    out = {"path": str(d), "rows": rep["rows"], "build_s": wall, "cpu_s": rep["cpu_seconds"],
           "langid_cpu_s": rep["langid_cpu_seconds"], "index_bytes": sum(f.stat().st_size for f in d.glob("*.parquet")),
           "langs": {str(k): v for k, v in langs.most_common()}}
    info.write_text(json.dumps(out, indent=1))
    return out


def index_arms(facts: dict, ix: dict, max_gap: int) -> dict:
    """The two selections of --index (English; the language nearest 1% of the pages) and what
    each will read: records, bytes, and the reads they join into (each one GET on object storage:
    tests/test_cc_index_s3.py counts them)."""
    from curation.io.cc_select import scan
    from curation.io.records import plan_reads

    n = sum(ix["langs"].values())
    rare = min((k for k in ix["langs"] if k not in ("eng", "None")), key=lambda k: abs(ix["langs"][k] / n - 0.01))
    wheres = {"index-en": "content_languages LIKE 'eng%'", "index-rare": f"content_languages LIKE '{rare}%'"}
    out: dict = {**ix, "where": wheres, "rare": rare, "selected": {}, "bytes": {}, "reads": {}, "scan_s": {}, "ids": {}}
    files = [str(p) for p in sorted(Path(ix["path"]).glob("*.parquet"))]
    scan(files, "false")  # the sandboxed connection made and the files' footers cached: not a selection's cost
    for mode, where in wheres.items():
        sc = scan(files, where)
        out["selected"][mode] = sc.records.num_rows
        out["scan_s"][mode] = sc.seconds
        out["ids"][mode] = [f"crawl/{f}#{o}" for f, o in zip(sc.records["warc_filename"].to_pylist(),
                                                            sc.records["warc_record_offset"].to_pylist())]
        spans: dict[str, list[tuple[int, int]]] = {}
        for f, o, ln in zip(sc.records["warc_filename"].to_pylist(), sc.records["warc_record_offset"].to_pylist(),
                            sc.records["warc_record_length"].to_pylist()):
            spans.setdefault(f, []).append((o, o + ln))
        out["bytes"][mode] = sum(e - b for v in spans.values() for b, e in v)
        out["reads"][mode] = sum(len(plan_reads(v, max_gap)) for v in spans.values())
    return out


def show_index(results: dict[str, list[dict]], facts: dict, a) -> None:
    """--index: each selection against the full scan (bytes, wall, the same documents) and the
    cost per snapshot of an English-only corpus and of a ~1% language."""
    ix = facts["index"]
    full = results["full"]
    w = full[0]["workers"]
    med = lambda xs: statistics.median(xs)  # noqa: E731
    n_all = facts["responses"]
    f_wall = med([r["wall_s"] for r in full])
    f_bytes = med([r["read"]["bytes_read"] for r in full])
    f_read_cpu = med([r["read"]["cpu"] for r in full]) / n_all
    f_core_s = f_wall * w / n_all  # the whole DAG's core-seconds a document
    ext = med([r["map_stages"].get("extract", {}).get("cpu", 0.0) for r in full]) / n_all
    print(f"\n== index selection ({len(full)} round(s), medians): the full scan read {f_bytes / MiB:,.1f} MiB in "
          f"{f_wall:,.1f} s for {n_all:,} documents")
    snapshot = a.snapshot_warcs * a.responses_per_warc
    for mode, label, share in (("index-en", "English (eng)", a.english_share),
                               ("index-rare", f"~1% language ({ix['rare']})", a.rare_share)):
        rs = results[mode]
        docs = ix["selected"][mode]
        wall = med([r["wall_s"] for r in rs])
        got = med([r["read"]["bytes_read"] for r in rs])
        read_cpu = med([r["read"]["cpu"] for r in rs]) / max(docs, 1)
        # the documents: the full scan's extract rows of the selected records, and the index run's
        chosen = set(ix["ids"][mode])
        ref = {i: t for i, t in full[0].get("text_digests", {}).items() if i in chosen}
        texts = rs[0].get("text_digests", {})
        same = sum(ref.get(i) == t for i, t in texts.items())
        print(f"{label}: {docs:,} documents = {docs / n_all:.1%} of the WARC's; where {ix['where'][mode]!r}")
        print(f"  bytes read {got / MiB:,.2f} MiB = {got / f_bytes:.3f}x the full scan's ({ix['bytes'][mode] / MiB:,.2f} "
              f"MiB of records, {ix['reads'][mode]:,} reads = GETs on object storage); per kept document "
              f"{got / max(docs, 1):,.0f} bytes against the full scan's {f_bytes / max(docs, 1):,.0f}")
        print(f"  wall {wall:,.1f} s = {wall / f_wall:.3f}x the full scan's; index scan {ix['scan_s'][mode]:.2f} s; "
              f"reader CPU {read_cpu * 1e3:,.2f} ms a document (full scan: {f_read_cpu * 1e3:,.2f} ms a response)")
        print(f"  documents: {len(texts):,} extracted (the full scan: {len(ref):,} of these records), {same:,} texts "
              "equal to the full scan's" + ("" if same == len(texts) == len(ref) and set(texts) == set(ref)
                                            else "  <-- NOT EQUAL"))
        per_doc = f_core_s - f_read_cpu + read_cpu  # the DAG's cost a document, read by range instead of in full
        scan_per_row = ix["scan_s"][mode] / max(ix["rows"], 1)
        hours = snapshot * (share * per_doc + scan_per_row) / 3600
        as_run = snapshot * share / (docs / wall / w) / 3600 if docs else float("nan")
        full_hours = snapshot * f_core_s / 3600
        print(f"  cost: {share:.0%} of a {a.snapshot_warcs:,}-WARC snapshot ({snapshot * share:,.0f} documents) = "
              f"{hours:,.0f} core-hours = {hours / full_hours:.4f}x the full scan's ({per_doc * 1e3:,.2f} ms a document: "
              f"the full DAG's {f_core_s * 1e3:,.2f} less its read, plus this read; index scan {scan_per_row * 1e6:,.1f} "
              f"us a row); at this run's own rate ({docs / wall / w:,.1f} docs/s/core, start-up and global stages' "
              f"fixed costs included) {as_run:,.0f}; on the project's cost line ({a.reference_core_hours:,.0f} "
              f"core-hours a full scan) {a.reference_core_hours * hours / full_hours:,.0f} core-hours")
    print(f"full scan: {snapshot / (n_all / f_wall / w) / 3600:,.0f} core-hours for any selection "
          f"({n_all / f_wall / w:,.1f} docs/s/core at this size; the project's cost line: {a.reference_core_hours:,.0f})")
    per_resp = ix["cpu_s"] / max(ix["rows"], 1)
    print(f"index where there is none (refinery index cc): {ix['build_s']:,.1f} s, {ix['cpu_s']:,.1f} CPU s for "
          f"{ix['rows']:,} responses ({per_resp * 1e3:,.2f} ms each, CLD2 on the HTML {ix['langid_cpu_s'] / max(ix['rows'], 1) * 1e3:,.2f} ms) "
          f"= {per_resp / ext:.2f}x the full scan's extract CPU a document ({ext * 1e3:,.2f} ms), "
          f"{snapshot * per_resp / 3600:,.0f} core-hours a snapshot; index {ix['index_bytes'] / MiB:,.2f} MiB "
          f"({ix['index_bytes'] / max(ix['rows'], 1):,.0f} bytes a row)")


# ---------------------------------------------------------------------------------------------
# measuring inside the Ray workers
# ---------------------------------------------------------------------------------------------


def _worker_hook() -> None:
    """Runs in every Ray worker at start (``worker_process_setup_hook``): times each map
    stage's ``run_batch`` and each reader, and appends one JSON line per call to
    ``$BENCH_SCALE_LOG/<pid>.jsonl``."""
    import json as _json
    import os as _os
    import resource as _resource
    import time as _time

    from curation.io import read as _read
    from curation.stages import base as _base

    log_dir = _os.environ.get("BENCH_SCALE_LOG")
    if not log_dir:
        return
    path = _os.path.join(log_dir, f"{_os.getpid()}.jsonl")

    def emit(rec: dict) -> None:
        with open(path, "a") as fh:
            fh.write(_json.dumps(rec) + "\n")

    real_run_batch = _base.MapStage.run_batch

    def faults() -> int:  # this process's minor page faults so far (each one a zeroed page)
        return _resource.getrusage(_resource.RUSAGE_SELF).ru_minflt

    def run_batch(self, batch, text=None):
        c0, t0, w0, f0 = _time.process_time(), _time.thread_time(), _time.perf_counter(), faults()
        out = real_run_batch(self, batch, text)
        emit({"kind": "stage", "type": self.type, "rows": batch.num_rows, "cpu": _time.process_time() - c0,
              "thread_cpu": _time.thread_time() - t0, "wall": _time.perf_counter() - w0, "faults": faults() - f0})
        return out

    _base.MapStage.run_batch = run_batch

    from curation.pipeline import executor as _executor

    real_step = _executor._Step.__call__

    def step(self, batch, text):  # the stage's batch plus its hand-off: split, state, writes
        c0, f0 = _time.process_time(), faults()
        out = real_step(self, batch, text)
        emit({"kind": "step", "type": self.stage.type, "cpu": _time.process_time() - c0, "faults": faults() - f0})
        return out

    _executor._Step.__call__ = step

    def timed(reader):
        def wrapper(shard, spec, res):
            cpu = wall = 0.0
            flt = 0
            gen = reader(shard, spec, res)
            while True:
                c0, w0, f0 = _time.process_time(), _time.perf_counter(), faults()
                try:
                    item = next(gen)
                except StopIteration:
                    cpu += _time.process_time() - c0
                    wall += _time.perf_counter() - w0
                    flt += faults() - f0
                    break
                cpu += _time.process_time() - c0
                wall += _time.perf_counter() - w0
                flt += faults() - f0
                yield item
            emit({"kind": "read", "shard": shard.key, "range": shard.end - shard.start, "cpu": cpu, "wall": wall,
                  "faults": flt,
                  "bytes_read": res.bytes_read, "bytes_decompressed": res.bytes_decompressed})
        return wrapper

    for fmt, reader in list(_read.READERS.items()):
        _read.READERS[fmt] = timed(reader)

    prof_dir = _os.environ.get("BENCH_SCALE_PROFILE")
    if prof_dir:  # --profile: each map task's whole work (read, chain, writes, hand-offs) under cProfile
        import cProfile as _cProfile
        import itertools as _itertools

        from curation.pipeline import executor as _executor

        real_entries, seq = _executor._root_entries, _itertools.count()

        def profiled(job):
            pr = _cProfile.Profile()
            try:
                return pr.runcall(real_entries, job)
            finally:
                pr.dump_stats(_os.path.join(prof_dir, f"{_os.getpid()}-{next(seq)}.prof"))

        _executor._root_entries = profiled

        from curation.pipeline import tasks as _tasks

        real_measured = _tasks._measured

        def measured_profiled(fn, job, star):  # a global stage's task, profiled apart ("g-" files)
            pr = _cProfile.Profile()
            try:
                return pr.runcall(real_measured, fn, job, star)
            finally:
                pr.dump_stats(_os.path.join(prof_dir, f"g-{getattr(fn, '__name__', 'task')}-{_os.getpid()}-{next(seq)}.prof"))

        _tasks._measured = measured_profiled


class ProcSampler(threading.Thread):
    """Samples VmHWM/VmRSS of every process under this one (Ray's raylet, workers...)."""

    def __init__(self, interval: float = 1.0):  # peaks are the kernel's high-water marks: 1 s loses none
        super().__init__(daemon=True)
        self.interval = interval
        self.peak: dict[int, tuple[str, float]] = {}  # pid -> (name, peak MB)
        self.cpu: dict[int, float] = {}  # pid -> user + system CPU s at its last sample
        self.sys: dict[int, float] = {}  # pid -> system CPU s at its last sample
        self.faults: dict[int, int] = {}  # pid -> minor page faults at its last sample
        self.stop = threading.Event()

    @staticmethod
    def _children() -> dict[int, list[int]]:
        kids: dict[int, list[int]] = {}
        for d in os.listdir("/proc"):
            if d.isdigit():
                try:
                    with open(f"/proc/{d}/stat") as fh:
                        ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
                except (OSError, ValueError, IndexError):
                    continue
                kids.setdefault(ppid, []).append(int(d))
        return kids

    def sample(self) -> None:
        kids = self._children()
        todo, seen = [os.getpid()], set()
        while todo:
            p = todo.pop()
            if p in seen:
                continue
            seen.add(p)
            todo.extend(kids.get(p, []))
            if p == os.getpid():
                continue
            try:
                with open(f"/proc/{p}/cmdline", "rb") as fh:
                    name = fh.read().split(b"\0")[0].decode(errors="replace")
                with open(f"/proc/{p}/status") as fh:
                    st = {k: v for k, _, v in (line.partition(":") for line in fh)}
                with open(f"/proc/{p}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                ticks = fields[11:13]  # utime, stime
                self.cpu[p] = sum(int(x) for x in ticks) / os.sysconf("SC_CLK_TCK")
                self.sys[p] = int(fields[12]) / os.sysconf("SC_CLK_TCK")
                self.faults[p] = int(fields[7])  # minflt
            except OSError:
                continue
            mb = max(int(st.get(k, "0 kB").split()[0]) for k in ("VmHWM", "VmRSS")) / 1024
            old = self.peak.get(p, ("", 0.0))
            label = name if name.startswith("ray::") else (old[0] or name)
            self.peak[p] = (label, max(old[1], mb))

    def run(self) -> None:
        while not self.stop.is_set():
            self.sample()
            time.sleep(self.interval)


class CoreSwap(threading.Thread):
    """--side-by-side: the two runs' process trees on the two halves of this process's CPUs,
    swapped every ``interval`` s. This VM's cores do not run at one speed: the same extraction loop
    pinned to each core at once ran 1.9-2.1 s on one and 3.1-3.5 s on the other, and which core is
    slow changes from one second to the next (``bench_cores.py``); two runs left where the
    scheduler puts them would each see their own core's luck. Swapped, both see both cores alike."""

    def __init__(self, roots: list[int], interval: float = 1.0):
        super().__init__(daemon=True)
        cpus = sorted(os.sched_getaffinity(0))
        half = max(1, len(cpus) // 2)
        self.halves = [set(cpus[:half]), set(cpus[half:]) or set(cpus[:half])]
        self.roots, self.interval, self.stop, self.swaps = roots, interval, threading.Event(), 0

    @staticmethod
    def _threads(root: int, kids: dict[int, list[int]]) -> list[int]:
        todo, out = [root], []
        while todo:
            p = todo.pop()
            todo.extend(kids.get(p, []))
            try:
                out.extend(int(t) for t in os.listdir(f"/proc/{p}/task"))  # affinity is per thread
            except OSError:
                continue
        return out

    def run(self) -> None:
        every = set(os.sched_getaffinity(0))
        while not self.stop.wait(self.interval if self.swaps else 0):
            kids = ProcSampler._children()
            for i, root in enumerate(self.roots):
                self._pin(root, kids, self.halves[(i + self.swaps) % 2])
            self.swaps += 1
        kids = ProcSampler._children()
        for root in self.roots:
            self._pin(root, kids, every)

    def _pin(self, root: int, kids: dict[int, list[int]], cpus: set[int]) -> None:
        for tid in self._threads(root, kids):
            with contextlib.suppress(OSError):  # a thread gone meanwhile
                os.sched_setaffinity(tid, cpus)


def _hwm_mb() -> float:
    from curation.pipeline.tasks import peak_rss_mb  # ru_maxrss: this process's VmHWM

    return peak_rss_mb()


# ---------------------------------------------------------------------------------------------
# one run (in its own process)
# ---------------------------------------------------------------------------------------------


def dag_spec(warc: str, mode: str, split_mb: int, docs: int, workers: int, index: dict | None = None) -> dict:
    stages = {"extract": {"type": "extract", "input": "crawl",
                          "engine": os.environ.get("BENCH_SCALE_ENGINE", "resiliparse"),  # --engine
                          "format": os.environ.get("BENCH_SCALE_FORMAT", "text")}}  # --format
    if mode == "full" or mode.startswith("index"):
        stages.update({
            "langid": {"type": "langid", "input": "extract"},
            "gopher_rep": {"type": "gopher_repetition", "input": "langid"},
            "gopher": {"type": "gopher_quality", "input": "gopher_rep"},
            "c4": {"type": "c4_quality", "input": "gopher"},
            "fineweb": {"type": "fineweb_quality", "input": "c4"},
            "exact": {"type": "exact_dedup", "input": "fineweb", "level": "document",
                      "bloom": {"expected_items": max(1000, 2 * docs), "false_positive_rate": 1e-6},
                      "partitions": max(2, 2 * workers)},
            "near": {"type": "minhash_dedup", "input": "exact", "ngram": 5, "num_perm": 128, "threshold": 0.8,
                     "keep": "first", "partitions": max(2, 2 * workers)},
        })
    crawl = {"format": "warc", "source": "web", "paths": [warc], "split_bytes": split_mb * MiB}
    if mode.startswith("index"):  # --index: the same DAG over the records the index selects
        crawl = {"format": "cc_index", "source": "web", "paths": [index["path"] + "/*.parquet"],
                 "where": index["where"][mode], "warc_root": os.path.dirname(warc), "split_bytes": split_mb * MiB}
    return {"name": f"bench-scale-{mode}", "inputs": {"crawl": crawl},
            "stages": stages, "output": "extract" if mode == "extract" else "near"}


def meet(barrier: str, me: str, parties: int = 2) -> None:
    """Mark ``me`` in the directory ``barrier`` and wait until ``parties`` marks are there."""
    (Path(barrier) / me).touch()
    while sum(1 for p in Path(barrier).iterdir() if p.suffix == Path(me).suffix) < parties:
        time.sleep(0.02)


def _extract_forever(stop: str, counter, pages: list[bytes]) -> None:
    """Extract the bench's pages (decode + resiliparse, the extract stage's work) until ``stop`` exists."""
    i = 0
    while not os.path.exists(stop):
        page_text(pages[i % len(pages)])
        i += 1
    with counter.get_lock():
        counter.value += i


def keep_busy_until(barrier: str, me: str, workers: int, pages: list[bytes]) -> int:
    """Mark ``me`` done; until the other run is done too, keep ``workers`` cores extracting pages
    (untimed), as this run's workers did: the other run's last minutes then share the machine as its
    first ones did. ``pages`` are loaded before the timed run: loading them here took seconds, in
    which the other run had the machine to itself. Returns the pages extracted meanwhile."""
    import multiprocessing as mp

    (Path(barrier) / me).touch()
    stop = Path(barrier) / "all.stop"
    ctx = mp.get_context("fork")
    counter = ctx.Value("q", 0)
    procs = [ctx.Process(target=_extract_forever, args=(str(stop), counter, pages)) for _ in range(workers)]
    for pr in procs:
        pr.start()
    while sum(1 for p in Path(barrier).iterdir() if p.suffix == ".done") < 2:
        time.sleep(0.05)
    stop.touch()
    for pr in procs:
        pr.join()
    return counter.value


def run_one(mode: str, warc_facts: dict, workers: int, split_mb: int, out_json: str,
            warm_facts: dict | None = None) -> None:
    import ray

    from curation.io.ranges import fast_inflate
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag

    fmt = os.environ.get("BENCH_SCALE_FORMAT", "text")
    me = f"{mode}-{fmt}"  # this run's name at the side-by-side barrier (two modes, or two formats)
    res: dict = {"mode": mode, "format": fmt, "engine": os.environ.get("BENCH_SCALE_ENGINE", "resiliparse"),
                 "workers": workers, "split_mb": split_mb, "input_bytes": warc_facts["bytes"],
                 "inflate": "isal" if fast_inflate() else "zlib",
                 "docs": warc_facts["index"]["selected"][mode] if mode.startswith("index") else warc_facts["responses"]}
    with tempfile.TemporaryDirectory(dir=bench_root()) as tmp:
        log_dir = Path(tmp) / "log"
        log_dir.mkdir()
        run_dir = Path(tmp) / "run"
        dag = parse_dag(dag_spec(warc_facts["path"], mode, split_mb, warc_facts["responses"], workers,
                                 warc_facts.get("index")), "bench_scale.yaml")
        sampler = ProcSampler()
        sampler.start()
        ray.init(address="local", num_cpus=workers, include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                 runtime_env={"worker_process_setup_hook": _worker_hook,
                              "env_vars": {"BENCH_SCALE_LOG": str(log_dir),
                                           "BENCH_SCALE_PROFILE": os.environ.get("BENCH_SCALE_PROFILE", "")}})
        warm_cpu: dict[int, float] = {}
        warm_sys: dict[int, float] = {}
        warm_faults: dict[int, int] = {}
        if warm_facts is not None:
            # --warm-mb: the same DAG over a small WARC first, in the same workers: what a worker of a
            # long run looks like (imports, compiled kernels, detector tables loaded once per process,
            # then thousands of WARCs). Its records and CPU are left out of every figure below.
            t0 = time.perf_counter()
            # cut in 2 shards per worker so that every worker warms (a shard is one task)
            warm_split = max(1, int(warm_facts["bytes"] / MiB) // (2 * workers))
            run_dag(parse_dag(dag_spec(warm_facts["path"], mode, warm_split, warm_facts["responses"], workers),
                              "bench_scale_warm.yaml"), Path(tmp) / "warm", workers=workers, quiet=True)
            res["warm_s"] = time.perf_counter() - t0
            res["warm_docs"] = warm_facts["responses"]
            sampler.sample()
            warm_cpu, warm_sys, warm_faults = dict(sampler.cpu), dict(sampler.sys), dict(sampler.faults)
            for f in log_dir.glob("*.jsonl"):
                f.unlink()
            if os.environ.get("BENCH_SCALE_PROFILE"):  # --profile: the timed run's tasks only
                for f in Path(os.environ["BENCH_SCALE_PROFILE"]).glob("*.prof"):
                    f.unlink()
        barrier = os.environ.get("BENCH_SCALE_BARRIER")
        if barrier:  # --side-by-side: the two runs' timed parts start together
            filler = [html for _, html in load_pages()]  # what keeps the cores busy after, loaded now
            meet(barrier, f"{me}.ready")
        t0, c0 = time.perf_counter(), time.process_time()
        state = run_dag(dag, run_dir, workers=workers, quiet=True)
        res["wall_s"] = time.perf_counter() - t0
        res["driver_cpu_s"] = time.process_time() - c0  # this process: the DAG's driver and the sampler
        sampler.sample()
        ray.shutdown()
        sampler.stop.set()
        if barrier:  # ... and neither one ever has the machine to itself
            res["side_by_side"] = True
            res["filler_pages"] = keep_busy_until(barrier, f"{me}.done", workers, filler)
        res["state"] = state.get("state")
        res["stages_progress"] = state.get("stages", {})
        # what the workers recorded
        stage_cpu: dict[str, dict] = {}
        reads = []
        for f in log_dir.glob("*.jsonl"):
            for line in f.read_text().splitlines():
                r = json.loads(line)
                if r["kind"] == "stage":
                    s = stage_cpu.setdefault(r["type"], {"rows": 0, "cpu": 0.0, "wall": 0.0, "batches": 0, "step": 0.0,
                                                         "faults": 0, "step_faults": 0, "thread_cpu": 0.0})
                    s["rows"] += r["rows"]
                    s["cpu"] += r["cpu"]
                    s["thread_cpu"] += r.get("thread_cpu", 0.0)
                    s["wall"] += r["wall"]
                    s["batches"] += 1
                    s["faults"] += r.get("faults", 0)
                elif r["kind"] == "step":
                    s = stage_cpu.setdefault(r["type"], {"rows": 0, "cpu": 0.0, "wall": 0.0, "batches": 0, "step": 0.0,
                                                         "faults": 0, "step_faults": 0})
                    s["step"] += r["cpu"]
                    s["step_faults"] += r.get("faults", 0)
                else:
                    reads.append(r)
        res["map_stages"] = stage_cpu
        res["read"] = {"shards": len(reads), "cpu": sum(r["cpu"] for r in reads), "wall": sum(r["wall"] for r in reads),
                       "faults": sum(r.get("faults", 0) for r in reads),
                       "bytes_read": sum(r["bytes_read"] for r in reads),
                       "bytes_decompressed": sum(r["bytes_decompressed"] for r in reads),
                       "max_shard_bytes_read": max((r["bytes_read"] for r in reads), default=0),
                       "max_range": max((r["range"] for r in reads), default=0)}
        res["global_stages"] = {}
        if warc_facts.get("index"):  # --index: each document's text, to hold the arms' documents equal
            from curation.pipeline.rundir import RunDir

            con = RunDir(run_dir).connect(["extract"])
            res["text_digests"] = dict(con.execute("select id, md5(coalesce(text, '')) from extract").fetchall())
        for name in GLOBAL_STAGES if mode != "extract" else []:
            ph = json.loads((run_dir / name / "_phases.json").read_text())
            res["global_stages"][name] = {
                "seconds": sum(v["seconds"] for v in ph["phases"].values()),
                "phases": {k: {"seconds": v["seconds"], "peak_worker_rss_mb": v["peak_worker_rss_mb"]}
                           for k, v in ph["phases"].items()},
                "work": ph.get("work", {})}
        counts = {}  # stage -> rows in / kept, from the manifests (global stages too)
        for m in sorted(run_dir.glob("*/_manifest.jsonl")):
            entries = [json.loads(x) for x in m.read_text().splitlines() if x.strip()]
            kept = sum(e.get("rows") or 0 for e in entries)
            counts[m.parent.name] = {"docs_in": kept + sum(e.get("rejected_rows") or 0 for e in entries),
                                     "docs_out": kept}
        res["stage_counts"] = counts
        files = [p for p in run_dir.rglob("*") if p.is_file()]
        res["files_written"] = len(files)
        res["bytes_written"] = sum(p.stat().st_size for p in files)
        res["bytes_by_stage"] = {}
        for p in files:
            top = p.relative_to(run_dir).parts[0]
            if top == "rejected":
                top = "rejected/" + p.relative_to(run_dir).parts[1]
            res["bytes_by_stage"][top] = res["bytes_by_stage"].get(top, 0) + p.stat().st_size
        workers_rss = {pid: v for pid, v in sampler.peak.items() if v[0].startswith("ray::")}
        res["worker_peak_mb"] = sorted((round(mb, 1) for _, mb in workers_rss.values()), reverse=True)
        others = {}
        for _, (name, mb) in sampler.peak.items():
            if not name.startswith("ray::"):
                key = Path(name).name or "?"
                others[key] = max(others.get(key, 0.0), round(mb, 1))
        res["other_process_peak_mb"] = others
        other_cpu: dict[str, float] = {}  # Ray's own processes' CPU in the timed run (raylet, GCS...)
        for pid, (name, _) in sampler.peak.items():
            if not name.startswith("ray::"):
                key = Path(name).name or "?"
                other_cpu[key] = round(other_cpu.get(key, 0.0) + sampler.cpu.get(pid, 0.0) - warm_cpu.get(pid, 0.0), 1)
        res["other_process_cpu_s"] = other_cpu
        # every worker's whole CPU (its last sample, taken after the run): what the timed
        # parts above leave out too (writes, hand-offs, scheduling, the global stages' reads)
        # (less each one's CPU at the end of the warm-up run, with --warm-mb)
        cpu = {pid: sampler.cpu.get(pid, 0.0) - warm_cpu.get(pid, 0.0) for pid in workers_rss}
        res["worker_cpu_s"] = sum(cpu.values())
        res["worker_sys_s"] = sum(sampler.sys.get(pid, 0.0) - warm_sys.get(pid, 0.0) for pid in workers_rss)
        res["worker_faults"] = sum(sampler.faults.get(pid, 0) - warm_faults.get(pid, 0) for pid in workers_rss)
        res["worker_cpu_each_s"] = sorted((round(c, 1) for c in cpu.values()), reverse=True)
    res["driver_peak_mb"] = _hwm_mb()
    Path(out_json).write_text(json.dumps(res, indent=1))


# ---------------------------------------------------------------------------------------------
# report
# ---------------------------------------------------------------------------------------------


def _faults(n: int | None, docs: int, handoff: int | None = None) -> str:
    """Page faults a document (each a page the kernel zeroes: ~4 us of system time on this VM)."""
    if n is None or not docs:
        return ""
    return f"  faults {n / docs:,.1f}/doc" + (f" (+{handoff / docs:,.1f} hand-off)" if handoff else "")


def show(r: dict) -> None:
    w, docs = r["workers"], r["docs"]
    print(f"\n== {r['mode']} (format: {r.get('format', 'text')}): {docs:,} documents, {r['input_bytes'] / MiB:,.1f} MiB WARC, {w} workers, "
          f"split {r['split_mb']} MiB -> {r['read']['shards']} shards; state {r['state']}; "
          f"inflate {r.get('inflate', 'zlib')}" + (f"; workers warmed on {r['warm_docs']:,} documents first "
                                                   f"({r['warm_s']:.1f} s, left out)" if "warm_s" in r else "")
          + (f"; side by side with the other run (then {r['filler_pages']:,} pages extracted untimed while it "
             "finished)" if r.get("side_by_side") else ""))
    print(f"end to end   {r['wall_s']:8.1f} s  {docs / r['wall_s']:9,.1f} docs/s  "
          f"{docs / r['wall_s'] / w:9,.1f} docs/s/core")
    rd = r["read"]
    print(f"read         cpu {rd['cpu']:7.1f} s  {docs / rd['cpu'] if rd['cpu'] else 0:9,.0f} docs/s/core  "
          f"bytes read {rd['bytes_read'] / MiB:,.1f} MiB = {rd['bytes_read'] / r['input_bytes']:.3f}x input  "
          f"decompressed {rd['bytes_decompressed'] / MiB:,.1f} MiB  "
          f"(largest shard read {rd['max_shard_bytes_read'] / MiB:,.1f} MiB "
          f"for a {rd['max_range'] / MiB:,.1f} MiB range)" + _faults(rd.get("faults"), docs))
    by_type = r["map_stages"]
    for name, s in by_type.items():
        print(f"  {name:20s} cpu {s['cpu']:7.1f} s  {s['rows'] / s['cpu'] if s['cpu'] else 0:9,.0f} docs/s/core  "
              + (f"(its thread {s['thread_cpu']:,.1f}) " if s.get("thread_cpu") else "")
              + f"({s['rows']:,} rows in {s['batches']} batches"
              + (f"; hand-off and writes {s['step'] - s['cpu']:,.1f} s" if s.get("step") else "") + ")"
              + _faults(s.get("faults"), s["rows"], s.get("step_faults", 0) - s.get("faults", 0)))
    for name, s in r["global_stages"].items():
        rows = r["stage_counts"].get(name, {}).get("docs_in") or 0
        sec = s["seconds"]
        print(f"  {name:20s} wall {sec:6.1f} s  {rows / sec / w if sec else 0:9,.0f} docs/s/core  ({rows:,} docs in; "
              + ", ".join(f"{k} {v['seconds']:.1f}s/{v['peak_worker_rss_mb']:.0f}MB"
                          for k, v in s["phases"].items()) + ")")
    order = ["crawl", *MAP_STAGES, *GLOBAL_STAGES]
    kept = sorted(r["stage_counts"].items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
    print("  docs in -> kept: " + ", ".join(f"{k} {v['docs_in']:,}->{v['docs_out']:,}" for k, v in kept))
    if "worker_cpu_s" in r:
        timed = rd["cpu"] + sum(s["cpu"] for s in by_type.values())
        print(f"workers' CPU {r['worker_cpu_s']:7.1f} s in all ({r['worker_cpu_s'] - timed:,.1f} s besides read and "
              f"the map stages' batches)" + (f"; by worker {r['worker_cpu_each_s']}" if "worker_cpu_each_s" in r else "")
              + (f"; system {r['worker_sys_s']:,.1f} s,{_faults(r['worker_faults'], docs)}" if "worker_sys_s" in r else ""))
    wp = r["worker_peak_mb"]
    print(f"peak RSS     workers (MB, largest first): {wp[:8]}{' ...' if len(wp) > 8 else ''}  "
          f"driver {r['driver_peak_mb']:,.0f} MB")
    print(f"             other processes: {r['other_process_peak_mb']}")
    if "other_process_cpu_s" in r:
        print(f"CPU besides the workers: driver (and this bench's sampler) {r['driver_cpu_s']:,.1f} s, "
              f"other processes {r['other_process_cpu_s']}")
    print(f"written      {r['bytes_written'] / MiB:,.1f} MiB in {r['files_written']:,} files under the run dir; "
          + ", ".join(f"{k} {v / MiB:,.1f}" for k, v in sorted(r["bytes_by_stage"].items())))


def show_profile(prof_dir: str, top: int = 30) -> None:
    """The map tasks' profiles of one run, merged, then the global stages' tasks': the top functions by own time."""
    import pstats

    every = sorted(str(p) for p in Path(prof_dir).glob("*.prof"))
    for what, files in (("map tasks'", [f for f in every if not Path(f).name.startswith("g-")]),
                        ("global stages' tasks'", [f for f in every if Path(f).name.startswith("g-")])):
        if not files:
            print(f"  (no {what} profiles in {prof_dir})")
            continue
        st = pstats.Stats(*files, stream=sys.stdout)
        print(f"  {what} profile ({len(files)} tasks, {st.total_tt:,.1f} s):")
        st.files = []  # not one line per task file
        st.sort_stats("tottime").print_stats(top)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=1024, help="compressed WARC size (default 1024)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--split-mb", type=int, default=128, help="InputSpec.split_bytes in MiB (default 128)")
    ap.add_argument("--only", choices=["full", "extract"])
    ap.add_argument("--pages", choices=["default", "long"], default="default",
                    help="long: the pages whose extracted text is longest plus the multilingual ones "
                         "(mean extracted length >= 2x the default's)")
    ap.add_argument("--snapshot-warcs", type=int, default=90_000, help="WARC files of a CC snapshot (cost line)")
    ap.add_argument("--responses-per-warc", type=int, default=44_000, help="HTML responses per CC WARC (cost line)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="full and extract-only this many times each, alternating order; the median ratio")
    ap.add_argument("--profile", metavar="DIR",
                    help="cProfile every map task (read, chain, writes) into DIR/<mode>-<round>/ and print the "
                         "top functions by own time per run (slows the run: its ratios are not comparable)")
    ap.add_argument("--warm-mb", type=int, default=0, metavar="MB",
                    help="warm workers: each run first takes its DAG over a MB-sized WARC of the same pages in the "
                         "same Ray workers, left out of every figure (a long run's steady state: per-process "
                         "start-up such as imports and compiled kernels paid once); 0: fresh workers (default)")
    ap.add_argument("--side-by-side", action="store_true",
                    help="each round runs full and extract-only at the same time, each on --workers workers "
                         "(on 2 cores: --workers 1), timed from a common start; the one done first keeps its "
                         "cores extracting pages until the other is done. The machine's speed then moves both "
                         "runs alike (run one after the other, extraction's own speed differed by up to 19%% "
                         "between the two runs of a pair)")
    ap.add_argument("--format", choices=["text", "markdown"], default="text",
                    help="the extract stage's format (its runs inherit it through BENCH_SCALE_FORMAT)")
    ap.add_argument("--engine", choices=["resiliparse", "trafilatura", "blocks"], default="resiliparse",
                    help="the extract stage's engine (its runs inherit it through BENCH_SCALE_ENGINE)")
    ap.add_argument("--formats", metavar="A,B",
                    help="with --only and --side-by-side: the --only mode once per extract format, the two at the "
                         "same time (e.g. text,markdown: format: markdown's full DAG against text's under the same "
                         "load, neither ever alone on the machine), and B's throughput as a fraction of A's")
    ap.add_argument("--index", action="store_true",
                    help="issue 63: the full DAG over the WARC, then over its records an index selects (built once "
                         "beside the WARC by `refinery index cc`'s builder): English and the language nearest 1%% of "
                         "the pages; bytes, wall, the same documents, and their cost per snapshot")
    ap.add_argument("--english-share", type=float, default=0.45,
                    help="share of a snapshot's pages whose primary language is English (--index cost line; Common "
                         "Crawl's language statistics: about 45%%)")
    ap.add_argument("--rare-share", type=float, default=0.01, help="the rare language's share (--index cost line)")
    ap.add_argument("--reference-core-hours", type=float, default=4488,
                    help="a full scan's core-hours per snapshot on the project's cost line (a 1 GB run: 4,488), which "
                         "--index scales by each selection's measured share of the full scan's cost")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # internal: MODE FACTS_JSON OUT_JSON
    ap.add_argument("--warm-facts", help=argparse.SUPPRESS)  # internal: the warm-up WARC's facts
    a = ap.parse_args()
    if not a.one:
        os.environ["BENCH_SCALE_FORMAT"] = a.format
        os.environ["BENCH_SCALE_ENGINE"] = a.engine
    if a.one:
        warm = json.loads(Path(a.warm_facts).read_text()) if a.warm_facts else None
        run_one(a.one[0], json.loads(Path(a.one[1]).read_text()), a.workers, a.split_mb, a.one[2], warm)
        return
    t0 = time.perf_counter()
    facts = cached_warc(a.size_mb, a.pages)
    print(f"WARC {facts['path']}: {facts['bytes'] / MiB:,.1f} MiB, {facts['records']:,} records, "
          f"{facts['responses']:,} responses ({facts['distinct_pages']} distinct pages x {facts['copies']} copies, "
          f"{facts['shuffled']:,} with shuffled paragraphs), {facts['raw_bytes'] / MiB:,.0f} MiB uncompressed, "
          f"mean extracted text {facts['mean_text_chars']:,.0f} chars (ready in {time.perf_counter() - t0:.0f} s)")
    facts_json = Path(facts["path"]).with_suffix(".json")
    warm_json = None
    if a.warm_mb:
        warm = cached_warc(a.warm_mb, a.pages)
        warm_json = Path(warm["path"]).with_suffix(".json")
        print(f"warm-up WARC {warm['path']}: {warm['responses']:,} responses, run first in the same workers "
              "and left out of the figures")
    # the runs of a round ("arms"): the two modes in one format, or (--formats) one mode in two formats
    if a.index:
        if a.only or a.side_by_side or a.formats or a.warm_mb:
            ap.error("--index runs full, index-en and index-rare, one after the other (no --only, --side-by-side, "
                     "--formats, --warm-mb)")
        from curation.io.records import DEFAULT_MAX_GAP

        t1 = time.perf_counter()
        ix = index_arms(facts, cached_index(facts), DEFAULT_MAX_GAP)
        n = sum(ix["langs"].values())
        print(f"index {ix['path']}: {ix['rows']:,} rows, built in {ix['build_s']:,.1f} s (ready in "
              f"{time.perf_counter() - t1:.1f} s); primary languages: "
              + ", ".join(f"{k} {v / n:.1%}" for k, v in list(ix["langs"].items())[:10]))
        facts = {**facts, "index": ix}
        facts_json = bench_root() / (Path(facts["path"]).name[: -len(".warc.gz")] + "-index-facts.json")
        facts_json.write_text(json.dumps(facts, indent=1))
        arms = {m: (m, a.format) for m in ("full", "index-en", "index-rare")}
    elif a.formats:
        fmts = a.formats.split(",")
        if not (a.only and a.side_by_side and len(fmts) == 2 and set(fmts) <= {"text", "markdown"} and fmts[0] != fmts[1]):
            ap.error("--formats A,B: two different formats of text,markdown, with --only and --side-by-side")
        arms = {f"{a.only}/{f}": (a.only, f) for f in fmts}
    else:
        arms = {m: (m, a.format) for m in (["full", "extract"] if a.only is None else [a.only])}
    modes = list(arms)
    walls: dict[str, list[float]] = {m: [] for m in modes}
    results: dict[str, list[dict]] = {m: [] for m in modes}
    if a.side_by_side and (len(modes) != 2 or a.profile):
        ap.error("--side-by-side runs both modes (no --only, or --only with --formats) and no --profile")

    def start(arm: str, r: int, out: str, env: dict) -> subprocess.Popen:
        mode, env["BENCH_SCALE_FORMAT"] = arms[arm]
        if a.profile:
            env["BENCH_SCALE_PROFILE"] = os.path.join(a.profile, f"{mode}-{r}")
            os.makedirs(env["BENCH_SCALE_PROFILE"], exist_ok=True)
        return subprocess.Popen([sys.executable, __file__, "--one", mode, str(facts_json), out,
                                 "--workers", str(a.workers), "--split-mb", str(a.split_mb)]
                                + (["--warm-facts", str(warm_json)] if warm_json else []), env=env)

    def collect(mode: str, r: int, out: str) -> None:
        res = json.loads(Path(out).read_text())
        show(res)
        if a.profile:
            show_profile(os.path.join(a.profile, f"{mode}-{r}"))
        walls[mode].append(res["wall_s"])
        results[mode].append(res)

    for r in range(a.rounds):
        # alternate the order so a slow stretch of the machine does not always land on one mode
        order = modes if r % 2 == 0 else modes[::-1]
        outs = {}
        for mode in order:
            with tempfile.NamedTemporaryFile(suffix=".json", delete=False, dir=bench_root()) as f:
                outs[mode] = f.name
        try:
            if a.side_by_side:
                with tempfile.TemporaryDirectory(dir=bench_root()) as barrier:
                    procs = {m: start(m, r, outs[m], dict(os.environ, BENCH_SCALE_BARRIER=barrier)) for m in order}
                    swap = CoreSwap([pr.pid for pr in procs.values()])
                    swap.start()
                    while any(pr.poll() is None for pr in procs.values()):
                        failed = [m for m, pr in procs.items() if pr.returncode not in (None, 0)]
                        if failed:  # the other one would wait for it at the start or the end
                            for pr in procs.values():
                                pr.kill()
                            raise SystemExit(f"the {failed[0]} run failed")
                        time.sleep(0.2)
                    swap.stop.set()
                    swap.join()
                    if any(pr.returncode != 0 for pr in procs.values()):
                        raise SystemExit("a run failed")
                    print(f"\n(side by side: the two runs swapped cores {swap.swaps:,} times)")
                for m in order:
                    collect(m, r, outs[m])
            else:
                for m in order:
                    if start(m, r, outs[m], dict(os.environ)).wait() != 0:
                        raise SystemExit(f"the {m} run failed")
                    collect(m, r, outs[m])
        finally:
            for out in outs.values():
                Path(out).unlink(missing_ok=True)
    rates = {m: results[m][0]["docs"] / statistics.median(w) / results[m][0]["workers"] for m, w in walls.items()}
    if a.formats:  # same documents, same DAG: B's throughput over A's is A's wall over B's
        fa, fb = modes
        ratios = [wa / wb for wa, wb in zip(walls[fa], walls[fb])]
        print(f"\n{fb} throughput = x{statistics.median(ratios):.3f} of {fa}'s (median of {len(ratios)} round(s): "
              f"{', '.join(f'x{x:.3f}' for x in ratios)}; wall {statistics.median(walls[fb]):.1f} s vs "
              f"{statistics.median(walls[fa]):.1f} s)")
        for ra, rb in zip(results[fa], results[fb]):  # where the difference lies, from the workers' clocks
            cpu = {k: (ra["map_stages"].get(k, {}).get("cpu", 0.0), rb["map_stages"].get(k, {}).get("cpu", 0.0))
                   for k in ra["map_stages"]}
            print("  map stages' CPU, " + fb + " over " + fa + ": "
                  + ", ".join(f"{k} x{b / x:.2f}" for k, (x, b) in cpu.items() if x)
                  + f"; global stages' wall: " + ", ".join(
                      f"{k} x{rb['global_stages'][k]['seconds'] / v['seconds']:.2f}"
                      for k, v in ra["global_stages"].items() if v["seconds"] and k in rb["global_stages"]))
    elif len(walls) == 2:  # same documents in both: the throughput ratio is the inverse wall ratio
        ratios = [e / f for f, e in zip(walls["full"], walls["extract"])]
        print(f"\nfull DAG throughput = {statistics.median(ratios):.1%} of extract-only "
              f"(median of {len(ratios)} round(s): {', '.join(f'{x:.1%}' for x in ratios)}; "
              f"wall {statistics.median(walls['full']):.1f} s vs {statistics.median(walls['extract']):.1f} s), "
              f"mean extracted text {facts['mean_text_chars']:,.0f} chars ({a.pages} pages)")
        # CPU view: what the full DAG adds to extract-only, from the workers' own clocks (resiliparse's
        # speed moves between runs; this share does not depend on which run it was faster in)
        for res in results["full"]:
            ext = res["map_stages"].get("extract", {}).get("cpu", 0.0)
            chain = sum(v["cpu"] for k, v in res["map_stages"].items() if k != "extract")
            glob = sum(v["seconds"] for v in res["global_stages"].values()) * res["workers"]
            base = res["read"]["cpu"] + ext
            print(f"  full run CPU: read + extract {base:,.1f} s, chain after extraction {chain:,.1f} s, "
                  f"global stages ~{glob:,.1f} s (wall x workers) -> read + extract are "
                  f"{base / (base + chain + glob):.1%} of the full DAG's CPU (the ratio with every core busy)")
        # the same from every worker's whole CPU: writes, hand-offs and scheduling included. The
        # extract-only run's CPU besides read + extract is added to the full run's read + extract
        # (what extract-only would cost at the full run's extraction speed)
        for f, e in zip(results["full"], results["extract"]):
            if "worker_cpu_s" not in f or "worker_cpu_s" not in e:
                continue
            f_base = f["read"]["cpu"] + f["map_stages"].get("extract", {}).get("cpu", 0.0)
            e_base = e["read"]["cpu"] + e["map_stages"].get("extract", {}).get("cpu", 0.0)
            e_rest = e["worker_cpu_s"] - e_base
            # the same pages' read + extract in the two runs: how far the machine drifted between
            # them (the wall ratio moves with it: -14% to +6% between consecutive runs here)
            print(f"  workers' whole CPU: full {f['worker_cpu_s']:,.1f} s (read + extract {f_base:,.1f}), extract-only "
                  f"{e['worker_cpu_s']:,.1f} s ({e_rest:,.1f} s besides read + extract) -> extract-only's work is "
                  f"{(f_base + e_rest) / f['worker_cpu_s']:.1%} of the full DAG's; extract-only's own read + extract "
                  f"{e_base:,.1f} s = x{e_base / f_base:.2f} the full run's")
    if a.index:
        show_index(results, facts, a)
    snapshot_docs = a.snapshot_warcs * a.responses_per_warc
    for mode, rate in rates.items():  # the unit users budget in
        if mode.startswith("index"):
            continue  # show_index's lines: per selected document, scaled by the selection's share
        label = ("full DAG" if arms[mode][0] == "full" else "extract-only") + f", format: {arms[mode][1]}"
        print(f"cost: a {a.snapshot_warcs:,}-WARC snapshot ({snapshot_docs:,.0f} responses) at {rate:,.1f} docs/s/core "
              f"({label}) = {snapshot_docs / rate / 3600:,.0f} core-hours")


if __name__ == "__main__":
    main()
