"""A stage of the user's own, ``type: package.module:ClassName``, from a module outside the
package: validated like a built-in, run in a DAG on Ray, its code part of the params hash."""

from __future__ import annotations

import textwrap

import pyarrow.parquet as pq
import pytest
import yaml

from conftest import DATA
from curation.pipeline.dag import DagError, load_dag
from curation.pipeline.executor import run_dag
from curation.pipeline.rundir import RunDir

MODULE = '''
from typing import ClassVar
import pyarrow as pa, pyarrow.compute as pc
from curation.stages import MapStage
from curation.stages.base import Rule

class CapsRatio(MapStage):
    """Drop documents that are mostly upper case."""
    max_caps_ratio: float | None = 0.5
    rules: ClassVar[tuple[Rule, ...]] = (Rule("too_many_caps", "caps_ratio", ">", "max_caps_ratio"),)

    def measure(self, batch, text=None):
        t = batch.column("text")
        upper = pc.utf8_length(pc.replace_substring_regex(t, "[^A-Z]", "")).cast(pa.float64())
        return batch.append_column("caps_ratio", pc.divide(upper, pc.max_element_wise(pc.utf8_length(t), 1).cast(pa.float64()))), text

class NotAStage:
    """Has no stage base class."""
'''


@pytest.fixture()
def project(tmp_path, monkeypatch):
    """A user's folder: their module next to their DAG (not installed, not on sys.path)."""
    name = f"myfilters_{tmp_path.name.replace('-', '_')}"  # a fresh module name per test
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.chdir(tmp_path)

    def write(stage: dict, file: str = "dag.yaml") -> str:
        d = {"name": "user", "inputs": {"docs": {"format": "jsonl", "source": "web",
                                                 "paths": [str(DATA / "jsonl" / "dolma_cc_en_head-0091.jsonl.gz")]}},
             "stages": {"caps": stage}}
        (tmp_path / file).write_text(yaml.safe_dump(d))
        return str(tmp_path / file)

    return name, write


def test_user_stage_runs_in_a_dag(project, tmp_path, ray_session):
    name, write = project
    dag = load_dag(write({"type": f"{name}:CapsRatio", "max_caps_ratio": 0.05}))
    run_dag(dag, tmp_path / "run", workers=2, quiet=True)
    rd = RunDir(tmp_path / "run")
    es = list(rd.entries("caps").values())
    kept = pq.read_table([rd.path(e["file"]) for e in es if e["file"]])
    rej = pq.read_table([rd.path(e["rejected_file"]) for e in es if e["rejected_file"]])
    assert kept.num_rows > 0 and rej.num_rows > 0
    assert max(kept.column("caps_ratio").to_pylist()) <= 0.05 < min(rej.column("caps_ratio").to_pylist())
    assert set(rej.column("reason").to_pylist()) == {"CapsRatio:too_many_caps"}
    assert sum(e["rows_in"] for e in es) == kept.num_rows + rej.num_rows
    written = yaml.safe_load((tmp_path / "run" / "dag.yaml").read_text())
    assert written["stages"]["caps"]["type"] == f"{name}:CapsRatio"
    # the module's source is part of the params hash (see the next test)
    assert dag.stages["caps"].params()["code"]["sha256"]


def test_user_stage_code_changes_the_params_hash(project, tmp_path):
    name, write = project
    h1 = load_dag(write({"type": f"{name}:CapsRatio"})).hashes()["caps"]
    other = f"{name}_v2"
    (tmp_path / f"{other}.py").write_text(textwrap.dedent(MODULE).replace("[^A-Z]", "[^A-Z0-9]"))
    h2 = load_dag(write({"type": f"{other}:CapsRatio"})).hashes()["caps"]
    assert h1 != h2


@pytest.mark.parametrize("stage, message", [
    ({"type": "no_such_module_xyz:Stage"}, r"stages\.caps\.type: cannot import module 'no_such_module_xyz'"),
    ({"type": "{mod}:Missing"}, r"stages\.caps\.type: module '{mod}' \(.*{mod}\.py\) has no class 'Missing'"),
    ({"type": "{mod}:NotAStage"}, r"stages\.caps\.type: '{mod}:NotAStage' is not a subclass of curation\.stages\.MapStage or GlobalStage"),
    ({"type": "{mod}:CapsRatio", "max_caps_ratio": "lots"}, r"stages\.caps\.max_caps_ratio: Input should be a valid number"),
    ({"type": "{mod}:CapsRatio", "max_caps": 0.3}, r"stages\.caps\.max_caps: Extra inputs are not permitted"),
    ({"type": "caps_ratio"}, r"stages\.caps\.type: unknown stage type 'caps_ratio' \(known: .*package\.module:ClassName\)"),
])
def test_invalid_user_stages_fail_with_one_line(project, stage, message):
    name, write = project
    stage = {k: v.replace("{mod}", name) if isinstance(v, str) else v for k, v in stage.items()}
    path = write(stage)
    with pytest.raises(DagError) as e:
        load_dag(path)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(path), msg
    assert __import__("re").search(message.replace("{mod}", name), msg), msg
