"""Mixture phases in one run, and annealing branches off a stable-phase checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from train_helpers import SMALL, records, write_config
from training.synthetic import write_packed
from training.train import main

SEQ, VOCAB = 32, 256
STABLE = {"web": 0.7, "math": 0.2, "code": 0.1}
ANNEAL = {"web": 0.2, "math": 0.5, "code": 0.3}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    # Full rows (no padding), so a source's share of tokens is its share of rows.
    return write_packed(tmp_path_factory.mktemp("phases") / "pack", {"web": 900, "math": 400, "code": 300}, SEQ, vocab=VOCAB, pad_prob=0.0)


def config(tmp_path: Path, data_dir: Path, name: str, **sections) -> Path:
    return write_config(tmp_path, name, {
        "model": {"vocab_size": VOCAB, **SMALL},
        "data": {"path": str(data_dir), "seq_len": SEQ},
        "train": {"global_batch": 20, "micro_batch": 10, "threads": 1},
        "optim": {"lr": 1e-3},
        "schedule": {"warmup_steps": 3},
        "phases": [
            # tokens: 30 steps x 20 rows x 32 tokens; the anneal phase is given in steps.
            {"name": "stable", "tokens": 30 * 20 * SEQ, "mix": STABLE, "lr": {"shape": "constant"}},
            {"name": "anneal", "steps": 20, "mix": ANNEAL, "lr": {"shape": "linear", "end_factor": 0.0}},
        ],
        "checkpoint": {"every": 10},
        "metrics": {"every": 5, "progress": "plain", "log_row_ids": True},
    }, **sections)


def shares(recs: list[dict]) -> dict[str, float]:
    total: dict[str, float] = {}
    for r in recs:
        for s, n in r["tokens_by_source"].items():
            total[s] = total.get(s, 0) + n
    n = sum(total.values())
    return {s: v / n for s, v in total.items()}


def rows_by_step(run_dir: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for f in (run_dir / "row_ids").glob("rank*.jsonl"):
        for r in map(json.loads, f.read_text().splitlines()):
            out.setdefault(r["step"], []).extend(r["rows"])
    return out


def test_phase_weights_and_switch(tmp_path, data):
    assert main(str(config(tmp_path, data, "run"))) == 0
    recs = records(tmp_path / "run")
    assert [(r["step"], r["phase"]) for r in recs] == [(s, "stable" if s < 30 else "anneal") for s in range(4, 50, 5)]
    stable, anneal = [r for r in recs if r["phase"] == "stable"], [r for r in recs if r["phase"] == "anneal"]
    for got, want in ((shares(stable), STABLE), (shares(anneal), ANNEAL)):
        for s, w in want.items():
            assert got[s] == pytest.approx(w, abs=0.02), (got, want)
    # The switch is at the phase boundary: the first anneal window already has the anneal mix.
    for s, w in ANNEAL.items():
        assert shares(anneal[:1])[s] == pytest.approx(w, abs=0.02)
    # Cumulative per-source counters add up.
    assert recs[-1]["tokens_seen_by_source"] == pytest.approx({s: sum(r["tokens_by_source"][s] for r in recs) for s in STABLE})
    # LR: constant through the stable phase (after warm-up), then linear to 0 from there.
    lr = {r["step"]: r["lr"] for r in recs}
    assert lr[4] == lr[29] == pytest.approx(1e-3)
    assert lr[34] == pytest.approx(1e-3 * (1 - 4 / 19)) and lr[49] == 0.0


def test_anneal_branch_from_stable_checkpoint(tmp_path, data):
    """--anneal-from CKPT --mix ...: one stable run, a decay branch starting at step 10's LR."""
    # A cosine parent, so the LR at the branch point is not simply the peak.
    stable = config(tmp_path, data, "stable", phases=[{"name": "stable", "steps": 40, "mix": STABLE}],
                    schedule={"kind": "cosine", "warmup_steps": 3}, metrics={"every": 1})
    assert main(str(stable), overrides=["train.stop_at_step=20"]) == 0
    parent_ckpt = tmp_path / "stable" / "checkpoints" / "step_00000010"
    parent_lr = {r["step"]: r["lr"] for r in records(tmp_path / "stable")}

    branch_dir = tmp_path / "branch"
    code = main(str(stable), overrides=[f"run_dir={branch_dir}", "anneal.steps=10"],
                anneal_from=str(parent_ckpt), mix="math=0.6,code=0.4")
    assert code == 0
    recs = records(branch_dir)
    assert [r["step"] for r in recs] == list(range(10, 20))
    assert {r["phase"] for r in recs} == {"anneal"}
    # It starts at the LR the stable schedule had at step 10 and decays linearly to 0.
    lrs = [r["lr"] for r in recs]
    assert lrs[0] == parent_lr[10] and parent_lr[10] < 1e-3
    assert lrs[-1] == 0.0 and all(a > b for a, b in zip(lrs, lrs[1:]))
    got = shares(recs)
    assert got["math"] == pytest.approx(0.6, abs=0.02) and got["code"] == pytest.approx(0.4, abs=0.02)
    assert got.get("web", 0.0) == 0.0
    # The branch continues each source stream: no row the parent used before step 10 comes back.
    parent_rows = {r for s, rows in rows_by_step(tmp_path / "stable").items() if s < 10 for r in rows}
    branch_rows = {r for rows in rows_by_step(branch_dir).values() for r in rows}
    assert parent_rows and branch_rows and not parent_rows & branch_rows
    meta = json.loads((branch_dir / "checkpoints" / "step_00000020" / "meta.json").read_text())
    assert meta["anneal"]["at_step"] == 10 and meta["anneal"]["mix"] == {"math": 0.6, "code": 0.4}
    assert [p["name"] for p in meta["plans"]] == ["stable", "anneal"]
    # Running the same command again resumes the branch's own lineage: already complete.
    assert main(str(stable), overrides=[f"run_dir={branch_dir}", "anneal.steps=10"], anneal_from=str(parent_ckpt), mix="math=0.6,code=0.4") == 0
    assert len(records(branch_dir)) == 10


def test_anneal_branch_needs_its_own_run_dir(tmp_path, data, capsys):
    path = config(tmp_path, data, "same", phases=[{"name": "stable", "steps": 10, "mix": STABLE}])
    assert main(str(path), overrides=["train.stop_at_step=5", "checkpoint.every=5"]) == 0
    ckpt = tmp_path / "same" / "checkpoints" / "step_00000005"
    assert main(str(path), resume="never", anneal_from=str(ckpt), mix="math=1") == 2
    assert main(str(path), overrides=[f"run_dir={tmp_path / 'b2'}"], anneal_from=str(ckpt)) == 2
    err = capsys.readouterr().err
    assert "already has checkpoints" in err and "--mix" in err
