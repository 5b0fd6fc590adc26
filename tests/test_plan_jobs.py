"""``executor.plan_jobs``, the driver's "what is done, what runs again, what is re-decided"
fixed point, on hand-made manifest entries (no Ray, no files written)."""

from __future__ import annotations

from pathlib import Path

from curation.pipeline.dag import parse_dag
from curation.pipeline.executor import make_plan, plan_jobs

DATA = Path(__file__).parent / "data"


def _plan(materialized_input: bool = False):
    """docs -> rep (gopher_repetition) -> gopher (gopher_quality). With ``materialized_input``
    a global stage also reads docs, so docs' rows are on disk and rep's shards hold only its
    signal columns (joined to docs by id)."""
    stages = {"rep": {"type": "gopher_repetition", "input": "docs"},
              "gopher": {"type": "gopher_quality", "input": "rep"}}
    if materialized_input:
        stages["dd"] = {"type": "exact_dedup", "input": "docs"}
    dag = parse_dag({"name": "plan", "inputs": {"docs": {"format": "jsonl", "source": "web",
                                                         "paths": [str(DATA / "jsonl" / "gsm8k_train_head400.jsonl.gz")],
                                                         "text_field": "question"}},
                     "stages": stages, "output": "gopher"}, "plan.yaml")
    assert dag.writes_rows("rep") is not materialized_input
    plan = make_plan(dag)
    jobs = [("docs", s.key, s, None) for s in plan.input_shards["docs"]]
    return dag, plan, jobs


def _entry(file: str | None = "x.parquet", **kw) -> dict:
    return {"file": file, "rows_in": 1, **kw}


def test_nothing_committed_runs_every_shard_with_nothing_done():
    dag, plan, jobs = _plan()
    committed = {s: {} for s in plan.writes("docs")}
    got = plan_jobs(plan, jobs, committed, {})
    assert [(j.root, j.key, j.done, j.signals) for j in got] == [("docs", k, (), ()) for _, k, *_ in jobs]
    assert all(j.shard is s and j.source_path is None and j.upstream is None for j, (_, _, s, _) in zip(got, jobs))


def test_everything_committed_runs_nothing():
    dag, plan, jobs = _plan()
    committed = {s: {k: _entry() for _, k, *_ in jobs} for s in plan.writes("docs")}
    assert plan_jobs(plan, jobs, committed, {}) == []


def test_a_done_stage_is_read_back_unless_it_holds_no_rows_or_has_no_file():
    dag, plan, jobs = _plan()
    key = jobs[0][1]
    assert plan.writes("docs") == ["docs", "rep", "gopher"]
    # docs and rep committed, gopher to run: rep's rows are read back, not recomputed
    committed = {"docs": {key: _entry()}, "rep": {key: _entry()}, "gopher": {}}
    (job,) = plan_jobs(plan, jobs[:1], committed, {})
    assert job.done == ("docs", "rep")
    # a shard that kept no row has no file: rep runs again for the stage below it
    committed["rep"][key] = _entry(file=None)
    (job,) = plan_jobs(plan, jobs[:1], committed, {})
    assert job.done == ("docs",)
    # rep's shards hold signal columns only: they cannot be read back as rows either
    dag, plan, jobs = _plan(materialized_input=True)
    committed = {"docs": {key: _entry()}, "rep": {key: _entry()}, "gopher": {}}
    (job,) = plan_jobs(plan, jobs[:1], committed, {})
    assert job.done == ("docs",)


def test_entries_with_the_current_signals_hash_are_handed_on_for_re_deciding():
    dag, plan, jobs = _plan()
    key = jobs[0][1]
    committed = {s: {} for s in plan.writes("docs")}
    stored = _entry(signals_hash=plan.signal_hashes["gopher"])
    (job, *_) = plan_jobs(plan, jobs, committed, {"gopher": {key: stored}, "rep": {}})
    assert job.signals == (("gopher", stored),)
