"""What a DAG cannot do, whoever wrote it (issue #52, review security-s4 findings 2, 6, 9, 10
and row 16): names are names (no write outside the run directory, even with ``parse_dag``
bypassed), stage parameters declared as paths are checked against the service's roots before
any validator opens them (everything else is data), and under an operator's allow-list no
module is imported from elsewhere, upstream runs' ``dag.yaml`` included."""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import pyarrow as pa
import pytest
import yaml
from typer.testing import CliRunner

from curation.cli import app
from curation.pipeline.dag import STAGE_MODULES_ENV, DagError, load_dag, parse_dag
from curation.pipeline.executor import make_plan
from curation.pipeline.rundir import OutsideRunDir, RunDir, ShardOutput
from curation.service.auth import PathPolicy
from curation.service.admission import SubmitError, admit_dag
from curation.stages import registry

DOC = {"id": "d1", "text": "hello world", "url": "http://a.example/x"}


def _dag(inputs: dict | None = None, stages: dict | None = None) -> dict:
    return {"name": "b",
            "inputs": inputs or {"docs": {"format": "jsonl", "paths": ["data/docs.jsonl"], "source": "web"}},
            "stages": stages or {"s": {"type": "select", "where": "true"}}}


# ---------------------------------------------------------------------------------------------
# names are names

HOSTILE_NAMES = ["../../other-run/sel/docs", "../../../x", "..", ".", "a/b", "/abs", "a..b", "", "x" * 129,
                 "-lead", "rejected", "tab\tname"]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
@pytest.mark.parametrize("part", ["inputs", "stages"])
def test_hostile_node_names_are_refused_by_parse_dag(name, part):
    d = _dag()
    if part == "inputs":
        d["inputs"] = {name: d["inputs"]["docs"]}
    else:
        d["stages"] = {name: d["stages"]["s"]}
    with pytest.raises(DagError, match=rf"{part}: .*(not a node name|the run directory uses itself)"):
        parse_dag(d)


def test_ordinary_names_still_parse():
    d = _dag(stages={"sel_v1.2-en": {"type": "select", "where": "true"}})
    d["inputs"] = {"web_2024.cc-main": d["inputs"]["docs"]}
    assert list(parse_dag(d).stages) == ["sel_v1.2-en"]


def _files_outside(root: Path, inside: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and inside not in p.parents]


BAD_PARTS = ["../x", "../../escape", "a/../../x", "/abs", ".", "..", "", "a//b", "./a"]


@pytest.mark.parametrize("bad", BAD_PARTS)
def test_every_rundir_writer_refuses_a_location_outside_it(tmp_path, bad):
    """parse_dag bypassed: each writer given a hostile stage name, then a hostile shard key."""
    run = tmp_path / "runs" / "r"
    run.mkdir(parents=True)
    rd = RunDir(run)
    t = pa.table({"id": ["a"], "text": ["t"]})
    rej = pa.table({"id": ["b"], "text": ["u"], "reason": ["x"]})
    writers = {
        "write_stage_shard": lambda s, k: rd.write_stage_shard(s, k, t, rej, 2, "h"),
        "open_shard": lambda s, k: rd.open_shard(s, k, "h").append(t, rej, 2),
        "shard_output": lambda s, k: ShardOutput(rd, s, "h", k).write(t, rej, 2),
        "commit": lambda s, k: rd.commit([{"stage": s, "shard": k, "file": None}]),
        "write_report": lambda s, k: rd.write_report(s, k, {"x": 1}),
        "work_dir": lambda s, k: os.makedirs(rd.work_dir(s, k)),
        "remove_work": lambda s, k: rd.remove_work(s, k),
        "rejected_path": lambda s, k: open(rd.rejected_path(s, k), "w").close(),
    }
    for name, write in writers.items():
        for stage, key in ((bad, "k0"), ("ok", bad)):
            if name == "commit" and stage == "ok":
                continue  # the manifest's location depends on the stage only
            if stage == "ok" and "/" not in bad and name not in ("write_report", "work_dir", "remove_work"):
                continue  # a key is a file name's stem: '.' or '' make '..parquet', still inside
            with pytest.raises(OutsideRunDir):
                write(stage, key)
                pytest.fail(f"{name}({stage!r}, {key!r}) wrote")
    assert _files_outside(tmp_path, run) == []
    with pytest.raises(OutsideRunDir):
        rd.path("../../etc/passwd")  # a manifest line pointing out is not followed either


