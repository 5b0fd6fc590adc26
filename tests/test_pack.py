"""The pack stage: best-fit decreasing equals the textbook algorithm, every token of every
document lands in exactly one row, and packed shards are byte-identical on 1 and 2 workers."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from curation.sampling.packing import best_fit_decreasing, concat_chunks, pack_window, split_long
from curation.stages.pack import Pack, PackError
from curation.stages.tokenize import int32_lists
from test_mix import mix_multi_run


@pytest.fixture(scope="module")
def run2(tmp_path_factory, ray_session) -> Path:
    return mix_multi_run(tmp_path_factory, 2)


# ---------------------------------------------------------------------------------------------
# algorithms


def _naive_bfd(lengths, cap):
    """Textbook best-fit decreasing: scan every open bin for the tightest fit (oldest on ties)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rooms, bins = [], []
    for i in order:
        best = None
        for b, r in enumerate(rooms):
            if r >= lengths[i] and (best is None or r < rooms[best]):
                best = b
        if best is None:
            rooms.append(cap - lengths[i])
            bins.append([i])
        else:
            rooms[best] -= lengths[i]
            bins[best].append(i)
    return bins


@pytest.mark.parametrize("seed", range(5))
def test_best_fit_decreasing_equals_the_textbook_algorithm(seed):
    rng = np.random.default_rng(seed)
    cap = int(rng.integers(20, 300))
    lengths = [int(x) for x in np.minimum(cap, rng.geometric(1 / (cap / 4), 400))]
    bins = best_fit_decreasing(np.array(lengths), cap)
    assert bins == _naive_bfd(lengths, cap)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in b) <= cap for b in bins)


def test_best_fit_is_fast_on_many_items():
    rng = np.random.default_rng(0)
    bins = best_fit_decreasing(rng.integers(1, 2049, 50_000), 2049)  # seconds if it were O(n^2)
    assert sum(len(b) for b in bins) == 50_000


def test_split_long_and_concat_cover_every_token_once():
    lengths = np.array([5, 10, 11, 0, 23, 1])
    p = split_long(lengths, 10)
    assert p.doc.tolist() == [0, 1, 2, 2, 4, 4, 4, 5]
    assert p.length.tolist() == [5, 10, 10, 1, 10, 10, 3, 1]
    assert p.start.tolist() == [0, 0, 0, 10, 0, 10, 20, 0] and p.count.tolist() == [1, 1, 2, 2, 3, 3, 3, 1]
    pieces, rows = concat_chunks(lengths, 10)
    assert [[int(pieces.length[i]) for i in r] for r in rows] == [[5, 5], [5, 5], [6, 4], [10], [9, 1]]
    assert [[int(pieces.doc[i]) for i in r] for r in rows] == [[0, 1], [1, 2], [2, 4], [4], [4, 5]]


def _window(lengths, sources, quality=None, seed=0):
    rng = np.random.default_rng(seed)
    docs = [rng.integers(2, 1000, n).astype(np.int32) for n in lengths]
    cols = {"id": [f"d{i}" for i in range(len(lengths))], "source": sources, "input_ids": int32_lists(docs)}
    if quality is not None:
        cols["quality"] = pa.array(quality, pa.float64())
    return pa.table(cols), docs


def _reassemble(packed: pa.Table, seq_len: int, pad_id: int) -> dict[str, list[int]]:
    """Documents rebuilt from rows through doc_lens and doc_ids; checks row invariants on the way."""
    parts: dict[str, dict[int, list[int]]] = {}
    counts: dict[str, int] = {}
    for ids, lens, names in zip(packed.column("input_ids").to_pylist(), packed.column("doc_lens").to_pylist(),
                                packed.column("doc_ids").to_pylist()):
        assert len(ids) == seq_len + 1 and len(lens) == len(names) and all(n > 0 for n in lens)
        off = 0
        for n, name in zip(lens, names):
            doc, piece = name.rsplit("@", 1)
            k, c = map(int, piece.split("/"))
            assert k not in parts.setdefault(doc, {})  # each piece once
            parts[doc][k] = ids[off:off + n]
            counts[doc] = c
            off += n
        assert all(t == pad_id for t in ids[off:])  # padding only at the end
    out = {}
    for doc, ps in parts.items():
        assert sorted(ps) == list(range(counts[doc]))
        out[doc] = [t for k in sorted(ps) for t in ps[k]]
    return out


