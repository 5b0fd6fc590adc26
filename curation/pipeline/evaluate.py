"""``refinery eval``: a run's stages measured on labelled data (the figures are computed by
``curation.quality.evaluate``; this module finds the stage, its documents and the labels).

A target is ``RUN/STAGE`` (a stage of a run directory, as run: its configuration from the
run's ``dag.yaml``), ``RUN`` (the run's stages of the kind evaluated), or ``DAG.yaml[:STAGE]``
(a pipeline file not run yet). Reports go to ``RUN/STAGE/_eval_<kind>.json`` when the target is
a run's stage (the latest one per stage and kind), and wherever ``--json`` says.

- ``decontam``: eval items of the stage's own eval sets, planted in the stage's kept documents
  in every leak form; recall per form, false drops on the kept documents themselves,
  look-alikes flagged (``--negatives``).
- ``rules``: a labelled JSONL/Parquet (``text``, ``lang``, ``label`` natural/unnatural,
  optional ``form``) through the target's per-language filter stages (every stage with
  ``lang_config``, in DAG order) or the stock Gopher repetition -> Gopher quality -> FineWeb
  chain, with ``lang_config`` variants side by side.
- ``langid``: a labelled file (``text``, ``lang``) through the target's ``langid`` stage (or the
  stock one): accuracy per language.
- ``dedup``: labelled pairs (``a``/``b`` ids with ``--docs`` or the run's own rows, or
  ``text_a``/``text_b``; ``label``; optional ``kind``) against the target's ``minhash_dedup``
  configuration: LSH collision, collision + exact Jaccard, exact Jaccard alone (with
  ``partner_check``, collision + exact Jaccard >= threshold - slack: a pair alone is a
  two-document cluster), and, for a run whose rows hold the pairs' documents, the run's own
  clusters (where the partner check splits chained clusters).
- ``extract``: extraction engines side by side, against gold sets or on a run's own pages
  (``curation.pipeline.evaluate_extract``).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from curation.io import files, location
from curation.io.evalsets import base_name, open_text
from curation.pipeline.dag import Dag, load_dag
from curation.pipeline.rundir import RunDir, stage_of
from curation.quality import evaluate as ev
from curation.stages.base import Stage


class EvalError(ValueError):
    pass


#: a run stage's latest report of one kind (``refinery eval`` overwrites it)
REPORT = "_eval_{kind}.json"


# -- targets -----------------------------------------------------------------------------------


class Target:
    """What ``refinery eval`` measures: a DAG (a run's or a file's) and optionally one stage."""

    def __init__(self, dag: Dag, stage: str | None, run: RunDir | None, label: str):
        self.dag, self.stage, self.run, self.label = dag, stage, run, label

    def stages_of(self, want) -> list[tuple[str, Stage]]:
        """``(name, stage)`` of the DAG's stages passing ``want``, in DAG order; with a stage
        named, that stage's chain of map stages back to the input (the stage included)."""
        if self.stage is None:
            return [(n, s) for n, s in self.dag.stages.items() if want(s)]
        chain, node = [], self.stage
        while node in self.dag.stages:
            st = self.dag.stages[node]
            if want(st):
                chain.append((node, st))
            if st.kind != "map":
                break
            node = st.input
        return chain[::-1]

    def write(self, kind: str, report: dict) -> str | None:
        if self.run is None or self.stage is None:
            return None
        name = REPORT.format(kind=kind)
        self.run.write_report(self.stage, name, report)
        return self.run.report_path(self.stage, name)


def open_target(spec: str | None) -> Target | None:
    if spec is None:
        return None
    raw = str(spec)
    path, _, stage = raw.partition(":") if raw.split(":", 1)[0].endswith((".yaml", ".yml")) else (raw, "", "")
    if path.endswith((".yaml", ".yml")):
        dag = load_dag(Path(path))
        if stage and stage not in dag.stages:
            raise EvalError(f"{path}: no stage {stage!r} (stages: {', '.join(dag.stages)})")
        return Target(dag, stage or None, None, raw)
    hit = stage_of(raw)
    if hit is not None:
        rd, node = hit
        return Target(rd.load_dag(), node, rd, raw)
    rd = RunDir(raw)
    if not rd.exists():
        raise EvalError(f"{raw}: neither RUN/STAGE, a run directory nor a DAG file (.yaml[:STAGE])")
    return Target(rd.load_dag(), None, rd, raw)


