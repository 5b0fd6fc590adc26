"""Time to quality (``eval.targets``, ``eval.token_budgets``: tokens and wall seconds to a
held-out loss, the loss at token budgets, in metrics.jsonl and summary.json, over a resume),
batches sized in tokens, and the compile-mode knob on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from train_helpers import SMALL, records, write_config
from training.config import ConfigError, load_config
from training.parallel import DistEnv
from training.synthetic import write_packed
from training.train import compile_mode_for, main, parallel_for_compile

SEQ, VOCAB = 64, 256
TARGETS, BUDGETS = [5.0, 4.5, 1.0], [3000.0, 6000.0]


@pytest.fixture(scope="module")
def packs(tmp_path_factory):
    root = tmp_path_factory.mktemp("quality")
    return (write_packed(root / "train", {"web": 300, "math": 100}, SEQ, vocab=VOCAB, seed=0),
            write_packed(root / "eval", {"web": 30, "math": 10}, SEQ, vocab=VOCAB, seed=1))


def config(tmp_path: Path, packs, name: str, **sections) -> Path:
    train, held = packs
    return write_config(tmp_path, name, {
        "seed": 0, "model": {"vocab_size": VOCAB, **SMALL}, "data": {"path": str(train), "seq_len": SEQ},
        "train": {"batch_tokens": 8 * SEQ, "micro_batch": 4, "steps": 30, "threads": 1}, "optim": {"lr": 3e-3},
        "checkpoint": {"every": 1000}, "metrics": {"every": 10, "progress": "off"},
        "eval": {"path": str(held), "every": 10, "batches": 2, "targets": TARGETS, "token_budgets": BUDGETS},
    }, **sections)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, packs):
    tmp = tmp_path_factory.mktemp("straight")
    assert main(str(config(tmp, packs, "run"))) == 0
    return tmp / "run"


def test_targets_and_budgets_in_metrics_and_summary(straight):
    evals = records(straight, "eval")
    events = {(e["event"], e.get("target", e.get("budget"))): e for e in records(straight, "event")}
    summary = json.loads((straight / "summary.json").read_text())
    ttq = summary["time_to_quality"]
    # tokens count up step by step (at most 8 rows x 63 targets a step), wall time too
    assert all(b["tokens"] > a["tokens"] and b["wall_s"] >= a["wall_s"] for a, b in zip(evals, evals[1:]))
    for budget in BUDGETS:
        at = ttq["token_budgets"][f"{budget:g}"]
        # measured by an eval at the first step whose tokens reach the budget
        assert budget <= at["tokens"] < budget + 8 * (SEQ - 1), at
        assert any(e["step"] == at["step"] and e["eval_loss"] == at["eval_loss"] for e in evals)
        assert events["token_budget", budget]["tokens"] == at["tokens"]
    assert {e["step"] for e in evals} >= {9, 19, 29}  # the every-10 evals still run
    for target in TARGETS:
        first = next((e for e in evals if e["eval_loss"] <= target), None)
        got = ttq["targets"][f"{target:g}"]
        if first is None:
            assert got is None and ("target_reached", target) not in events
        else:
            assert (got["step"], got["tokens"], got["eval_loss"]) == (first["step"], first["tokens"], first["eval_loss"])
            assert events["target_reached", target]["step"] == first["step"]
    assert ttq["targets"]["1"] is None  # a tiny model on random motifs does not get there
    assert ttq["targets"]["5"] is not None
    assert summary["final_eval_loss"] == evals[-1]["eval_loss"] and summary["tokens"] >= evals[-1]["tokens"]


def test_time_to_quality_continues_over_a_resume(tmp_path, packs, straight):
    """Stopped at step 8 and resumed: the same steps and token counts as the straight run (the
    counts are in the checkpoint), wall seconds counting on."""
    path = config(tmp_path, packs, "resumed", checkpoint={"every": 8})
    assert main(str(path), overrides=["train.stop_at_step=8"]) == 0
    first = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    assert main(str(path)) == 0
    a = json.loads((straight / "summary.json").read_text())["time_to_quality"]
    b = json.loads((tmp_path / "resumed" / "summary.json").read_text())["time_to_quality"]
    for kind in ("targets", "token_budgets"):
        assert {k: v and (v["step"], v["tokens"]) for k, v in a[kind].items()} == \
               {k: v and (v["step"], v["tokens"]) for k, v in b[kind].items()}
    assert json.loads((tmp_path / "resumed" / "summary.json").read_text())["wall_s"] > first["wall_s"]


def test_batch_sizes_in_tokens(tmp_path, packs):
    cfg = load_config(config(tmp_path, packs, "t", train={"micro_batch": None, "micro_batch_tokens": 2 * SEQ}))
    assert (cfg.train.global_batch, cfg.train.micro_batch) == (8, 2)
    with pytest.raises(ConfigError, match="batch_tokens .* multiple of data.seq_len"):
        load_config(config(tmp_path, packs, "t2", train={"batch_tokens": 8 * SEQ + 1}))
    with pytest.raises(ConfigError, match="one of train.global_batch"):
        load_config(config(tmp_path, packs, "t3", train={"batch_tokens": None}))
    with pytest.raises(ConfigError, match="disagree"):
        load_config(config(tmp_path, packs, "t4", train={"global_batch": 4}))
    # a dumped config (both fields) reads back
    assert load_config(config(tmp_path, packs, "t5", train={"global_batch": 8})).train.global_batch == 8


def test_compile_mode_cuda_graphs(tmp_path, packs):
    """CUDA graphs: on CPU the mode falls back to default with a note; on one process ``auto``
    means no data-parallel wrapper; with FSDP2 (its hooks cannot be captured) it is refused."""
    graphs = load_config(config(tmp_path, packs, "g", train={"compile": True, "compile_mode": "reduce-overhead"}))
    notes: list[str] = []
    assert compile_mode_for(graphs, DistEnv(0, 1, 0, torch.device("cpu")), notes) == "default"
    assert "CUDA graphs need a CUDA device" in notes[0]
    one_gpu = DistEnv(0, 1, 0, torch.device("cuda", 0))
    assert parallel_for_compile(graphs).strategy == "none"  # what run() hands on for one process
    resolved = graphs.model_copy(update={"parallel": parallel_for_compile(graphs)})
    assert compile_mode_for(resolved, one_gpu, []) == "reduce-overhead"
    fsdp = graphs.model_copy(update={"parallel": graphs.parallel.model_copy(update={"strategy": "fsdp"})})
    assert parallel_for_compile(fsdp).strategy == "fsdp"
    with pytest.raises(ConfigError, match="cannot capture fsdp's hooks"):
        compile_mode_for(fsdp, one_gpu, [])
    plain = load_config(config(tmp_path, packs, "p", train={"compile": True, "compile_mode": "max-autotune-no-cudagraphs"}))
    assert parallel_for_compile(plain).strategy == "auto" and compile_mode_for(plain, one_gpu, []) == "max-autotune-no-cudagraphs"


def test_cuda_graph_mode_runs_on_cpu_with_the_note(tmp_path, packs):
    """The knob on CPU (eager here: compile off would make it moot, so compile stays on with a
    one-step run): the run trains and its log says what was ignored."""
    path = config(tmp_path, packs, "cg", train={"compile": True, "compile_mode": "reduce-overhead", "steps": 2},
                  eval=None, metrics={"every": 1})
    assert main(str(path)) == 0
    notes = [e["message"] for e in records(tmp_path / "cg", "event") if e["event"] == "note"]
    assert any("CUDA graphs need a CUDA device; compiling with mode default on cpu" in n for n in notes), notes
    assert len(records(tmp_path / "cg")) == 2
