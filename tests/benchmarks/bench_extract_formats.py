"""Extraction formats and engine policies: print figures, assert nothing (issue #53, items 2-4).

``--formats``: word F1 (bag of whitespace tokens, as bench_extract.py) on the article-extraction
benchmark's 181 gold pages and on Mozilla readability's 130 (``expected.html`` text), plus
structure kept on the Mozilla set: code lines and table rows as ``curation.extract.scores``
defines them (``refinery eval extract`` reports the same, and more); docs/s on one core. Markdown
is scored on its plain view (``markup.plain_view``) for words, on its own lines for structure.

``--speed``: ``extract``'s batch call (``extract_pages``: decode + extract, the stage's per-page
limits) on the real pages of ``shared/data/html`` (``bench_scale.load_pages``), ``format: text``
against ``format: markdown`` in one process: ``--rounds N`` rounds, each taking the pages in chunks
of ``--chunk`` with the two formats alternating on every chunk (which goes first alternates too),
so both see the same core speed (this VM's cores change speed from second to second); CPU seconds
per format, docs/s and markdown's speed as a fraction of text's, per round and in all.

``--agreement``: keep/drop of the filter chain (langid -> gopher_repetition -> gopher_quality ->
c4_quality -> fineweb_quality, default params) on the bench WARC's real pages
(``bench_scale.load_pages``), ``format: text`` against ``format: markdown`` measured through the
plain view (``TextState.plain``) and raw; the differing pages listed; the chain's speed on each.

Run: ``flock /tmp/refinery-bench.lock .venv/bin/python tests/benchmarks/bench_extract_formats.py --formats --agreement``
or ``... bench_extract_formats.py --speed --rounds 3``
or ``... bench_extract_formats.py --steps [--gold]`` (where Markdown's time goes, step by step)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
for p in (str(REPO), str(REPO / "tests" / "benchmarks")):
    if p not in sys.path:
        sys.path.insert(0, p)

import pyarrow as pa  # noqa: E402

from bench_scale import load_pages  # noqa: E402
from curation.extract import gold as extract_gold  # noqa: E402
from curation.extract import scores as xe  # noqa: E402
from curation.extract.engines import decode_html, extract_page  # noqa: E402
from curation.text.markup import plain_view  # noqa: E402

CONFIGS = {  # name -> extract_page kwargs
    "text": dict(format="text"),
    "markdown": dict(format="markdown"),
    "trafilatura": dict(engines=("trafilatura",), format="text"),
    "text/longest": dict(engines=("resiliparse", "trafilatura"), format="text", policy="longest"),
    "text/union": dict(engines=("resiliparse", "trafilatura"), format="text", policy="union"),
    "text/route": dict(engines=("resiliparse", "trafilatura"), format="text", policy="route"),
    "markdown/route": dict(engines=("resiliparse", "trafilatura"), format="markdown", policy="route"),
    "markdown/union": dict(engines=("resiliparse", "trafilatura"), format="markdown", policy="union"),
}


def formats(names: list[str]) -> None:
    """The gold sets and measures of ``refinery eval extract`` (curation.extract.gold,
    curation.extract.scores), in this script's one-line-per-config layout."""
    aeb, moz = extract_gold.load("aeb"), extract_gold.load("readability")
    moz_gold = [xe.gold_structure(p.gold_html) for p in moz]
    print(f"{'config':16} {'aeb F1':>7} {'moz F1':>7} {'code':>6} {'rows':>6} {'docs/s':>7} {'tokens':>9}")
    for name in names:
        kw = CONFIGS[name]
        t0 = time.process_time()
        outs_a = [extract_page(p.html, **kw) for p in aeb]
        outs_m = [extract_page(p.html, **kw) for p in moz]
        cpu = time.process_time() - t0
        md = kw.get("format") == "markdown"
        view = (lambda xs: plain_view(pa.array(xs)).to_pylist()) if md else (lambda xs: xs)
        fa = sum(xe.word_prf(o, p.text)[2] for o, p in zip(view(outs_a), aeb)) / len(aeb)
        fm = sum(xe.word_prf(o, g.text)[2] for o, g in zip(view(outs_m), moz_gold)) / len(moz)
        ck = cn = rk = rn = 0
        for o, g in zip(outs_m, moz_gold):
            kept = xe.structure_kept(o, g)
            ck, cn = ck + kept["code_lines"][0], cn + kept["code_lines"][1]
            rk, rn = rk + kept["table_rows"][0], rn + kept["table_rows"][1]
        toks = sum(len(o.split()) for o in view(outs_a + outs_m))
        print(f"{name:16} {fa:7.3f} {fm:7.3f} {ck / max(cn, 1):6.3f} {rk / max(rn, 1):6.3f} "
              f"{(len(aeb) + len(moz)) / cpu:7.1f} {toks:9d}", flush=True)
    print(f"(code lines: {cn} in {sum(bool(g.code) for g in moz_gold)} pages; table rows: {rn} in "
          f"{sum(bool(g.rows) for g in moz_gold)} pages; docs/s: CPU seconds of this process, one core)")