def the_stage(target: Target | None, stype: str, default: Stage | None = None) -> tuple[str | None, Stage]:
    """The target's one stage of type ``stype`` (the one named, or the only one)."""
    if target is None:
        if default is None:
            raise EvalError(f"name a {stype} stage: RUN/STAGE or DAG.yaml:STAGE")
        return None, default
    if target.stage is not None:
        st = target.dag.stages[target.stage]
        if st.type != stype:
            raise EvalError(f"{target.label}: a {st.type} stage, not {stype}")
        return target.stage, st
    found = [(n, s) for n, s in target.dag.stages.items() if s.type == stype]
    if len(found) != 1:
        raise EvalError(f"{target.label}: {len(found)} {stype} stages; name one as RUN/STAGE")
    target.stage = found[0][0]
    return found[0]


def stage_documents(target: Target, limit: int, seed: int = 0, columns: Sequence[str] = ("text",)) -> pa.Table:
    """Up to ``limit`` of the target stage's kept documents (a pseudo-random sample by id hash)."""
    if target.run is None:
        raise EvalError(f"{target.label}: a run's stage is needed (its kept documents are the hosts)")
    con = target.run.connect(views=[target.stage])
    cols = ", ".join(f'"{c}"' for c in columns)
    q = (f'select {cols} from "{target.stage}" where text is not null '
         f"order by md5(coalesce(cast(id as varchar), '') || '{int(seed)}') limit {int(limit)}")
    return con.sql(q).to_arrow_table()


# -- labelled files ----------------------------------------------------------------------------


def read_labelled(path: str | Path) -> list[dict]:
    """Rows of a JSONL (.gz/.xz/.bz2/.zst) or Parquet file."""
    p = Path(path)
    if not p.is_file():
        raise EvalError(f"{path}: no such file")
    if base_name(p).endswith(".parquet"):
        return pq.read_table(p).to_pylist()
    with open_text(p) as f:
        return [json.loads(line) for line in f if line.strip()]


def _field(rows: list[dict], field: str, path: Any) -> list:
    if rows and field not in rows[0]:
        raise EvalError(f"{path}: rows have no {field!r} field (fields: {', '.join(rows[0])})")
    return [r.get(field) for r in rows]


def save(report: dict, json_out: str | Path | None, target: Target | None, kind: str) -> dict:
    """Write ``report`` into the target stage's folder (a run's) and to ``json_out``; the
    returned report lists where under ``written`` (not in the files)."""
    written = [w for w in (target.write(kind, report) if target else None,) if w]
    if json_out:
        files.write_json(str(json_out), report)
        written.append(str(json_out))
    return {**report, "written": written}


# -- decontamination ---------------------------------------------------------------------------


def decontam_flagger(stage: Any, batch: int = 256) -> ev.Flagger:
    """A ``decontaminate`` stage as a ``Flagger``: a text is flagged when it has at least
    ``min_overlaps`` verified windows (so ``remove_spans``, which keeps the document, counts)."""
    def flag(texts: list[str]) -> tuple[list[bool], list[set]]:
        got: list[bool] = []
        matched: list[set] = []
        for i in range(0, len(texts), batch):
            res = stage.process(pa.table({stage.text_field: pa.array(texts[i:i + batch], pa.string())}))
            ov = res.table.column("decontam_overlaps").to_pylist()
            got += [(x or 0) >= stage.min_overlaps for x in ov]
            matched += [{(m["benchmark"], m["item"]) for m in (ms or [])}
                        for ms in res.table.column("decontam_matches").to_pylist()]
        return got, matched
    return flag


