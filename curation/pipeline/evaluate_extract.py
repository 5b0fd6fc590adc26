"""``refinery eval extract``: extraction engines measured side by side (the measures are
``curation.extract.scores``'s; this module finds the pages, runs the engines, writes reports).

- Against gold (``eval_extract``): the gold sets of ``curation.extract.gold`` (``aeb``,
  ``trafilatura``, ``readability``, a user's ``{html, gold}`` JSONL); per engine spec and set,
  word P/R/F1, snippet rates, code lines / table rows / headings / list items kept, the same per
  page type and per language, and docs/s per core (CPU time of the extraction calls alone).
- On a run (``eval_extract_ab``, ``--ab RUN/STAGE``): the extract stage's kept documents, their
  HTML re-read from the run's WARC input (by the documents' origin columns, a ranged read of
  each record; for a run made before documents carried them, the record each id names, a read
  of its gzip member), each engine spec over them: characters and words kept, empty pages, the pages where
  the first two specs differ most (``_eval_extract_sample.md`` beside the report, for reading).

An engine spec is ``ENGINE[+ENGINE...][:FORMAT][:POLICY]`` (``resiliparse``,
``resiliparse:markdown``, ``resiliparse+trafilatura:route``, ``blocks``) or ``policy:POLICY[:FORMAT]``
(resiliparse and trafilatura, ``extraction.POLICY_ENGINES``, combined by the policy): keyword
arguments of ``extract_page``.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from typing import Sequence

from curation.formats.documents import ORIGIN_COLUMNS
from curation.io import files
from curation.pipeline.evaluate import EvalError, open_target, save, stage_documents, the_stage
from curation.quality import evaluate as ev

#: the sample of differing pages ``--ab`` writes beside its report
SAMPLE = "_eval_extract_sample.md"


def parse_engine_spec(spec: str) -> dict:
    """``ENGINE[+ENGINE...][:FORMAT][:POLICY]`` or ``policy:POLICY[:FORMAT]`` -> ``extract_page``
    keyword arguments (see module docstring); ``EvalError`` naming what is wrong."""
    from curation.extract.engines import ENGINES, FORMATS, POLICIES, POLICY_ENGINES

    head, *rest = spec.strip().split(":")
    if head == "policy":
        engines = POLICY_ENGINES
        if not any(p in POLICIES for p in rest):
            raise EvalError(f"engine spec {spec!r}: policy:POLICY needs one of {', '.join(POLICIES)}")
    else:
        engines = tuple(e for e in head.split("+") if e)
    kw: dict = {"engines": engines}
    for part in rest:
        key = "format" if part in FORMATS else "policy" if part in POLICIES else None
        if key is None:
            raise EvalError(f"engine spec {spec!r}: {part!r} is neither a format ({', '.join(FORMATS)}) "
                            f"nor a policy ({', '.join(POLICIES)})")
        if key in kw:
            raise EvalError(f"engine spec {spec!r}: two {key}s")
        kw[key] = part
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        raise EvalError(f"engine spec {spec!r}: unknown engine {bad[0] if bad else ''!r} (engines: {', '.join(ENGINES)})")
    if len(engines) > 1 and "policy" not in kw:
        kw["policy"] = "first"
    return kw


def parse_engine_specs(specs: Sequence[str]) -> dict[str, dict]:
    out = {s.strip(): parse_engine_spec(s) for s in specs if s.strip()}
    if not out:
        raise EvalError("no engine specs given (--engines)")
    return out


# -- running the engines ------------------------------------------------------------------------

_PAGES: list[str] = []  # the pages a forked worker extracts (set before the pool forks: no pickling)


def _extract_chunk(args: tuple[int, int, dict]) -> tuple[list[str], list[float], int]:
    from curation.extract.engines import extract_page

    lo, hi, kw = args
    outs, cpu, errors = [], [], 0
    for html in _PAGES[lo:hi]:
        t0 = time.process_time()
        try:
            outs.append(extract_page(html, **kw))
        except Exception:  # noqa: BLE001 (a parser failing on one page: that page is empty, and counted)
            outs.append("")
            errors += 1
        cpu.append(time.process_time() - t0)
    return outs, cpu, errors


def run_engines(htmls: list[str], specs: dict[str, dict], workers: int = 1) -> dict[str, dict]:
    """Each spec over every page: ``{spec: {"out": texts, "words": plain views, "cpu": seconds
    per page, "errors": pages that raised}}``. CPU time is each page's own ``process_time`` in
    the process that extracted it, so docs/s per core does not depend on ``workers``."""
    import pyarrow as pa

    from curation.text.markup import plain_view

    global _PAGES
    _PAGES = htmls
    step = max(1, min(64, len(htmls) // max(1, 4 * workers) or 1))
    res: dict[str, dict] = {}
    pool = ProcessPoolExecutor(workers, mp_context=get_context("fork")) if workers > 1 and len(htmls) > 1 else None
    try:
        for spec, kw in specs.items():
            jobs = [(lo, min(lo + step, len(htmls)), kw) for lo in range(0, len(htmls), step)]
            parts = list(pool.map(_extract_chunk, jobs)) if pool else [_extract_chunk(j) for j in jobs]
            outs = [o for p in parts for o in p[0]]
            words = plain_view(pa.array(outs, pa.string())).to_pylist() if kw.get("format") == "markdown" else outs
            res[spec] = {"out": outs, "words": words, "cpu": [c for p in parts for c in p[1]],
                         "errors": sum(p[2] for p in parts)}
    finally:
        if pool:
            pool.shutdown()
        _PAGES = []
    return res


def _params(kw: dict) -> dict:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in kw.items()}


def _rate(n: int, cpu: float) -> float | None:
    return round(n / cpu, 1) if cpu > 0 else None


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


# -- against gold -------------------------------------------------------------------------------


def eval_extract(gold: Sequence[str], engines: Sequence[str], json_out: str | None = None,
                 limit: int | None = None, workers: int = 1) -> dict:
    """Each engine spec over each gold set (module docstring); the report goes to ``json_out``
    (default ``eval-extract.json``)."""
    from curation.extract.gold import load
    from curation.extract import scores as xe

    specs = parse_engine_specs(engines)
    pages = [p for g in gold for p in load(g)[:limit]]
    if not pages:
        raise EvalError("no gold pages")
    structs = [xe.gold_structure(p.gold_html) if p.gold_html else None for p in pages]
    # a set's own labels are named with the set (``wcxb:forum``): its "article" is not AEB's
    kinds = [f"{p.set}:{p.page_type}" if p.page_type else xe.page_kind(p.set, st) for p, st in zip(pages, structs)]
    kind_order = sorted(set(kinds), key=lambda k: (xe.PAGE_KINDS.index(k.split(":")[-1])
                                                   if k.split(":")[-1] in xe.PAGE_KINDS else len(xe.PAGE_KINDS), k))
    langs = [xe.page_language(p.html, p.lang) for p in pages]
    gold_texts = [p.text if p.text is not None else st.text if st else None for p, st in zip(pages, structs)]
    sets = list(dict.fromkeys(p.set for p in pages))
    ran = run_engines([p.html for p in pages], specs, workers)
    report: dict = {"kind": "extract", "gold": list(gold), "pages": len(pages),
                    "sets": {s: sum(p.set == s for p in pages) for s in sets},
                    "page_types": {k: kinds.count(k) for k in kind_order}, "engines": {}}
    t_sets, t_struct, t_types, t_langs = [], [], [], []
    lang_n = defaultdict(int)
    for lg in langs:
        lang_n[lg] += 1
    for spec, kw in specs.items():
        r = ran[spec]
        by_set, by_type, by_lang = defaultdict(xe.Tally), defaultdict(xe.Tally), defaultdict(xe.Tally)
        cpu_set: dict[str, float] = defaultdict(float)
        worst, empty = [], []
        for i, p in enumerate(pages):
            s = xe.score_page(r["out"][i] or "", r["words"][i] or "", gold_texts[i], structs[i], p.with_, p.without,
                              p.scoring)
            if s.empty:
                empty.append({"set": p.set, "page": p.name, "type": kinds[i], "url": p.url})
            by_set[p.set].add(s)
            by_type[kinds[i]].add(s)
            by_lang[langs[i]].add(s)
            cpu_set[p.set] += r["cpu"][i]
            if s.prf is not None:
                worst.append((s.prf[2], p.set, p.name, p.url, kinds[i], s.prf[0], s.prf[1]))
        cpu = sum(r["cpu"])
        sets_sum = {name: {**by_set[name].summary(), "docs_per_cpu_s": _rate(by_set[name].pages, cpu_set[name])}
                    for name in sets}
        report["engines"][spec] = {
            "params": _params(kw), "cpu_s": round(cpu, 3), "docs_per_cpu_s": _rate(len(pages), cpu),
            "errors": r["errors"], "sets": sets_sum,
            "page_types": {k: by_type[k].summary() for k in kind_order},
            "languages": {lg: by_lang[lg].summary() for lg in sorted(by_lang, key=lambda x: -lang_n[x])},
            "worst_f1": [{"f1": round(f, 3), "precision": round(pr, 3), "recall": round(rc, 3), "set": s, "page": n,
                          "type": k, "url": u} for f, s, n, u, k, pr, rc in sorted(worst, key=lambda w: w[:3])[:10]],
            "empty_pages": empty,
        }
        for name, d in sets_sum.items():
            t_sets.append([spec, name, d["pages"], _f(d["precision"]), _f(d["recall"]), _f(d["f1"]), ev.pct(d["with"]),
                           ev.pct(d["without"]), _f(d["seg_f1"]), d["empty"],
                           "-" if d["docs_per_cpu_s"] is None else f"{d['docs_per_cpu_s']:.0f}"])
            if any(d["counts"][k][1] for k in xe.STRUCTURE_KINDS):
                t_struct.append([spec, name, d["pages"], *(ev.pct(d[k]) for k in xe.STRUCTURE_KINDS)])
        for k, t in report["engines"][spec]["page_types"].items():
            t_types.append([spec, k, t["pages"], _f(t["precision"]), _f(t["recall"]), _f(t["f1"]), t["empty"],
                            *(ev.pct(t[k2]) for k2 in xe.STRUCTURE_KINDS)])
        for lg, t in report["engines"][spec]["languages"].items():
            if lang_n[lg] >= 5:
                t_langs.append([spec, lg, t["pages"], _f(t["f1"]), ev.pct(t["with"]), ev.pct(t["without"])])
    report["tables"] = [
        ev.table("extraction against gold: words and snippets (seg F1: trafilatura's benchmark score over the "
                 "snippets; empty: pages with gold words and none out; docs/s: per CPU-second of the extraction calls)",
                 ["engine", "gold", "pages", "P", "R", "word F1", "with", "without", "seg F1", "empty", "docs/s"],
                 t_sets),
        ev.table("structure kept (gold with HTML structure)",
                 ["engine", "gold", "pages", "code lines", "table rows", "headings", "list items"], t_struct),
        ev.table("by page type (the set's label where it has one, WCXB's; else docs-like: the gold has <pre> or "
                 "table rows)", ["engine", "type", "pages", "P", "R", "word F1", "empty", "code lines", "table rows",
                                 "headings", "list items"], t_types),
        ev.table("by language (languages with >= 5 pages)", ["engine", "lang", "pages", "word F1", "with", "without"],
                 t_langs)]
    return save(report, json_out or "eval-extract.json", None, "extract")


# -- on a run: engines side by side on its own pages ---------------------------------------------


def _split_id(doc_id: str, input_name: str) -> tuple[str, int] | None:
    """A WARC document id ``INPUT/RELPATH#MEMBER[+WITHIN]`` -> (relpath, member offset)."""
    if not doc_id.startswith(input_name + "/") or "#" not in doc_id:
        return None
    rel, _, index = doc_id[len(input_name) + 1:].rpartition("#")
    head = index.split("+", 1)[0]
    return (rel, int(head)) if head.isdigit() else None


