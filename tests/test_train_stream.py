"""Streaming with bounded reads: shards through fsspec URLs (``file://``, ``memory://``), the
block order's read amplification (bytes decoded per byte trained on), lanes that keep each
rank on its own blocks, and the order settings a checkpoint records."""

from __future__ import annotations

import json
import shutil
import uuid

import fsspec
import numpy as np
import pytest

from train_helpers import SMALL, write_config
from training.data import DataChangedError, DataOrder, PackedDataset, check_resume
from training.data.order import split_lanes
from training.schedule import PhasePlan
from training.synthetic import write_packed
from training.train import main

SEQ = 32


@pytest.fixture(scope="module")
def pack(tmp_path_factory):
    # 64 row groups of 32 rows, every source in every row group (as the pack stage writes them).
    return write_packed(tmp_path_factory.mktemp("stream") / "pack", {"web": 1024, "math": 512, "code": 512}, SEQ,
                        rows_per_shard=256, row_group_size=32)


def _to_memory(local, name: str | None = None) -> str:
    """Copy a local directory tree into fsspec's in-memory filesystem; its URL."""
    fs = fsspec.filesystem("memory")
    url = f"memory://{name or uuid.uuid4().hex}"
    for f in local.rglob("*"):
        if f.is_file():
            fs.pipe(f"{url}/{f.relative_to(local)}", f.read_bytes())
    return url


def test_urls_read_the_same_rows_as_local_paths(pack, tmp_path):
    local = PackedDataset(pack)
    rows = np.array([0, 2047, 31, 32, 1000, 5, 1999])
    want = local.read_rows(rows, 0)
    for url in (f"file://{pack}", _to_memory(pack)):
        ds = PackedDataset(url)
        assert ds.num_rows == 2048 and ds.num_blocks == 64 and ds.fingerprint == local.fingerprint
        assert np.array_equal(ds.row_source, local.row_source)
        got = ds.read_rows(rows, 0)
        assert np.array_equal(got.ids, want.ids)
        assert all(np.array_equal(a, b) for a, b in zip(got.doc_lens, want.doc_lens))
    # refinery's own layout (manifest paths relative to the run dir) in object storage
    stage = tmp_path / "run" / "pack"
    stage.mkdir(parents=True)
    lines = []
    for f in sorted(pack.glob("*.parquet")):
        shutil.copy(f, stage / f.name)
        lines.append(json.dumps({"shard": f.stem, "file": f"pack/{f.name}", "rows": 256}) + "\n")
    (stage / "_manifest.jsonl").write_text("".join(lines))
    ds = PackedDataset(_to_memory(tmp_path / "run") + "/pack")
    assert ds.num_rows == 2048 and ds.shards[0].file == "pack/part-00000.parquet"
    assert ds.url(ds.shards[0]).startswith("memory://")
    with pytest.raises(FileNotFoundError, match="not a directory"):
        PackedDataset("memory://nowhere/pack")


def _epoch_amplification(ds, order: str, mix=None, **kw) -> float:
    steps = ds.num_rows // 16
    o = DataOrder(ds, [PhasePlan("m", 0, steps, mix or {s: n / ds.num_rows for s, n in ds.source_rows().items()})], 0, 16, order=order, **kw)
    for s in range(steps):
        ds.read_rows(o.step_rows(s), 0)
    return ds.read_stats()["read_amplification"]


def test_block_order_decodes_each_block_about_once(pack):
    # A cache of 16 blocks (a quarter of the data): the row order decodes a row group for
    # almost every row; the block order (windows of 4 blocks) each block once.
    rows = _epoch_amplification(PackedDataset(pack, row_group_cache=16), "rows")
    blocks = _epoch_amplification(PackedDataset(pack, row_group_cache=16), "blocks", window=4)
    assert rows > 10 and blocks <= 1.05, (rows, blocks)
    # Sources shuffled together in every row group and a mix far from theirs: each source
    # walks the blocks at its own pace, so a block is decoded more than once (bounded memory).
    skewed = _epoch_amplification(PackedDataset(pack, row_group_cache=16), "blocks", {"web": 0.2, "math": 0.5, "code": 0.3}, window=4)
    assert 1.05 < skewed < 5