def eval_decontam(target_spec: str, plant: int = 50, hosts: int = 1000, seed: int = 0,
                  forms: Sequence[str] | None = None, negatives: str | None = None,
                  negatives_field: str | list[str] = "text", eval_dir: str | None = None,
                  json_out: str | None = None, clean: str | None = None,
                  clean_field: str | list[str] = "text") -> dict:
    """Plant up to ``plant`` items of each of the stage's eval sets, in every leak form, in its
    kept documents (up to ``hosts``); recall per form, false drops, look-alikes flagged."""
    from curation.io.benchmarks import file_items
    from curation.text.decontam import words_of

    target = open_target(target_spec)
    name, st = the_stage(target, "decontaminate")
    if eval_dir is not None:
        st = type(st).model_validate({**st.model_dump(), "eval_dir": eval_dir})
    bad = [f for f in forms or () if f not in ev.LEAK_FORMS]
    if bad:
        raise EvalError(f"unknown leak form {bad[0]!r} (forms: {', '.join(ev.LEAK_FORMS)})")
    st.setup()
    items = st.items()
    n_words = np.diff(words_of(pa.array([it.texts[0] for it in items], pa.string())).doc_tok)
    rng = random.Random(seed)
    chosen, too_short = [], 0
    for b in dict.fromkeys(it.benchmark for it in items):
        mine = [k for k, it in enumerate(items) if it.benchmark == b]
        ok = [k for k in mine if n_words[k] >= st.min_words]
        too_short += len(mine) - len(ok)
        chosen += [(b, items[k].item, items[k].texts[0]) for k in sorted(rng.sample(ok, min(plant, len(ok))))]
    host_texts = [t for t in stage_documents(target, hosts, seed).column("text").to_pylist() if t and t.strip()]
    neg = [t for it in file_items(negatives, negatives_field) for t in it.texts[:1]] if negatives else []
    # false drops on documents the stage never judged (``clean``): its own kept documents cannot show one
    clean_texts = [t for it in file_items(clean, clean_field) for t in it.texts[:1]] if clean else None
    rep = ev.decontam_figures(decontam_flagger(st), chosen, host_texts, forms=forms, seed=seed, negatives=neg,
                              negatives_name="negatives", clean=clean_texts, hosts_independent=False)
    rep.update(kind="decontam", target=target.label, stage=name, mode=st.mode, ngram=st.ngram,
               eval_sets=st.eval_sets, eval_paths=[Path(p).name for p in st.eval_paths],
               items_too_short_skipped=too_short, negatives_file=negatives, clean_file=clean)
    return save(rep, json_out, target, "decontam")


# -- rules -------------------------------------------------------------------------------------

#: the stock chain of per-language rule stages (Gopher repetition -> Gopher quality -> FineWeb)
STOCK_RULES = ("gopher_repetition", "gopher_quality", "fineweb_quality")


def chain_kept(stages: Sequence[Any], batch: pa.Table) -> np.ndarray:
    """Which rows of ``batch`` survive ``stages`` one after the other (each sees the survivors
    of the previous, with the text state passed along as the executor does)."""
    keep = np.ones(batch.num_rows, bool)
    idx = np.arange(batch.num_rows)
    text = None
    for st in stages:
        res = st.run_batch(batch, text)
        if res.reasons is None:
            k = np.ones(batch.num_rows, bool)
        else:
            k = pc.is_null(res.reasons).to_numpy(zero_copy_only=False)
        keep[idx[~k]] = False
        idx = idx[k]
        batch = res.table.filter(pa.array(k))
        text = res.text.take(np.flatnonzero(k)) if res.text is not None else None
        if not len(idx):
            break
    return keep


def _with(st: Stage, **update: Any) -> Stage:
    return type(st).model_validate({**st.model_dump(exclude_none=True), **update})


