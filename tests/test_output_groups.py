"""Global stages on many small shards: a block's small upstream shards share one output shard
(``curation.io.shards.output_groups``), so a stage's files and fixed per-file costs follow the
data's bytes, not the shard count. The rows written, their order and the rejections are those
of one output per shard; large shards keep their own output and key."""

from __future__ import annotations

import random

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from curation.io import shards as shards_mod
from curation.io.shards import blocks, output_groups
from curation.stages.context import GroupedOutputs
from curation.stages.exact_dedup import ExactDedup
from curation.stages.minhash_dedup import MinHashDedup
from curation.stages.quality_top import QualityTop
from dedup_helpers import run_global, write_upstream


def test_output_groups_cut_a_block_into_runs_of_at_most_the_target():
    sizes = [10, 10, 10, 50, 10, 10, 100, 5]
    assert output_groups(sizes, (0, 8), target=30) == [(0, 3), (3, 4), (4, 6), (6, 7), (7, 8)]
    assert output_groups(sizes, (2, 5), target=30) == [(2, 3), (3, 4), (4, 5)]
    assert output_groups(sizes, (0, 8), target=1) == [(i, i + 1) for i in range(8)]  # one per shard
    # within the blocks: a group never spans two blocks' tasks
    spans = blocks(sizes, target=40, min_blocks=1)
    groups = [g for s in spans for g in output_groups(sizes, s, target=1000)]
    assert groups == spans


def test_grouped_outputs_refuse_ends_that_do_not_match_their_outputs():
    with pytest.raises(ValueError, match="group ends"):
        GroupedOutputs(sinks=(), ends=(1,))


def _docs(n: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(400)]
    base = [" ".join(rng.choice(words) for _ in range(60)) for _ in range(n // 3)]
    docs = []
    for i in range(n):
        text = base[i % len(base)] if i % 4 == 0 else " ".join(rng.choice(words) for _ in range(60))
        if i % 7 == 0:  # a near copy: one word changed
            text = base[i % len(base)].replace("w1 ", "w2 ", 1) + " tail"
        docs.append({"id": f"doc-{i:05d}", "text": text, "quality": rng.random()})
    return docs


STAGES = {
    "exact": lambda: ExactDedup(input="up", partitions=2),
    "near": lambda: MinHashDedup(input="up", partitions=2),
    "top": lambda: QualityTop(input="up", keep_top=0.4),
}


def _written(ctx) -> tuple[list[dict], pa.Table, pa.Table]:
    rd = ctx.rundir
    entries = sorted(ctx.committed().values(), key=lambda e: e["shard"])
    kept = pa.concat_tables([pq.read_table(rd.path(e["file"])) for e in entries if e.get("file")])
    rej = pa.concat_tables([pq.read_table(rd.path(e["rejected_file"])) for e in entries if e.get("rejected_file")])
    return entries, kept, rej


@pytest.mark.parametrize("name", sorted(STAGES))
def test_small_shards_share_outputs_with_the_same_rows_as_one_output_per_shard(name, tmp_path, ray_session,
                                                                              monkeypatch):
    docs = _docs(600)
    upstream = write_upstream(tmp_path / "in", docs, shards=40)  # 40 shards of 15 documents
    monkeypatch.setattr(shards_mod, "OUTPUT_BYTES", 1)  # the reference: every shard its own output
    ref_entries, ref_kept, ref_rej = _written(run_global(STAGES[name](), tmp_path / "one", name, upstream))
    monkeypatch.setattr(shards_mod, "OUTPUT_BYTES", 16 << 20)
    entries, kept, rej = _written(run_global(STAGES[name](), tmp_path / "grouped", name, upstream))

    keys = [k for k, _ in upstream]
    assert [e["shard"] for e in ref_entries] == keys  # the reference: each shard its own key
    # one output per block (every shard is small), under its first upstream shard's key
    spans = blocks([(tmp_path / "in" / "up" / f"{k}.parquet").stat().st_size for k in keys])
    assert [e["shard"] for e in entries] == [keys[lo] for lo, _ in spans]
    assert len(entries) < len(keys)
    assert kept.equals(ref_kept) and rej.equals(ref_rej)
    for field in ("rows_in", "rows", "rejected_rows"):
        assert sum(e[field] for e in entries) == sum(e[field] for e in ref_entries)
    assert ref_rej.num_rows > 0 and ref_kept.num_rows > 0  # the stage kept some and rejected some
    # an output's rows_in is its group's upstream rows
    rows = [pq.ParquetFile(p).metadata.num_rows for _, p in upstream]
    assert [e["rows_in"] for e in entries] == [sum(rows[lo:hi]) for lo, hi in spans]
