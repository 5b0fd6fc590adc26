"""The extraction table of curation/extract/README.md from a `refinery eval extract` report (one run, every
configuration): WCXB word F1 overall and per page type with its empty pages, trafilatura's
benchmark scored its way (segment P / R / F1) and as with/without rates, the article-extraction
benchmark's and Mozilla's word F1, Mozilla's structure kept, docs per CPU-second. Prints Markdown;
asserts nothing.

    refinery eval extract --gold wcxb,trafilatura,aeb,readability --engines ... --workers 2 --json R.json
    python tests/benchmarks/extract_table.py R.json
"""

from __future__ import annotations

import json
import sys

TYPES = ("article", "forum", "product", "collection", "listing", "documentation", "service")


def f(x) -> str:
    return "-" if x is None else f"{x:.3f}"


def pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main(path: str) -> None:
    rep = json.loads(open(path).read())
    print("| config | WCXB F1 | " + " | ".join(TYPES) + " | WCXB empty | trafilatura seg P / R / F1 | with / without "
          "| aeb F1 | Mozilla F1 | code lines | table rows | docs per CPU-s |")
    print("|---" * (len(TYPES) + 10) + "|")
    for spec, e in rep["engines"].items():
        sets, types = e["sets"], e["page_types"]
        w, t, a, m = (sets.get(k, {}) for k in ("wcxb", "trafilatura", "aeb", "readability"))
        row = [f"`{spec}`", f(w.get("f1")), *(f(types.get(f"wcxb:{k}", {}).get("f1")) for k in TYPES),
               str(w.get("empty", "-")),
               f"{f(t.get('seg_p'))} / {f(t.get('seg_r'))} / **{f(t.get('seg_f1'))}**",
               f"{pct(t.get('with'))} / {pct(t.get('without'))}", f(a.get("f1")), f(m.get("f1")),
               pct(m.get("code_lines")), pct(m.get("table_rows")),
               "-" if e.get("docs_per_cpu_s") is None else f"{e['docs_per_cpu_s']:.0f}"]
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main(sys.argv[1])