def speed(limit: int, rounds: int, chunk: int) -> None:
    """docs/s of ``extract_pages`` in ``format: text`` and ``format: markdown``, alternating."""
    from curation.extract.pages import extract_pages

    pages = [b for _, b in load_pages()[:limit]]
    charsets = [None] * len(pages)
    fmts = ("text", "markdown")
    for f in fmts:  # warm-up: imports, the converter's options
        extract_pages(pages[:20], charsets[:20], format=f)
    print(f"{len(pages)} pages, {rounds} rounds, formats alternating every {chunk} pages")
    total = dict.fromkeys(fmts, 0.0)
    ratios = []
    for r in range(rounds):
        cpu = dict.fromkeys(fmts, 0.0)
        for k, i in enumerate(range(0, len(pages), chunk)):
            for f in (fmts if (r + k) % 2 == 0 else fmts[::-1]):
                t0 = time.process_time()
                extract_pages(pages[i:i + chunk], charsets[i:i + chunk], format=f)
                cpu[f] += time.process_time() - t0
        ratios.append(cpu["text"] / cpu["markdown"])
        for f in fmts:
            total[f] += cpu[f]
        print(f"round {r + 1}: text {len(pages) / cpu['text']:.1f} docs/s, markdown "
              f"{len(pages) / cpu['markdown']:.1f} docs/s: markdown x{ratios[-1]:.3f} of text", flush=True)
    n = rounds * len(pages)
    print(f"all rounds: text {n / total['text']:.1f} docs/s ({1000 * total['text'] / n:.2f} ms/page), markdown "
          f"{n / total['markdown']:.1f} docs/s ({1000 * total['markdown'] / n:.2f} ms/page): markdown "
          f"x{total['text'] / total['markdown']:.3f} of text (rounds x{min(ratios):.3f}-x{max(ratios):.3f}, "
          f"median x{statistics.median(ratios):.3f})")


def chain_keep(texts: list[str], plain: bool) -> tuple[list[str | None], float]:
    """The filter chain's drop reason per text (None: kept) and its CPU seconds."""
    import curation.stages  # noqa: F401 (registers the filter stages)
    from curation.stages import langid  # noqa: F401
    from curation.stages.base import registry
    from curation.text.state import TextState

    stages = [registry[t]() for t in
              ("langid", "gopher_repetition", "gopher_quality", "c4_quality", "fineweb_quality")]
    batch = pa.table({"id": pa.array([str(i) for i in range(len(texts))]), "text": pa.array(texts, pa.string())})
    reasons: list[str | None] = [None] * len(texts)
    alive = list(range(len(texts)))
    t0 = time.process_time()
    # plain: the state extract hands on in format: markdown (the stages measure TextState.plain)
    state = TextState(batch.column("text"), markup="markdown" if plain else "text")
    for st in stages:
        res = st.process(batch, state)
        rs = res.reasons.to_pylist() if res.reasons is not None else [None] * batch.num_rows
        keep = [i for i, r in enumerate(rs) if r is None]
        for i, r in enumerate(rs):
            if r is not None:
                reasons[alive[i]] = r
        alive = [alive[i] for i in keep]
        batch = res.table.take(pa.array(keep, pa.int64()))
        state = (res.text.take(keep, batch.column("text")) if res.text is not None
                 else TextState(batch.column("text"), markup=state.markup))
    return reasons, time.process_time() - t0