def rule_configs(target: Target | None, lang_configs: Sequence[str]) -> dict[str, list[Stage]]:
    from curation.stages.base import registry

    if target is not None:
        chain = target.stages_of(lambda s: "lang_config" in type(s).model_fields)
        if not chain:
            raise EvalError(f"{target.label}: no stage with per-language rules (lang_config) to evaluate")
        out = {"as run": [s for _, s in chain]}
        from curation.text import lang_rules

        for lc in lang_configs:  # a stage the preset has no values for keeps English rules
            has = set(lang_rules.preset_stages(lc)) if lc != "english" else set()
            out[lc] = [_with(s, lang_config=lc if s.type in has else None, by_lang=None) for _, s in chain]
        return out
    stock = [registry[t] for t in STOCK_RULES]
    return {lc: [cls(type=t, **({} if lc == "english" else {"lang_config": lc})) for t, cls in zip(STOCK_RULES, stock)]
            for lc in (lang_configs or ("english", "fineweb2"))}


def eval_rules(labelled: str, target_spec: str | None = None, lang_configs: Sequence[str] = (),
               text_field: str = "text", lang_field: str = "lang", label_field: str = "label",
               form_field: str = "form", json_out: str | None = None) -> dict:
    """Kept share per label and language of the target's rule stages (or the stock chain) on
    labelled pages, beside ``lang_configs`` variants (``english`` = no per-language rules)."""
    from curation.text import lang_rules

    target = open_target(target_spec)
    rows = read_labelled(labelled)
    texts, langs = _field(rows, text_field, labelled), _field(rows, lang_field, labelled)
    natural = [ev.is_natural(x) for x in _field(rows, label_field, labelled)]
    forms = [r.get(form_field) or ("natural" if n else "unnatural") for r, n in zip(rows, natural)]
    n = len(rows)
    batch = pa.table({"id": [str(i) for i in range(n)], "text": pa.array(texts, pa.string()),
                      "source": ["eval"] * n, "lang": pa.array(langs, pa.string())})
    configs = rule_configs(target, lang_configs)
    kept = {name: chain_kept(stages, batch) for name, stages in configs.items()}
    rep = ev.rules_figures(kept, langs, natural, forms, entry=lang_rules.has_own_entry)
    rep.update(kind="rules", labelled=str(labelled), target=target.label if target else None,
               stages={name: [s.type for s in stages] for name, stages in configs.items()})
    if target is not None and target.stage is None and target.run is not None:
        target.stage = target.stages_of(lambda s: "lang_config" in type(s).model_fields)[-1][0]
    return save(rep, json_out, target, "rules")


# -- language ID -------------------------------------------------------------------------------


def eval_langid(labelled: str, target_spec: str | None = None, text_field: str = "text", lang_field: str = "lang",
                json_out: str | None = None) -> dict:
    from curation.quality.langid import normalize_lang
    from curation.stages.base import registry

    target = open_target(target_spec)
    name, st = the_stage(target, "langid", default=registry["langid"](type="langid"))
    rows = read_labelled(labelled)
    gold = [normalize_lang(x) or str(x) for x in _field(rows, lang_field, labelled)]
    batch = pa.table({"id": [str(i) for i in range(len(rows))], "text": pa.array(_field(rows, text_field, labelled), pa.string()),
                      "source": ["eval"] * len(rows)})
    st.setup()
    res = st.run_batch(batch)
    pred = res.table.column("lang").to_pylist()
    kept = None if res.reasons is None else pc.is_null(res.reasons).to_numpy(zero_copy_only=False)
    rep = ev.langid_figures(gold, pred, kept)
    rep.update(kind="langid", labelled=str(labelled), target=target.label if target else None, stage=name,
               keep=st.keep, min_score=st.min_score, model=st.model)
    return save(rep, json_out, target, "langid")


# -- near-duplicate pairs ----------------------------------------------------------------------


