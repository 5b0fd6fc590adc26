"""Curation quality, measured on labelled data: the figures ``refinery eval`` prints.

Below the stages: functions over texts, labels and a stage's decisions handed in as callables
or arrays (``curation/pipeline/evaluate.py`` reads a run, builds its stages and calls these).
Every ``*_figures`` function returns a JSON-able dict with ``tables``: ``[{title, columns,
rows}]``, what the command prints.

**Decontamination** (``decontam_figures``): eval items planted between two paragraphs of clean
host documents in the forms a leak takes on the web (``LEAK_FORMS``):

- ``verbatim``: as in the benchmark file;
- ``spaced_punct``: every punctuation mark set off by spaces (``3 , 5 .``, tokenised text);
- ``typographic``: curly quotes and apostrophes, ``…``, en dashes;
- ``html_entities``: ``html.escape`` (``&quot;``, ``&#x27;``, ``&amp;``, ``&lt;``), a fifth of
  the spaces as ``&nbsp;``, non-ASCII as ``&#NNN;``;
- ``boilerplate_split``: two boilerplate lines (``Advertisement``, ``Continue reading below``)
  inserted at random word boundaries inside the item;
- ``reflow``: re-wrapped at 60 columns with doubled spaces, code re-indented with tabs;
- ``upper``: upper case;
- ``unicode_compat``: full-width letters in every third word, soft hyphens inside long words,
  no-break spaces;
- ``combined``: typographic + html_entities + boilerplate_split + reflow at once.

Recall per form and per benchmark = planted documents flagged; ``attributed`` = flagged with
the planted item among the matched ones; false drops = the hosts alone flagged; optional
negatives (look-alikes: same style, other problems) flagged.

**Rules** (``rules_figures``): per language, the share of natural pages kept and of unnatural
pages caught by a filter chain. ``natural_pages`` / ``unnatural_pages`` build labelled pages
from sentences of a language in the forms human raters flag as not natural text
(``UNNATURAL_FORMS``: FineWeb-C's "problematic", DCLM's "drop"): ``keywords`` (a tag cloud),
``menu`` (lines of 1-3 words), ``salad`` (words drawn uniformly from the language's vocabulary),
``boilerplate`` (short lines repeated around one sentence), ``repeated`` (one paragraph 4
times), ``teasers`` (sentence openings cut with "..."), ``listing`` (product rows: words,
prices, dates, codes). For Chinese and Japanese a "word" is two characters.

**Language ID** (``langid_figures``): accuracy per language, the most frequent confusions.

**Near-duplicate pairs** (``pair_decisions``, ``pair_figures``): precision, recall and F1 of
a stage's pairwise decisions (LSH band collision with the stage's hasher and (bands, rows),
the same and exact shingle Jaccard >= threshold, the run's clusters) on labelled pairs.
"""

from __future__ import annotations

import html
import random
import re
import textwrap
import time
from collections import Counter
from typing import Any, Callable, Iterable, Sequence

import numpy as np

# -- tables ---------------------------------------------------------------------------------------


