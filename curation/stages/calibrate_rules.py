"""``calibrate_rules``: per-language thresholds for the heuristic filters, calibrated on the
run's own documents the way FineWeb-2 did it, written to ``RUN/STAGE/_calibration.json``.

```yaml
calibrate: {type: calibrate_rules, input: langid}            # base: auto, min_docs: 100
filters:   {type: gopher_quality, input: ..., lang_config: runs/x/calibrate/_calibration.json}
```

For each language of the input (its ``lang`` column, as ``langid`` writes it) that has no entry
of its own in the ``base`` preset (all of them with ``all_languages: true``) and at least
``min_docs`` documents, each threshold in ``fields`` is set where that language loses the share
of its documents that the ``reference`` language (English) loses to the same rule at its own
threshold (the stage's own field, or the base preset's ``en`` entry): a quantile of the
language's signal (``curation.text.calibrate``). A rule the preset switched off for a language
of its own (FineWeb-2's ``line_punct_thr: -1``) stays off. A language with fewer documents keeps the
base's entry (the preset's, or the median ``fallback`` for a language without one), the reason
recorded. Stop words: a language whose base entry has no list (and that splits at spaces) gets
the ``stop_words`` most frequent words of its documents (a bounded top-k count per block,
merged), with ``min_stop_words: 2`` as FineWeb-2; its stop-word share rule is then calibrated
with that list.

**The file** is a preset in the shipped presets' format (``curation/text/data/lang_rules/``):
``base`` (the preset it overlays, like ``auto`` over ``fineweb2``) and ``languages`` (language
-> filter type -> fields), plus ``calibration``: the reference language, its documents and the
share it loses per threshold, and per language its documents, its status (``calibrated``,
``preset``, ``fallback``, ``reference``), the reason, its corpus-derived stop words and, per
threshold, the value chosen, the base's value and the share it drops (``achieved_share``, exact
on the histogram). **A filter uses it by path**: ``lang_config: RUN/STAGE/_calibration.json``,
in a later DAG or a rerun, on this corpus or another: the file is read when the DAG is
validated and its values go into the filter's params hash (its digest, not its path: moving it
reruns nothing), and changing only thresholds re-decides stored signals (the stop words are
signal parameters). A downstream filter of the same DAG cannot name the file of a run that has
not happened: run the calibration first (``pipelines/calibrate-lang.yaml``), then the filters.

Phases, one task per block of upstream shards (``curation.io.shards.blocks``); nothing per
document reaches the driver: ``words`` (per language: documents and its words' top-k counts,
only for languages that need a list), ``signals`` (the filters' signals measured with the
base's views and the derived stop words, as fixed-size histograms per language and threshold,
and the reference language's exact drops), ``copy`` (the input rows, unchanged, as this
stage's shards: a filter may follow it in the same DAG, with any ``lang_config``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, field_validator, model_validator

from curation.io import location
from curation.io.shards import blocks
from curation.stages.base import GlobalStage, Resources, registry
from curation.stages.paths import PathParam
from curation.stages.context import ShardSink, StageContext
from curation.text import calibrate as cal
from curation.text import lang_rules
from curation.text.state import TextState

REPORT = "_calibration.json"

#: the thresholds calibrated by default: those FineWeb-2 set per language, and the stop-word
#: share of ``lang_config: auto``
DEFAULT_FIELDS: dict[str, tuple[str, ...]] = {
    "gopher_repetition": ("dup_line_frac", "top_n_grams", "dup_n_grams"),
    "gopher_quality": ("min_avg_word_length", "max_avg_word_length", "min_alpha_words_ratio", "min_stop_words_frac"),
    "fineweb_quality": ("line_punct_thr", "new_line_ratio"),
}
#: languages written without spaces whose "words" (space-separated phrases) make no stop words
NO_DERIVED_STOP_WORDS = frozenset({"th", "lo", "km", "my", "bo", "dz"})


def _specs(stage: Any, fields: tuple[str, ...]) -> list[cal.FieldSpec]:
    """The thresholds of ``fields`` in the stage's rule table, as calibration specs."""
    out = []
    for rule in stage.rules:
        for i, param in enumerate(rule.params):
            if param not in fields:
                continue
            op = {"<": "<", ">": ">", "< unless 0": "<"}.get(rule.op) or ("<" if i == 0 else ">")
            if rule.op not in ("<", ">", "< unless 0", "outside"):
                raise ValueError(f"{stage.type}.{param}: a {rule.op!r} rule is not calibrated")
            value = getattr(stage, param)
            if isinstance(value, dict):
                out += [cal.spec(stage.type, param, str(n), rule.signal.format(n=n), op) for n in value]
            else:
                out.append(cal.spec(stage.type, param, None, rule.signal, op))
    return out