@pytest.mark.parametrize("algorithm", ["best_fit", "concat"])
def test_pack_window_rows_reassemble_to_the_documents(algorithm):
    lengths = [3, 700, 64, 65, 1, 129, 300, 17, 64, 2000, 40]
    sources = ["web", "web", "code", "math", "math", "web", "code", "math", "web", "web", "code"]
    quality = [0.5, 0.9, None, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]
    table, docs = _window(lengths, sources, quality)
    packed, stats = pack_window(table, 63, algorithm, pad_id=7777)
    assert packed.schema.field("input_ids").type == pa.list_(pa.int32())
    rebuilt = _reassemble(packed, 63, 7777)
    assert rebuilt == {f"d{i}": d.tolist() for i, d in enumerate(docs)}
    assert stats["tokens"] == sum(lengths) and stats["rows"] == packed.num_rows
    assert stats["padding"] == packed.num_rows * 64 - sum(lengths)
    assert sum(map(sum, packed.column("doc_lens").to_pylist())) == sum(lengths)
    src_of = {f"d{i}": s for i, s in enumerate(sources)}
    q_of = {f"d{i}": q for i, q in enumerate(quality)}
    for row in packed.to_pylist():
        per = {}
        qs = qw = 0.0
        for n, name in zip(row["doc_lens"], row["doc_ids"]):
            d = name.rsplit("@", 1)[0]
            per[src_of[d]] = per.get(src_of[d], 0) + n
            if q_of[d] is not None:
                qs, qw = qs + q_of[d] * n, qw + n
        assert json.loads(row["source_tokens"]) == per
        assert row["source"] == min(per, key=lambda s: (-per[s], s))
        assert row["quality"] == (pytest.approx(qs / qw) if qw else None)
    if algorithm == "best_fit":  # only the documents longer than a row are split
        assert stats["docs_split"] == stats["long_docs"] == sum(n > 64 for n in lengths)
    no_q, _ = pack_window(table.drop_columns(["quality"]), 63, algorithm, pad_id=0)
    assert no_q.column("quality").null_count == no_q.num_rows


# ---------------------------------------------------------------------------------------------
# on the real DAG (pipelines/mix-multi.yaml: mix then pack, seq_len 512)


def _read_dir(d: Path, pattern: str) -> pa.Table:
    return pa.concat_tables(pq.read_table(p) for p in sorted(d.glob(pattern)))


def test_every_token_of_every_mixed_document_is_in_exactly_one_row(run2):
    report = json.loads((run2 / "pack" / "_pack_report.json").read_text())
    packed = _read_dir(run2 / "pack", "pack-*.parquet")
    rebuilt = _reassemble(packed, 512, report["pad_id"])
    mixed = _read_dir(run2 / "mix", "mix-*.parquet")
    expect = dict(zip(mixed.column("id").to_pylist(), mixed.column("input_ids").to_pylist()))
    assert rebuilt == expect  # also: no document twice, none missing, none invented
    tokens = sum(len(v) for v in expect.values())
    assert report["tokens"] == tokens and report["rows"] == packed.num_rows
    assert report["non_padding_fraction"] == pytest.approx(tokens / (packed.num_rows * 513))
    assert report["docs"] == len(expect) and report["docs_split"] == report["long_docs"]
    assert report["pad_id"] == 1  # from the tokenize stage's shard metadata
    # rows are shuffled within a window, not left in best-fit's largest-piece-first order
    largest = [max(x) for x in pq.read_table(sorted((run2 / "pack").glob("*.parquet"))[0]).column("doc_lens").to_pylist()]
    assert largest != sorted(largest, reverse=True)
    # what the trainer reads
    for p in sorted((run2 / "pack").glob("pack-*.parquet")):
        md = pq.read_metadata(p)
        assert [md.row_group(i).num_rows for i in range(md.num_row_groups - 1)] == [256] * (md.num_row_groups - 1)
    manifest = [json.loads(x) for x in (run2 / "pack" / "_manifest.jsonl").read_text().splitlines()]
    assert sum(e["rows"] for e in manifest) == packed.num_rows
    assert all((run2 / e["file"]).exists() for e in manifest)
    assert set(packed.column_names) >= {"input_ids", "doc_lens", "source", "source_tokens", "quality"}