def agreement(limit: int) -> None:
    pages = load_pages()[:limit]
    htmls = []
    for _, b in pages:
        try:
            htmls.append(decode_html(b, None))
        except Exception:  # noqa: BLE001 (a page the decoder refuses is left out of both sides)
            continue
    t0 = time.process_time()
    text = [extract_page(h).strip() for h in htmls]
    t_text = time.process_time() - t0
    t0 = time.process_time()
    md = [extract_page(h, format="markdown").strip() for h in htmls]
    t_md = time.process_time() - t0
    keep = [i for i in range(len(htmls)) if text[i] and md[i]]
    text, md = [text[i] for i in keep], [md[i] for i in keep]
    print(f"{len(text)} pages with text in both formats; extraction docs/s: text {len(htmls) / t_text:.1f}, "
          f"markdown {len(htmls) / t_md:.1f} (x{t_text / t_md:.2f})")
    chain_keep(text[:100], plain=False)  # warm-up: the langid model, compiled kernels
    chain_keep(md[:100], plain=True)
    r_text, c_text = chain_keep(text, plain=False)
    for label, plain in (("markdown, plain view", True), ("markdown, raw", False)):
        r_md, c_md = chain_keep(md, plain=plain)
        same = sum((a is None) == (b is None) for a, b in zip(r_text, r_md))
        print(f"{label}: keep/drop agreement {same}/{len(text)} = {same / len(text):.4f}; kept text "
              f"{sum(r is None for r in r_text)}, markdown {sum(r is None for r in r_md)}; chain CPU text "
              f"{c_text:.2f}s, markdown {c_md:.2f}s (x{c_md / c_text:.2f})")
        diffs = Counter((a, b) for a, b in zip(r_text, r_md) if (a is None) != (b is None))
        for (a, b), n in diffs.most_common(12):
            print(f"   {n:4d}  text: {a or 'kept'}  | markdown: {b or 'kept'}")


def _gold_pages() -> list[str]:
    return [p.html for name in ("aeb", "trafilatura", "readability") for p in extract_gold.load(name)]


