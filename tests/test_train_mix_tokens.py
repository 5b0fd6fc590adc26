"""Phase weights are shares of content tokens, not of rows (issue #16 item 2).

A math-like source of short documents whose rows are often closed early (the packer could not
fill them) next to a web-like source of long documents that fill every row: drawing rows by
the weights would under-serve math's tokens by several points. The trainer divides each
weight by the source's content tokens per row, so the realised token share of every source
is within one point of its weight, in each phase, across the switch, and after a resume.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from train_helpers import SMALL, records, write_config
from training.data import DataOrder, PackedDataset
from training.schedule import MixturePattern, PhasePlan
from training.synthetic import write_packed
from training.train import main

SEQ, VOCAB = 32, 256
STABLE = {"web": 0.8, "math": 0.2}
ANNEAL = {"web": 0.4, "math": 0.6}
TOL = 0.01  # one point of share


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    # web: long documents, full rows; math: 8-12 token documents, 60% of rows closed early.
    return write_packed(tmp_path_factory.mktemp("mixtok") / "pack", {"web": 1500, "math": 900}, SEQ, vocab=VOCAB,
                        pad_prob={"web": 0.0, "math": 0.6}, max_doc={"web": 4 * SEQ, "math": 12}, rows_per_shard=300)


def content_tokens(path: Path) -> tuple[np.ndarray, list[str]]:
    """Each global row's non-padding tokens (from doc_lens) and source, read without the trainer."""
    t = pq.read_table(sorted(path.glob("*.parquet")), columns=["doc_lens", "source"])
    return np.array([sum(x) for x in t.column("doc_lens").to_pylist()]), t.column("source").to_pylist()


def shares(tokens: np.ndarray, sources: np.ndarray) -> dict[str, float]:
    total = tokens.sum()
    return {str(s): float(tokens[sources == s].sum() / total) for s in np.unique(sources)}


def test_token_counts_from_footers_match_rows(data, tmp_path):
    ds = PackedDataset(data)
    tokens, src = content_tokens(data)
    src = np.array(src)
    assert ds.source_tokens() == {s: int(tokens[src == s].sum()) for s in ds.sources}
    # Without the footer pack writes, the reader counts doc_lens itself: same figures.
    bare = write_packed(tmp_path / "bare", {"web": 1500, "math": 900}, SEQ, vocab=VOCAB, pad_prob={"web": 0.0, "math": 0.6},
                        max_doc={"web": 4 * SEQ, "math": 12}, rows_per_shard=300, footer_tokens=False)
    assert b"refinery.source_tokens" not in (pq.read_schema(next(bare.glob("*.parquet"))).metadata or {})
    assert PackedDataset(bare).source_tokens() == ds.source_tokens()


def test_order_realises_token_shares(data):
    ds = PackedDataset(data)
    tokens, src = content_tokens(data)
    src = np.array(src)
    fill = {s: tokens[src == s].mean() / (SEQ + 1) for s in ds.sources}
    assert fill["web"] == 1.0 and fill["math"] < 0.9  # the setup: math rows hold fewer tokens
    plans = [PhasePlan("stable", 0, 40, STABLE), PhasePlan("anneal", 40, 60, ANNEAL)]
    order = DataOrder(ds, plans, 0, 20)
    for plan in plans:
        rows = np.concatenate([order.step_rows(s) for s in range(plan.start, plan.end)])
        got = shares(tokens[rows], src[rows])
        print(plan.name, {s: round(v, 4) for s, v in got.items()}, "target", plan.weights)
        assert all(abs(got[s] - w) <= TOL for s, w in plan.weights.items()), (plan.name, got)
        # Drawing rows by the same weights (the old mixing) misses math's share by more than a
        # point here, so this test can tell the two apart.
        pat = MixturePattern.from_weights(plan.weights, ds.sources)
        by_rows = pat.consumed(len(rows), len(ds.sources)) * np.array([tokens[src == s].mean() for s in ds.sources])
        assert plan.weights["math"] - by_rows[ds.sources.index("math")] / by_rows.sum() > 2 * TOL


def config(tmp_path: Path, data_dir: Path, name: str) -> Path:
    return write_config(tmp_path, name, {
        "model": {"vocab_size": VOCAB, **SMALL},
        "data": {"path": str(data_dir), "seq_len": SEQ},
        "train": {"global_batch": 20, "micro_batch": 10, "threads": 1},
        "optim": {"lr": 1e-3},
        "schedule": {"warmup_steps": 3},
        "phases": [
            {"name": "stable", "steps": 40, "mix": STABLE, "lr": {"shape": "constant"}},
            {"name": "anneal", "steps": 20, "mix": ANNEAL, "lr": {"shape": "linear", "end_factor": 0.0}},
        ],
        "checkpoint": {"every": 10},
        "metrics": {"every": 5, "progress": "plain"},
    })


def phase_shares(recs: list[dict]) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for r in recs:
        for s, n in r["content_tokens_by_source"].items():
            out.setdefault(r["phase"], {}).setdefault(s, 0.0)
            out[r["phase"]][s] += n
    return {p: {s: n / sum(v.values()) for s, n in v.items()} for p, v in out.items()}


def test_trainer_token_shares_across_switch_and_resume(tmp_path, data):
    """The trainer's own content-token counters, stopped mid-stable and resumed."""
    path = config(tmp_path, data, "run")
    assert main(str(path), overrides=["train.stop_at_step=25"]) == 0
    assert main(str(path)) == 0  # resumes from the checkpoint written at the stop (step 25)
    recs = records(tmp_path / "run")
    assert sorted({r["step"] for r in recs}) == list(range(4, 60, 5))
    got = phase_shares(recs)
    print("realised content-token share per phase:", {p: {s: round(v, 4) for s, v in d.items()} for p, d in got.items()})
    for phase, want in (("stable", STABLE), ("anneal", ANNEAL)):
        for s, w in want.items():
            assert abs(got[phase][s] - w) <= TOL, (phase, got[phase], want)
    # The windows after the resume alone also hold the mix (the resumed order is the same order).
    after = phase_shares([r for r in recs if 25 < r["step"] < 40])["stable"]
    assert all(abs(after[s] - w) <= 2 * TOL for s, w in STABLE.items()), after
