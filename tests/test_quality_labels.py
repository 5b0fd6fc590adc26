"""``refinery quality label RUN/STAGE`` reads a run's stage through its manifest
(``curation.pipeline.run_input.node_rows``): a signals-only stage is joined back to whole rows,
only committed shards count (a stray Parquet file in the stage folder is not read), and the same
run on object storage (the local S3 server of ``test_s3``) gives the same label file. A run's
stage folder handed to the file reader is refused, not listed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import DATA, REPO
from curation.pipeline.dag import parse_dag
from curation.pipeline.executor import run_dag
from curation.pipeline.rundir import RunDir
from curation.quality.labels import LabelError, Tables, quality_label, read_documents
from test_s3 import BUCKET, s3  # noqa: F401  (the S3 server fixture)

CRAWL = DATA / "quality" / "crawl_sample.jsonl.gz"
REFERENCE = DATA / "quality" / "reference_sample.jsonl.gz"
REFINERY = [sys.executable, "-m", "curation.cli"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_session) -> Path:
    """web -> rep (whole rows: its input is not on disk) -> gq (signals only) -> last (the output)."""
    root = tmp_path_factory.mktemp("labels") / "run"
    dag = parse_dag({
        "name": "labels",
        "inputs": {"web": {"format": "jsonl", "paths": [str(CRAWL)], "source": "web", "url_field": "id",
                                 "id_field": "id", "split_bytes": 100_000}},
        "stages": {"rep": {"type": "gopher_repetition", "input": "web"},
                   "gq": {"type": "gopher_quality", "input": "rep"},
                   "last": {"type": "gopher_quality", "input": "gq", "min_doc_words": 1}},
        "output": "last"}, "labels.yaml")
    assert not dag.writes_rows("gq") and dag.writes_rows("rep")
    run_dag(dag, root, workers=2, quiet=True)
    return root


def _label(s3env: dict | None, crawl: str, out: Path) -> dict:
    res = subprocess.run(REFINERY + ["quality", "label", crawl, "--teacher", "reference", "--positive", str(REFERENCE),
                                     "--out", str(out)], env=s3env, cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(Path(f"{out}.json").read_text())


def _kept(run: Path, node: str) -> list[tuple[str, str]]:
    """(id, text) of the rows ``node`` kept, from the SQL view (which joins signals-only shards)."""
    con = RunDir(run).connect([node])
    return sorted(con.execute(f'select id, text from "{node}"').fetchall())


def test_a_signals_only_stage_is_labelled_from_its_whole_rows(run, tmp_path):
    gq = RunDir(run).entries("gq")
    shard = pq.read_table(run / next(e["file"] for e in gq.values() if e.get("file")))
    assert "text" not in shard.column_names  # signals only: id and gopher_quality's own columns
    # a file no manifest names is not a shard of the stage
    pq.write_table(pa.table({"id": ["stray"], "text": ["not committed " * 20]}), run / "gq" / "zz-stray.parquet")
    from curation.pipeline.run_input import node_rows

    docs = read_documents(Tables("gq", node_rows(str(run / "gq"))))
    want = [d for d in _kept(run, "gq") if d[1].strip()]
    assert sorted(docs) == want and len(want) > 50
    assert len(want) < len(_kept(run, "rep"))  # gopher_quality dropped some: its own rows, not its input's
    meta = _label(None, str(run / "gq"), tmp_path / "labels.txt")
    assert meta["crawl"] == {"source": str(run / "gq"), "documents": len(want)}
    assert meta["labels"]["negatives"] == min(meta["labels"]["positives"], len(want)) > 0


def test_a_run_stage_folder_is_not_listed(run):
    with pytest.raises(LabelError, match="manifest"):
        read_documents(run / "gq")
    with pytest.raises(LabelError, match="manifest"):
        read_documents(run)


def test_the_same_run_on_object_storage_gives_the_same_labels(run, s3, tmp_path):  # noqa: F811
    s3["fs"].put(str(run), f"{BUCKET}/label-run", recursive=True)
    url = f"s3://{BUCKET}/label-run"
    local = _label(None, str(run / "gq"), tmp_path / "local.txt")
    remote = _label(s3["env"], f"{url}/gq", tmp_path / "remote.txt")
    assert (tmp_path / "remote.txt").read_bytes() == (tmp_path / "local.txt").read_bytes()
    assert remote["crawl"]["documents"] == local["crawl"]["documents"]
    # plain files on object storage too
    s3["fs"].put(str(CRAWL), f"{BUCKET}/label-files/crawl.jsonl.gz")
    assert read_documents(f"s3://{BUCKET}/label-files") == read_documents(CRAWL)