def _value(stage: Any, s: cal.FieldSpec) -> float | None:
    v = getattr(stage, s.field)
    if s.key is not None:
        v = {str(k): x for k, x in (v or {}).items()}.get(s.key)
    return None if v is None else float(v)


def _rows(paths: tuple[str, ...]) -> pa.Table:
    return pa.concat_tables([location.read_parquet(p, columns=["text", "lang"]) for p in paths]).combine_chunks()


def _by_lang(table: pa.Table) -> dict[str, np.ndarray]:
    """Row indices (ascending) per language of the ``lang`` column (null as ""), languages in
    sorted order: one dictionary encoding and one sort, no Python object per document."""
    enc = pc.fill_null(table.column("lang").cast(pa.string()), "").combine_chunks().dictionary_encode()
    names, codes = enc.dictionary.to_pylist(), enc.indices.to_numpy()
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    return {names[c]: order[bounds[c]:bounds[c + 1]] for c in sorted(range(len(names)), key=names.__getitem__)}


@dataclass(frozen=True)
class WordsJob:
    paths: tuple[str, ...]
    listed: frozenset[str]  # languages that have a stop-word list: no words counted
    k: int


def words_task(job: WordsJob) -> dict[str, list]:
    """Phase ``words``, one block: per language, [documents, top-k word counts or {}]."""
    table = _rows(job.paths)
    out: dict[str, list] = {}
    for lang, idx in _by_lang(table).items():
        counts: dict[str, int] = {}
        if lang and lang not in job.listed:
            texts = table.column("text").take(pa.array(idx)).combine_chunks()
            words = (lang_rules.char_words(texts) if lang_rules.default_words(lang) == "chars"
                     else TextState(texts).words)
            keep = words.alpha & ~words.symbol
            counts = cal.top_words(words.values().filter(pa.array(keep)), job.k)
        out[lang] = [len(idx), counts]
    return out


def _merge_words(k: int):
    def fold(acc: dict | None, part: dict) -> dict:
        acc = acc or {}
        for lang, (n, counts) in part.items():
            m, c = acc.get(lang, [0, {}])
            acc[lang] = [m + n, cal.merge_top(c, counts, k)]
        return acc
    return fold


@dataclass(frozen=True)
class SignalsJob:
    paths: tuple[str, ...]
    stages: tuple[Any, ...]  # the measuring filter stages (base preset, derived stop words)
    specs: tuple[cal.FieldSpec, ...]
    targets: frozenset[str]  # languages histogrammed
    reference: str
    ref_thresholds: tuple[tuple[str, float], ...]  # spec name -> the reference's threshold
    bins: int


def signals_task(job: SignalsJob) -> dict:
    """Phase ``signals``, one block: per target language its documents and a histogram per
    threshold; the reference language's documents each threshold drops."""
    table = _rows(job.paths)
    wanted = [idx for lang, idx in _by_lang(table).items() if lang in job.targets or lang == job.reference]
    out: dict[str, Any] = {"docs": {}, "hist": {}, "ref_drop": {}}
    if not wanted:
        return out
    table = table.take(pa.array(np.sort(np.concatenate(wanted))))
    text = None
    measured = table
    for stage in job.stages:  # in the DAG's order; one text state, words split once
        measured, text = stage.measure(measured, text)
        if stage.rewrites_text:
            text = None
    ref = dict(job.ref_thresholds)
    for lang, idx in _by_lang(table).items():
        rows = pa.array(idx)
        out["docs"][lang] = len(rows)
        cols = {}
        for s in job.specs:
            if s.signal not in cols:
                cols[s.signal] = measured.column(s.signal).take(rows).to_numpy(zero_copy_only=False).astype(np.float64)
        if lang in job.targets:
            out["hist"][lang] = {s.name: cal.histogram(cols[s.signal], s, job.bins).tolist() for s in job.specs}
        if lang == job.reference:
            out["ref_drop"] = {s.name: cal.dropped(cols[s.signal], s.op, ref[s.name]) for s in job.specs
                               if s.name in ref}
    return out


