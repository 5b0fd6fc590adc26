"""A stage that keeps no row of a shard writes no file: its manifest line says ``file: null,
rows: 0`` (issue 29, "empty is not a document"); readers list shards through the manifest and
skip it, and a rerun that adds a stage below such a shard runs the shard's stages again rather
than open a file that is not there."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from conftest import DATA
from curation.pipeline.dag import parse_dag
from curation.pipeline.executor import run_dag
from curation.pipeline.rundir import RunDir
from curation.pipeline.stats import stage_table

GSM = DATA / "jsonl" / "gsm8k_train_head400.jsonl.gz"


def _dag(bad: Path, stages: dict) -> object:
    return parse_dag({"name": "empty", "inputs": {"math": {"format": "jsonl", "paths": [str(GSM), str(bad)],
                                                             "source": "math", "text_field": "question"}},
                      "stages": stages}, "empty.yaml")


def test_no_zero_row_files_and_a_rerun_below_an_empty_shard(tmp_path, ray_session):
    bad = tmp_path / "no-question.jsonl"  # every line lacks the text field: all rejected, 0 rows kept
    bad.write_text("".join(json.dumps({"answer": str(i)}) + "\n" for i in range(3)))
    out = tmp_path / "run"
    g1 = {"g1": {"type": "gopher_quality", "input": "math", "min_doc_words": 1}}
    run_dag(_dag(bad, g1), out, workers=2, quiet=True)
    rd = RunDir(out)
    empty = [e for e in rd.entries("g1").values() if e["rows_in"] == 0]
    assert len(empty) == 1 and empty[0]["file"] is None and empty[0]["rows"] == 0
    for f in out.rglob("*.parquet"):  # kept and rejected files alike: none without a row
        assert pq.ParquetFile(f).metadata.num_rows > 0, f
    assert not (out / "g1" / f"{empty[0]['shard']}.parquet").exists()
    before = {r["stage"]: r for r in stage_table(str(out))}
    assert before["g1"]["docs_in"] == 400

    # a stage added below g1: the empty shard's g1 has no file to read, so it runs again
    g2 = {**g1, "g2": {"type": "c4_quality", "input": "g1"}}
    run_dag(_dag(bad, g2), out, workers=2, quiet=True, overwrite=True)
    g2_entries = RunDir(out).entries("g2")
    assert {e["shard"] for e in g2_entries.values()} == {e["shard"] for e in rd.entries("g1").values()}
    assert g2_entries[empty[0]["shard"]]["rows"] == 0 and g2_entries[empty[0]["shard"]]["file"] is None
    after = {r["stage"]: r for r in stage_table(str(out))}
    assert after["g2"]["docs_in"] == before["g1"]["docs_in"] - before["g1"]["rejected"]
    con = RunDir(out).connect(["g2"])
    assert con.execute("select count(*) from g2").fetchone()[0] == after["g2"]["kept"]
