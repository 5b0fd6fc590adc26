"""An export over a stage with an empty shard (an input file whose every line was rejected):
no format writes a 0-document file or hands on a prefix/path to one, and every file and prefix
the export lists opens with that trainer's own reader (megatron-core ``IndexedDataset`` fails on
an empty ``.bin``: "cannot mmap an empty file"). Readers that cannot be imported skip, saying why
(the ``*_spec`` readers of tests/test_export.py check the layouts then)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import DATA
from curation.export import FORMATS
from curation.export.common import Docs, Rows, TokenInfo
from curation.export import format_module
from curation.pipeline.dag import parse_dag
from curation.pipeline.executor import run_dag
from curation.pipeline.export import export_stage, hand_off_line
from curation.pipeline.rundir import RunDir
from curation.tokenizer.model import train_tokenizer
from test_export import import_streaming, need, spec_megatron, spec_nanotron, spec_olmo

GSM = DATA / "jsonl" / "gsm8k_train_head400.jsonl.gz"
_CACHE: dict = {}


@pytest.fixture(scope="module")
def run(tmp_path_factory, ray_session) -> Path:
    """tokenize -> pack over three files, the middle one all rejected (no `question` field)."""
    root = tmp_path_factory.mktemp("export-empty")
    corpus = root / "corpus.parquet"
    import gzip

    with gzip.open(GSM, "rt") as f:
        texts = [json.loads(line)["question"] for line in f]
    pq.write_table(pa.table({"text": texts}), corpus)
    tok = train_tokenizer(corpus, root / "tok", kind="bpe", vocab_size=512, progress=False).path.parent
    a, b = root / "a.jsonl", root / "c.jsonl"
    a.write_text("".join(json.dumps({"question": t}) + "\n" for t in texts[:150]))
    b.write_text("".join(json.dumps({"question": t}) + "\n" for t in texts[150:]))
    (root / "b.jsonl").write_text("".join(json.dumps({"answer": str(i)}) + "\n" for i in range(5)))
    dag = parse_dag({"name": "empty-shard",
                     "inputs": {"math": {"format": "jsonl", "source": "math", "text_field": "question",
                                         "paths": [str(a), str(root / "b.jsonl"), str(b)]}},
                     "stages": {"tokenize": {"type": "tokenize", "tokenizer": str(tok)},
                                "pack": {"type": "pack", "seq_len": 128}}}, "empty.yaml")
    run_dag(dag, root / "run", workers=2, quiet=True)
    return root / "run"


def exported(run: Path, fmt: str, node: str) -> Path:
    if (fmt, node) not in _CACHE:
        out = run.parent / f"{node}-{fmt}"
        export_stage(run / node, fmt, out, workers=2)
        _CACHE[(fmt, node)] = out
    return _CACHE[(fmt, node)]


def upstream_docs(run: Path, node: str) -> tuple[int, int]:
    """(documents, tokens) of the node's shards, and check one shard has no row."""
    rd = RunDir(run)
    dag = rd.load_dag()
    entries = rd.shard_entries(dag, node, dag.hashes())
    tables = [pq.read_table(p) for _, p, _ in entries]
    if "doc_lens" in tables[0].column_names:
        lens = [n for t in tables for row in t.column("doc_lens").to_pylist() for n in row]
    else:
        lens = [len(x) for t in tables for x in t.column("input_ids").to_pylist() if x]
    return len(lens), sum(lens)


def test_the_tokenize_stage_has_an_empty_shard(run):
    rd = RunDir(run)
    rows = sorted(e["rows"] for e in rd.entries("tokenize").values())
    assert rows[0] == 0 and rows[1] > 0, rows