def _run_rows(target: Target, ids: set[str]) -> tuple[dict[str, str], dict[str, int]]:
    """Texts and clusters of the stage's rows (kept and rejected) whose id, or id without its
    input prefix (``docs/x`` for ``x``), is in ``ids``."""
    con = target.run.connect(views=[target.stage, "rejected"])
    texts, cluster = {}, {}
    kept = con.execute(f'select id, text, dup_cluster from "{target.stage}"').fetchall()
    stage_sql = target.stage.replace("'", "''")
    rej = con.sql(f"select * from rejected where stage = '{stage_sql}'").to_arrow_table()
    rows = list(kept)
    if rej.num_rows:
        cols = rej.column_names
        cl = (rej.column("dup_cluster").to_pylist() if "dup_cluster" in cols else
              [int(r.rsplit("=", 1)[1]) if r and "=" in r else None for r in rej.column("reason").to_pylist()])
        rows += list(zip(rej.column("id").to_pylist(),
                         rej.column("text").to_pylist() if "text" in cols else [None] * rej.num_rows, cl))
    for rid, text, c in rows:
        for key in (rid, rid.split("/", 1)[1] if rid and "/" in rid else None):
            if key in ids:
                if text is not None:
                    texts[key] = text
                if c is not None:
                    cluster[key] = int(c)
    return texts, cluster


def eval_dedup(pairs: str, target_spec: str | None = None, docs: Sequence[str] = (), id_field: str = "id",
               text_field: str = "text", json_out: str | None = None) -> dict:
    """P/R/F1 of the target's ``minhash_dedup`` configuration (or the stock one) on labelled pairs."""
    from curation.stages.base import registry

    target = open_target(target_spec)
    name, st = the_stage(target, "minhash_dedup", default=registry["minhash_dedup"](type="minhash_dedup"))
    rows = read_labelled(pairs)
    labels = [ev.is_natural(x) for x in _field(rows, "label", pairs)]
    kinds = [r.get("kind") or ("duplicate" if lab else "distinct") for r, lab in zip(rows, labels)]
    by_text = rows and "text_a" in rows[0]
    cluster: dict[str, int] = {}
    if by_text:
        ta, tb = _field(rows, "text_a", pairs), _field(rows, "text_b", pairs)
    else:
        a, b = [str(x) for x in _field(rows, "a", pairs)], [str(x) for x in _field(rows, "b", pairs)]
        want = set(a) | set(b)
        texts: dict[str, str] = {}
        for d in docs:
            for r in read_labelled(d):
                if str(r.get(id_field)) in want:
                    texts[str(r[id_field])] = r[text_field]
        if target is not None and target.run is not None and name is not None:
            run_texts, cluster = _run_rows(target, want)
            for k, v in run_texts.items():
                texts.setdefault(k, v)
        missing = sorted(want - set(texts))
        if missing:
            raise EvalError(f"{pairs}: {len(missing)} document ids not found (e.g. {missing[0]!r}); "
                            "give --docs files holding them, or a run whose rows hold them")
        ta, tb = [texts[x] for x in a], [texts[x] for x in b]
    bands, rws = st.band_rows()
    partner = bool(getattr(st, "partner_check", False))
    dec = ev.pair_decisions(ta, tb, st.hasher(), bands, rws, st.threshold,
                            partner_floor=st.partner_floor() if partner else None)
    jac = dec.pop("jaccard")
    decisions = {"lsh": dec["lsh"], "lsh+verify": dec["lsh+verify"], "jaccard>=t": dec["jaccard>=t"]}
    stage_key = "lsh+verify" if st.verify_jaccard else "lsh"
    if partner:  # a pair alone is a two-document component, judged by the stage's own partner code
        decisions["lsh+partner"] = decisions[stage_key] & dec["lsh+partner"]
        stage_key = "lsh+partner"
    decisions = {("stage: " if k == stage_key else "") + k: v for k, v in decisions.items()}
    if cluster and not by_text:
        if all(x in cluster for x in a + b):
            decisions["run clusters"] = np.array([cluster[x] == cluster[y] for x, y in zip(a, b)])
    rep = ev.pair_figures(decisions, labels, kinds, jac, st.threshold)
    rep.update(kind="dedup", pairs_file=str(pairs), target=target.label if target else None, stage=name,
               ngram=st.ngram, num_perm=st.num_perm, bands=bands, rows=rws, verify_jaccard=st.verify_jaccard,
               **({"partner_check": True, "partner_slack": st.partner_slack} if getattr(st, "partner_check", False)
                  else {}))
    return save(rep, json_out, target, "dedup")



