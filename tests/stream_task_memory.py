"""Run one map task in this process and print its peak memory growth (a subprocess of
``test_streaming.py``: peak RSS is per process and cannot be reset)."""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

from curation.pipeline.dag import parse_dag
from curation.pipeline.executor import RootJob, _root_entries, make_plan
from curation.pipeline.rundir import RunDir


def main(src: str, work: str, batch_bytes: int) -> None:
    spec = {"name": "mem", "batch_bytes": batch_bytes,
            "inputs": {"docs": {"format": "jsonl", "paths": [src], "source": "web", "split_bytes": 1 << 30}},
            "stages": {"gopher": {"type": "gopher_quality", "input": "docs"},
                       "c4": {"type": "c4_quality", "input": "gopher"},
                       "fineweb": {"type": "fineweb_quality", "input": "c4"}}}
    dag = parse_dag(spec, str(Path(work) / "dag.yaml"), work)
    (shard,) = make_plan(dag).input_shards["docs"]
    rundir = RunDir(Path(work) / "run")
    rundir.prepare(dag, overwrite=True)
    # stage setup (word lists, compiled kernels) is not what is measured: warm it on a few rows
    warm = RootJob(dag.to_dict(), dag.path, dag.base_dir, RunDir(Path(work) / "warm"), "docs", shard.key,
                   shard.__class__(**{**shard.__dict__, "end": min(shard.size, 200_000)}), None, False)
    _root_entries(warm)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    entries = _root_entries(RootJob(dag.to_dict(), dag.path, dag.base_dir, rundir, "docs", shard.key, shard,
                                    None, False))
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"growth_mb": after - before, "rows": {e["stage"]: e["rows"] for e in entries}}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