def table(title: str, columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> dict:
    return {"title": title, "columns": list(columns), "rows": [list(r) for r in rows]}


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def pct0(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def ratio(num: int, den: int) -> float | None:
    return num / den if den else None


def markdown(tables: list[dict]) -> str:
    """``tables`` as Markdown (for notes and benchmarks; the CLI prints them with rich)."""
    out = []
    for t in tables:
        out += [f"**{t['title']}**", "", "| " + " | ".join(t["columns"]) + " |",
                "|" + "---|" * len(t["columns"])]
        out += ["| " + " | ".join(str(c) for c in r) + " |" for r in t["rows"]]
        out.append("")
    return "\n".join(out)


# -- decontamination: leak forms ------------------------------------------------------------------

BOILER = ["Advertisement", "Continue reading below", "Share this: Facebook | Twitter | Email"]


def spaced_punct(t: str, rng: random.Random) -> str:
    return re.sub(r"[ \t]+", " ", re.sub(r"([^\w\s])", r" \1 ", t))


def typographic(t: str, rng: random.Random) -> str:
    t = re.sub(r"(^|[\s(\[])\"", "\\1\u201c", t)
    t = t.replace('"', "\u201d")
    t = re.sub(r"(^|[\s(\[])'", "\\1\u2018", t)
    t = t.replace("'", "\u2019").replace("...", "\u2026")
    return re.sub(r"(?<=\w) - (?=\w)", " \u2013 ", t)


def html_entities(t: str, rng: random.Random) -> str:
    t = html.escape(t, quote=True)
    t = "".join(f"&#{ord(c)};" if ord(c) > 127 else c for c in t)
    return re.sub(" ", lambda m: "&nbsp;" if rng.random() < 0.2 else " ", t)


def boilerplate_split(t: str, rng: random.Random) -> str:
    spaces = [m.start() for m in re.finditer(r" ", t)]
    if len(spaces) < 2:
        return t
    cuts = sorted(rng.sample(spaces, 2))
    parts = [t[:cuts[0]], t[cuts[0] + 1:cuts[1]], t[cuts[1] + 1:]]
    return parts[0] + "\n" + rng.choice(BOILER) + "\n" + parts[1] + "\n" + rng.choice(BOILER) + "\n" + parts[2]


def reflow(t: str, rng: random.Random) -> str:
    if re.search(r"^(    )+\S", t, re.M):  # code: re-indent with tabs
        return re.sub(r"^((?:    )+)", lambda m: "\t" * (len(m.group(1)) // 4), t, flags=re.M)
    paras = t.split("\n")
    return "\n".join(textwrap.fill(p, 60).replace(" ", "  ") if p.strip() else p for p in paras)


def upper(t: str, rng: random.Random) -> str:
    return t.upper()


def unicode_compat(t: str, rng: random.Random) -> str:
    def word(m: re.Match) -> str:
        w = m.group(0)
        if rng.random() < 1 / 3:
            return "".join(chr(ord(c) + 0xFEE0) if c.isascii() and c.isalnum() else c for c in w)
        if len(w) > 7:
            return w[:4] + "\u00ad" + w[4:]
        return w
    t = re.sub(r"\w+", word, t)
    return re.sub(" ", lambda m: "\u00a0" if rng.random() < 0.3 else " ", t)


def combined(t: str, rng: random.Random) -> str:
    return reflow(boilerplate_split(html_entities(typographic(t, rng), rng), rng), rng)


LEAK_FORMS: dict[str, Callable[[str, random.Random], str]] = {
    "verbatim": lambda t, r: t, "spaced_punct": spaced_punct, "typographic": typographic,
    "html_entities": html_entities, "boilerplate_split": boilerplate_split, "reflow": reflow,
    "upper": upper, "unicode_compat": unicode_compat, "combined": combined}


def plant(host: str, leak: str, rng: random.Random) -> str:
    """``leak`` pasted into ``host`` at a random line break (its end when it has none)."""
    breaks = [m.end() for m in re.finditer(r"\n", host)] or [len(host)]
    at = rng.choice(breaks)
    return host[:at] + "\n" + leak + "\n\n" + host[at:]


def planted_docs(items: Sequence[tuple[str, str, str]], hosts: Sequence[str], rng: random.Random,
                 forms: Sequence[str] | None = None) -> tuple[list[str], list[tuple[str, str, str]]]:
    """Every item in every form, each in a random host: (documents, (form, benchmark, item))."""
    docs, meta = [], []
    for form in forms or LEAK_FORMS:
        fn = LEAK_FORMS[form]
        for b, i, text in items:
            docs.append(plant(rng.choice(hosts), fn(text, rng), rng))
            meta.append((form, b, i))
    return docs, meta


#: what a decontamination stage answers for a list of texts: flagged, and per text the
#: (benchmark, item) pairs it matched
Flagger = Callable[[list[str]], tuple[list[bool], list[set[tuple[str, str]]]]]


def decontam_figures(flag: Flagger, items: Sequence[tuple[str, str, str]], hosts: Sequence[str], *,
                     forms: Sequence[str] | None = None, seed: int = 0,
                     negatives: Sequence[str] = (), negatives_name: str = "negatives",
                     clean: Sequence[str] | None = None, hosts_independent: bool = True) -> dict:
    """Recall per leak form and per benchmark, attribution, false drops, look-alikes flagged
    (``negatives``) and the stage's docs/s, for ``items`` = (benchmark, item, text) planted in
    ``hosts`` (clean documents).

    False drops are measured on documents independent of the stage: ``clean`` when given, else
    the hosts when ``hosts_independent``. Hosts the same stage already kept (a run's documents)
    cannot show a false drop (they were kept for having too few matches), so then, without
    ``clean``, false drops are reported as not measured rather than as a 0."""
    if not items or not hosts:
        raise ValueError("decontamination eval needs eval items and host documents")
    rng = random.Random(seed)
    forms = list(forms or LEAK_FORMS)
    docs, meta = planted_docs(items, hosts, rng, forms)
    t0 = time.perf_counter()
    got, matched = flag(docs)
    planted_s = time.perf_counter() - t0
    judged = list(clean) if clean is not None else list(hosts) if hosts_independent else []
    t0 = time.perf_counter()
    clean_flags, _ = flag(judged) if judged else ([], [])
    clean_s = time.perf_counter() - t0
    neg, _ = flag(list(negatives)) if negatives else ([], [])
    per_form: dict[str, dict] = {}
    for form in forms:
        sel = [k for k, m in enumerate(meta) if m[0] == form]
        hit = sum(got[k] for k in sel)
        attr = sum(got[k] and (meta[k][1], meta[k][2]) in matched[k] for k in sel)
        per_form[form] = {"planted": len(sel), "flagged": hit, "recall": ratio(hit, len(sel)),
                          "attributed": ratio(attr, len(sel))}
    per_bench: dict[str, dict] = {}
    for b in sorted({m[1] for m in meta}):
        sel = [k for k, m in enumerate(meta) if m[1] == b]
        hit = sum(got[k] for k in sel)
        per_bench[b] = {"items": len({meta[k][2] for k in sel}), "planted": len(sel), "flagged": hit,
                        "recall": ratio(hit, len(sel))}
    missed = [{"form": meta[k][0], "benchmark": meta[k][1], "item": meta[k][2]}
              for k in range(len(docs)) if not got[k]]
    out = {
        "forms": forms, "items": len(items), "hosts": len(hosts), "planted": len(docs), "seed": seed,
        "recall_per_form": per_form, "recall_per_benchmark": per_bench,
        "recall_all": ratio(sum(got), len(got)),
        "false_drops": ({"documents": len(judged), "flagged": sum(clean_flags),
                         "rate": ratio(sum(clean_flags), len(judged)),
                         "on": "clean documents given" if clean is not None else "the hosts"} if judged else
                        {"documents": 0, "flagged": None, "rate": None,
                         "on": "not measured: the hosts are the stage's own kept documents (0 by construction); "
                               "give independent clean documents (--clean)"}),
        negatives_name: {"documents": len(negatives), "flagged": sum(neg), "rate": ratio(sum(neg), len(negatives))},
        "docs_per_s": round((len(docs) + len(judged)) / max(planted_s + clean_s, 1e-9), 1),
        "missed": missed[:50],
    }
    rows = [[f, v["planted"], v["flagged"], pct(v["recall"]), pct(v["attributed"])] for f, v in per_form.items()]
    rows.append(["all forms", len(docs), sum(got), pct(out["recall_all"]), ""])
    rows += [[f"  {b}", v["planted"], v["flagged"], pct(v["recall"]), ""] for b, v in per_bench.items()]
    if judged:
        rows.append([f"false drops ({out['false_drops']['on']})", len(judged), sum(clean_flags),
                     pct(out["false_drops"]["rate"]), ""])
    else:
        rows.append(["false drops", "not measured", "", "", "give --clean"])
    if negatives:
        rows.append([f"{negatives_name} flagged", len(negatives), sum(neg), pct(out[negatives_name]["rate"]), ""])
    out["tables"] = [table(f"decontamination recall: {len(items)} eval items x {len(forms)} forms in "
                           f"{len(hosts)} clean documents ({out['docs_per_s']:.0f} docs/s)",
                           ["leak form", "documents", "flagged", "recall", "item attributed"], rows)]
    return out


# -- rules: natural and unnatural pages -----------------------------------------------------------

UNNATURAL_FORMS = ("keywords", "menu", "salad", "boilerplate", "repeated", "teasers", "listing")
CHARS = {"zh", "ja"}  # languages whose "word", for these pages, is two characters


def _join(lang: str, sents: Sequence[str]) -> str:
    return ("" if lang in CHARS else " ").join(sents)


def natural_pages(lang: str, sents: Sequence[str], n: int, rng: random.Random) -> list[str]:
    """Up to ``n`` pages of 10 consecutive sentences, in paragraphs of 2-4."""
    docs = []
    for i in range(0, min(len(sents), n * 10) - 9, 10):
        chunk, paras = list(sents[i: i + 10]), []
        while chunk:
            k = rng.randint(2, 4)
            paras.append(_join(lang, chunk[:k]))
            chunk = chunk[k:]
        docs.append("\n".join(paras))
    return docs


def vocabulary(lang: str, sents: Sequence[str]) -> list[str]:
    if lang in CHARS:
        text = "".join(sents)
        words = {text[i: i + 2] for i in range(0, len(text) - 1, 2) if re.fullmatch(r"\w\w", text[i: i + 2])}
    else:
        words = {w for s in sents for w in re.findall(r"\w+", s) if not w.isdigit()}
    return sorted(words)


def unnatural_pages(lang: str, sents: Sequence[str], n: int, rng: random.Random) -> list[tuple[str, str]]:
    """``n`` pages of every ``UNNATURAL_FORMS`` form: (form, text). Most of each page is junk
    around two natural sentences (as spam pages carry a sentence or two of real text)."""
    vocab = vocabulary(lang, sents)
    sp = "" if lang in CHARS else " "
    out = []

    def words(k: int) -> list[str]:
        return [rng.choice(vocab) for _ in range(k)]

    for _ in range(n):
        a, b = (_join(lang, rng.sample(list(sents), 1)) for _ in range(2))
        out.append(("keywords", "\n".join([a, ", ".join(rng.sample(vocab, min(80, len(vocab)))), b])))
        out.append(("menu", "\n".join([sp.join(words(rng.randint(1, 3))) for _ in range(40)] + [a, b])))
        out.append(("salad", "\n".join([a] + [sp.join(words(12)) + "." for _ in range(10)] + [b])))
        lines = [sp.join(words(rng.randint(3, 6))) for _ in range(4)]
        out.append(("boilerplate", "\n".join(lines * 3 + [a, b] + lines * 3)))
        para = _join(lang, rng.sample(list(sents), 3))
        out.append(("repeated", "\n".join([para] * 4)))
        teasers = []
        for s in rng.sample(list(sents), 15):
            toks = list(s) if lang in CHARS else s.split()
            teasers.append(sp.join(toks[: max(3, len(toks) // 2)]) + "...")
        out.append(("teasers", "\n".join(teasers)))
        rows = [f"{sp.join(words(2))} {rng.randint(1, 999)}.{rng.randint(0, 99):02d} € | "
                f"{rng.randint(2000, 2024)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d} | "
                f"#{rng.randint(100, 99999)}" for _ in range(20)]
        out.append(("listing", "\n".join([a] + rows + [b])))
    return out


def is_natural(label: Any) -> bool:
    """A page's label: 1/true/"natural"/"keep" is natural; 0/false/"unnatural"/"drop" is not."""
    if isinstance(label, str):
        s = label.strip().lower()
        if s in ("natural", "keep", "good", "1", "true", "yes"):
            return True
        if s in ("unnatural", "drop", "bad", "problematic", "0", "false", "no"):
            return False
        raise ValueError(f"label {label!r}: not natural/unnatural (or 1/0)")
    return bool(label)


def rules_figures(kept: dict[str, np.ndarray], langs: Sequence[str], natural: Sequence[bool],
                  forms: Sequence[str] | None = None, entry: Callable[[str], bool] | None = None) -> dict:
    """Per language and in total, per configuration (``kept``: name -> kept mask): natural pages
    kept and unnatural pages caught; per unnatural form, caught. ``entry(lang)``: whether the
    language has a preset entry of its own (shown beside it)."""
    langs_a, nat = np.asarray(langs, object), np.asarray(natural, bool)
    forms_a = np.asarray(forms if forms is not None else ["natural" if x else "unnatural" for x in nat], object)
    names = list(kept)

    def share(mask: np.ndarray, sel: np.ndarray, want: bool) -> float | None:
        return float((mask[sel] == want).mean()) if sel.any() else None

    per_lang: dict[str, dict] = {}
    for lang in sorted(set(langs_a.tolist()), key=str) + ["all"]:
        sel = np.ones(len(langs_a), bool) if lang == "all" else langs_a == lang
        per_lang[lang] = {"natural": int((sel & nat).sum()), "unnatural": int((sel & ~nat).sum()),
                          **({"own_entry": bool(entry(lang))} if entry and lang != "all" else {}),
                          **{x: {"natural_kept": share(kept[x], sel & nat, True),
                                 "unnatural_caught": share(kept[x], sel & ~nat, False)} for x in names}}
    per_form = {f: {"pages": int((forms_a == f).sum()),
                    **{x: share(kept[x], forms_a == f, False) for x in names}}
                for f in sorted(set(forms_a[~nat].tolist()), key=str)}
    cols = ["lang", "entry", "nat.", "unnat.", *names]
    rows = [[lang, ("all" if lang == "all" else ("yes" if v.get("own_entry") else "no") if entry else "-"),
             v["natural"], v["unnatural"],
             *[f"{pct0(v[x]['natural_kept'])} / {pct0(v[x]['unnatural_caught'])}" for x in names]]
            for lang, v in per_lang.items()]
    form_rows = [[f, v["pages"], *[pct0(v[x]) for x in names]] for f, v in per_form.items()]
    tables = [table("natural pages kept / unnatural pages caught, per language and configuration", cols, rows)]
    if form_rows:
        tables.append(table("unnatural pages caught per form", ["form", "pages", *names], form_rows))
    return {"configs": names, "pages": len(langs_a), "languages": per_lang, "forms": per_form, "tables": tables}


# -- language ID ----------------------------------------------------------------------------------

def langid_figures(gold: Sequence[str], pred: Sequence[str | None], kept: Sequence[bool] | None = None,
                   top_confusions: int = 10) -> dict:
    """Accuracy per gold language (a missing prediction is wrong), kept share when the stage
    drops documents (``kept``), and the most frequent (gold, predicted) confusions."""
    gold_a = np.asarray(gold, object)
    pred_a = np.asarray([p if p is not None else "-" for p in pred], object)
    ok = gold_a == pred_a
    kept_a = np.asarray(kept, bool) if kept is not None else None
    per: dict[str, dict] = {}
    for lang in sorted(set(gold_a.tolist())) + ["all"]:
        sel = np.ones(len(gold_a), bool) if lang == "all" else gold_a == lang
        per[lang] = {"documents": int(sel.sum()), "correct": int(ok[sel].sum()), "accuracy": float(ok[sel].mean()),
                     **({"kept": float(kept_a[sel].mean())} if kept_a is not None else {})}
    conf = Counter((g, p) for g, p in zip(gold_a.tolist(), pred_a.tolist()) if g != p)
    confusions = [{"gold": g, "predicted": p, "documents": n} for (g, p), n in conf.most_common(top_confusions)]
    cols = ["lang", "documents", "correct", "accuracy"] + (["kept"] if kept_a is not None else [])
    rows = [[lang, v["documents"], v["correct"], pct(v["accuracy"]), *([pct(v["kept"])] if kept_a is not None else [])]
            for lang, v in per.items()]
    tables = [table(f"language ID accuracy ({len(gold_a)} documents)", cols, rows)]
    if confusions:
        tables.append(table("most frequent confusions", ["gold", "predicted", "documents"],
                            [[c["gold"], c["predicted"], c["documents"]] for c in confusions]))
    return {"documents": len(gold_a), "accuracy": per["all"]["accuracy"], "languages": per,
            "confusions": confusions, "tables": tables}


# -- near-duplicate pairs -------------------------------------------------------------------------

def pair_decisions(texts_a: Sequence[str], texts_b: Sequence[str], hasher: Any, bands: int, rows: int,
                   threshold: float, partner_floor: float | None = None) -> dict[str, np.ndarray]:
    """Per pair: ``jaccard`` (exact, on the hasher's word n-gram shingles), and the decisions
    ``lsh`` (the two signatures share a band bucket: a candidate link), ``lsh+verify`` (and
    exact Jaccard >= threshold) and ``jaccard>=t`` (exact Jaccard alone: what LSH
    approximates). ``hasher``: a ``curation.dedup.minhash.MinHasher``. With ``partner_floor``,
    also ``lsh+partner``: each LSH-linked pair is a two-document component run through the
    stage's own partner check (``curation.dedup.partners.partner_clusters``), a duplicate when it
    removes the second document."""
    from curation.dedup.minhash import band_hashes, jaccard, shingle_sets
    from curation.dedup.partners import partner_clusters

    texts = list(texts_a) + list(texts_b)
    n = len(texts_a)
    sig, nsh = hasher.signatures(texts)
    bh = band_hashes(sig, bands, rows, hasher.seed)
    has = nsh > 0
    lsh = (bh[:n] == bh[n:]).any(axis=1) & has[:n] & has[n:]
    sets = shingle_sets(texts, hasher.ngram)
    jac = np.array([jaccard(sets[i], sets[n + i]) for i in range(n)], float)
    out = {"jaccard": jac, "lsh": lsh, "lsh+verify": lsh & (jac >= threshold), "jaccard>=t": jac >= threshold}
    if partner_floor is not None:
        linked = np.flatnonzero(lsh)
        comp = np.repeat(np.arange(len(linked), dtype=np.int64), 2)
        doc = np.arange(2 * len(linked), dtype=np.int64)
        res = partner_clusters(comp, doc, [s for i in linked.tolist() for s in (sets[i], sets[n + i])], partner_floor)
        partner = np.zeros(n, dtype=bool)
        partner[linked] = ~res.kept[1::2]
        out["lsh+partner"] = partner
    return out


def prf(pred: np.ndarray, gold: np.ndarray) -> dict:
    tp = int((pred & gold).sum())
    fp = int((pred & ~gold).sum())
    fn = int((~pred & gold).sum())
    p, r = ratio(tp, tp + fp), ratio(tp, tp + fn)
    f1 = 2 * p * r / (p + r) if p and r else (0.0 if p is not None and r is not None else None)
    return {"tp": tp, "fp": fp, "fn": fn, "precision": p, "recall": r, "f1": f1}


def pair_figures(decisions: dict[str, np.ndarray], labels: Sequence[bool], kinds: Sequence[str] | None = None,
                 jaccards: np.ndarray | None = None, threshold: float | None = None) -> dict:
    """P/R/F1 of each decision (name -> bool per pair) against ``labels``; recall per kind of
    positive pair (e.g. the edit that made the near-duplicate); positives below the threshold
    in exact Jaccard (what no threshold-faithful decision can find)."""
    gold = np.asarray(labels, bool)
    names = list(decisions)
    per = {x: prf(np.asarray(decisions[x], bool), gold) for x in names}
    out: dict[str, Any] = {"pairs": len(gold), "positives": int(gold.sum()), "negatives": int((~gold).sum()),
                           "threshold": threshold, "decisions": per}
    rows = [[x, v["tp"], v["fp"], v["fn"], pct(v["precision"]), pct(v["recall"]),
             "-" if v["f1"] is None else f"{v['f1']:.3f}"] for x, v in per.items()]
    tables = [table(f"near-duplicate pairs: {out['positives']} duplicate, {out['negatives']} distinct"
                    + (f" (threshold {threshold})" if threshold is not None else ""),
                    ["decision", "TP", "FP", "FN", "precision", "recall", "F1"], rows)]
    if jaccards is not None and threshold is not None:
        out["positives_below_threshold"] = int((gold & (jaccards < threshold)).sum())
        out["negatives_at_or_above_threshold"] = int((~gold & (jaccards >= threshold)).sum())
    if kinds is not None:
        kinds_a = np.asarray(kinds, object)
        by_kind = {}
        for k in sorted(set(kinds_a[gold].tolist()), key=str):
            sel = gold & (kinds_a == k)
            by_kind[k] = {"pairs": int(sel.sum()),
                          **({"median_jaccard": round(float(np.median(jaccards[sel])), 3)} if jaccards is not None else {}),
                          **{x: float(np.asarray(decisions[x], bool)[sel].mean()) for x in names}}
        out["recall_per_kind"] = by_kind
        tables.append(table("recall per kind of duplicate", ["kind", "pairs"]
                            + (["median Jaccard"] if jaccards is not None else []) + names,
                            [[k, v["pairs"], *([v["median_jaccard"]] if jaccards is not None else []),
                              *[pct(v[x]) for x in names]] for k, v in by_kind.items()]))
    out["tables"] = tables
    return out
