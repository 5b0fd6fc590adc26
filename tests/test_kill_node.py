"""Faults, survived (issue 29): a two-node Ray cluster (real raylets, ``ray.cluster_utils``) runs
a DAG with ``refinery run --address``; the second node is SIGKILLed (raylet, object store and
workers) in the middle of the map phase. Ray retries the lost tasks on the node that is left,
the run finishes, and every shard and manifest is byte-identical to an undisturbed run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from conftest import DATA, REPO
from test_global_resume import _digests

pytestmark = pytest.mark.slow

SLOW = '''
import time
import pyarrow as pa, pyarrow.compute as pc
from curation.stages import MapStage

class Slow(MapStage):
    """Sleeps per batch, so the map phase is still running when a node dies."""
    seconds: float = 1.0

    def measure(self, batch, text=None):
        time.sleep(self.seconds)
        return batch.append_column("chars", pc.utf8_length(batch.column("text"))), text
'''


def _run(dag: Path, out: Path, env: dict, address: str | None = None) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "curation.cli", "run", str(dag), "--out", str(out), "-q"]
    cmd += ["--address", address] if address else ["--workers", "2"]
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_a_node_sigkilled_mid_map_phase_the_run_finishes_byte_identical(tmp_path_factory):
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("n")  # short: Ray's socket paths are capped at 107 bytes
    (root / "slowstage.py").write_text(textwrap.dedent(SLOW))
    dag = root / "dag.yaml"
    dag.write_text(yaml.safe_dump({
        "name": "node-kill",
        "inputs": {"math": {"format": "jsonl", "source": "math", "text_field": "question", "split_bytes": 20_000,
                            "paths": [str(DATA / "jsonl" / "gsm8k_train_head400.jsonl")]}},
        "stages": {"slow": {"type": "slowstage:Slow", "seconds": 0.5},
                   "g": {"type": "gopher_quality", "min_doc_words": 1}}}))
    env = {**os.environ, "RAY_TMPDIR": str(root)}
    env.pop("RAY_ADDRESS", None)

    # the undisturbed reference (embedded Ray) runs beside the cluster run: the slow stage
    # sleeps, so the two barely compete, and this test takes one run's time, not two
    ref = _run(dag, root / "ref", env)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "temp_dir": str(root / "c")})
    try:
        second = cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        t0 = time.time()
        run = _run(dag, root / "run", env, cluster.address)
        progress = root / "run" / "progress.json"
        killed_at = None
        while run.poll() is None and time.time() - t0 < 300:
            try:
                state = json.loads(progress.read_text())
            except (OSError, ValueError):
                state = {}
            p = state.get("phases", {}).get("read+map", {})
            # once the second node has finished a task (so it holds work and results), mid-phase
            if second.node_id in state.get("nodes", {}) and p.get("done", 0) < p.get("total", 0) - 2:
                cluster.remove_node(second, allow_graceful=False)  # SIGKILL: raylet, plasma, workers
                killed_at = dict(p)
                break
            time.sleep(0.1)
        out, _ = run.communicate(timeout=600)
        text = out.decode(errors="replace")
        assert killed_at is not None, f"the map phase ended before the kill: {text[-2000:]}"
        assert run.returncode == 0, text[-3000:]
        seconds = time.time() - t0
    finally:
        cluster.shutdown()
    out, _ = ref.communicate(timeout=600)
    assert ref.returncode == 0, out.decode()[-3000:]
    assert _digests(root / "run") == _digests(root / "ref")
    nodes = json.loads(progress.read_text())["nodes"]
    assert len(nodes) == 2 and sum(nodes.values()) == killed_at["total"]  # both nodes ran tasks, then one died
    print(f"node SIGKILLed at read+map {killed_at['done']}/{killed_at['total']}; run finished in {seconds:.1f} s "
          f"(the undisturbed embedded run beside it); tasks per node {nodes}")