def warc_pages(dag, input_name: str, ids: Sequence[str]) -> tuple[dict[str, tuple[bytes, str | None]], int]:
    """The HTML (bytes, HTTP charset) of the WARC records ``ids`` name, read again from the
    input's files: the gzip member each id's offset names (a ranged read through the input's
    own reader, so ids match), a file whose records are not members read whole; and how many
    files were read whole."""
    from curation.io.inputs import InputError, plan_input
    from curation.io.read import read_shard

    spec = dag.inputs[input_name]
    try:
        shards = plan_input(input_name, spec, dag.base_dir)
    except InputError as e:
        raise EvalError(f"--ab re-reads the run's input to get each page's HTML: {e} "
                        "(run this from the folder the run was started in)") from None
    by_rel = {s.relpath: s for s in shards}
    want = set(ids)
    got: dict[str, tuple[bytes, str | None]] = {}

    def take(shard) -> None:
        res = read_shard(shard, spec)
        for i, h, c in zip(res.docs["id"], res.docs["html"], res.docs["charset"]):
            if i in want and h is not None:
                got[i] = (h, c)

    members: dict[tuple[str, int], list[str]] = defaultdict(list)
    for i in ids:
        hit = _split_id(i, input_name)
        if hit and hit[0] in by_rel:
            members[hit].append(i)
    for (rel, off), wanted in sorted(members.items()):
        base = by_rel[rel]
        take(dataclasses.replace(base, start=off, end=min(off + 1, base.size), part=0, nparts=1))
    missing_files = {(_split_id(i, input_name) or ("",))[0] for i in want - set(got)}
    whole = sorted(missing_files & set(by_rel))
    for rel in whole:
        base = by_rel[rel]
        take(dataclasses.replace(base, start=0, end=base.size, part=0, nparts=1))
    return got, len(whole)


