"""The ``blocks`` engine's speed beside resiliparse (and trafilatura), per page in one process:
prints figures, asserts nothing.

Each page is extracted by every engine in turn (blocks, resiliparse, trafilatura, blocks, ...), so
the machine's load lands on all of them alike; CPU time (``process_time``) of the extraction calls
alone, after one warm-up page (numba's start-up and compiled kernels are paid once a process).
Two page sets: WCXB's dev split (``--every N``: every Nth page), and the responses of a CC-like
WARC (``bench_scale.py``'s cache, ``--warc``; its pages are the shared gold sets' pages, each once).

    .venv/bin/python tests/benchmarks/bench_blocks.py [--every 3] [--warc PATH] [--trafilatura]

Run against another commit's code: ``PYTHONPATH=TREE`` with this file (the engines are reached
through ``extract_page``, which every version has).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))  # after PYTHONPATH: another tree's code when it names one

from curation.extract.engines import decode_html, extract_page  # noqa: E402


def warc_pages(path: Path) -> list[str]:
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    pages = []
    with open(path, "rb") as f:
        for rec in ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True):
            body = rec.reader.read()
            ctype = rec.http_headers.get("Content-Type", "") if rec.http_headers else ""
            pages.append(decode_html(body, ctype.split("charset=")[-1].strip() if "charset=" in ctype else None))
    return pages


def measure(name: str, pages: list[str], engines: list[str]) -> None:
    for e in engines:  # warm-up: imports, model, compiled kernels
        extract_page(pages[0], engines=[e])
    cpu = dict.fromkeys(engines, 0.0)
    for html in pages:
        for e in engines:
            t0 = time.process_time()
            extract_page(html, engines=[e])
            cpu[e] += time.process_time() - t0
    n = len(pages)
    mean = sum(map(len, pages)) / n / 1000
    print(f"{name}: {n} pages, mean {mean:,.0f} k characters")
    for e in engines:
        print(f"  {e:12s} {1000 * cpu[e] / n:6.2f} ms a page  {n / cpu[e]:6.1f} pages per CPU-s  "
              f"x{cpu[e] / cpu['resiliparse']:.2f} resiliparse's time")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=int, default=3, help="every Nth WCXB dev page (default 3)")
    ap.add_argument("--warc", type=Path, default=Path(os.environ.get("BENCH_TMP", "/tmp")) / "refinery-bench-scale"
                    / "cc-like-16mb-v1.warc.gz", help="a CC-like WARC (bench_scale.py --size-mb 16 writes this one)")
    ap.add_argument("--trafilatura", action="store_true", help="trafilatura too (slow: ~40 ms a page)")
    a = ap.parse_args()
    from curation.extract.gold import load

    engines = ["blocks", "resiliparse"] + (["trafilatura"] if a.trafilatura else [])
    measure(f"WCXB dev, 1 page in {a.every}", [p.html for p in load("wcxb")[::a.every]], engines)
    if a.warc.is_file():
        measure(f"CC-like WARC {a.warc.name}", warc_pages(a.warc), engines)
    else:
        print(f"(no {a.warc}: run bench_scale.py --size-mb 16 once to build it)")


if __name__ == "__main__":
    main()
