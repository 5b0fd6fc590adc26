"""Per-language filter rules on real multilingual pages: kept share per language with the
English rules alone vs FineWeb-2's per-language rules (``lang_config: fineweb2``). Run by hand:

    .venv/bin/python tests/benchmarks/bench_lang_rules.py [--pages trafilatura|all] [--sanity]

Pages: the trafilatura evaluation set (1,032 real pages, mostly German, English, Spanish,
French, Polish; ``shared/data/html/trafilatura_eval_and_cache_pages.tar.xz``); ``--pages all``
adds the article-extraction benchmark, postlight and Mozilla readability pages and the
Common Crawl / ClueWeb WARC pages (Chinese, Japanese, Russian). Text by resiliparse
(``extract`` stage defaults), language by CLD2 (``langid`` stage); pages without a language
are left out. Each filter is run alone on every page, then the chain repetition -> quality
-> FineWeb as a DAG would run it.

``--sanity``: for every language of lingua's sentence sets (``shared/data/text/...``), documents
of 10 sentences, the share with at least 2 distinct stop words, with Gopher's English list and
with the language's FineWeb-2 list (the check that chose the preset's languages).
"""

from __future__ import annotations

import argparse
import sys
import tarfile
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_corpus import SHARED_DATA  # noqa: E402

from curation.extract.engines import _resiliparse, decode_html  # noqa: E402
from curation.stages.fineweb_quality import FineWebQualityFilter  # noqa: E402
from curation.stages.gopher_quality import GopherQualityFilter
from curation.stages.gopher_repetition import GopherRepetitionFilter
from curation.stages.langid import LanguageId  # noqa: E402
from curation.text import lang_rules  # noqa: E402

HTML = SHARED_DATA / "html"


def _html_members(path: Path, keep) -> list[tuple[str, bytes]]:
    out = []
    with tarfile.open(path) as tar:
        for m in tar:
            if m.isfile() and keep(m.name):
                out.append((f"{path.name}:{m.name}", tar.extractfile(m).read()))
    return out


def _warc_pages(path: Path) -> list[tuple[str, bytes]]:
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    with open(path, "rb") as f:
        return [(f"{path.name}:{r.headers.get('WARC-Target-URI')}", r.reader.read())
                for r in ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True)]


def pages(which: str) -> pa.Table:
    raw = _html_members(HTML / "trafilatura_eval_and_cache_pages.tar.xz", lambda n: True)
    if which == "all":
        raw += _html_members(HTML / "article_extraction_benchmark_pages.tar.xz", lambda n: n.endswith(".html"))
        raw += _html_members(HTML / "postlight_parser_fixtures.tar.xz", lambda n: n.endswith(".html"))
        raw += _html_members(HTML / "mozilla_readability_test_pages.tar.xz", lambda n: n.endswith("source.html"))
        for w in ("resiliparse_warcfile.warc.gz", "resiliparse_clueweb-quirk.warc.gz"):
            raw += _warc_pages(SHARED_DATA / "warc" / w)
    ids, texts = [], []
    for name, html in raw:
        try:
            text = _resiliparse(decode_html(html, None)).strip()
        except Exception:  # noqa: BLE001 (a page the extractor cannot read is left out)
            continue
        if text:
            ids.append(name)
            texts.append(text)
    table = pa.table({"id": ids, "text": texts})
    table = LanguageId(min_score=0.0).run_batch(table).table
    return table.filter(pc.is_valid(table.column("lang")))


def _kept(stage, table: pa.Table) -> np.ndarray:
    return pc.is_null(stage.run_batch(table).reasons).to_numpy(zero_copy_only=False)


def _chain(stages, table: pa.Table) -> np.ndarray:
    keep = np.ones(table.num_rows, bool)
    idx = np.arange(table.num_rows)
    text = None
    for st in stages:
        res = st.run_batch(table, text)
        k = pc.is_null(res.reasons).to_numpy(zero_copy_only=False)
        keep[idx[~k]] = False
        idx = idx[k]
        table = res.table.filter(pa.array(k))
        text = res.text.take(np.flatnonzero(k))
    return keep


def kept_table(table: pa.Table) -> str:
    stages = {"gopher_repetition": GopherRepetitionFilter, "gopher_quality": GopherQualityFilter,
              "fineweb_quality": FineWebQualityFilter}
    langs = np.array(table.column("lang").to_pylist(), object)
    counts = Counter(langs.tolist())
    results = {}
    for name, cls in stages.items():
        results[name] = (_kept(cls(), table), _kept(cls(lang_config="fineweb2"), table))
    results["chain"] = (_chain([c() for c in stages.values()], table),
                        _chain([c(lang_config="fineweb2") for c in stages.values()], table))
    preset = set(lang_rules.preset("fineweb2"))
    head = "| lang | pages | " + " | ".join(f"{n} en → per-lang" for n in results) + " |"
    lines = [head, "|" + "---|" * (2 + len(results))]
    order = [lang for lang, _ in counts.most_common()]
    for lang in order + ["all"]:
        sel = np.ones(len(langs), bool) if lang == "all" else langs == lang
        label = lang if lang == "all" or lang in preset or lang == "en" else f"{lang} (no entry)"
        cells = []
        for en, per in results.values():
            cells.append(f"{en[sel].mean():.0%} → {per[sel].mean():.0%}")
        lines.append(f"| {label} | {int(sel.sum())} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sanity() -> str:
    tar_path = SHARED_DATA / "text" / "lingua_language_testdata_sentences.tar.xz"
    table = lang_rules.preset("fineweb2")
    rows = defaultdict(dict)
    with tarfile.open(tar_path) as tar:
        for m in sorted((m for m in tar.getmembers() if m.name.endswith(".txt")), key=lambda m: m.name):
            lang = Path(m.name).stem
            sents = [s.strip() for s in tar.extractfile(m).read().decode("utf-8").splitlines() if s.strip()]
            sep = "" if lang in lang_rules.CHAR_WORD_LANGS else " "
            docs = [sep.join(sents[i: i + 10]) for i in range(0, len(sents) - 9, 10)]
            batch = pa.table({"text": docs, "lang": [lang] * len(docs)})
            en = GopherQualityFilter().measure(batch)[0].column("gopher_stop_words").to_numpy()
            rows[lang]["en"] = (en >= 2).mean()
            rows[lang]["n"] = len(docs)
            if lang in table:
                own = GopherQualityFilter(lang_config="fineweb2").measure(batch)[0]
                rows[lang]["own"] = (own.column("gopher_stop_words").to_numpy() >= 2).mean()
    lines = ["| lang | docs | >= 2 stop words: English list | own list (fineweb2) |", "|---|---|---|---|"]
    for lang, r in rows.items():
        own = f"{r['own']:.0%}" if "own" in r else "(no entry)"
        lines.append(f"| {lang} | {r['n']} | {r['en']:.0%} | {own} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pages", choices=["trafilatura", "all"], default="all")
    ap.add_argument("--sanity", action="store_true")
    args = ap.parse_args()
    table = pages(args.pages)
    print(f"{table.num_rows} pages with a language ({args.pages}); kept share per filter, English rules "
          "(defaults) -> FineWeb-2 per-language rules (lang_config: fineweb2)\n")
    print(kept_table(table))
    if args.sanity:
        print("\nStop-word sanity on lingua's sentences (10 sentences a document)\n")
        print(sanity())


if __name__ == "__main__":
    main()
