"""The stage API as a user writes it (issue #55): a module outside the package, loaded by
``type: module:Class``, returning the reasons its pyarrow or numpy idiom gives (a ChunkedArray
from a table column, a numpy keep mask, a list), rewriting text or adding a signal only, run
through ``refinery run`` on Ray. ``StageResult`` normalises the reasons once at the boundary."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from conftest import DATA
from curation.cli import app
from curation.pipeline.rundir import RunDir
from curation.stages.base import MASK_REASON, StageResult

MODULE = '''
import numpy as np
import pyarrow as pa, pyarrow.compute as pc
from curation.stages import MapStage
from curation.stages.base import StageResult

class ShortDocs(MapStage):
    """Drop short documents: reasons straight from pc.if_else over a table column (a ChunkedArray)."""
    min_chars: int = 200

    def process(self, t):
        n = pc.utf8_length(t["text"])
        return StageResult(t, pc.if_else(pc.less(n, self.min_chars), pa.scalar("short"), pa.scalar(None, pa.string())))

class KeepMask(MapStage):
    """Keep documents with a digit: a numpy boolean keep mask."""
    def process(self, t):
        return StageResult(t, np.asarray(pc.match_substring_regex(t["text"], "[0-9]").to_numpy(zero_copy_only=False)))

class Shout(MapStage):
    """Rewrite the text (upper case); keep everything."""
    rewrites_text = True
    def process(self, t):
        return StageResult(t.set_column(t.schema.get_field_index("text"), "text", pc.utf8_upper(t["text"])))

class Lines(MapStage):
    """Signals only: a new column, reasons as a Python list of None."""
    def process(self, t):
        lines = pc.add(pc.count_substring(t["text"], "\\n"), 1)
        return StageResult(t.append_column("n_lines", lines), [None] * t.num_rows)

# A global stage: a statistic over every shard (phase "measure"), then each shard cut by it
# (phase "cut", one task per shard writing through its out). Jobs are frozen dataclasses.
from dataclasses import dataclass
from typing import Any
from curation.io import location
from curation.stages import GlobalStage

@dataclass(frozen=True)
class CutJob:
    path: str
    out: Any  # ctx.output(key): where the task writes its shard
    mean: float

def measure_task(path):
    n = pc.utf8_length(location.read_parquet(path)["text"])
    return [pc.sum(n).as_py() or 0, len(n)]

def cut_task(job):
    t = location.read_parquet(job.path)
    n = pc.utf8_length(t["text"])  # a ChunkedArray: the reasons below are one too
    reasons = pc.if_else(pc.less(n, job.mean), pa.scalar("below_mean"), pa.scalar(None, pa.string()))
    return job.out.write(*StageResult(t, reasons).split(job.out.stage), t.num_rows)

class AboveMeanLength(GlobalStage):
    """Keep documents at least as long as the corpus' mean (over all shards)."""
    def run(self, ctx):
        if ctx.finished([k for k, _ in ctx.upstream], "_mean.json"):
            return
        total, docs = ctx.phase("measure", measure_task, [p for _, p in ctx.upstream],
                                fold=lambda acc, r: [acc[0] + r[0], acc[1] + r[1]], init=[0, 0])
        mean = total / max(docs, 1)
        ctx.phase("cut", cut_task, [CutJob(p, ctx.output(k), mean) for k, p in ctx.upstream], commit=True)
        ctx.write_report("_mean.json", {"documents": docs, "mean_chars": mean})
'''


def test_reasons_normalised_from_each_idiom():
    t = pa.table({"text": pa.chunked_array([["a" * 300, "b"], ["c" * 10]])})
    n = pc.utf8_length(t["text"])
    chunked = pc.if_else(pc.less(n, 200), pa.scalar("short"), pa.scalar(None, pa.string()))
    assert isinstance(chunked, pa.ChunkedArray)
    expected = [None, "short", "short"]
    for reasons in (chunked, chunked.combine_chunks(), expected, np.array(expected, dtype=object),
                    pa.array(expected).dictionary_encode(), pa.array(expected, pa.large_string())):
        r = StageResult(t, reasons).reasons
        assert isinstance(r, pa.Array) and r.type == pa.string() and r.to_pylist() == expected
    assert StageResult(t, np.array([True, False, True])).reasons.to_pylist() == [None, MASK_REASON, None]
    assert StageResult(t, [None, None, None]).reasons.null_count == 3
    with pytest.raises(ValueError, match="2 values for a table of 3 rows"):
        StageResult(t, ["x", None])
    with pytest.raises(TypeError, match="int64"):
        StageResult(t, pa.array([1, 2, 3]))


def test_user_stages_written_the_natural_way_run_through_refinery_run(tmp_path, monkeypatch, ray_session):
    mod = f"userstages_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{mod}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))  # the user's module is importable, as their PYTHONPATH would make it
    monkeypatch.chdir(tmp_path)
    dag = {"name": "user-idioms",
           "inputs": {"docs": {"format": "jsonl", "source": "web",
                               "paths": [str(DATA / "jsonl" / "dolma_cc_en_head-0091.jsonl.gz")]}},
           "stages": {"short": {"type": f"{mod}:ShortDocs", "input": "docs", "min_chars": 2000},
                      "digits": {"type": f"{mod}:KeepMask", "input": "short"},
                      "lines": {"type": f"{mod}:Lines", "input": "digits"},
                      "shout": {"type": f"{mod}:Shout", "input": "lines"},
                      "long": {"type": f"{mod}:AboveMeanLength", "input": "shout"}},
           "output": "long"}
    (tmp_path / "dag.yaml").write_text(yaml.safe_dump(dag))
    res = CliRunner().invoke(app, ["run", "dag.yaml", "--out", str(tmp_path / "run"), "--workers", "2", "--quiet"])
    assert res.exit_code == 0, res.output + repr(res.exception)
    rd = RunDir(tmp_path / "run")

    def rows(stage: str, key: str = "file") -> pa.Table:
        files = [rd.path(e[key]) for e in rd.entries(stage).values() if e.get(key)]
        return pq.read_table(files) if files else pa.table({})

    src = pa.Table.from_pylist([__import__("json").loads(x) for x in
                                __import__("gzip").open(DATA / "jsonl" / "dolma_cc_en_head-0091.jsonl.gz", "rt")])
    lengths = pc.utf8_length(src["text"]).to_pylist()
    rejected_short = rows("short", "rejected_file")
    assert rejected_short.num_rows == sum(n < 2000 for n in lengths) > 0
    assert set(rejected_short.column("reason").to_pylist()) == {"short"}
    out = rows("shout")
    assert out.num_rows > 0
    assert all(t == t.upper() for t in out.column("text").to_pylist())
    assert all(any(c.isdigit() for c in t) for t in out.column("text").to_pylist())
    lines = rows("lines")
    assert "n_lines" in lines.column_names and min(lines.column("n_lines").to_pylist()) >= 1
    mean = json.loads((tmp_path / "run" / "long" / "_mean.json").read_text())
    assert mean["documents"] == out.num_rows and mean["mean_chars"] == pytest.approx(
        sum(len(t) for t in out.column("text").to_pylist()) / out.num_rows)
    rejected_long, kept_long = rows("long", "rejected_file"), rows("long")
    assert set(rejected_long.column("reason").to_pylist()) == {"below_mean"}
    assert rejected_long.num_rows + kept_long.num_rows == out.num_rows and kept_long.num_rows > 0
    assert min(pc.utf8_length(kept_long["text"]).to_pylist()) >= mean["mean_chars"]
    assert max(pc.utf8_length(rejected_long["text"]).to_pylist()) < mean["mean_chars"]
