"""``select``: SQL selection over signal columns, and routing by two selects on one input."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import DATA
from curation.pipeline.dag import DagError, parse_dag
from curation.pipeline.executor import run_dag
from curation.pipeline.rundir import RunDir
from curation.stages.base import MapStage
from curation.stages.select import Select

LINGUA = str(DATA / "langid" / "lingua_docs_gt200chars_14lang.jsonl.gz")


def dag(stages: dict, output: str | None = None) -> dict:
    d = {"name": "route", "inputs": {"docs": {"format": "jsonl", "paths": [LINGUA], "source": "web"}}, "stages": stages}
    if output:
        d["output"] = output
    return d


def test_expression_keeps_true_rows_and_drops_false_or_null():
    s = Select(where="quality > 0.3 AND lang = 'en'", name="en")
    t = pa.table({"text": list("abcd"), "quality": [0.5, 0.1, None, 0.9], "lang": ["en", "en", "en", "de"]})
    assert s.run_batch(t).reasons.to_pylist() == [None, "select:en", "select:en", "select:en"]


@pytest.mark.parametrize("where, message", [
    ("quality >", "syntax error"),
    ("1=1) OR (1=1", "syntax error"),
    ("lang = 'en'; DROP TABLE x", "where:"),
])
def test_bad_expression_fails_at_validation(where, message):
    with pytest.raises(DagError, match=rf"stages\.sel\.where: .*{message}"):
        parse_dag(dag({"lid": {"type": "langid", "min_score": 0}, "sel": {"type": "select", "where": where}}))


def test_unknown_column_fails_at_validation_with_the_column_list():
    with pytest.raises(DagError) as e:
        parse_dag(dag({"lid": {"type": "langid", "min_score": 0}, "sel": {"type": "select", "where": "qualty > 0.3"}}))
    msg = str(e.value)
    assert "stages.sel.where: no column 'qualty'" in msg and "lang, lang_score" in msg and "\n" not in msg
    # the same column after a quality stage is fine
    parse_dag(dag({"lid": {"type": "langid", "min_score": 0}, "sel": {"type": "select", "where": "lang_score > 0.3"}}))


def test_two_selects_route_by_language(tmp_path, ray_session):
    d = parse_dag(dag({
        "lid": {"type": "langid", "min_score": 0},
        "english": {"type": "select", "input": "lid", "where": "lang = 'en'"},
        "other": {"type": "select", "input": "lid", "where": "lang IS DISTINCT FROM 'en'"},
    }, output="english"))
    run_dag(d, tmp_path / "run", workers=2, quiet=True)
    rd = RunDir(tmp_path / "run")
    counts = {}
    for stage in ("lid", "english", "other"):
        es = rd.entries(stage).values()
        counts[stage] = {k: sum(e[k] for e in es) for k in ("rows_in", "rows", "rejected_rows")}
        # in = kept + rejected, per branch
        assert counts[stage]["rows_in"] == counts[stage]["rows"] + counts[stage]["rejected_rows"], (stage, counts)
    lid_kept = counts["lid"]["rows"]
    assert counts["english"]["rows_in"] == counts["other"]["rows_in"] == lid_kept
    assert counts["english"]["rows"] + counts["other"]["rows"] == lid_kept  # the branches partition the rows
    assert counts["english"]["rows"] > 0 and counts["other"]["rows"] > 0
    english = pq.read_table([rd.path(e["file"]) for e in rd.entries("english").values() if e["file"]])
    assert set(english.column("lang").to_pylist()) == {"en"}
    # the input's own labels agree with the detector on what went where
    truth = [json.loads(m)["lang"] for m in english.column("meta").to_pylist()]
    assert truth.count("en") >= 0.9 * len(truth)
    rej = pq.read_table([rd.path(e["rejected_file"]) for e in rd.entries("english").values() if e["rejected_file"]])
    assert set(rej.column("reason").to_pylist()) == {"select:english"}


def test_map_stages_declare_the_columns_they_add():
    """What ``select`` validation relies on: every built-in map stage that runs with its
    defaults adds exactly the columns its ``output_columns`` says (its declared columns plus
    its rules' signals) (so a column it adds
    is never refused, and a column it does not add is never accepted)."""
    import gzip

    from curation.stages import MapStage, registry

    docs = [json.loads(line) for line in gzip.open(LINGUA, "rt")][:40]
    batch = pa.table({"id": [d["id"] for d in docs], "text": [d["text"] for d in docs], "source": ["web"] * len(docs),
                      "url": [f"https://example.com/{i}" for i in range(len(docs))], "meta": [None] * len(docs),
                      "lang": [d["lang"] for d in docs]})
    checked = []
    for name, cls in sorted(registry.items()):
        if ":" in name or not issubclass(cls, MapStage) or name in ("extract", "quality", "tokenize", "decontaminate",
                                                                     "select", "reextract"):
            continue  # those need HTML, a model, a tokenizer or eval sets (or an expression, or WARC records)
        st = cls.model_validate({"type": name})
        st.setup()
        out = st.run_batch(batch.drop_columns(["lang"]) if name == "langid" else batch).table
        added = set(out.column_names) - set(batch.column_names)
        declared = st.output_columns(set(batch.column_names))  # what Dag.columns says
        assert added == declared - set(batch.column_names), (name, added, declared)
        checked.append(name)
    assert len(checked) >= 9, checked


class Shaper(MapStage):
    """A user stage whose rows are something else: it says so through ``output_columns``."""

    def output_columns(self, upstream: set[str] | None) -> set[str] | None:
        return {"id", "shape"}


def test_stages_say_their_output_columns_and_the_dag_asks_them():
    """``Dag.columns`` asks each stage (``Stage.output_columns``) instead of knowing stages by
    name: pack says its training rows, export says nothing, a stage of one's own says its own."""
    from curation.formats.packed import PACKED_SCHEMA

    d = parse_dag(dag({"lid": {"type": "langid", "min_score": 0}, "pack": {"type": "pack", "input": "lid"},
                       "sel": {"type": "select", "input": "pack", "where": "len(doc_lens) > 1"}}))
    assert d.columns("pack") == set(PACKED_SCHEMA.names)
    d = parse_dag(dag({"lid": {"type": "langid", "min_score": 0}, "pack": {"type": "pack", "input": "lid"},
                       "out": {"type": "export", "input": "pack", "format": "megatron"}}))
    assert d.columns("out") is None
    with pytest.raises(DagError, match=r"stages\.sel\.where: no column 'lang' in the rows of 'pack'"):
        parse_dag(dag({"lid": {"type": "langid", "min_score": 0}, "pack": {"type": "pack", "input": "lid"},
                       "sel": {"type": "select", "input": "pack", "where": "lang = 'en'"}}))
    d = parse_dag(dag({"shape": {"type": "test_select:Shaper"}, "sel": {"type": "select", "where": "shape > 1"}}))
    assert d.columns("shape") == {"id", "shape"} and d.columns("sel") == {"id", "shape"}
    with pytest.raises(DagError, match=r"no column 'text' in the rows of 'shape'"):
        parse_dag(dag({"shape": {"type": "test_select:Shaper"}, "sel": {"type": "select", "where": "text = ''"}}))
    assert parse_dag(dag({"lid": {"type": "langid", "min_score": 0}})).columns("lid") >= {"lang", "lang_score", "text"}