@pytest.mark.parametrize("node", ["tokenize", "pack"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_no_empty_file_is_written_or_listed(run, fmt, node):
    out = exported(run, fmt, node)
    m = json.loads((out / "export.json").read_text())
    files = [p for p in out.iterdir() if not p.name.startswith(("_", ".")) and p.name != "export.json"]
    assert files and all(p.stat().st_size > 0 for p in files), [(p.name, p.stat().st_size) for p in files]
    assert {f["path"] for f in m["files"]} == {p.name for p in files}
    for s in m["shards"]:
        assert bool(s["files"]) == (s["docs"] > 0), s
    docs, tokens = upstream_docs(run, node)
    assert (m["docs"], m["tokens"]) == (docs, tokens)
    line = hand_off_line(out)
    if fmt == "megatron":
        prefixes = line.removeprefix("--data-path ").split()
        assert prefixes and all(Path(f"{p}.bin").stat().st_size > 0 for p in prefixes), line
        assert len(prefixes) == sum(1 for s in m["shards"] if s["docs"])


@pytest.mark.parametrize("node", ["tokenize", "pack"])
def test_megatron_core_opens_every_listed_prefix(run, node):
    idx = need("megatron.core.datasets.indexed_dataset", "megatron-core")
    out = exported(run, "megatron", node)
    prefixes = hand_off_line(out).removeprefix("--data-path ").split()
    n_seq = n_tok = 0
    for p in prefixes:
        ds = idx.IndexedDataset(p)
        n_seq += len(ds)
        n_tok += int(sum(len(ds[i]) for i in range(len(ds))))
        assert np.array_equal(np.array(ds[0]), spec_megatron(Path(p))[1][0])
    docs, tokens = upstream_docs(run, node)
    assert (n_seq, n_tok) == (docs, tokens)


@pytest.mark.parametrize("node", ["tokenize", "pack"])
def test_datatrove_opens_the_folder_and_every_file(run, node):
    dt = need("datatrove.utils.dataset", "datatrove")
    out = exported(run, "nanotron", node)
    per_file = []
    for ds_file in sorted(out.glob("*.ds")):
        toks, _ = spec_nanotron(ds_file)
        n = sum(len(t) for t in toks)
        item = dt.DatatroveFileDataset(str(ds_file), seq_len=n - 1, token_size=2)[0]
        assert len(item["input_ids"]) == n > 0
        per_file.append(n)
    folder = dt.DatatroveFolderDataset(str(out), seq_len=15, token_size=2)
    assert len(folder) == sum(n // 16 for n in per_file)
    assert sum(per_file) == upstream_docs(run, node)[1]


@pytest.mark.parametrize("node", ["tokenize", "pack"])
def test_olmo_core_opens_every_npy(run, node):
    nd = need("olmo_core.data.numpy_dataset", "ai2-olmo-core")
    out = exported(run, "olmo", node)
    m = json.loads((out / "export.json").read_text())
    tok = m["tokenizer"]
    paths = sorted(str(p) for p in out.glob("*.npy"))
    fsl = nd.NumpyFSLDataset(*paths, sequence_length=16, pad_token_id=tok["pad_id"], eos_token_id=tok["eos_id"],
                             vocab_size=tok["vocab_size"], dtype=np.uint16)
    per_file = [len(spec_olmo(Path(p), "uint16")) for p in paths]
    assert all(per_file) and len(fsl) == sum(
        sum(len(d[0]) for d in spec_olmo(Path(p), "uint16")) // 16 for p in paths)
    assert [fsl[i]["input_ids"] for i in range(min(3, len(fsl)))]


@pytest.mark.parametrize("node", ["tokenize", "pack"])
def test_streaming_opens_the_mds_folder(run, node):
    streaming = import_streaming()
    out = exported(run, "mds", node)
    m = json.loads((out / "export.json").read_text())
    ds = streaming.StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    assert len(ds) == (m["rows"] if m["unit"] == "rows" else m["docs"])
    assert len(list(iter(ds))) == len(ds)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("node", ["tokenize", "pack"])
def test_hugging_face_datasets_loads_the_folder(run, fmt, node, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets = need("datasets", "datasets")
    out = exported(run, fmt, node)
    line = hand_off_line(out)  # datasets.load_dataset('json', data_files='OUT/[!_]*.jsonl', ...)
    pattern = line.split("data_files='", 1)[1].split("'", 1)[0]
    assert pattern == f"{out}/[!_]*.{fmt}", line
    ds = datasets.load_dataset("json" if fmt == "jsonl" else fmt, data_files=pattern, split="train",
                               cache_dir=str(tmp_path))
    assert len(ds) == upstream_docs(run, node)[0]


@pytest.mark.parametrize("fmt", FORMATS)
def test_a_writer_that_got_nothing_writes_nothing(tmp_path, fmt):
    info = TokenInfo("bpe", "0" * 64, 512, 0, 1, None)
    # nothing handed over (no batch), or empty batches (token formats; text formats decode, and
    # the export task hands them no empty batch)
    for unit in ("nothing",) + (("docs", "rows") if fmt not in ("parquet", "jsonl") else ()):
        out = tmp_path / unit
        w = format_module(fmt).WRITER(out, "shard-00000", info, 0, {})
        if unit == "docs":
            w.write_docs(Docs(np.zeros(0, np.int32), np.zeros(0, np.int64), [], []))
        elif unit == "rows":
            w.write_rows(Rows(np.zeros((0, 8), np.int32), np.zeros(0, np.int64), np.zeros(0, np.int64), [], []))
        assert w.close() == []
        assert not out.exists() or not list(out.iterdir()), list(out.iterdir())