def test_a_symlinked_stage_folder_leading_out_is_refused(tmp_path):
    run, outside = tmp_path / "run", tmp_path / "outside"
    run.mkdir()
    outside.mkdir()
    (run / "sel").symlink_to(outside)
    rd = RunDir(run)
    with pytest.raises(OutsideRunDir, match="symlink"):
        rd.write_stage_shard("sel", "k", pa.table({"id": ["a"]}), None, 1, "h")
    assert list(outside.iterdir()) == []


def test_object_storage_keys_with_dot_segments_are_refused():
    rd = RunDir("s3://bucket/runs/r")
    assert rd.shard_path("sel", "docs-00000") == "s3://bucket/runs/r/sel/docs-00000.parquet"
    for stage, key in (("../other", "k"), ("sel", "../../k"), ("a/./b", "k"), ("", "k")):
        with pytest.raises(OutsideRunDir):
            rd.shard_path(stage, key)


# ---------------------------------------------------------------------------------------------
# path parameters: checked before they are opened; everything else is data


@pytest.fixture
def base(tmp_path):
    """The review's layout: base dir with a token and runs, one allowed root ``data``."""
    b = tmp_path / "svc"
    (b / "data").mkdir(parents=True)
    (b / "runs" / "r1").mkdir(parents=True)
    (b / "runs" / "r1" / "submitted.yaml").write_text("name: r1\n")
    (b / "token").write_text("TOKEN-outside-root\n")
    (b / "probe.json").write_text("{}")
    (tmp_path / "secret.txt").write_text("TOPSECRET")
    (b / "data" / "docs.jsonl").write_text(json.dumps(DOC) + "\n")
    (b / "data" / "passwd_link").symlink_to("/etc/passwd")
    (b / "data" / "secret_link").symlink_to(tmp_path / "secret.txt")
    return b


def _admit(base: Path, d: dict, stage_modules=()):
    return admit_dag(yaml.safe_dump(d), PathPolicy(["data"], base), stage_modules=stage_modules)


#: review row 16: every one refused before any read (403); two more that match no file (422)
INPUT_TRICKS_403 = ["/etc/passwd", "../../etc/passwd", "file:///etc/passwd", "data/passwd_link", "data/secret_link",
                    "token", "data/../token", "data/*", "data/**", "/etc/pass*", "data/../../secret.txt", "~/.bashrc",
                    "http://127.0.0.1:8765/healthz", "s3://bucket/x.jsonl", "simplecache::file:///etc/passwd",
                    "/proc/self/environ", "runs/*/submitted.yaml", "memory://x", "file://data/../../secret.txt",
                    "/usr/../etc/passwd"]
INPUT_TRICKS_422 = ["data/[", "data/docs.jsonl#/etc/passwd"]


@pytest.mark.parametrize("path", INPUT_TRICKS_403 + INPUT_TRICKS_422)
def test_input_path_tricks_are_refused(base, path):
    d = _dag({"docs": {"format": "jsonl", "paths": [path], "source": "web"}})
    with pytest.raises(SubmitError) as e:
        _admit(base, d)
    assert e.value.status == (422 if path in INPUT_TRICKS_422 else 403), str(e.value)


PARAM_TRICKS = ["token", "nosuch", "probe.json", "/etc/passwd", "../secret.txt", "~/.bashrc", "file:///etc/passwd",
                "simplecache::file:///etc/passwd", "s3://bucket/m.bin", "data/../token", "/proc/self/environ"]