def test_block_order_is_an_epoch_permutation_that_moves_window_by_window(pack):
    ds = PackedDataset(pack)
    web = ds.sources.index("web")
    o = DataOrder(ds, [PhasePlan("m", 0, 200, {"web": 1.0})], 3, 16, window=4)
    rows = np.concatenate([o.step_rows(s) for s in range(128)])  # 2 epochs of web's 1024 rows
    for epoch in (rows[:1024], rows[1024:]):
        assert sorted(epoch.tolist()) == np.flatnonzero(ds.row_source == web).tolist()
    assert not np.array_equal(rows[:1024], rows[1024:])
    # Consecutive rows come from a few blocks at a time (a window), not from anywhere.
    blocks_per_step = [len(np.unique(ds.block_of(rows[a : a + 16]))) for a in range(0, 2048, 16)]
    assert max(blocks_per_step) <= 8 and len(np.unique(ds.block_of(rows[:64]))) <= 8
    # and still shuffled inside the window
    assert not np.all(np.diff(rows[:64]) > 0)


def test_lanes_keep_each_rank_on_its_own_blocks(pack):
    ds = PackedDataset(pack)
    lanes = split_lanes(ds, 4, 0)
    assert sorted(np.concatenate(lanes).tolist()) == list(range(64))
    assert max(np.diff(ds.block_starts)[lane].sum() for lane in lanes) <= 512 + 32
    plans = [PhasePlan("m", 0, 50, {"web": 0.5, "math": 0.25, "code": 0.25})]
    o = DataOrder(ds, plans, 0, 16, lanes=4)
    for world in (2, 4):
        for rank in range(world):
            mine = set(np.concatenate([lanes[i] for i in range(rank, 4, world)]).tolist())
            got = np.concatenate([o.rank_rows(s, rank, world) for s in range(50)])
            assert set(ds.block_of(got).tolist()) <= mine
    # each rank's reads: about one decode per block
    for world in (1, 2, 4):
        ds2 = PackedDataset(pack, row_group_cache=3 * 8 * (4 // world))
        o2 = DataOrder(ds2, [PhasePlan("m", 0, 128, {s: n / 2048 for s, n in ds2.source_rows().items()})], 0, 16, lanes=4)
        for s in range(128):
            ds2.read_rows(o2.rank_rows(s, 0, world), 0)
        assert ds2.read_stats()["read_amplification"] <= 1.2, world
    with pytest.raises(ValueError, match="multiple of data.lanes"):
        DataOrder(ds, plans, 0, 18, lanes=4)


def test_checkpoint_records_the_order_settings(pack):
    ds = PackedDataset(pack)
    plans = [PhasePlan("m", 0, 10, {"web": 1.0})]
    state = DataOrder(ds, plans, 0, 16, window=4).state(5)
    assert state["order"] == {"kind": "blocks", "window": 4, "lanes": 1}
    DataOrder(ds, plans, 0, 16, window=4).check_resume(state, False)
    with pytest.raises(DataChangedError, match="shuffle_blocks: 4"):
        DataOrder(ds, plans, 0, 16, window=8).check_resume(state, False)
    # A checkpoint from before the block order (no "order") resumes only with data.order: rows.
    legacy = {k: v for k, v in state.items() if k != "order"}
    with pytest.raises(DataChangedError, match="data.order: rows"):
        DataOrder(ds, plans, 0, 16).check_resume(legacy, False)
    assert check_resume(legacy, ds, 0, 16, False, DataOrder(ds, plans, 0, 16, order="rows").settings) is False


def test_training_from_object_storage_equals_local(pack, tmp_path):
    url = _to_memory(pack)
    losses = {}
    for name, path in (("local", str(pack)), ("memory", url)):
        cfg = write_config(tmp_path, name, {
            "model": {"vocab_size": 512, **SMALL},
            "data": {"path": path, "seq_len": SEQ},
            "train": {"global_batch": 8, "micro_batch": 4, "steps": 6, "threads": 1},
            "checkpoint": {"every": 3},
            "metrics": {"every": 1, "progress": "off", "tensorboard": False},
        })
        assert main(str(cfg)) == 0
        recs = [json.loads(x) for x in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [(r["loss"], r["grad_norm"]) for r in recs if r["kind"] == "train"]
        assert all(r["read_amplification"] > 0 for r in recs if r["kind"] == "train")
        seg = json.loads((tmp_path / name / "trace" / "data.jsonl").read_text().splitlines()[0])
        assert seg["shards"][0][2].startswith("memory://" if name == "memory" else "file://")
    assert losses["local"] == losses["memory"] and len(losses["local"]) == 6
