"""Decontamination recall on planted leaks, false drops on clean pages, and docs/s per core.

Leaks of our own construction: items of the real GSM8K test, MATH test (1,000-problem subset)
and HumanEval sets in ``../shared/data/jsonl`` (question + answer, problem + solution, prompt +
canonical solution: what a copy on the web holds) pasted between two paragraphs of a real web
page (DCLM human-labelled Common Crawl text, CCNet documents, UD English Web Treebank
documents, WikiText-2 articles), in one of the forms ``curation.quality.evaluate.LEAK_FORMS`` lists and its docstring describes (verbatim, spaced
punctuation, typographic, HTML entities, boilerplate split, reflow, upper case, Unicode
compatibility forms, and all of them combined).

Recall = planted documents flagged; false drops = clean pages (the hosts alone) flagged;
GSM8K train items (same style, other problems) are reported as hard negatives.
``--before REV`` also runs the stage as it was at git revision REV (loaded from ``git show``)
on the same documents, in the same process.

    .venv/bin/python tests/benchmarks/bench_decontam.py --items 300 --before 6a72000
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parent))
from real_corpus import SHARED_DATA, jsonl_gz, ud_ewt_documents, wikitext_articles  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from curation.quality.evaluate import LEAK_FORMS, plant  # noqa: E402


# -- eval items and hosts ------------------------------------------------------------------------

def eval_items(n: int, rng: random.Random) -> list[tuple[str, str, str]]:
    """(benchmark, item id, planted text)."""
    jl = SHARED_DATA / "jsonl"
    out = []
    g = list(jsonl_gz(jl / "gsm8k_test.jsonl.gz"))
    for i in rng.sample(range(len(g)), min(n, len(g))):
        out.append(("gsm8k", str(i), g[i]["question"] + "\n" + g[i]["answer"]))
    m = list(jsonl_gz(jl / "math_hendrycks_test_subset1000.jsonl.gz"))
    for i in rng.sample(range(len(m)), min(n, len(m))):
        out.append(("math", str(i), m[i]["problem"] + "\n" + m[i]["solution"]))
    h = list(jsonl_gz(jl / "humaneval.jsonl.gz"))
    for i in rng.sample(range(len(h)), min(n, len(h))):
        out.append(("humaneval", h[i]["task_id"], h[i]["prompt"] + h[i]["canonical_solution"]))
    return out


def host_pages() -> list[str]:
    jl = SHARED_DATA / "jsonl"
    docs = [r["text"] for f in ("dclm_majority_data.jsonl.gz", "dclm_agreement_data.jsonl.gz",
                                "dolma_cc_en_head-0091.jsonl.gz", "dolma_cc_en_head-0174.jsonl.gz")
            for r in jsonl_gz(jl / f)]
    docs += ud_ewt_documents(SHARED_DATA / "text" / "ud_english_ewt-dev.conllu.xz")
    docs += ud_ewt_documents(SHARED_DATA / "text" / "ud_english_ewt-test.conllu.xz")
    docs += wikitext_articles(SHARED_DATA / "text" / "wikitext-2_valid.txt.xz")
    docs += wikitext_articles(SHARED_DATA / "text" / "wikitext-2_test.txt.xz")
    return list(dict.fromkeys(d for d in docs if d.strip()))


# -- perturbations: the leak forms and planting of ``refinery eval decontam`` --------------------

FORMS = LEAK_FORMS

# -- stages ------------------------------------------------------------------------------------

def old_stage_class(rev: str):
    """The ``Decontaminate`` class as it was at ``rev``."""
    from curation.stages.base import registry

    src = subprocess.run(["git", "show", f"{rev}:curation/stages/decontaminate.py"], cwd=REPO, check=True,
                         capture_output=True, text=True).stdout
    mod = types.ModuleType(f"decontaminate_{rev}")
    mod.__dict__["__name__"] = mod.__name__
    sys.modules[mod.__name__] = mod
    saved = registry.pop("decontaminate")
    try:
        exec(compile(src, f"<decontaminate@{rev}>", "exec"), mod.__dict__)
    finally:
        registry["decontaminate"] = saved
    return mod.Decontaminate


def flags(stage, texts: list[str], batch: int = 256) -> tuple[list[bool], float]:
    out: list[bool] = []
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        res = stage.process(pa.table({"text": texts[i:i + batch]}))
        out += [r is not None for r in res.reasons.to_pylist()] if res.reasons is not None else [False] * len(texts[i:i + batch])
        if "decontam_matches" in res.table.column_names:  # remove_spans keeps rows: flagged = matched
            pass
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--items", type=int, default=300, help="items per benchmark")
    ap.add_argument("--before", default=None, help="git revision of the stage to compare with")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--hard-negatives", type=int, default=2000, help="GSM8K train items as clean documents")
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    items = eval_items(args.items, rng)
    hosts = host_pages()
    docs, meta = [], []
    for form, fn in FORMS.items():
        for b, i, text in items:
            docs.append(plant(rng.choice(hosts), fn(text, rng), rng))
            meta.append((form, b))
    train = list(jsonl_gz(SHARED_DATA / "jsonl" / "gsm8k_train.jsonl.gz"))
    hard = [r["question"] + "\n" + r["answer"] for r in rng.sample(train, min(args.hard_negatives, len(train)))]
    print(f"{len(items)} eval items x {len(FORMS)} forms = {len(docs)} planted docs; {len(hosts)} clean pages; "
          f"{len(hard)} GSM8K train items as hard negatives", flush=True)

    with tempfile.TemporaryDirectory() as tmp:
        # the eval sets as the old stage reads them: one JSONL per benchmark, "text" = what is planted
        from curation.io.benchmarks import find_benchmark
        paths = []
        for b in ("gsm8k", "math", "humaneval"):
            p = Path(tmp) / f"{b}.jsonl"
            src = find_benchmark(b, [str(SHARED_DATA / "jsonl")])
            with open(p, "w") as f:
                for r in jsonl_gz(Path(src)):
                    t = {"gsm8k": lambda r: r["question"] + "\n" + r["answer"],
                         "math": lambda r: r["problem"] + "\n" + r["solution"],
                         "humaneval": lambda r: r["prompt"] + r["canonical_solution"]}[b](r)
                    f.write(json.dumps({"text": t}) + "\n")
            paths.append(str(p))
        from curation.stages.decontaminate import Decontaminate
        arms = {"after": Decontaminate(type="decontaminate", eval_sets=["gsm8k", "math", "humaneval"],
                                       eval_dir=str(SHARED_DATA / "jsonl"))}
        if args.before:
            arms[f"before ({args.before})"] = old_stage_class(args.before)(type="decontaminate", eval_paths=paths)
        figures = {}
        for name, st in arms.items():
            t0 = time.perf_counter()
            st.setup()
            setup_s = time.perf_counter() - t0
            st.process(pa.table({"text": hosts[:8]}))  # compile / warm up
            planted, _ = flags(st, docs)
            clean, clean_s = flags(st, hosts)
            hardf, _ = flags(st, hard)
            rec = {}
            for form in FORMS:
                sel = [f for f, (fm, _) in zip(planted, meta) if fm == form]
                rec[form] = sum(sel) / len(sel)
            per_bench = {}
            for b in ("gsm8k", "math", "humaneval"):
                sel = [f for f, (_, bb) in zip(planted, meta) if bb == b]
                per_bench[b] = sum(sel) / len(sel) if sel else None
            mb = sum(len(h.encode()) for h in hosts) / 1e6
            figures[name] = {"recall_per_form": rec, "recall_per_benchmark": per_bench,
                             "recall_all": sum(planted) / len(planted),
                             "false_drops_clean": sum(clean) / len(clean), "false_drops_clean_n": sum(clean),
                             "hard_negatives_flagged": sum(hardf) / len(hardf),
                             "docs_per_s": len(hosts) / clean_s, "mb_per_s": mb / clean_s, "setup_s": setup_s}
        print()
        names = list(figures)
        print(f"{'recall':<20}" + "".join(f"{n:>22}" for n in names))
        for form in FORMS:
            print(f"{form:<20}" + "".join(f"{figures[n]['recall_per_form'][form]:>22.4f}" for n in names))
        print(f"{'all forms':<20}" + "".join(f"{figures[n]['recall_all']:>22.4f}" for n in names))
        for b in ("gsm8k", "math", "humaneval"):
            print(f"{'  ' + b:<20}" + "".join(f"{figures[n]['recall_per_benchmark'][b]:>22.4f}" for n in names))
        print(f"{'false drops (clean)':<20}" + "".join(
            f"{figures[n]['false_drops_clean']:>15.4%} ({figures[n]['false_drops_clean_n']})" for n in names))
        print(f"{'gsm8k-train flagged':<20}" + "".join(f"{figures[n]['hard_negatives_flagged']:>22.4%}" for n in names))
        print(f"{'docs/s (1 core)':<20}" + "".join(f"{figures[n]['docs_per_s']:>22.0f}" for n in names))
        print(f"{'MB/s (1 core)':<20}" + "".join(f"{figures[n]['mb_per_s']:>22.2f}" for n in names))
        print(f"{'index build s':<20}" + "".join(f"{figures[n]['setup_s']:>22.2f}" for n in names))
        if len(names) == 2:
            print(f"speed after/before: {figures[names[0]]['docs_per_s'] / figures[names[1]]['docs_per_s']:.2f}x")
        if args.json:
            Path(args.json).write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