@pytest.mark.parametrize("stage", [
    {"type": "quality", "model": "{v}"},
    {"type": "langid", "model": "{v}"},
    {"type": "tokenize", "tokenizer": "{v}"},
    {"type": "gopher_quality", "lang_config": "{v}.json"},
    {"type": "url_filter", "blocklists": [{"name": "b", "path": "{v}"}]},
    {"type": "badwords", "word_lists": {"en": "{v}"}},
    {"type": "decontaminate", "eval_paths": ["{v}"]},
    {"type": "exact_dedup", "against": ["{v}"]},
])
def test_path_parameters_are_refused_before_anything_opens_them(base, stage, monkeypatch):
    """Finding 9: a bare name is resolved against the base dir and refused there, never opened
    (no 'no such file' versus 'not a model' oracle)."""
    opened: list[str] = []
    real_open = open

    def spy(f, *a, **k):
        opened.append(str(f))
        return real_open(f, *a, **k)

    for v in PARAM_TRICKS:
        st = json.loads(json.dumps(stage).replace("{v}", v))
        monkeypatch.setattr("builtins.open", spy)
        try:
            with pytest.raises(SubmitError) as e:
                _admit(base, _dag(stages={"p": st}))
        finally:
            monkeypatch.setattr("builtins.open", real_open)
        assert e.value.status == 403 and "outside the allowed roots" in str(e.value), (v, str(e.value))
        assert "stages.p." in str(e.value)
        assert not [f for f in opened if "token" in f or "secret" in f or "probe" in f or "passwd" in f], opened


def test_a_path_parameter_under_a_root_is_pinned_to_its_real_path(base):
    (base / "data" / "q.bin").write_bytes(b"not a model")
    with pytest.raises(SubmitError) as e:  # under the root: now the validator may open it, and says why not
        _admit(base, _dag(stages={"q": {"type": "quality", "model": "data/q.bin"}}))
    assert e.value.status == 422 and "not a fastText model" in str(e.value)
    (base / "data" / "words.txt").write_text("badword\n")
    dag = _admit(base, _dag(stages={"b": {"type": "badwords", "word_lists": {"en": "data/../data/words.txt"}}}))
    assert dag.stages["b"].word_lists == {"en": str((base / "data" / "words.txt").resolve())}


@pytest.mark.parametrize("stage", [
    {"type": "select", "where": "length(text) / 2 > 10"},
    {"type": "url_filter", "url_regexes": [r"^https?://[^/]*\.xxx(?:[:/]|$)"]},
    {"type": "url_filter", "blocklists": [{"name": "b", "entries": ["example.com/ads/", "http://x.example/a/b"]}]},
    {"type": "gopher_quality", "lang_config": "fineweb2"},
    {"type": "gopher_quality", "stop_words": ["and/or", "w/"]},
])
def test_strings_that_are_not_paths_are_data(base, stage):
    """Finding 10: a '/' in a where expression, a URL regex or a blocklist entry is admitted."""
    dag = _admit(base, _dag(stages={"p": stage}))
    assert dag.stages["p"].type == stage["type"]


def test_the_where_exploit_is_a_422_at_admission(base):
    where = "error((SELECT text FROM read_text(chr(47)||'etc'||chr(47)||'hostname') t(url, text))) IS NULL"
    with pytest.raises(SubmitError) as e:
        _admit(base, _dag(stages={"s": {"type": "select", "where": where}}))
    assert e.value.status == 422 and "subquery" in str(e.value)


def test_hostile_names_are_refused_at_admission(base):
    d = _dag({"../../r1/sel/docs": {"format": "jsonl", "paths": ["data/docs.jsonl"], "source": "web"}})
    with pytest.raises(SubmitError) as e:
        _admit(base, d)
    assert e.value.status == 422 and "not a node name" in str(e.value)


# ---------------------------------------------------------------------------------------------
# code only from where the operator allows


