"""Every step traceable: a curated run, a pack run reading its output (the demo's layout), a
short training run on the packed rows; ``refinery trace`` prints exactly the documents of a
step's rows, with the curation signals joined from the curation run, and ``--loss-spikes``
the documents of the steps the guard flagged."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from conftest import REPO
from train_helpers import SMALL, write_config
from training import trace
from training.train import main

SEQ, STEPS = 64, 6


@pytest.fixture(scope="module")
def runs(tmp_path_factory, ray_session):
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.executor import run_dag
    from curation.tokenizer.model import train_tokenizer
    from test_tokenize import fixture_corpus

    root = tmp_path_factory.mktemp("trace")
    tok = train_tokenizer(fixture_corpus(root / "corpus.parquet"), root / "tok", kind="bpe", vocab_size=512, progress=False).path.parent
    data = REPO / "tests" / "data" / "jsonl"
    curated = {
        "name": "trace-curation",
        "inputs": {
            # the dolma id is the page's URL
            "ccnet": {"format": "jsonl", "paths": [str(data / "dolma_cc_en_head-0091.jsonl.gz")], "source": "web", "url_field": "id"},
            "math": {"format": "jsonl", "paths": [str(data / "gsm8k_train_head400.jsonl.gz")], "source": "math", "text_field": "question"},
        },
        "stages": {
            "gopher": {"type": "gopher_quality", "input": "ccnet"},
            "c4": {"type": "c4_quality", "input": "gopher"},
            "fineweb": {"type": "fineweb_quality", "input": "c4"},
            "merged": {"type": "union", "inputs": ["fineweb", "math"]},
        },
        "output": "merged",
    }
    run_dag(parse_dag(curated, "curation.yaml", base_dir=str(REPO)), root / "curation", workers=2, quiet=True)
    # As pipelines/demo-pack.yaml: a second run packs the first one's output, read through its
    # manifest (format: run; ids and sources as the curation run wrote them).
    packed = {
        "name": "trace-pack",
        "inputs": {"docs": {"format": "run", "run": str(root / "curation"), "stage": "merged"}},
        "stages": {
            "tokenize": {"type": "tokenize", "input": "docs", "tokenizer": str(tok), "keep_text": False},
            "pack": {"type": "pack", "input": "tokenize", "seq_len": SEQ, "algorithm": "best_fit"},
        },
        "output": "pack",
    }
    run_dag(parse_dag(packed, "pack.yaml", base_dir=str(REPO)), root / "pack", workers=2, quiet=True)
    cfg = write_config(root, "train", {
        "model": {"vocab_size": 512, **SMALL},
        "data": {"path": str(root / "pack" / "pack"), "seq_len": SEQ, "pad_id": 1},
        "train": {"global_batch": 8, "micro_batch": 4, "steps": STEPS, "threads": 1},
        "checkpoint": {"every": 3},
        "metrics": {"every": 1, "progress": "off", "log_row_ids": True, "tensorboard": False},
        "guard": {"inject_nonfinite_steps": [2]},  # a flagged step for --loss-spikes
    })
    assert main(str(cfg)) == 0
    return SimpleNamespace(curation=root / "curation", pack=root / "pack", train=root / "train")


def _rows_logged(train: Path, step: int) -> list[int]:
    """The step's rows as the metrics logger recorded them (independent of the trace)."""
    recs = [json.loads(x) for x in (train / "row_ids" / "rank0.jsonl").read_text().splitlines()]
    return next(r["rows"] for r in recs if r["step"] == step)


def _docs_in_rows(pack: Path, rows: list[int]) -> tuple[list[str], int]:
    """Document ids of the rows (in order, once each) and their tokens, read straight from the shards."""
    table = pq.read_table(sorted((pack / "pack").glob("*.parquet")), columns=["doc_ids", "doc_lens"]).to_pylist()
    ids: list[str] = []
    tokens = 0
    for r in rows:
        for piece, n in zip(table[r]["doc_ids"], table[r]["doc_lens"]):
            doc = piece.rsplit("@", 1)[0]
            if doc not in ids:
                ids.append(doc)
            tokens += n
    return ids, tokens


def _invoke(*args: str):
    from unittest.mock import patch

    from rich.console import Console

    from curation.cli import app, train

    # the CLI's console takes its width when curation.cli is first imported (80 where that was
    # outside a terminal and without COLUMNS): a wide one of its own, whatever the import order
    with patch.object(train, "console", Console(width=400)):
        res = CliRunner().invoke(app, ["trace", *map(str, args)])
    assert res.exit_code == 0, res.output
    return res.stdout


