"""``profile:``: a window of training steps under torch.profiler (training/profiling.py), on the
CPU path here (on a GPU the same window records the CUDA kernels too: bench_gpu.py --only trace)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train_helpers import SMALL, losses, records, write_config
from training.config import ConfigError, load_config
from training.synthetic import write_packed
from training.train import main

SEQ, VOCAB, STEPS = 32, 256, 6


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return write_packed(tmp_path_factory.mktemp("prof") / "pack", {"web": 60, "math": 20}, SEQ, vocab=VOCAB)


def config(tmp_path: Path, data: Path, name: str, **extra) -> Path:
    return write_config(tmp_path, name, {
        "seed": 0,
        "model": {"vocab_size": VOCAB, **SMALL},
        "data": {"path": str(data), "seq_len": SEQ},
        "train": {"global_batch": 4, "micro_batch": 2, "steps": STEPS, "threads": 1},
        "checkpoint": {"every": 1000},
        "metrics": {"every": 1, "progress": "off", "tensorboard": False},
        **extra,
    })


def test_a_profiled_window_writes_a_trace_and_an_ops_table_and_trains_the_same(tmp_path, data):
    assert main(str(config(tmp_path, data, "plain"))) == 0
    assert main(str(config(tmp_path, data, "prof", profile={"start": 2, "steps": 2}))) == 0
    run = tmp_path / "prof"
    trace = json.loads((run / "profile" / "rank0_steps2-3.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    # the window's steps, as training steps; the warm-up step and the steps after are not in it
    assert {"train_step 2", "train_step 3"} <= names
    assert not {"train_step 0", "train_step 1", "train_step 4", "train_step 5"} & names
    assert any(str(n).startswith("aten::") for n in names)  # the ops inside the steps
    ops = (run / "profile" / "rank0_steps2-3_ops.txt").read_text()
    assert "self_cpu_time_total" in ops and "aten::" in ops
    event = [r for r in records(run, "event") if r["event"] == "profile"]
    assert len(event) == 1 and Path(event[0]["trace"]).name == "rank0_steps2-3.json"
    assert "top ops per step" in event[0]["message"]
    # the window's shape: two steps, the host's ops counted, no device on CPU
    assert event[0]["steps"] == 2 and event[0]["window_ms"] > 0 and event[0]["device_busy"] is None
    assert event[0]["host_ops_per_step"] > 50 and "host ops per step" in ops
    # the profiler watches; it changes nothing the run computes
    assert losses(run) == losses(tmp_path / "plain") and len(losses(run)) == STEPS


def test_a_run_that_ends_inside_the_window_writes_what_it_recorded(tmp_path, data):
    assert main(str(config(tmp_path, data, "short", profile={"start": 4, "steps": 5}))) == 0
    trace = json.loads((tmp_path / "short" / "profile" / "rank0_steps4-8.json").read_text())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"train_step 4", "train_step 5"} <= names


def test_profile_config_errors_name_the_field(tmp_path, data):
    with pytest.raises(ConfigError, match=r"profile\.start"):
        load_config(config(tmp_path, data, "bad", profile={"start": 0}))
    with pytest.raises(ConfigError, match=r"profile\.stpes: unknown field; did you mean 'steps'"):
        load_config(config(tmp_path, data, "typo", profile={"start": 2, "stpes": 2}))


def test_window_summary_counts_the_device_busy_once_where_kernels_overlap():
    """``window_summary``: the union of the kernels' intervals inside the steps' span (two
    overlapping kernels count once, one after the window not at all), host ops per step."""
    from training.profiling import window_summary

    ev = [{"ph": "X", "name": "train_step 6", "cat": "user_annotation", "ts": 0, "dur": 100},
          {"ph": "X", "name": "train_step 7", "cat": "user_annotation", "ts": 100, "dur": 100},
          {"ph": "X", "name": "train_step 7", "cat": "gpu_user_annotation", "ts": 120, "dur": 130},  # not a step
          {"ph": "X", "name": "k1", "cat": "kernel", "ts": 10, "dur": 20},
          {"ph": "X", "name": "k2", "cat": "kernel", "ts": 20, "dur": 20},     # overlaps k1: 10..40
          {"ph": "X", "name": "c", "cat": "gpu_memcpy", "ts": 150, "dur": 10},  # 150..160
          {"ph": "X", "name": "late", "cat": "kernel", "ts": 250, "dur": 10},   # after the window
          *({"ph": "X", "name": "aten::mm", "cat": "cpu_op", "ts": t, "dur": 1} for t in range(0, 200, 20))]
    got = window_summary({"traceEvents": ev})
    assert got == {"window_ms": 0.2, "steps": 2, "device_busy": pytest.approx(40 / 200), "host_ops_per_step": 5}