def test_stats_count_packed_documents_as_kept_and_rows_apart(run2):
    from curation.pipeline.stats import stage_table

    row = {r["stage"]: r for r in stage_table(run2)}["pack"]
    packed = _read_dir(run2 / "pack", "pack-*.parquet")
    assert row["rows_out"] == packed.num_rows < row["docs_in"]
    assert row["kept"] == row["docs_in"] - row["rejected"] == row["docs_in"]  # pack drops nothing


def test_best_fit_splits_far_fewer_documents_than_concat_on_the_same_rows(run2):
    mixed = _read_dir(run2 / "mix", "mix-*.parquet").select(["id", "source", "input_ids"])
    _, bf = pack_window(mixed, 512, "best_fit", 1)
    _, cc = pack_window(mixed, 512, "concat", 1)
    assert bf["docs_split"] < cc["docs_split"] / 2
    assert bf["rows"] <= cc["rows"] + 2  # and almost no extra padding for it


def test_one_and_two_workers_give_byte_identical_packed_shards(run2, tmp_path_factory, ray_session):
    run1 = mix_multi_run(tmp_path_factory, 1)

    def hashes(run: Path) -> dict[str, str]:
        return {str(p.relative_to(run)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(run.rglob("*.parquet"))}

    h1, h2 = hashes(run1), hashes(run2)
    assert any(k.startswith("pack/") for k in h1) and any(k.startswith("mix/") for k in h1)
    assert h1 == h2
    for stage in ("mix", "pack"):
        assert (run1 / stage / "_manifest.jsonl").read_text() == (run2 / stage / "_manifest.jsonl").read_text()
        report = f"_{stage}_report.json"
        assert (run1 / stage / report).read_text() == (run2 / stage / report).read_text()


def test_pad_id_comes_from_param_tokenizer_or_shard_metadata(tmp_path):
    p = tmp_path / "x.parquet"
    pq.write_table(pa.table({"id": ["a"], "source": ["web"], "input_ids": int32_lists([np.arange(5, dtype=np.int32)])}), p)
    assert Pack(pad_id=9).resolve_pad_id([str(p)]) == 9
    with pytest.raises(PackError, match="no pad id"):
        Pack().resolve_pad_id([str(p)])
    pq.write_table(pa.table({"id": ["a"], "text": ["x"]}), tmp_path / "y.parquet")
    with pytest.raises(PackError, match="no input_ids column"):
        Pack().windows([str(tmp_path / "y.parquet")])


def test_every_packed_row_holds_one_source_and_windows_cut_the_global_order(run2, tmp_path):
    """per_source (the default): each row's tokens come from one source, so the trainer can mix
    by tokens exactly. Windows are the global document order cut every ``window`` documents."""
    packed = _read_dir(run2 / "pack", "pack-*.parquet")
    per_row = [json.loads(x) for x in packed.column("source_tokens").to_pylist()]
    assert all(len(p) == 1 for p in per_row) and {next(iter(p)) for p in per_row} == set(packed.column("source").to_pylist())
    assert len(set(packed.column("source").to_pylist())) >= 2
    counts = [3, 0, 7, 1, 12]
    paths = []
    for i, n in enumerate(counts):
        p = tmp_path / f"s{i}.parquet"
        pq.write_table(pa.table({"id": [f"{i}-{j}" for j in range(n)], "input_ids": int32_lists(
            [np.arange(3, dtype=np.int32)] * n)}, schema=pa.schema([("id", pa.string()), ("input_ids", pa.list_(pa.int32()))])), p)
        paths.append(str(p))
    for window in (1, 4, 5, 23, 100):
        got = Pack(type="pack", window=window, pad_id=0).windows(paths)
        flat = [(p, r) for p, n in zip(paths, counts) for r in range(n)]
        expect = [flat[i:i + window] for i in range(0, len(flat), window)]
        assert [[(p, r) for p, lo, hi in w for r in range(lo, hi)] for w in got] == expect