@pytest.fixture
def evil(tmp_path, monkeypatch):
    """A module on the import path whose import leaves a marker file (as the review's
    ``mypkgevil``), and an upstream run directory whose dag.yaml names it."""
    pkg = tmp_path / "pylib"
    pkg.mkdir()
    marker = tmp_path / "imported.marker"
    (pkg / "sec52evil.py").write_text(f"open({str(marker)!r}, 'w').write('x')\nclass Evil: pass\n")
    monkeypatch.syspath_prepend(str(pkg))
    up = tmp_path / "upstream_run"
    up.mkdir()
    (tmp_path / "docs.jsonl").write_text(json.dumps(DOC) + "\n")
    (up / "dag.yaml").write_text(yaml.safe_dump(
        _dag({"docs": {"format": "jsonl", "paths": [str(tmp_path / "docs.jsonl")], "source": "web"}},
             {"sel": {"type": "sec52evil:Evil"}})))
    (up / "progress.json").write_text(json.dumps({"state": "done"}))
    down = tmp_path / "down.yaml"
    down.write_text(yaml.safe_dump(_dag({"prev": {"format": "run", "run": str(up), "stage": "sel"}})))
    yield marker, down
    sys.modules.pop("sec52evil", None)
    registry.pop("sec52evil:Evil", None)


def test_an_upstream_runs_module_is_not_imported_under_an_allow_list(evil, monkeypatch):
    """Finding 6: the run process holds an upstream run's dag.yaml to the allow-list too."""
    marker, down = evil
    monkeypatch.setenv(STAGE_MODULES_ENV, "")  # what the service passes: built-in stages only
    from curation.io.inputs import InputError

    with pytest.raises(InputError, match="built-in stage types only"):
        make_plan(load_dag(down))
    assert not marker.exists()
    # `refinery run` says so and stops before Ray starts
    r = CliRunner().invoke(app, ["run", str(down), "--out", str(down.parent / "out"), "--stage-modules", "mypkg"])
    assert r.exit_code == 2 and "allowed (mypkg)" in r.output.replace("\n", ""), r.output
    assert not marker.exists()
    # without an allow-list (a user's own run) the module is imported, as before
    monkeypatch.delenv(STAGE_MODULES_ENV)
    with pytest.raises(Exception):  # noqa: B017 (the class is not a stage: it fails after the import)
        make_plan(load_dag(down))
    assert marker.exists()


def test_no_folder_is_put_on_sys_path_under_an_allow_list(tmp_path, monkeypatch):
    """A module next to the DAG file is found for a user's own run, never under an allow-list
    (then only what the operator installed is importable)."""
    (tmp_path / "nextdoor52.py").write_text(f"open({str(tmp_path / 'm')!r}, 'w').close()\n")
    dag = tmp_path / "d.yaml"
    dag.write_text(yaml.safe_dump(_dag(stages={"s": {"type": "nextdoor52:X"}})))
    monkeypatch.setenv(STAGE_MODULES_ENV, "nextdoor52")
    path_before = list(sys.path)
    try:
        with pytest.raises(DagError, match="cannot load"):
            load_dag(dag)
        assert sys.path == path_before and not (tmp_path / "m").exists()
        monkeypatch.delenv(STAGE_MODULES_ENV)
        with pytest.raises(DagError, match="has no class"):  # found next to the DAG: imported
            load_dag(dag)
        assert (tmp_path / "m").exists()
    finally:
        sys.path[:] = path_before
        sys.modules.pop("nextdoor52", None)


def test_a_run_directory_is_never_a_place_to_import_from(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "inrun52.py").write_text(f"open({str(tmp_path / 'm')!r}, 'w').close()\n")
    d = copy.deepcopy(_dag(stages={"s": {"type": "inrun52:X"}}))
    (run / "dag.yaml").write_text(yaml.safe_dump(d))
    path_before = list(sys.path)
    try:
        with pytest.raises(DagError, match="cannot import"):
            RunDir(run).load_dag()
        assert not (tmp_path / "m").exists() and str(run) not in sys.path
    finally:
        sys.path[:] = path_before
        sys.modules.pop("inrun52", None)