def stage_pages(dag, input_name: str, docs: Sequence[dict]) -> tuple[dict[str, tuple[bytes, str | None]], dict]:
    """The HTML of a stage's documents: by their origin columns (``curation.io.records``: a
    ranged read of each record) where they have them, else by id (``warc_pages``: runs made
    before documents carried their origin). Also how many were found each way and the bytes
    the origin reads took."""
    from curation.io.records import Wanted, read_records

    got: dict[str, tuple[bytes, str | None]] = {}
    placed = [d for d in docs if d.get("origin_file") and d.get("origin_offset") is not None]
    stats = None
    if placed:
        pages, stats = read_records([Wanted(d["origin_file"], d["origin_offset"], d.get("origin_length"))
                                     for d in placed])
        got = {d["id"]: (p.html, p.charset) for d, p in zip(placed, pages) if p.html is not None}
    by_origin = len(got)
    rest = [d["id"] for d in docs if d["id"] not in got]
    whole = 0
    if rest:
        found, whole = warc_pages(dag, input_name, rest)
        got.update(found)
    return got, {"by_origin": by_origin, "by_id": len(got) - by_origin, "files_read_whole": whole,
                 "origin_bytes_read": stats.bytes_read if stats else None}


def eval_extract_ab(stage_spec: str, engines: Sequence[str], limit: int = 1000, sample: int = 20, seed: int = 0,
                    workers: int = 1, json_out: str | None = None) -> dict:
    """The engine specs side by side on a run's extract stage's pages (module docstring):
    report ``RUN/STAGE/_eval_extract.json``, sample ``RUN/STAGE/_eval_extract_sample.md``."""
    from curation.extract import scores as xe
    from curation.extract.engines import decode_html

    specs = parse_engine_specs(engines)
    target = open_target(stage_spec)
    name, st = the_stage(target, "extract")
    if target.run is None:
        raise EvalError(f"{stage_spec}: --ab needs a run's extract stage (RUN/STAGE), not a DAG file")
    src = st.input
    if src not in target.dag.inputs or target.dag.inputs[src].format != "warc":
        raise EvalError(f"{target.label}: --ab re-reads the stage's WARC input, but its input {src!r} is not a "
                        "WARC input of the run")
    have = set(target.run.connect(views=[name]).sql(f'select * from "{name}" limit 0').columns)
    origin = [c for c in ORIGIN_COLUMNS if c in have]
    docs = stage_documents(target, limit, seed, columns=("id", "url", "text", *origin)).to_pylist()
    if not docs:
        raise EvalError(f"{target.label}: the stage kept no documents")
    html, reread = stage_pages(target.dag, src, docs)
    lost = [d["id"] for d in docs if d["id"] not in html]
    docs = [d for d in docs if d["id"] in html]
    if not docs:
        raise EvalError(f"{target.label}: none of its documents' records found again in input {src!r} "
                        f"(e.g. {lost[0]}); have its files changed since the run?")
    pages = [decode_html(*html[d["id"]]) for d in docs]
    ran = run_engines(pages, specs, workers)
    names = list(specs)
    figs = xe.ab_figures({**{s: ran[s]["words"] for s in names}, "as run": [d["text"] or "" for d in docs]})
    for s in names:
        figs["engines"][s].update(params=_params(specs[s]), cpu_s=round(sum(ran[s]["cpu"]), 3),
                                  docs_per_cpu_s=_rate(len(docs), sum(ran[s]["cpu"])), errors=ran[s]["errors"])
    report: dict = {"kind": "extract", "ab": True, "target": target.label, "stage": name, "input": src,
                    "stage_params": st.model_dump(mode="json", exclude_defaults=True) if hasattr(st, "model_dump")
                    else {}, "documents": len(docs), "not_found_again": len(lost), "reread": reread, **figs,
                    "engine_order": [*names, "as run"]}
    rows = []
    for s, f in figs["engines"].items():
        rows.append([s, figs["pages"], f"{f['chars']:,}", f"{f['words']:,}", f"{f['words_per_page']:.0f}",
                     ev.pct(f["empty_share"]), ev.pct(f.get("words_vs_first")), ev.pct(f.get("one_empty_share")),
                     _f(f.get("mean_disagreement")),
                     "-" if f.get("docs_per_cpu_s") is None else f"{f['docs_per_cpu_s']:.0f}"])
    cols = ["engine", "pages", "chars", "words", "words/page", "empty", "words vs 1st", "one empty", "1-F1 vs 1st",
            "docs/s"]
    report["tables"] = [ev.table(f"{target.label}: engines on the stage's own pages ({len(docs)} kept documents; "
                                 f"1st: {names[0]}; one empty: pages where exactly one of it and the 1st is empty; "
                                 "'as run': the text the stage kept)", cols, rows)]
    if len(names) >= 2:
        a, b = names[0], names[1]
        diff = xe.most_different(ran[a]["words"], ran[b]["words"], sample)
        report["most_different"] = [{"id": docs[i]["id"], "url": docs[i]["url"], "disagreement": round(d, 3),
                                     "words": {a: len(ran[a]["words"][i].split()), b: len(ran[b]["words"][i].split())}}
                                    for i, d in diff]
        path = target.run.report_path(name, SAMPLE)
        files.write_text(path, _sample_text(target.label, a, b, docs, ran, diff))
        report["sample"] = f"{name}/{SAMPLE}"
        report["tables"].append(ev.table(f"pages where {a} and {b} differ most (all in {SAMPLE})",
                                         ["url", "disagreement", f"words {a}", f"words {b}"],
                                         [[m["url"] or m["id"], f"{m['disagreement']:.2f}", m["words"][a], m["words"][b]]
                                          for m in report["most_different"][:10]]))
    return save(report, json_out, target, "extract")


def _sample_text(label: str, a: str, b: str, docs: list[dict], ran: dict, diff: list[tuple[int, float]]) -> str:
    from curation.extract import scores as xe

    out = [f"# {label}: where {a} and {b} differ most", "",
           f"{len(diff)} pages, the most different first (disagreement = 1 - F1 of their words). "
           f"Left: {a}; right: {b} (as extracted, wrapped).", ""]
    for i, d in diff:
        wa, wb = (len(ran[s]["words"][i].split()) for s in (a, b))
        out += [f"## {docs[i]['url'] or docs[i]['id']}", "", f"id `{docs[i]['id']}` · disagreement {d:.2f} · "
                f"words {a} {wa:,} · {b} {wb:,}", "", "````text",
                f"{a:<70} | {b}", f"{'-' * 70} | {'-' * 70}",
                *xe.side_by_side(ran[a]["out"][i], ran[b]["out"][i]), "````", ""]
    return "\n".join(out)