# -- reports in a run --------------------------------------------------------------------------


def _figure(name: str, value: Any, unit: str = "share") -> dict:
    """One headline figure: ``unit`` is ``share`` (0..1), ``count`` or ``rate`` (per second)."""
    return {"name": name, "value": value, "unit": unit}


def headline(report: dict) -> list[dict]:
    """The few figures that sum a report up (what a dashboard row shows), by its ``kind``."""
    kind = report.get("kind")
    if kind == "decontam":
        return [_figure("recall, all forms", report.get("recall_all")),
                _figure("false drops", (report.get("false_drops") or {}).get("rate")),
                _figure("planted", report.get("planted"), "count"),
                _figure("docs/s", report.get("docs_per_s"), "rate")]
    if kind == "rules":
        every = (report.get("languages") or {}).get("all") or {}
        return [f for c in report.get("configs") or []
                for f in (_figure(f"{c}: natural kept", (every.get(c) or {}).get("natural_kept")),
                          _figure(f"{c}: unnatural caught", (every.get(c) or {}).get("unnatural_caught")))]
    if kind == "langid":
        return [_figure("accuracy", report.get("accuracy")), _figure("documents", report.get("documents"), "count")]
    if kind == "extract":  # --ab on a run: words each engine keeps, pages it leaves empty
        engines = report.get("engines") or {}
        return [f for e in report.get("engine_order") or list(engines) if isinstance(engines.get(e), dict)
                for f in (_figure(f"{e}: words/page", engines[e].get("words_per_page"), "count"),
                          _figure(f"{e}: empty", engines[e].get("empty_share")))]
    if kind == "dedup":
        out = [_figure("pairs", report.get("pairs"), "count")]
        for name, d in (report.get("decisions") or {}).items():
            if name.startswith("stage: ") or name == "run clusters":
                out += [_figure(f"{name} precision", d.get("precision")), _figure(f"{name} recall", d.get("recall"))]
        return out
    return []


def run_reports(run: RunDir) -> list[dict]:
    """The eval reports in a run directory, each stage's latest of each kind: ``stage``,
    ``kind``, ``modified`` (when it was written, epoch seconds), ``target`` (``RUN/STAGE`` when
    it is this run's stage), its ``headline``
    figures and its ``tables`` (what ``refinery eval`` printed). In DAG order, the newest first
    within a stage. A report that is not JSON is listed with an ``error``; a file that leads
    outside the run directory is not read."""
    out = []
    for stage in run.load_dag().stages:
        if stage.startswith(".") or "/" in stage:
            continue
        found = []
        prefix, suffix = REPORT.split("{kind}")
        for path in location.listdir(run.stage_dir(stage), REPORT.format(kind="*")):
            kind = location.name(path)[len(prefix):-len(suffix)]
            entry: dict[str, Any] = {"stage": stage, "kind": kind, "file": f"{stage}/{location.name(path)}",
                                     "modified": None}
            try:
                if not run.remote:
                    real = Path(path).resolve()
                    if not str(real).startswith(str(Path(run.root).resolve()) + "/"):
                        continue
                    entry["modified"] = real.stat().st_mtime
                else:
                    fs, p = location.fs_path(path)
                    when = fs.info(p).get("LastModified")
                    entry["modified"] = when.timestamp() if hasattr(when, "timestamp") else None
                report = json.loads(location.read_text(path))
                if not isinstance(report, dict):
                    raise ValueError("not a JSON object")
            except (OSError, ValueError) as e:
                found.append({**entry, "error": f"unreadable report: {type(e).__name__}"})
                continue
            target = report.get("target")
            if isinstance(target, str) and target.startswith(run.root + "/"):
                target = "RUN/" + target[len(run.root) + 1:]  # the run's own stage, not this machine's path
            found.append({**entry, "kind": report.get("kind") or kind, "target": target,
                          "headline": headline(report), "tables": report.get("tables") or []})
        out += sorted(found, key=lambda e: -(e["modified"] or 0))
    return out
