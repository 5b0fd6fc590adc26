"""Kept share per language on real web pages grouped by their ``<html lang>`` (issue 30's figure),
under English rules, ``lang_config: fineweb2``, ``lang_config: auto`` and a calibration file
written by the ``calibrate_rules`` stage on the same pages. Run by hand:

    .venv/bin/python tests/benchmarks/bench_lang_html.py [--min-docs 20] [--json OUT] [--out-calibration F]

Pages: trafilatura's evaluation and cache pages (``shared/data/html/trafilatura_eval_and_cache_
pages.tar.xz``, 1,033 real pages: news, blogs, shops, government), text by resiliparse with the
``extract`` stage's settings, language = the page's ``<html lang>`` primary subtag (``de-DE`` ->
``de``), pages without one left out. No labels: the figure is the share each configuration keeps
per language, with English's kept share as the level the calibration aims every language at.

The chain is ``gopher_repetition -> gopher_quality -> fineweb_quality``. Calibrations (the
``calibrate_rules`` stage's phases, run in this process through a minimal context, the same
functions Ray runs): ``calibrated`` (default: only languages without an entry of their own;
languages here all have one, so it differs from ``auto`` only by corpus stop words, if any) and
``calibrated-all`` (``all_languages: true``: every language with ``--min-docs`` pages
recalibrated against English on these pages).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from real_corpus import SHARED_DATA  # noqa: E402

import curation.stages  # noqa: E402,F401  registers the stages
from curation.pipeline.evaluate import chain_kept  # noqa: E402
from curation.stages.calibrate_rules import REPORT, CalibrateRules  # noqa: E402
from curation.extract.engines import _resiliparse, decode_html  # noqa: E402
from curation.stages.fineweb_quality import FineWebQualityFilter  # noqa: E402
from curation.stages.gopher_quality import GopherQualityFilter
from curation.stages.gopher_repetition import GopherRepetitionFilter
from curation.text import lang_rules  # noqa: E402

TRAF = SHARED_DATA / "html" / "trafilatura_eval_and_cache_pages.tar.xz"
FILTERS = (GopherRepetitionFilter, GopherQualityFilter, FineWebQualityFilter)
HTML_LANG = re.compile(rb"<html[^>]*?\slang\s*=\s*[\"']?([A-Za-z]{2,3})(?![A-Za-z])(?:[-_][A-Za-z0-9-]+)?", re.I)


def pages() -> tuple[list[str], list[str], list[str]]:
    """(name, text, html lang) of every page that declares a language."""
    names, texts, langs = [], [], []
    with tarfile.open(TRAF) as tar:
        for m in tar.getmembers():
            if not m.isfile():
                continue
            html = tar.extractfile(m).read()
            found = HTML_LANG.search(html[:20000])
            if not found:
                continue
            text = _resiliparse(decode_html(html, None)).strip()
            names.append(m.name), texts.append(text), langs.append(found.group(1).decode().lower())
    return names, texts, langs


class LocalContext:
    """Enough of ``StageContext`` to run a global stage's phases in this process (no run
    directory: the output shards are not written, the report goes to ``out``)."""

    def __init__(self, path: str, out: Path):
        self.name, self.params_hash, self.workers = "calibrate", "bench", 1
        self.upstream, self.phases, self.out = [("pages", path)], {}, out

    def finished(self, keys, report):
        return False

    def output(self, key):
        class Sink:
            stage, params_hash = "calibrate", "bench"

            def write(self, kept, rejected, rows_in, **kw):
                return {}
        s = Sink()
        s.key = key
        return s

    def phase(self, name, fn, jobs, commit=False, resources=None, fold=None, init=None):
        t = time.perf_counter()
        acc = init
        for j in jobs:
            r = fn(j)
            acc = fold(acc, r) if fold else acc
        self.phases[name] = {"jobs": len(jobs), "seconds": round(time.perf_counter() - t, 2)}
        return acc

    def write_report(self, filename, report, timings=False):
        self.out.write_text(json.dumps({"stage": self.name, **report}, indent=1, sort_keys=True))


def calibrate(table: pa.Table, out: Path, **params) -> tuple[Path, dict]:
    with tempfile.TemporaryDirectory() as d:
        path = str(Path(d) / "pages.parquet")
        pq.write_table(table, path)
        ctx = LocalContext(path, out)
        CalibrateRules(**params).run(ctx)
    return out, ctx.phases


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--min-docs", type=int, default=20, help="pages a language needs to be calibrated")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--out-calibration", type=Path, help="keep the calibration files here (a folder)")
    args = ap.parse_args()
    t0 = time.perf_counter()
    names, texts, langs = pages()
    n = len(texts)
    table = pa.table({"id": names, "text": texts, "lang": langs})
    print(f"{n} trafilatura pages with <html lang> ({time.perf_counter() - t0:.0f} s to extract); "
          f"by language: {dict(Counter(langs).most_common())}\n")
    folder = args.out_calibration or Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    cal_default, ph1 = calibrate(table, folder / "calibrated.json", min_docs=args.min_docs)
    cal_all, ph2 = calibrate(table, folder / "calibrated-all.json", min_docs=args.min_docs, all_languages=True)
    configs = {"english": [cls() for cls in FILTERS],
               "fineweb2": [cls(lang_config="fineweb2") for cls in FILTERS],
               "auto": [cls(lang_config="auto") for cls in FILTERS],
               "calibrated": [cls(lang_config=str(cal_default)) for cls in FILTERS],
               "calibrated-all": [cls(lang_config=str(cal_all)) for cls in FILTERS]}
    kept = {name: chain_kept(stages, table) for name, stages in configs.items()}
    langs_a = np.array(langs, object)
    info = json.loads(cal_all.read_text())["calibration"]["languages"]
    counts = Counter(langs)
    order = [lang for lang, _ in counts.most_common()]
    print("| lang | pages | entry | calibration (all_languages) | " + " | ".join(f"kept {x}" for x in kept) + " |")
    print("|" + "---|" * (4 + len(kept)))
    figures = {"pages": n, "languages": {}, "calibration_phases": {"calibrated": ph1, "calibrated-all": ph2}}
    for lang in order + ["all"]:
        sel = np.ones(n, bool) if lang == "all" else langs_a == lang
        row = {x: float(kept[x][sel].mean()) for x in kept}
        status = "" if lang == "all" else info.get(lang, {}).get("status", "-")
        entry = "" if lang == "all" else ("yes" if lang_rules.has_own_entry(lang) else ("en rules" if lang == "en" else "no"))
        figures["languages"][lang] = {"pages": int(sel.sum()), "status": status, "kept": row}
        print(f"| {lang} | {int(sel.sum())} | {entry} | {status} | " + " | ".join(f"{row[x]:.0%}" for x in kept) + " |")
    ref = json.loads(cal_all.read_text())["calibration"]
    print(f"\nEnglish loses per rule (reference, {ref['reference_docs']} pages): "
          + ", ".join(f"{k.split('.', 1)[1]} {v:.0%}" for k, v in ref["reference_drop_share"].items()))
    for lang, v in info.items():
        if v.get("status") == "calibrated":
            worst = max((abs(f["achieved_share"] - f["reference_share"]) for f in v["fields"].values()
                         if "achieved_share" in f), default=0.0)
            print(f"  {lang}: {v['docs']} pages calibrated, largest |its loss - English's| over "
                  f"{len(v['fields'])} thresholds: {worst:.1%}")
    print(f"\ncalibration files: {cal_default}, {cal_all}; phases {ph2}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
