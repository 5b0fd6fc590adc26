"""ablate: the smoke config end to end (two arms, one seed), and determinism of a training run."""

from __future__ import annotations

import json
import math

import pytest

from curation.experiments.ablate import AblateError, ablate, load_ablate_config, time_to_quality, tokens_to_reach, train_run

SMOKE = "pipelines/ablate-smoke.yaml"


def test_tokens_to_reach_interpolates():
    curve = [(100, 5.0), (200, 4.0), (300, 3.0)]
    assert tokens_to_reach(curve, 4.5) == 150
    assert tokens_to_reach(curve, 5.0) == 100
    assert tokens_to_reach(curve, 2.0) is None


def test_time_to_quality_first_eval_at_or_below_target(tmp_path):
    recs = [{"kind": "train", "step": 0, "time": 100.0, "loss": 9.0},
            {"kind": "eval", "step": 9, "time": 110.0, "eval_loss": 6.0},
            {"kind": "eval", "step": 19, "time": 125.5, "eval_loss": 5.0},
            {"kind": "eval", "step": 19, "time": 126.0, "eval_loss": 4.9},  # a resume rewrote step 19: the last wins
            {"kind": "eval", "step": 29, "time": 140.0, "eval_loss": 4.5}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    q = time_to_quality(tmp_path, 100, [5.0, 6.0, 4.0], [1500, 2000, 9000])
    assert q["targets"] == {"5": {"tokens": 2000, "wall_s": 26.0}, "6": {"tokens": 1000, "wall_s": 10.0}, "4": None}
    assert q["token_budgets"] == {"1500": 4.9, "2000": 4.9, "9000": None}
    # the trainer's own figures (eval.targets given to it) win: tokens with loss, wall s without evals
    recs[2:] = [{**recs[2], "tokens": 1890.0, "wall_s": 12.5}, {**recs[3], "tokens": 1890.0, "wall_s": 12.5},
                {**recs[4], "tokens": 2850.0, "wall_s": 20.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    q = time_to_quality(tmp_path, 100, [5.0, 4.6], [1890, 1900])
    assert q["targets"] == {"5": {"tokens": 1890.0, "wall_s": 12.5}, "4.6": {"tokens": 2850.0, "wall_s": 20.0}}
    assert q["token_budgets"] == {"1890": 4.9, "1900": 4.5}


def test_config_errors(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("arms: {a: {dag: x.yaml}}\neval: {paths: [e.txt]}\ntokens: 100\neval_every_tokens: 10\nbaseline: zz\n")
    with pytest.raises(AblateError, match="baseline"):
        load_ablate_config(p)


def test_smoke_report_and_determinism(tmp_path, in_repo, ray_session):
    out = tmp_path / "ablate"
    report = ablate(SMOKE, str(out), workers=2)
    assert (out / "report.md").exists() and (out / "eval_loss.png").stat().st_size > 1000
    saved = json.loads((out / "report.json").read_text())
    assert set(saved["arms"]) == {"raw", "filters"}
    cfg = load_ablate_config(SMOKE)
    for name, a in saved["arms"].items():
        assert len(a["curves"]) == 1
        assert len(a["curves"][0]) == cfg.steps // cfg.eval_every_steps
        assert all(math.isfinite(l) for _, l in a["curves"][0])
        assert math.isfinite(a["final_loss_mean"]) and a["final_loss_mean"] < math.log(cfg.vocab_size) + 1
        assert a["tokens_kept"] > 0 and a["docs_kept"] > 0 and a["epochs"] > 0
        assert a["docs_decontaminated"] >= 0
        assert f"| {name} |" in (out / "report.md").read_text()
        # time to quality: the trainer's own record (summary.json) is what the report shows
        summary = json.loads((out / "train" / name / "seed0" / "summary.json").read_text())["time_to_quality"]
        for target in cfg.targets:
            got, own = a["time_to_quality"]["targets"][f"{target:g}"], summary["targets"][f"{target:g}"]
            assert (got is None) == (own is None), (target, got, own)
            if own is not None:
                assert got["tokens"] == own["tokens"] and got["wall_s"] == pytest.approx(own["wall_s"], abs=0.01)
    assert "Time to quality" in (out / "report.md").read_text()
    # filters keep fewer documents than raw
    assert saved["arms"]["filters"]["docs_curated"] < saved["arms"]["raw"]["docs_curated"]
    assert report["arms"]["raw"]["final_loss_mean"] == saved["arms"]["raw"]["final_loss_mean"]

    # the two arms trained at once (threads: 1 on this machine's CPUs), each in its own process
    spans = {}
    for name in ("raw", "filters"):
        recs = [json.loads(x) for x in (out / "train" / name / "seed0" / "metrics.jsonl").read_text().splitlines()]
        spans[name] = (recs[0]["time"], recs[-1]["time"])
    if cfg.trainings_at_once >= 2:
        assert max(a for a, _ in spans.values()) < min(b for _, b in spans.values()), spans

    # determinism, concurrency included: the raw arm's seed trained again, alone, gives the
    # identical loss curve
    trainer = out / "train" / "trainer.yaml"
    data = out / "pack" / "raw" / "pack"
    alone = train_run(trainer, data, tmp_path / "alone", 0, cfg.steps, cfg.tokens_per_step, cfg.threads)
    assert len(alone) == cfg.steps // cfg.eval_every_steps
    assert [list(x) for x in alone] == saved["arms"]["raw"]["curves"][0]

    # a rerun reuses everything (no retraining) and reports the same figures
    again = ablate(SMOKE, str(out), workers=2)
    assert json.loads(json.dumps(again["arms"]["raw"]["curves"])) == saved["arms"]["raw"]["curves"]
