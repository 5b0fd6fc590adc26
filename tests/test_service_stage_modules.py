"""The service imports no module a client names: a submitted ``type: module:Class`` stage is
refused before any import unless the operator listed the module (``refinery serve
--stage-modules``), and what the client is told names no file of the server. A real server
process (its ``sys.modules`` is its own), modules whose import leaves a mark on disk."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from conftest import DATA
from test_service import TERMINAL, ServiceProcess, wait_state

ALLOWED = "refinery_probe_allowed"
FORBIDDEN = "refinery_probe_forbidden"
JSONL = DATA / "jsonl" / "gsm8k_train_head400.jsonl"

MODULE = '''
import os, pathlib
import pyarrow as pa, pyarrow.compute as pc
from curation.stages import MapStage

# the side effect a client must not be able to trigger: a mark that this process imported us
pathlib.Path(os.environ["PROBE_MARKS"], f"{__name__}.{os.getpid()}").touch()

class Length(MapStage):
    """Adds the text's length in characters."""

    def measure(self, batch, text=None):
        return batch.append_column("probe_chars", pc.utf8_length(batch.column("text"))), text
'''


@pytest.fixture(scope="module")
def svc(tmp_path_factory, request):
    root = tmp_path_factory.mktemp("sm")  # short: Ray's socket paths under it are capped at 107 bytes
    mods = root / "site"
    (mods / ALLOWED).mkdir(parents=True)
    (mods / ALLOWED / "__init__.py").write_text(textwrap.dedent(MODULE))
    (mods / f"{FORBIDDEN}.py").write_text(textwrap.dedent(MODULE))
    (mods / f"{ALLOWED}_evil.py").write_text(textwrap.dedent(MODULE))  # shares the prefix's letters only
    marks = root / "marks"
    marks.mkdir()
    s = ServiceProcess(root, [DATA], extra_args=["--stage-modules", f"{ALLOWED},other_pkg.sub"],
                       env={"PYTHONPATH": str(mods), "PROBE_MARKS": str(marks)})
    s.runs_dir.mkdir(parents=True)
    s.start()
    request.addfinalizer(s.stop)
    s.marks = marks
    s.mods = mods
    return s


def _dag(stype: str) -> str:
    return yaml.safe_dump({"name": "probe", "inputs": {"docs": {"format": "jsonl", "paths": [str(JSONL)],
                                                                 "source": "math", "text_field": "question"}},
                           "stages": {"mine": {"type": stype}}})


def _marks(svc, module: str) -> list[str]:
    return sorted(p.name for p in svc.marks.iterdir() if p.name.rsplit(".", 1)[0] == module)


@pytest.mark.parametrize("stype", ["this:X", f"{FORBIDDEN}:Length", f"{ALLOWED}_evil:Length", "other_pkg:X",
                                   "os.path:X", ".relative:X", f"{ALLOWED}x.y:Length"])
def test_a_module_the_operator_did_not_list_is_refused_unimported(svc, stype):
    n_runs = len(list(svc.runs_dir.iterdir()))
    with svc.client() as c:
        r = c.post("/runs", content=_dag(stype), headers={"Content-Type": "application/yaml"})
    assert r.status_code == 403, r.text
    detail = r.json()["detail"]
    assert "stages.mine.type" in detail and ALLOWED in detail, detail  # says what is allowed
    assert str(svc.root) not in detail and str(DATA.parent.parent) not in detail, detail
    assert len(list(svc.runs_dir.iterdir())) == n_runs  # nothing was created
    assert not _marks(svc, FORBIDDEN) and not _marks(svc, f"{ALLOWED}_evil")
    assert "Beautiful is better than ugly" not in svc.log.read_text()  # `this` prints the Zen when imported


def test_a_refused_module_is_not_imported_by_browsing_or_resuming_either(svc):
    """A run directory written by the CLI into the runs dir names a module the service does not
    allow: its stats and stage list are read without importing it."""
    d = svc.runs_dir / "cli-made"
    d.mkdir()
    (d / "dag.yaml").write_text(_dag(f"{FORBIDDEN}:Length"))
    with svc.client() as c:
        for path in ("/runs/cli-made/stats", "/runs/cli-made/stages", "/runs/cli-made/stages/mine",
                     "/runs/cli-made/sql?q=select+1"):
            r = c.get(path)
            if r.status_code != 200:
                assert r.status_code == 403 and "stages.mine.type" in r.json()["detail"], (path, r.text)
            assert str(svc.root) not in r.text, (path, r.text)
        assert c.get("/runs/cli-made").status_code == 200  # listed and described (no DAG validation)
    assert not _marks(svc, FORBIDDEN)


def test_an_allowed_module_loads_errors_name_no_server_path(svc):
    with svc.client() as c:
        r = c.post("/runs", content=_dag(f"{ALLOWED}:NoSuchClass"))
        assert r.status_code == 422, r.text
        detail = r.json()["detail"]
        assert "cannot load" in detail and str(svc.mods) not in detail and "/" not in detail.split(":", 1)[1], detail
        r = c.post("/runs", content=_dag("other_pkg.sub.missing:X"))  # allowed, not installed
        assert r.status_code == 422 and "/" not in r.json()["detail"].split(":", 1)[1], r.text


def test_an_allowed_module_runs(svc):
    with svc.client() as c:
        r = c.post("/runs", content=_dag(f"{ALLOWED}:Length"))
        assert r.status_code == 201, r.text
        rid = r.json()["id"]
        info = wait_state(c, rid, TERMINAL, timeout=300)
    assert info["state"] == "done", info
    out = svc.runs_dir / rid / "mine"
    chars = pq.read_table(sorted(out.glob("*.parquet")), columns=["probe_chars"]).column("probe_chars")
    assert len(chars) == sum(1 for _ in JSONL.open()) and min(chars.to_pylist()) > 0
    assert _marks(svc, ALLOWED)  # imported: by the server on admission and by the run
    assert not _marks(svc, FORBIDDEN)
    # the live figures `refinery status` shows, over HTTP
    with svc.client() as c:
        prog = c.get(f"/runs/{rid}/progress").raise_for_status().json()
    live = prog["live"]["read+map"]
    assert prog["run_state"] == "done" and live["done"] == live["total"] >= 1 and live["docs"] == len(chars)
    assert {"docs_per_s", "bytes_per_s_1m", "eta_s", "stragglers", "nodes"} <= set(live)
    with svc.client() as c:
        text = c.get("/metrics").raise_for_status().text
    assert f'refinery_phase_shards_done{{run="{rid}",phase="read+map"}} {live["done"]}' in text
    assert f'refinery_phase_docs{{run="{rid}",phase="read+map"}} {live["docs"]}' in text
    assert f'refinery_run_running{{run="{rid}"}} 0' in text


def test_the_allow_list_is_checked_before_import_in_process(tmp_path, monkeypatch):
    """The same guard without a server: parse_dag under an allow-list refuses before importing."""
    import sys

    from curation.pipeline.dag import StageModuleRefused, parse_dag, stage_modules_allowed

    name = f"probe_inproc_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text("raise SystemExit('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    data = yaml.safe_load(_dag(f"{name}:X"))
    with stage_modules_allowed(()), pytest.raises(StageModuleRefused, match="built-in stage types only"):
        parse_dag(data, "d.yaml")
    with stage_modules_allowed(["other"]), pytest.raises(StageModuleRefused, match="allowed \\(other\\)"):
        parse_dag(data, "d.yaml")
    assert name not in sys.modules
    with pytest.raises(ValueError, match="dotted Python name"):
        stage_modules_allowed(["../evil"]).__enter__()


def test_a_run_input_outside_the_allowed_roots_is_403(svc):
    """``format: run`` names another run directory: it is a location like ``paths``."""
    dag = yaml.safe_dump({"name": "probe", "inputs": {"docs": {"format": "run", "run": "/etc", "stage": "x"}},
                          "stages": {"g": {"type": "gopher_quality"}}})
    with svc.client() as c:
        r = c.post("/runs", content=dag)
    assert r.status_code == 403 and "inputs.docs.run" in r.json()["detail"], r.text