def test_trace_prints_exactly_the_documents_of_the_steps_rows(runs):
    step = 4
    rows = _rows_logged(runs.train, step)
    assert trace.step_rows(runs.train, step).tolist() == rows  # the trace's record is the step's global batch
    want, tokens = _docs_in_rows(runs.pack, rows)
    out = json.loads(_invoke(runs.train, "--step", step, "--curation-run", runs.curation, "--json"))
    assert out["step"] == step and out["rows"] == rows
    docs = out["documents"]
    assert [d["id"] for d in docs] == want and len(want) > 1
    assert sum(d["tokens"] for d in docs) == tokens
    # Joined from the runs: the curation run's signals (the pack run kept its ids).
    signals = {r["id"]: r for r in pq.read_table(sorted((runs.curation / "fineweb").glob("*.parquet"))).to_pylist()}
    seen = set()
    for d in docs:
        assert d["source"] in ("web", "math") and d["num_tokens"] >= d["tokens"]
        seen.add(d["source"])
        if d["source"] == "web":
            src = signals[d["id"]]
            assert d["url"].startswith("http") and d["url"] == src["url"]
            for col in ("gopher_n_words", "gopher_stop_words", "c4_n_sentences", "fineweb_line_punct_frac", "fineweb_char_dup_frac"):
                assert d["signals"][col] == pytest.approx(src[col]), col
        else:
            assert not any(k.startswith("gopher_") for k in d["signals"])  # math is not web-filtered
    assert seen == {"web", "math"} or len(docs) < 4
    # Without --curation-run: the pack run's own views still give sources, urls and token counts,
    # and the curation signals its rows carried in (format: run reads whole rows)
    bare = json.loads(_invoke(runs.train, "--step", step, "--json"))
    assert [d["id"] for d in bare["documents"]] == want
    assert all(d["num_tokens"] for d in bare["documents"])
    assert [d["signals"] for d in bare["documents"]] == [d["signals"] for d in docs]


def test_trace_table_and_loss_spikes(runs):
    text = _invoke(runs.train, "--step", 1, "--curation-run", runs.curation)
    assert "step 1:" in text and "gopher:" in text and "fineweb:" in text
    first = _docs_in_rows(runs.pack, _rows_logged(runs.train, 1))[0][0]
    assert first in text
    spikes = [json.loads(x) for x in _invoke(runs.train, "--loss-spikes", "--curation-run", runs.curation, "--json").splitlines()]
    assert [s["step"] for s in spikes] == [2] and spikes[0]["event"] == "skip" and "non-finite" in spikes[0]["message"]
    assert [d["id"] for d in spikes[0]["documents"]] == _docs_in_rows(runs.pack, _rows_logged(runs.train, 2))[0]
    assert "non-finite" in _invoke(runs.train, "--loss-spikes")


def test_trace_errors(runs, tmp_path):
    from curation.cli import app

    res = CliRunner().invoke(app, ["trace", str(runs.train), "--step", str(STEPS + 5)])
    assert res.exit_code == 2 and "not in the trace" in res.output
    res = CliRunner().invoke(app, ["trace", str(tmp_path), "--step", "0"])
    assert res.exit_code == 2 and "no step trace" in res.output
    res = CliRunner().invoke(app, ["trace", str(runs.train)])
    assert res.exit_code == 2 and "--step N or --loss-spikes" in res.output


class _Data:
    fingerprint = "f" * 64
    root = "/data/pack"
    num_rows = 1000
    shards = [SimpleNamespace(file="a.parquet", rows=1000)]
    fs = SimpleNamespace(unstrip_protocol=lambda p: "file://" + p)

    @staticmethod
    def url(s):
        return "file:///data/pack/" + s.file


def test_trace_file_is_truncated_on_resume_and_survives_a_torn_tail(tmp_path):
    w = trace.TraceWriter(tmp_path, 0, _Data())
    for s in range(10):
        w.add(s, np.arange(s, s + 4))
        if s == 5:
            w.flush()  # a checkpoint after 6 steps
    w.flush()
    rows = tmp_path / "trace" / "rows.bin"
    with open(rows, "ab") as f:  # killed mid-append
        f.write(struct.pack("<qII", 10, 4, 4) + b"\x01\x02")
    assert trace.recorded_steps(tmp_path) == list(range(10))
    assert trace.step_rows(tmp_path, 7).tolist() == [7, 8, 9, 10]
    # Resuming from the checkpoint at step 6 drops the steps it will redo, then appends.
    w = trace.TraceWriter(tmp_path, 6, _Data())
    w.add(6, np.array([60, 61, 62, 63]))
    w.close()
    assert trace.recorded_steps(tmp_path) == list(range(7))
    assert trace.step_rows(tmp_path, 6).tolist() == [60, 61, 62, 63] and trace.step_rows(tmp_path, 5).tolist() == [5, 6, 7, 8]
    assert rows.stat().st_size == 7 * (16 + 4 * 4)  # 4 bytes a row id
    segs = [json.loads(x) for x in (tmp_path / "trace" / "data.jsonl").read_text().splitlines()]
    assert [s["step"] for s in segs] == [0, 6] and trace.data_segment(tmp_path, 3)["step"] == 0
