"""What keying Markdown by its plain view costs dedup: print figures, assert nothing (issue #53 item 3).

2,000 documents from the real pages of ``shared/data/html`` (``bench_scale.load_pages``) extracted as
Markdown (``extract_page(format="markdown")``; 1,504 pages give Markdown, so ~500 are taken twice), then, on one 2,000-document batch as ``exact_dedup``'s keys
phase and ``minhash_dedup``'s signatures phase see it: exact document keys, exact paragraph keys
and MinHash signatures (the stage's defaults) of the raw Markdown against those of its plain view
(``markup.plain_texts``, what the stages now hash), and the plain view alone. Raw and
plain alternate within every round (this VM's cores change speed from second to second); the
figure is the median over rounds. ``format: text`` shards pay nothing: their texts are hashed as
they are (``plain_texts`` returns them).

Run: ``.venv/bin/python tests/benchmarks/bench_markdown_dedup.py [--docs 2000] [--rounds 7]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for p in (str(REPO), str(REPO / "tests" / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

import pyarrow as pa  # noqa: E402

from bench_scale import load_pages  # noqa: E402
from curation.dedup.exact import text_keys  # noqa: E402
from curation.stages.minhash_dedup import MinHashDedup  # noqa: E402
from curation.extract.engines import decode_html, extract_page  # noqa: E402
from curation.text.markup import plain_texts  # noqa: E402


def markdown_pages(n: int) -> pa.Array:
    out = []
    for _, html in load_pages():
        try:
            md = extract_page(decode_html(html, None), format="markdown")
        except Exception:  # noqa: BLE001 (a page an engine refuses is not part of the batch)
            continue
        if md and md.strip():
            out.append(md)
        if len(out) == n:
            break
    return pa.array((out * (n // len(out) + 1))[:n], pa.string())  # fewer pages than n: taken again


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--docs", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    texts = markdown_pages(args.docs)
    print(f"{len(texts)} Markdown documents ({len(set(texts.to_pylist()))} distinct), "
          f"{sum(len(t.encode()) for t in texts.to_pylist()) / 1e6:.1f} MB")
    hasher = MinHashDedup().hasher()
    work = {"exact document keys": lambda x: text_keys(x, "document", 0),
            "exact paragraph keys": lambda x: text_keys(x, "paragraph", 0),
            "minhash signatures": hasher.signatures}
    times: dict[tuple[str, str], list[float]] = {}

    def timed(key: tuple[str, str], fn) -> None:
        t0 = time.perf_counter()
        fn()
        times.setdefault(key, []).append((time.perf_counter() - t0) * 1e3)

    for r in range(args.rounds + 1):  # round 0 warms up (compiled kernels, regex caches)
        timed(("plain view", "plain"), lambda: plain_texts(texts, "markdown"))
        for name, fn in work.items():
            order = ("raw", "plain") if r % 2 else ("plain", "raw")
            for view in order:
                timed((name, view), lambda fn=fn, view=view: fn(texts if view == "raw" else plain_texts(texts, "markdown")))
    med = {k: statistics.median(v[1:]) for k, v in times.items()}
    print(f"plain view alone: {med[('plain view', 'plain')]:.0f} ms per {len(texts):,} docs")
    for name in work:
        raw, plain = med[(name, "raw")], med[(name, "plain")]
        print(f"{name}: {plain:.0f} ms on the plain view vs {raw:.0f} ms on the raw Markdown per {len(texts):,} docs "
              f"(x{plain / raw:.2f})")


if __name__ == "__main__":
    main()
