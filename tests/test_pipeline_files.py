"""The DAGs in pipelines/ that read the real sample data name it as ``${REFINERY_DATA}``, never
a path of one machine: from a clone they plan (every input matches files) when the data folder
is ``$REFINERY_DATA`` or ``../shared/data``, and otherwise stop with one line saying what to set."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REPO
from curation.experiments.ablate import _resolve, load_ablate_config
from curation.io.inputs import InputError
from curation.pipeline.dag import load_dag
from curation.pipeline.executor import make_plan

DATA_DAGS = ["web-raw", "web-filters", "web-full"]


def _data_available() -> bool:
    import os

    return bool(os.environ.get("REFINERY_DATA")) or (REPO.parent / "shared" / "data").is_dir()


def test_no_pipeline_file_names_an_absolute_path():
    for f in sorted((REPO / "pipelines").glob("*.yaml")):
        assert "/work/" not in f.read_text(), f


@pytest.mark.parametrize("name", DATA_DAGS)
def test_data_dags_plan_from_the_repo(name, monkeypatch):
    if not _data_available():
        pytest.skip("no sample-data folder here: REFINERY_DATA unset and ../shared/data absent; "
                    "set REFINERY_DATA to the sample data to run it")
    monkeypatch.chdir(REPO)
    plan = make_plan(load_dag(REPO / "pipelines" / f"{name}.yaml"))
    assert all(len(shards) > 0 for shards in plan.input_shards.values())


def test_ablate_demo_eval_paths_resolve(monkeypatch):
    if not _data_available():
        pytest.skip("no sample-data folder here: REFINERY_DATA unset and ../shared/data absent; "
                    "set REFINERY_DATA to the sample data to run it")
    monkeypatch.chdir(REPO)
    cfg = load_ablate_config(REPO / "pipelines" / "ablate-demo.yaml")
    assert all(Path(_resolve(p, REPO / "pipelines")).is_file() for p in cfg.eval.paths)


def test_without_a_data_folder_the_error_says_what_to_set(tmp_path, monkeypatch):
    monkeypatch.delenv("REFINERY_DATA", raising=False)
    monkeypatch.chdir(tmp_path)  # no ../shared/data beside it
    with pytest.raises(InputError, match=r"inputs\.crawl\.paths: \$\{REFINERY_DATA\} is not set .*set REFINERY_DATA"):
        make_plan(load_dag(REPO / "pipelines" / "web-raw.yaml"))
