"""A real two-node Ray cluster on this machine (`ray start --head` + `ray start --address`):
one DAG's map tasks land on both nodes, and its shards are byte-identical to a one-node run."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from conftest import REPO

RAY = str(Path(sys.executable).parent / "ray")
REFINERY = [sys.executable, "-m", "curation.cli"]

DAG = {
    "name": "two-nodes",
    "inputs": {"crawl": {"format": "warc", "paths": [str(REPO / "tests/data/warc/*.warc.gz")], "source": "web"},
               "ccnet": {"format": "jsonl", "paths": [str(REPO / "tests/data/jsonl/dolma_cc_en_head-*.jsonl.gz")], "source": "web"}},
    "stages": {"extract": {"type": "extract", "input": "crawl", "engine": "resiliparse"},
               "web": {"type": "union", "inputs": ["extract", "ccnet"]},
               "gopher": {"type": "gopher_quality", "input": "web"},
               "c4": {"type": "c4_quality", "input": "gopher"}},
    "output": "c4",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and proc.poll() is None and text not in log.read_text(errors="replace"):
        time.sleep(0.5)
    assert text in log.read_text(errors="replace"), log.read_text(errors="replace")[-2000:]


TOKEN = secrets.token_hex(32)


@pytest.fixture(scope="module")
def two_nodes():
    """Head (1 CPU) and a second node (1 CPU) joined to it, each in its own process group with
    a private temp dir, killed exactly (never `ray stop`, which would stop every Ray here)."""
    temp = tempfile.mkdtemp(prefix="r2n-", dir="/tmp")  # short: Ray's socket paths have a length limit
    port = _free_port()
    # token auth with this cluster's own token, given to every process (nothing is written to
    # ~/.ray, which would switch later Ray sessions on this machine to token auth)
    env = {**os.environ, "RAY_ADDRESS": "", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
    procs = []
    try:
        for i, args in enumerate([["--head", f"--port={port}", f"--temp-dir={temp}", "--include-dashboard=false"],
                                  [f"--address=127.0.0.1:{port}"]]):
            log = Path(f"{temp}-{i}.log")
            with open(log, "wb") as out:
                procs.append(subprocess.Popen([RAY, "start", *args, "--num-cpus=1", "--disable-usage-stats", "--block"],
                                              env=env, cwd=temp, start_new_session=True, stdout=out, stderr=subprocess.STDOUT))
            _wait_for(log, "Ray runtime started", procs[-1])
        yield f"127.0.0.1:{port}"
    finally:
        for p in procs[::-1]:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        # raylets and GCS may have left the group: every process naming our temp dir goes too
        for d in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                if temp.encode() in (d / "cmdline").read_bytes():
                    os.kill(int(d.name), signal.SIGKILL)


def _run(dag_file: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN, "RAY_ADDRESS": ""}
    res = subprocess.run([*REFINERY, "run", str(dag_file), "--out", str(out), "-q", *extra], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
    return res


def _beside_a_local_run(cluster_run: tuple, dag_file: Path, local: Path) -> None:
    """``_run(*cluster_run)`` (a ``refinery run --address`` process) and, meanwhile, its one-worker
    reference in this process (``run_dag`` on the session's one-node Ray): they share nothing
    (the cluster has its own temp dir), and the reference needs no process and Ray of its own."""
    from curation.pipeline.dag import load_dag
    from curation.pipeline.executor import run_dag

    with ThreadPoolExecutor(1) as pool:
        done = pool.submit(_run, *cluster_run)
        run_dag(load_dag(dag_file), local, workers=1, quiet=True)
        done.result()


def _entries(run: Path, stage: str) -> list[dict]:
    return [json.loads(line) for line in (run / stage / "_manifest.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_tasks_run_on_both_nodes_and_match_a_one_node_run(tmp_path, two_nodes, ray_session):
    dag_file = tmp_path / "dag.yaml"
    dag_file.write_text(yaml.safe_dump(DAG))
    # no --workers: as many tasks in flight as the cluster has CPUs (2, one per node); the
    # one-worker reference (this process, on one node) runs beside it
    _beside_a_local_run((dag_file, tmp_path / "cluster", "--address", two_nodes), dag_file, tmp_path / "local")
    # progress.json counts the map tasks per Ray node id they ran on
    nodes = json.loads((tmp_path / "cluster" / "progress.json").read_text())["nodes"]
    assert len(nodes) == 2 and sum(nodes.values()) == 6, nodes  # 6 input shards, tasks on both nodes
    assert len(json.loads((tmp_path / "local" / "progress.json").read_text())["nodes"]) == 1
    for stage in ("extract", "gopher", "c4"):
        shards = lambda run: {e["shard"]: (e.get("sha256"), e["rows"], e.get("rejected_sha256"))  # noqa: E731
                              for e in _entries(run, stage)}
        assert shards(tmp_path / "cluster") == shards(tmp_path / "local"), stage


@pytest.mark.slow
def test_against_an_index_on_two_nodes_is_byte_identical_to_one_worker(tmp_path, two_nodes, ray_session):
    """Issue 31: snapshot B deduplicated (exact + near) against snapshot A's corpus index on the
    two-node cluster and with one local worker: the same shards, manifests, persisted keys and
    LSH state, and the same index member built from each. (Snapshot A's run, the index's input,
    is this process's, on the session's Ray.)"""
    from curation.pipeline.dag import load_dag
    from curation.pipeline.executor import run_dag
    from test_corpus_index import _digests, _index_digests, _snapshots, _write

    A, B, _ = _snapshots()
    _write(tmp_path / "in" / "a.jsonl.gz", A)
    for k in range(4):  # four shards: read tasks on both nodes (global phases' tasks are not counted per node)
        _write(tmp_path / "in" / f"b-{k}.jsonl.gz", B[k::4])

    def dag(name: str, against: list[str]) -> Path:
        d = {"name": "snap",
             "inputs": {"docs": {"format": "jsonl", "paths": [str(tmp_path / "in" / name)], "source": "web",
                                 "id_field": "id", "split_bytes": 60000}},
             "stages": {"exact": {"type": "exact_dedup", "input": "docs", "partitions": 4, "against": against,
                                  "bloom": {"expected_items": 10_000, "false_positive_rate": 1e-6}},
                        "near": {"type": "minhash_dedup", "input": "exact", "partitions": 4, "against": against}},
             "output": "near"}
        f = tmp_path / f"{name[0]}.yaml"
        f.write_text(yaml.safe_dump(d))
        return f

    index = tmp_path / "index"
    run_dag(load_dag(dag("a.jsonl.gz", [])), tmp_path / "cc-a", workers=1, quiet=True)
    res = subprocess.run([*REFINERY, "index", "build", str(tmp_path / "cc-a"), "--out", str(index)], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    b = dag("b-*.jsonl.gz", [str(index)])
    _beside_a_local_run((b, tmp_path / "cluster", "--address", two_nodes), b, tmp_path / "local")
    assert len(json.loads((tmp_path / "cluster" / "progress.json").read_text())["nodes"]) == 2
    got, want = _digests(tmp_path / "cluster"), _digests(tmp_path / "local")
    assert got == want and any("/_keys/" in k for k in got) and any("/_lsh/" in k for k in got)
    adds = [subprocess.Popen([*REFINERY, "index", "add", str(tmp_path / f"index-{run}"), str(tmp_path / run),
                              "--name", "cc-b"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for run in ("cluster", "local")]  # two independent processes at once
    for add in adds:
        out, _ = add.communicate(timeout=300)
        assert add.returncode == 0, out
    assert _index_digests(tmp_path / "index-cluster") == _index_digests(tmp_path / "index-local")


def test_a_run_without_address_stays_embedded_beside_a_recorded_cluster(two_nodes):
    """``ray start`` records its address on the machine (``$RAY_TMPDIR/ray/ray_current_cluster``),
    and a bare ``ray.init`` joins it: ``refinery run --workers 1`` then failed with Ray's "When
    connecting to an existing cluster, num_cpus and num_gpus must not be provided". Without
    ``--address`` a run is embedded (the README's promise), whatever cluster is recorded here."""
    tmp = Path(tempfile.mkdtemp(prefix="re-", dir="/tmp"))  # short: Ray's socket paths are capped
    try:
        (tmp / "ray").mkdir()
        (tmp / "ray" / "ray_current_cluster").write_text(two_nodes)  # as `ray start --head` leaves it
        dag = tmp / "dag.yaml"
        dag.write_text(yaml.safe_dump({
            "name": "embedded",
            "inputs": {"web": {"format": "jsonl", "source": "web",
                               "paths": [str(REPO / "tests/data/jsonl/dolma_cc_en_head-0091.jsonl.gz")]}},
            "stages": {"gopher": {"type": "gopher_quality", "input": "web"}}}))
        env = {**os.environ, "RAY_TMPDIR": str(tmp), "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}
        env.pop("RAY_ADDRESS", None)
        res = subprocess.run([*REFINERY, "run", str(dag), "--out", str(tmp / "run"), "-q", "--workers", "1"],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-3000:]
        progress = json.loads((tmp / "run" / "progress.json").read_text())
        assert len(progress["nodes"]) == 1 and progress["state"] == "done", progress  # one (embedded) node
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
