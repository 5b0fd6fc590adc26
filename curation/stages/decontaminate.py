"""Find benchmark items in training documents (word n-grams, 13 by default) and drop the
documents or cut the leaked spans out.

**Eval sets.** ``eval_sets`` names shipped registry entries (``gsm8k``, ``math``,
``humaneval``: ``curation.io.benchmarks.REGISTRY``), found under ``eval_dir`` or
``$REFINERY_EVAL_DIR``; ``eval_paths`` names files (JSONL(.gz/.zst), Parquet, plain text,
CoNLL-U; ``eval_text_field``: a field or several joined). Every item's texts are indexed once
per worker in ``setup`` (``curation.text.decontam.EvalIndex``): normalised words (NFKC,
lowercase, punctuation and spacing ignored, HTML character references decoded, invisible
format characters skipped), every ``ngram``-word window in an exact index (a bitmap is only a
pre-filter; every hit is verified word for word, so there are no false matches), items
shorter than ``ngram`` words but at least ``min_words`` indexed whole.

**Per document** (a whole batch in one compiled scan): ``decontam_overlaps`` (verified
windows) and ``decontam_matches``: per leaked item its benchmark, id, the matched span
(character offsets in the text as it came in, and the text itself, cut at 300 characters)
and the share of the item's words found. With ``mode: drop`` (default) a document with at
least ``min_overlaps`` windows is dropped as ``decontaminate:ngram_overlap``. With
``mode: remove_spans`` the spans are cut out (a line left blank goes with them) and the rest
of the document is kept, as BFF and Llama 3 do; a document left without a word is dropped as
``decontaminate:empty_after_removal``.

**Report.** When the run's map tasks are done, ``RUN/STAGE/_decontam_report.json`` lists per
benchmark: items, items too short to index, leaked items, contaminated documents, and per
leaked item the documents it is in with an example span (``refinery stats`` prints it). It is
built from the stage's own shards (rows with ``decontam_overlaps > 0``; Parquet statistics
skip the row groups without any).

The eval files' content (sha256) is part of the params hash: a changed eval set reruns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, PrivateAttr, field_validator, model_validator

from curation.io.benchmarks import REGISTRY, benchmark_items, file_items, find_benchmark
from curation.io.files import cached_file_sha256
from curation.io.shards import replace_column
from curation.stages.base import MapStage, StageResult, registry
from curation.stages.paths import PathStr
from curation.text.decontam import EvalIndex, EvalItem, byte_to_char, remove_spans, words_of

REASON = "decontaminate:ngram_overlap"
REASON_EMPTY = "decontaminate:empty_after_removal"
REPORT = "_decontam_report.json"
SPAN_CHARS = 300

MATCH_TYPE = pa.struct([("benchmark", pa.string()), ("item", pa.string()), ("start", pa.int64()),
                        ("end", pa.int64()), ("windows", pa.int32()), ("coverage", pa.float32()),
                        ("span", pa.string())])


@registry.register("decontaminate")
class Decontaminate(MapStage):
    """Drop documents (or cut spans) sharing an ``ngram``-word window with an eval set."""

    type: Literal["decontaminate"] = "decontaminate"
    columns: ClassVar[tuple[str, ...]] = ("decontam_overlaps", "decontam_matches")
    eval_paths: list[PathStr] = Field(default_factory=list)
    eval_sets: list[str] = Field(default_factory=list)
    eval_dir: PathStr | None = None
    ngram: int = Field(default=13, gt=0)
    min_words: int = Field(default=8, gt=0)  # shorter eval texts are indexed whole down to this
    text_field: str = "text"  # of the training documents
    eval_text_field: str | list[str] = "text"  # of JSONL / Parquet eval files
    min_overlaps: int = Field(default=1, ge=1)
    mode: Literal["drop", "remove_spans"] = "drop"
    span_gap: int = Field(default=16, ge=0)  # words between two matched windows of one item that join them

    _index: EvalIndex | None = PrivateAttr(default=None)

    @field_validator("eval_paths")
    @classmethod
    def _exist(cls, v: list[str]) -> list[str]:
        out = []
        for p in v:
            ap = Path(p).expanduser().resolve()
            if not ap.is_file():
                raise ValueError(f"eval file {p} does not exist")
            out.append(str(ap))
        return out

    @field_validator("eval_sets")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        for name in v:
            if name not in REGISTRY:
                raise ValueError(f"unknown eval set {name!r} (registry: {', '.join(REGISTRY)}; files go in eval_paths)")
        return v

    @model_validator(mode="after")
    def _some(self) -> Decontaminate:
        if not self.eval_paths and not self.eval_sets:
            raise ValueError("decontaminate needs eval_sets (registry names) or eval_paths (files)")
        if self.min_words > self.ngram:
            raise ValueError("min_words must be <= ngram")
        self.resolved_sets()  # a registry entry without a file is a config error, before any work
        return self

    @property
    def rewrites_text(self) -> bool:  # type: ignore[override]
        return self.mode == "remove_spans"

    def resolved_sets(self) -> list[tuple[str, str]]:
        """(registry name, file) of every ``eval_sets`` entry."""
        dirs = [self.eval_dir] if self.eval_dir else []
        return [(name, find_benchmark(name, dirs)) for name in self.eval_sets]

    def params(self) -> dict[str, Any]:
        p = super().params()
        p.pop("eval_dir", None)  # where the files are does not matter, what they hold does
        p["eval_paths"] = [{"name": Path(x).name, "sha256": cached_file_sha256(x)} for x in self.eval_paths]
        p["eval_sets"] = [{"name": n, "sha256": cached_file_sha256(x)} for n, x in self.resolved_sets()]
        return p

    def items(self) -> list[EvalItem]:
        out: list[EvalItem] = []
        for name, path in self.resolved_sets():
            out += benchmark_items(name, path)
        for path in self.eval_paths:
            out += file_items(path, self.eval_text_field)
        return out

    def build_index(self) -> EvalIndex:
        return EvalIndex.build(self.items(), self.ngram, self.min_words)

    def setup(self) -> None:
        if self._index is None:
            self._index = self.build_index()

    def process(self, batch: pa.Table) -> StageResult:
        if self._index is None:
            self.setup()
        idx = self._index
        if self.text_field not in batch.column_names:
            raise ValueError(f"decontaminate: input has no {self.text_field!r} column")
        col = batch.column(self.text_field)
        words = words_of(col)
        counts, hits = idx.match(words, self.span_gap)
        n = batch.num_rows
        matches: list[list[dict] | None] = [[] for _ in range(n)]
        by_doc: dict[int, list] = {}
        for h in hits:
            by_doc.setdefault(h.doc, []).append(h)
        texts = {d: col[d].as_py() or "" for d in by_doc}
        for d, hs in by_doc.items():
            t = texts[d]
            chars = byte_to_char(t, [x for h in hs for x in (h.start, h.end)])
            for k, h in enumerate(hs):
                it = idx.items[h.item]
                s, e = chars[2 * k], chars[2 * k + 1]
                matches[d].append({"benchmark": it.benchmark, "item": it.item, "start": s, "end": e,
                                   "windows": h.windows, "coverage": round(h.coverage, 4),
                                   "span": t[s:min(e, s + SPAN_CHARS)]})
        leaked = counts >= self.min_overlaps
        reasons: list[str | None] = [REASON if x else None for x in leaked]
        table = batch
        if self.mode == "remove_spans" and by_doc:
            new_texts = col.to_pylist()
            for d, hs in by_doc.items():
                if not leaked[d]:
                    continue
                new_texts[d] = remove_spans(texts[d], [(h.start, h.end) for h in hs])
                reasons[d] = None
            fresh = pa.array(new_texts, col.type)
            empty = np.diff(words_of(fresh).doc_tok) == 0
            for d in by_doc:
                if leaked[d] and empty[d]:
                    reasons[d] = REASON_EMPTY
            table = replace_column(table, self.text_field, fresh)
        elif self.mode == "remove_spans":
            reasons = [None] * n
        for name, arr in (("decontam_overlaps", pa.array(counts, pa.int32())),
                          ("decontam_matches", pa.array(matches, pa.list_(MATCH_TYPE)))):
            i = table.schema.get_field_index(name)
            table = table.set_column(i, name, arr) if i >= 0 else table.append_column(name, arr)
        return StageResult(table, pa.array(reasons, pa.string()))

    # -- the run's report -----------------------------------------------------------------------

    def summarise_run(self, read: Callable[..., pa.Table | None], docs: int) -> tuple[str, dict]:
        """``(REPORT, report)`` from the stage's committed rows (the executor calls this when
        the run's tasks are done; ``read(columns, filters)`` reads the stage's kept and
        rejected rows)."""
        t = read(["id", "decontam_overlaps", "decontam_matches"], [("decontam_overlaps", ">", 0)])
        return REPORT, self.summarise(t.to_pylist() if t is not None else [], docs)

    def summarise(self, rows: list[dict], docs: int) -> dict:
        """The report from the rows with matches (``id``, ``decontam_overlaps``, ``decontam_matches``)."""
        idx = self._index or self.build_index()
        totals: dict[str, dict] = {}
        for it in idx.items:
            totals.setdefault(it.benchmark, {"items": 0})["items"] += 1
        per_item: dict[tuple[str, str], dict] = {}
        docs_per_bench: dict[str, set] = {}
        contaminated = 0
        for r in rows:
            if (r.get("decontam_overlaps") or 0) < self.min_overlaps:
                continue
            contaminated += 1
            for m in r.get("decontam_matches") or []:
                k = (m["benchmark"], m["item"])
                e = per_item.setdefault(k, {"benchmark": m["benchmark"], "item": m["item"], "documents": 0,
                                            "max_coverage": 0.0, "example_id": r.get("id"), "span": m["span"],
                                            "_ids": set()})
                if r.get("id") not in e["_ids"]:
                    e["_ids"].add(r.get("id"))
                    e["documents"] += 1
                if m["coverage"] > e["max_coverage"]:
                    e.update(max_coverage=round(float(m["coverage"]), 4), example_id=r.get("id"), span=m["span"])
                docs_per_bench.setdefault(m["benchmark"], set()).add(r.get("id"))
        short: dict[str, int] = {}
        nw = np.diff(idx.words.doc_tok)
        indexable = np.zeros(len(idx.items), bool)
        indexable[idx.text_item[nw >= idx.min_words]] = True
        for i, it in enumerate(idx.items):
            if not indexable[i]:
                short[it.benchmark] = short.get(it.benchmark, 0) + 1
        benches = []
        for b, t in totals.items():
            leaked = sorted((v for v in per_item.values() if v["benchmark"] == b),
                            key=lambda v: (-v["documents"], v["item"]))
            for v in leaked:
                v.pop("_ids", None)
            benches.append({"benchmark": b, "items": t["items"], "items_too_short": short.get(b, 0),
                            "leaked_items": len(leaked), "contaminated_documents": len(docs_per_bench.get(b, ())),
                            "leaks": leaked})
        return {"mode": self.mode, "ngram": self.ngram, "min_words": self.min_words, "documents": docs,
                "contaminated_documents": contaminated, "index": idx.stats, "benchmarks": benches}