def _merge_signals(acc: dict | None, part: dict) -> dict:
    acc = acc or {"docs": {}, "hist": {}, "ref_drop": {}}
    for lang, n in part["docs"].items():
        acc["docs"][lang] = acc["docs"].get(lang, 0) + n
    for lang, hists in part["hist"].items():
        mine = acc["hist"].setdefault(lang, {})
        for name, h in hists.items():
            mine[name] = (np.asarray(mine[name], np.int64) + np.asarray(h, np.int64)) if name in mine \
                else np.asarray(h, np.int64)
    for name, n in part["ref_drop"].items():
        acc["ref_drop"][name] = acc["ref_drop"].get(name, 0) + n
    return acc


@dataclass(frozen=True)
class CopyJob:
    outs: tuple[ShardSink, ...]
    paths: tuple[str, ...]


def copy_task(job: CopyJob) -> list[dict]:
    """Phase ``copy``, one block: each input shard's rows as this stage's shard."""
    out = []
    for sink, path in zip(job.outs, job.paths):
        table = location.read_parquet(path)
        out.append(sink.write(table, None, table.num_rows))
    return out


@registry.register("calibrate_rules")
class CalibrateRules(GlobalStage):
    """Per-language filter thresholds calibrated on the run's documents (FineWeb-2's method),
    written to ``RUN/STAGE/_calibration.json``, which filters read with ``lang_config: PATH``.
    Passes its input rows on unchanged. See the module docstring."""

    type: Literal["calibrate_rules"] = "calibrate_rules"
    #: the preset (or a calibration file) the result overlays; its entries are what a language
    #: keeps when it is not calibrated, and how every language is measured
    base: Annotated[str, PathParam(when=lang_rules.is_file)] = "auto"
    #: filter type -> that filter's own (English) parameters, as in a DAG
    filters: dict[str, dict[str, Any]] = Field(default_factory=lambda: {t: {} for t in DEFAULT_FIELDS})
    #: filter type -> threshold fields to calibrate (default ``DEFAULT_FIELDS``)
    fields: dict[str, list[str]] | None = None
    #: the language whose loss to each rule the others match
    reference: str = "en"
    #: spec name (``gopher_quality.min_alpha_words_ratio``, ``gopher_repetition.top_n_grams.2``)
    #: -> the reference's threshold, where not the filter's own / the base's ``reference`` entry
    reference_thresholds: dict[str, float] = Field(default_factory=dict)
    #: fewer documents: the language keeps the base's entry (reason recorded)
    min_docs: int = Field(100, ge=1)
    #: also calibrate languages that have an entry of their own in the base preset
    all_languages: bool = False
    #: only these languages (default: every language of the input)
    languages: list[str] | None = None
    #: corpus-derived stop words per language without a list (0: none derived)
    stop_words: int = Field(20, ge=0)
    #: words counted per language and block (the bounded top-k)
    sketch_size: int = Field(1000, ge=1)
    bins: int = Field(cal.BINS, ge=10, le=100_000)
    resources: ClassVar[Resources] = Resources(cpus=1)

    @field_validator("base")
    @classmethod
    def _known_base(cls, v: str) -> str:
        if lang_rules.is_file(v):
            from pathlib import Path  # noqa: PLC0415

            v = str(Path(v).expanduser().resolve())
        lang_rules.preset(v)  # unknown name / missing file: said here
        return v

    @model_validator(mode="after")
    def _known_filters(self) -> CalibrateRules:
        for t, fields in self.field_map().items():
            cls = registry.get(t)
            if cls is None or not hasattr(cls, "lang_table"):
                raise ValueError(f"filters.{t}: not a filter with per-language rules "
                                 "(gopher_quality, gopher_repetition, fineweb_quality)")
            params = {**self.filters.get(t, {}), "lang_config": self.base}
            stage = cls(**params)
            known = {p for r in stage.rules for p in r.params}
            bad = [f for f in fields if f not in known]
            if bad:
                raise ValueError(f"fields.{t}.{bad[0]}: not a threshold of {t} ({', '.join(sorted(known))})")
        return self

    def field_map(self) -> dict[str, tuple[str, ...]]:
        if self.fields is not None:
            return {t: tuple(f) for t, f in self.fields.items()}
        return {t: DEFAULT_FIELDS.get(t, ()) for t in self.filters}

    def params(self) -> dict[str, Any]:
        p = super().params()
        if lang_rules.is_file(self.base):
            p["base"] = {"file_sha256": lang_rules.sha256(self.base)}
        return p

    # -- the run --------------------------------------------------------------------------------

    def _stage(self, t: str, by_lang: dict | None = None, stop_frac: bool = False) -> Any:
        params = {**self.filters.get(t, {}), "lang_config": self.base}
        if by_lang:
            params["by_lang"] = by_lang
        if stop_frac and params.get("min_stop_words_frac") is None:
            params["min_stop_words_frac"] = 0.0  # measured for every row (the reference's own cut applies)
        return registry[t](**params)

    def run(self, ctx: StageContext) -> None:
        keys = [k for k, _ in ctx.upstream]
        paths = [p for _, p in ctx.upstream]
        if ctx.finished(keys, REPORT):
            return
        missing = [p for p in paths[:1] if not {"text", "lang"} <= set(location.read_schema(p).names)]
        if missing:
            raise ValueError(f"{ctx.name}: calibrate_rules needs 'text' and 'lang' columns (put a langid stage "
                             f"upstream); {missing[0]} has {location.read_schema(missing[0]).names}")
        spans = blocks(location.sizes(paths))
        base = lang_rules.preset(self.base)
        root = lang_rules.root_preset(self.base)
        ref_stages = {t: self._stage(t).view(self.reference) for t in self.field_map()}
        listed = frozenset(lang for lang, e in base.items() if e.get("gopher_quality", {}).get("stop_words"))
        listed |= {self.reference} | NO_DERIVED_STOP_WORDS
        words = ctx.phase("words", words_task, [WordsJob(tuple(paths[lo:hi]), listed, self.sketch_size)
                                                for lo, hi in spans], fold=_merge_words(self.sketch_size))
        words = words or {}
        langs, derived = self._languages(words, listed, root)
        targets = frozenset(lang for lang, info in langs.items() if info["status"] == "calibrated")
        by_lang = {lang: {"stop_words": w, "min_stop_words": 2} for lang, w in derived.items()}
        stages, specs, ref_thr, skipped = self._rule_specs(ref_stages, by_lang)
        sig = {"docs": {}, "hist": {}, "ref_drop": {}}
        if targets and specs:
            sig = ctx.phase("signals", signals_task,
                            [SignalsJob(tuple(paths[lo:hi]), tuple(stages), tuple(specs), targets, self.reference,
                                        tuple(sorted(ref_thr.items())), self.bins) for lo, hi in spans],
                            fold=_merge_signals) or sig
        ref_docs = int(sig["docs"].get(self.reference, 0))
        ref_share = {s.name: sig["ref_drop"].get(s.name, 0) / ref_docs for s in specs} if ref_docs else {}
        if targets and specs and not ref_docs:
            for lang in targets:
                langs[lang].update(status="fallback", reason=f"no {self.reference} documents to calibrate against")
            targets = frozenset()
        entries = self._entries(targets, specs, sig, ref_share, by_lang, root, langs)
        for lang, w in derived.items():  # the list goes with the language whatever its status
            entries.setdefault(lang, {}).setdefault("gopher_quality", {}).update(stop_words=w, min_stop_words=2)
        ctx.phase("copy", copy_task, [CopyJob(tuple(ctx.output(k) for k in keys[lo:hi]), tuple(paths[lo:hi]))
                                      for lo, hi in spans], commit=True)
        ctx.write_report(REPORT, {
            "name": f"calibration:{ctx.name}",
            "base": self.base,
            "source": f"calibrate_rules stage {ctx.name!r} (FineWeb-2's method: each language loses to each rule "
                      f"about the share {self.reference} loses)",
            "calibration": {
                "reference": self.reference, "reference_docs": ref_docs,
                "reference_thresholds": ref_thr, "reference_drop_share": {k: round(v, 6) for k, v in ref_share.items()},
                "skipped": skipped, "min_docs": self.min_docs, "all_languages": self.all_languages,
                "bins": self.bins, "languages": langs,
            },
            "languages": entries,
        })

    def _languages(self, words: dict, listed: frozenset, root: str) -> tuple[dict[str, dict], dict[str, list[str]]]:
        """Each language seen (of ``languages``, and the reference) with what will happen to it:
        the reference, skipped, a fallback (too few documents), its preset entry kept, or
        calibrated; and the stop words derived from the corpus for languages without a list."""
        docs = {lang: n for lang, (n, _) in words.items() if lang}
        langs = {lang: {"docs": n} for lang, n in sorted(docs.items())
                 if self.languages is None or lang in self.languages or lang == self.reference}
        derived: dict[str, list[str]] = {}
        for lang, info in langs.items():
            if lang == self.reference:
                info["status"] = "reference"
                continue
            if not lang_rules.LANG_CODE.match(lang):
                info.update(status="skipped", reason="not a language code (ISO 639-1 or 639-3)")
                continue
            own = lang_rules.has_own_entry(lang, root)
            if info["docs"] < self.min_docs:
                info["status"] = "fallback"
                info["reason"] = (f"{info['docs']} documents < min_docs {self.min_docs}: keeps the "
                                  + (f"{root} entry of its own" if own else f"{root} fallback entry (the median "
                                     "of the checked languages' thresholds; no stop-word rule)"))
                continue
            if self.stop_words and lang not in listed and words[lang][1]:
                derived[lang] = cal.stop_words(words[lang][1], self.stop_words)
                info["stop_words"] = {"source": "corpus", "words": derived[lang]}
            if own and not self.all_languages:
                info["status"] = "preset"
                info["reason"] = f"has an entry of its own in {root} (all_languages: true recalibrates it)"
            else:
                info["status"] = "calibrated"
        return langs, derived

    def _rule_specs(self, ref_stages: dict, by_lang: dict) -> tuple[list, list[cal.FieldSpec], dict[str, float],
                                                                    dict[str, str]]:
        """The filter stages to measure with, the rules to calibrate (those the reference has on)
        with the reference's thresholds, and the rules skipped with why."""
        fmap = self.field_map()
        stages = []
        specs: list[cal.FieldSpec] = []
        ref_thr: dict[str, float] = {}
        skipped: dict[str, str] = {}
        for t, fields in fmap.items():
            stop_frac = t == "gopher_quality" and "min_stop_words_frac" in fields
            st = self._stage(t, by_lang.copy() if t == "gopher_quality" else None, stop_frac)
            stages.append(st)
            for s in _specs(ref_stages[t], fields):
                v = self.reference_thresholds.get(s.name, _value(ref_stages[t], s))
                if v is None:
                    skipped[s.name] = f"the reference ({self.reference}) rule is off"
                    continue
                specs.append(s)
                ref_thr[s.name] = v
        return stages, specs, ref_thr, skipped

    def _entries(self, targets: frozenset, specs: list[cal.FieldSpec], sig: dict, ref_share: dict[str, float],
                 by_lang: dict, root: str, langs: dict[str, dict]) -> dict[str, dict]:
        """Each calibrated language's preset entry: every rule's threshold at the reference's drop
        share (``cal.choose``), the base's value where the preset switched a rule off; the chosen
        figures go into ``langs``."""
        fmap = self.field_map()
        entries: dict[str, dict] = {}
        for lang in sorted(targets):
            n = int(sig["docs"].get(lang, 0))
            # what the language had: the base's entry (and derived stop words), no forced rule
            view = {t: self._stage(t, by_lang if t == "gopher_quality" else None).view(lang) for t in fmap}
            entry: dict[str, dict] = {}
            fields_out = {}
            own = lang_rules.has_own_entry(lang, root)
            for s in specs:
                prefer = _value(view[s.stage], s)
                if prefer is None and own:  # the preset switched the rule off for this language
                    fields_out[s.name] = {"threshold": None, "base": None, "reason": f"off in {root}'s entry"}
                    continue
                thr, share = cal.choose(sig["hist"][lang][s.name], n, s, ref_share[s.name], prefer, self.bins)
                fields_out[s.name] = {"threshold": thr, "base": prefer, "achieved_share": round(share, 6),
                                      "reference_share": round(ref_share[s.name], 6)}
                fe = entry.setdefault(s.stage, {})
                if s.key is None:
                    fe[s.field] = thr
                else:
                    if s.field not in fe:
                        fe[s.field] = {str(k): x for k, x in (getattr(view[s.stage], s.field) or {}).items()}
                    fe[s.field][s.key] = thr
            langs[lang]["fields"] = fields_out
            entries[lang] = entry
        return entries