def steps(limit: int, rounds: int, chunk: int, gold: bool) -> None:
    """Where ``format: markdown``'s time goes, per page (ms, one core), every step alternating
    with the others in chunks of ``chunk`` pages: resiliparse's plain text (``format: text``),
    its ``minimal_html`` (what Markdown starts from), the table/math gate scan, the table pass
    (gate included), html-to-markdown on the main content, and the whole of ``format: markdown``.
    Then the two cheaper variants tried, with how many pages' output they change: tables found
    in resiliparse's DOM (one parse, ``query_selector_all``) instead of the string scan, and
    html-to-markdown's ``tier1`` byte scanner instead of ``auto`` (which takes tier 2 here)."""
    import html_to_markdown as h2m
    from html_to_markdown._html_to_markdown import convert
    from html_to_markdown.api import _to_rust_conversion_options
    from resiliparse.extract.html2text import extract_plain_text
    from resiliparse.parse.html import HTMLTree

    from curation.extract import markdown as md
    from curation.extract.engines import RESILIPARSE_OPTIONS as opts

    pages = _gold_pages() if gold else [decode_html(b, None) for _, b in load_pages()]
    pages = pages[:limit]
    mins = [extract_plain_text(h, preserve_formatting="minimal_html", **opts) for h in pages]
    tier1 = _to_rust_conversion_options(h2m.ConversionOptions(
        heading_style="atx", bullets="-", code_block_style="backticks", escape_asterisks=False,
        escape_underscores=False, escape_misc=False, escape_ascii=False, autolinks=False,
        extract_metadata=False, compact_tables=True, tier_strategy="tier1"))

    def table_pass(h: str) -> None:
        first = md._GATE.search(h)
        if first is not None:
            md._mark(h, [], first.start())

    def dom_markdown(h: str) -> str:  # the DOM variant: tables found and replaced in the parsed tree
        tree, parts = HTMLTree.parse(h), []
        if tree.body is not None:
            for t in tree.body.query_selector_all("table"):
                if t.query_selector("table") is None and (rows := md._table_markdown(t.html)) is not None:
                    parts.append(rows)
                    md._replace(tree, t, "T", len(parts) - 1, True)
        out = convert(html=extract_plain_text(tree, preserve_formatting="minimal_html", **opts),
                      options=md._opts(), visitor=None).content
        return md._PLACEHOLDER.sub(lambda m: parts[int(m.group(2))], out).strip() if parts else out.strip()

    per_page = {  # name -> (function, its input per page)
        "text (resiliparse plain)": (lambda h: extract_plain_text(h, **opts), pages),
        "minimal_html extraction": (lambda h: extract_plain_text(h, preserve_formatting="minimal_html", **opts), pages),
        "gate scan": (md._GATE.search, pages),
        "table pass (gate included)": (table_pass, pages),
        "html-to-markdown (auto)": (lambda m: convert(html=m, options=md._opts(), visitor=None), mins),
        "html-to-markdown (tier1)": (lambda m: convert(html=m, options=tier1, visitor=None), mins),
        "markdown (the whole step)": (lambda h: md.resiliparse_markdown(h, opts), pages),
        "markdown, DOM tables": (dom_markdown, pages),
    }
    cpu = dict.fromkeys(per_page, 0.0)
    names = list(per_page)
    for r in range(rounds):
        for k, i in enumerate(range(0, len(pages), chunk)):
            for name in (names if (r + k) % 2 == 0 else names[::-1]):
                fn, xs = per_page[name]
                t0 = time.process_time()
                for x in xs[i:i + chunk]:
                    fn(x)
                cpu[name] += time.process_time() - t0
    n = rounds * len(pages)
    print(f"{len(pages)} {'gold-set' if gold else 'bench'} pages, {rounds} rounds, steps alternating every {chunk} pages")
    for name in names:
        print(f"  {name:28} {1000 * cpu[name] / n:6.3f} ms/page")
    print(f"  markdown x{cpu['text (resiliparse plain)'] / cpu['markdown (the whole step)']:.3f} of text's speed")
    same = [md.resiliparse_markdown(h, opts) for h in pages]
    print(f"  DOM tables change {sum(a != dom_markdown(h) for a, h in zip(same, pages))} of {len(pages)} pages; "
          f"tier1 changes {sum(convert(html=m, options=md._opts(), visitor=None).content != convert(html=m, options=tier1, visitor=None).content for m in mins)} "
          f"of {len(pages)} converter outputs")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--formats", action="store_true", help="F1 / code / table rows / speed per config")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"of {list(CONFIGS)}")
    ap.add_argument("--agreement", action="store_true", help="filter chain keep/drop, markdown vs text")
    ap.add_argument("--pages", type=int, default=5000, help="--agreement, --speed: at most this many pages")
    ap.add_argument("--speed", action="store_true", help="extract's docs/s, markdown vs text, alternating")
    ap.add_argument("--rounds", type=int, default=3, help="--speed: rounds over the pages")
    ap.add_argument("--chunk", type=int, default=10, help="--speed: pages per turn of one format")
    ap.add_argument("--steps", action="store_true", help="markdown's time per step, and two cheaper variants tried")
    ap.add_argument("--gold", action="store_true", help="--steps on the three gold sets' pages, not the bench pages")
    a = ap.parse_args()
    if a.formats:
        formats(a.configs.split(","))
    if a.speed:
        speed(a.pages, a.rounds, a.chunk)
    if a.agreement:
        agreement(a.pages)
    if a.steps:
        steps(a.pages, a.rounds, a.chunk, a.gold)


if __name__ == "__main__":
    main()
