"""Export to other trainers' formats (curation/export/, the export stage, ``refinery export``).

On pipelines/mix-multi.yaml's tokenize stage (documents in the run's order), its mix stage (the
interleaved order) and its pack stage (rows): every document's tokens read back through the other
tool's own reader (Megatron-core's ``IndexedDataset``, datatrove's ``DatatroveFileDataset`` /
``DatatroveFolderDataset``, OLMo-core's ``NumpyPaddedFSLDataset`` / ``NumpyFSLDataset``, MosaicML
``streaming.StreamingDataset``, Hugging Face ``datasets``) are identical and in order, with the
document (and packed row) boundaries. Where a reader is not installed or cannot be imported its
test skips saying why; the ``*_spec`` tests read the same files with readers written here from
the formats' published layouts (header bytes, dtype codes, offsets), and always run. Then: the
manifest, the one-line refusals, the export stage at the end of a DAG, resume and determinism.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib
import json
import struct
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from curation.export import format_module, hand_off
from curation.export.common import Docs, ExportError, Rows, TokenInfo
from curation.export import mds as mds_format
from curation.pipeline.executor import run_dag
from curation.pipeline.export import export_stage, parse_weights
from curation.pipeline.rundir import RunDir
from curation.stages.export import EXPORT_MANIFEST
from curation.tokenizer.model import Tokenizer, train_tokenizer
from test_mix import mix_multi_dag, mix_multi_run, mix_multi_tokenizer

NODES = ["tokenize", "mix", "pack"]
_EXPORTS: dict[tuple[str, str], Path] = {}


@pytest.fixture(scope="module")
def run2(tmp_path_factory, ray_session) -> Path:
    return mix_multi_run(tmp_path_factory, 2)


@pytest.fixture(scope="module")
def exported(run2, tmp_path_factory):
    """``exported(fmt, node)``: the folder ``refinery export RUN/node --format fmt`` wrote (once)."""
    root = tmp_path_factory.mktemp("exports")

    def get(fmt: str, node: str) -> Path:
        if (fmt, node) not in _EXPORTS:
            out = root / f"{node}-{fmt}"
            export_stage(run2 / node, fmt, out, workers=2)
            _EXPORTS[(fmt, node)] = out
        return _EXPORTS[(fmt, node)]

    return get


def manifest(out: Path) -> dict:
    return json.loads((out / EXPORT_MANIFEST).read_text())


# ---------------------------------------------------------------------------------------------
# what the stage holds, read through RunDir (shards by key, rows in order)


def stage_tables(run: Path, node: str) -> list[tuple[str, pa.Table]]:
    rd = RunDir(run)
    dag = rd.load_dag()
    return [(k, pq.read_table(p)) for k, p, _ in rd.shard_entries(dag, node, dag.hashes())]


def expected(run: Path, node: str) -> dict:
    """docs: [(id, source, tokens)] in order; for packed rows also rows: [(tokens, doc_lens,
    doc_ids, source)] and groups (pieces per row)."""
    docs, rows, groups = [], [], []
    for _, t in stage_tables(run, node):
        if "doc_lens" in t.column_names:
            for ids, lens, names, src, st in zip(*(t.column(c).to_pylist() for c in
                                                   ("input_ids", "doc_lens", "doc_ids", "source", "source_tokens"))):
                rows.append((np.array(ids), lens, names, src))
                groups.append(len(lens))
                one = next(iter(json.loads(st))) if len(json.loads(st)) == 1 else None
                off = 0
                for n, name in zip(lens, names):
                    docs.append((name, one, np.array(ids[off:off + n])))
                    off += n
        else:
            for i, s, ids in zip(*(t.column(c).to_pylist() for c in ("id", "source", "input_ids"))):
                if ids:
                    docs.append((i, s, np.array(ids)))
    return {"docs": docs, "rows": rows, "groups": groups, "packed": bool(rows)}


def same_tokens(got: list, want: list) -> bool:
    return len(got) == len(want) and all(np.array_equal(np.asarray(a, np.int64), np.asarray(b, np.int64))
                                         for a, b in zip(got, want))


def shard_paths(out: Path, suffix: str) -> list[Path]:
    return [out / f"{s['name']}{suffix}" for s in manifest(out)["shards"]]


# ---------------------------------------------------------------------------------------------
# the real readers


def need(module: str, package: str):
    """The other trainer's own reader: a hard requirement of `make test` (it installs them), so an
    import failure (missing, or a release broken against this torch/numpy) fails the test rather
    than skipping it green."""
    try:
        return importlib.import_module(module)
    except Exception as e:  # noqa: BLE001 (any import failure is a failure to report)
        pytest.fail(f"{package} cannot be imported here ({type(e).__name__}: {e}); `make setup-test` "
                    "installs the reader (.[export-test] plus the --no-deps line in the Makefile)")


def import_streaming():
    """``streaming`` (mosaicml-streaming). Its package __init__ imports ``streaming.vision``,
    which imports torchvision; the only torchvision wheels for torch 2.13 on PyPI are CUDA builds
    that fail to load next to CPU torch ("operator torchvision::nms does not exist"). The MDS
    reader does not use torchvision: when it cannot be imported, a stub with the two names
    ``streaming.vision`` imports (``VisionDataset``, ``to_tensor``) stands in during the import and
    is removed afterwards. The reading below is Streaming's own code."""
    try:
        return importlib.import_module("streaming")
    except ModuleNotFoundError as e:
        if e.name != "torchvision":
            pytest.fail(f"mosaicml-streaming cannot be imported here (ModuleNotFoundError: {e}); "
                        "MDS is checked against its published layout by test_mds_spec; `make setup` installs "
                        "mosaicml-streaming (--no-deps line in the Makefile)")
    except Exception as e:  # noqa: BLE001
        if "torchvision" not in repr(e):
            pytest.fail(f"mosaicml-streaming cannot be imported here ({type(e).__name__}: {e}); "
                        "MDS is checked against its published layout by test_mds_spec; `make setup` installs "
                        "mosaicml-streaming (--no-deps line in the Makefile)")
    saved = {k: v for k, v in sys.modules.items() if k == "torchvision" or k.startswith(("torchvision.", "streaming"))}
    for k in saved:
        del sys.modules[k]
    stub = {n: types.ModuleType(n) for n in ("torchvision", "torchvision.datasets", "torchvision.transforms",
                                             "torchvision.transforms.functional")}
    stub["torchvision.datasets"].VisionDataset = type("VisionDataset", (), {})
    stub["torchvision.transforms.functional"].to_tensor = lambda x: x
    stub["torchvision"].datasets = stub["torchvision.datasets"]
    stub["torchvision"].transforms = stub["torchvision.transforms"]
    stub["torchvision.transforms"].functional = stub["torchvision.transforms.functional"]
    sys.modules.update(stub)
    try:
        return importlib.import_module("streaming")
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"mosaicml-streaming cannot be imported here even with torchvision stubbed "
                    f"({type(e).__name__}: {e}); MDS is checked against its published layout by test_mds_spec; "
                    "a torchvision built for the installed torch would make it run")
    finally:
        for k in stub:
            sys.modules.pop(k, None)


@pytest.mark.parametrize("node", NODES)
def test_megatron_indexed_dataset_reads_every_document(run2, exported, node):
    idx = need("megatron.core.datasets.indexed_dataset", "megatron-core")
    out = exported("megatron", node)
    want = expected(run2, node)
    seqs, doc_sizes = [], []
    for prefix in shard_paths(out, ""):
        ds = idx.IndexedDataset(str(prefix))
        seqs += [np.array(ds[i]) for i in range(len(ds))]  # copies: the memmap closes with ds
        di = np.array(ds.document_indices)
        assert di[0] == 0 and di[-1] == len(ds)
        doc_sizes += np.diff(di).tolist()
        assert ds.index.dtype == np.uint16  # vocabulary of 2,048 ids
    assert same_tokens(seqs, [d[2] for d in want["docs"]])
    # a document is a sequence; a packed row is a document whose sequences are its pieces
    assert doc_sizes == (want["groups"] if want["packed"] else [1] * len(want["docs"]))


@pytest.mark.parametrize("node", NODES)
def test_datatrove_reads_every_document_with_its_boundaries(run2, exported, node):
    dt = need("datatrove.utils.dataset", "datatrove")
    out = exported("nanotron", node)
    m = manifest(out)
    want = [d[2] for d in expected(run2, node)["docs"]]
    got = []
    for s in m["shards"]:
        n = s["tokens"]
        # one window of the whole file: tokens, and positions restarting at each document from .ds.index
        item = dt.DatatroveFileDataset(str(out / f"{s['name']}.ds"), seq_len=n - 1, token_size=2,
                                       return_positions=True)[0]
        ids, pos = item["input_ids"].numpy(), item["positions"].numpy()
        starts = np.flatnonzero(pos == 0).tolist() + [n]
        got += [ids[a:b] for a, b in zip(starts[:-1], starts[1:])]
    assert same_tokens(got, want)
    # the folder reader (what Nanoset uses) takes the files in the run's order, windows of seq_len + 1
    seq = 63
    folder = dt.DatatroveFolderDataset(str(out), seq_len=seq, token_size=2)
    assert [Path(f.file_path).name for f in folder.files] == [f"{s['name']}.ds" for s in m["shards"]]
    flat = iter(want)
    windows = []
    for s in m["shards"]:
        toks = np.concatenate([next(flat) for _ in range(s["docs"])])
        windows += [toks[i * (seq + 1):(i + 1) * (seq + 1)] for i in range(len(toks) // (seq + 1))]
    assert len(folder) == len(windows)
    assert all(np.array_equal(folder[i]["input_ids"].numpy(), w) for i, w in enumerate(windows))


@pytest.mark.parametrize("node", NODES)
def test_olmo_core_reads_every_document(run2, exported, node, tmp_path, monkeypatch):
    nd = need("olmo_core.data.numpy_dataset", "ai2-olmo-core")
    out = exported("olmo", node)
    m = manifest(out)
    want = expected(run2, node)
    docs = [d[2] for d in want["docs"]]
    paths = [str(p) for p in shard_paths(out, ".npy")]
    tok = m["tokenizer"]
    kw = dict(sequence_length=max(len(d) for d in docs), pad_token_id=tok["pad_id"], eos_token_id=tok["eos_id"],
              vocab_size=tok["vocab_size"], dtype=np.uint16)
    modes = ["metadata"] if want["packed"] else ["metadata", "array"]
    for mode in modes:  # boundaries from NAME.csv.gz, and (documents) inferred from EOS
        monkeypatch.setenv("OLMO_DATA_PREP_USE_ARRAY_IF_LOCAL", mode)
        ds = nd.NumpyPaddedFSLDataset(*paths, **kw)
        ds.work_dir = tmp_path / mode
        ds.prepare()
        got = [ds[i]["input_ids"][ds[i]["label_mask"]].numpy() for i in range(len(ds))]
        assert same_tokens(got, docs), mode
    # a packed row's pieces: only a document's last piece ends with EOS
    assert m["docs_without_eos"] == sum(1 for d in want["docs"] if d[2][-1] != tok["eos_id"])
    if want["packed"]:  # "<id>@<piece>/<pieces>": every piece but the last
        last = [int(k) == int(n) - 1 for k, n in (d[0].rsplit("@", 1)[1].split("/") for d in want["docs"])]
        assert m["docs_without_eos"] == last.count(False) > 0
    # the fixed-length reader: the documents concatenated, cut every sequence_length tokens
    fsl = nd.NumpyFSLDataset(*paths, sequence_length=128, pad_token_id=tok["pad_id"], eos_token_id=tok["eos_id"],
                             vocab_size=tok["vocab_size"], dtype=np.uint16)
    flat = iter(docs)
    chunks = []
    for s in m["shards"]:
        toks = np.concatenate([next(flat) for _ in range(s["docs"])])
        chunks += [toks[i * 128:(i + 1) * 128] for i in range(len(toks) // 128)]
    assert same_tokens([fsl[i]["input_ids"] for i in range(len(fsl))], chunks)


@pytest.mark.parametrize("node", NODES)
def test_mosaic_streaming_dataset_reads_every_sample(run2, exported, node):
    streaming = import_streaming()
    out = exported("mds", node)
    want = expected(run2, node)
    ds = streaming.StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    samples = [ds[i] for i in range(len(ds))]
    if want["packed"]:
        assert len(samples) == len(want["rows"])
        for s, (ids, lens, names, src) in zip(samples, want["rows"]):
            assert np.array_equal(s["input_ids"], ids) and s["input_ids"].dtype == np.int32  # the row, padding too
            assert s["doc_lens"].tolist() == lens and s["doc_ids"] == names and s["source"] == src
    else:
        assert same_tokens([s["input_ids"] for s in samples], [d[2] for d in want["docs"]])
        assert [(s["id"], s["source"]) for s in samples] == [(d[0], d[1]) for d in want["docs"]]
    assert len(list(iter(ds))) == len(samples)


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
@pytest.mark.parametrize("node", NODES)
def test_hugging_face_datasets_reads_every_document(run2, exported, fmt, node, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    datasets = need("datasets", "datasets")
    out = exported(fmt, node)
    want = expected(run2, node)
    files = [str(p) for p in shard_paths(out, f".{fmt}")]
    ds = datasets.load_dataset("json" if fmt == "jsonl" else "parquet", data_files=files, split="train",
                               cache_dir=str(tmp_path))
    assert [r["id"] for r in ds] == [d[0] for d in want["docs"]]
    assert [r["source"] for r in ds] == [d[1] for d in want["docs"]]
    assert same_tokens([r["input_ids"] for r in ds], [d[2] for d in want["docs"]])
    assert [r["num_tokens"] for r in ds] == [len(d[2]) for d in want["docs"]]
    if not want["packed"]:  # the stage kept its text: exported as is
        text = {i: t for _, tb in stage_tables(run2, node) for i, t in zip(tb["id"].to_pylist(), tb["text"].to_pylist())}
        assert [r["text"] for r in ds] == [text[d[0]] for d in want["docs"]]
    else:  # rows hold tokens only: decoded with the tokenizer the tokens were made with
        tok = Tokenizer.load(manifest(out)["tokenizer"]["dir"])
        assert all(r["text"] == tok.decode(r["input_ids"]) for r in ds)


# ---------------------------------------------------------------------------------------------
# readers written from the published layouts (run where the tools are not installed)


def spec_megatron(prefix: Path) -> tuple[np.dtype, list[np.ndarray], np.ndarray]:
    """Megatron's .idx: b"MMIDIDX\\0\\0", u64 version 1, u8 dtype code, u64 sequences, u64
    document indices, i32 lengths, i64 byte pointers, i64 document indices."""
    raw = Path(f"{prefix}.idx").read_bytes()
    assert raw[:9] == b"MMIDIDX\x00\x00"
    version, code, n_seq, n_doc = struct.unpack_from("<QBQQ", raw, 9)
    assert version == 1
    dtype = np.dtype({1: "u1", 2: "i1", 3: "i2", 4: "i4", 5: "i8", 6: "f8", 7: "f4", 8: "u2"}[code]).newbyteorder("<")
    off = 9 + 8 + 1 + 8 + 8
    lens = np.frombuffer(raw, "<i4", n_seq, off)
    ptrs = np.frombuffer(raw, "<i8", n_seq, off + 4 * n_seq)
    docs = np.frombuffer(raw, "<i8", n_doc, off + 12 * n_seq)
    assert len(raw) == off + 12 * n_seq + 8 * n_doc
    binary = Path(f"{prefix}.bin").read_bytes()
    assert len(binary) == int(lens.sum()) * dtype.itemsize
    assert np.array_equal(ptrs, np.concatenate([[0], np.cumsum(lens[:-1].astype(np.int64) * dtype.itemsize)]))
    seqs = [np.frombuffer(binary, dtype, int(n), int(p)) for n, p in zip(lens, ptrs)]
    return dtype, seqs, docs


def spec_nanotron(path: Path) -> tuple[list[np.ndarray], list[str]]:
    """datatrove: NAME.ds raw tokens, NAME.ds.index u64 document ends, NAME.ds.metadata lines."""
    meta = Path(f"{path}.metadata").read_text().splitlines()
    size = int(meta[0].rsplit("|", 1)[1])
    toks = np.frombuffer(path.read_bytes(), "<u2" if size == 2 else "<u4")
    ends = np.frombuffer(Path(f"{path}.index").read_bytes(), "<u8").astype(np.int64)
    assert int(meta[1]) == len(toks) and (len(ends) == 0 or ends[-1] == len(toks))
    starts = np.concatenate([[0], ends[:-1]])
    return [toks[a:b] for a, b in zip(starts, ends)], meta


def spec_olmo(npy: Path, dtype: str) -> list[tuple[np.ndarray, str, str]]:
    """OLMo: a headerless token array; NAME.csv.gz start,end(,id,source) per document."""
    toks = np.fromfile(npy, dtype)
    with gzip.open(npy.with_suffix(".csv.gz"), "rt", newline="") as f:
        lines = list(csv.reader(f))
    assert [int(r[0]) for r in lines[1:]] == [int(r[1]) for r in lines[:-1]] and int(lines[-1][1]) == len(toks)
    return [(toks[int(r[0]):int(r[1])], r[2], r[3]) for r in lines]


def spec_mds(folder: Path) -> list[dict]:
    """MDS: index.json; per shard u32 samples, u32 offsets, config JSON, samples (u32 sizes of the
    variable-size columns, then the columns); ndarray: [ndim << 2 | shape dtype][shape][values]."""
    index = json.loads((folder / "index.json").read_text())
    assert index["version"] == 2
    out = []
    for sh in index["shards"]:
        assert sh["format"] == "mds" and sh["version"] == 2 and sh["compression"] is None and sh["zip_data"] is None
        raw = (folder / sh["raw_data"]["basename"]).read_bytes()
        assert len(raw) == sh["raw_data"]["bytes"]
        n = struct.unpack_from("<I", raw)[0]
        assert n == sh["samples"]
        offs = np.frombuffer(raw, "<u4", n + 1, 4)
        config = json.loads(raw[4 + 4 * (n + 1):offs[0]])
        assert config == {k: sh[k] for k in config} and config["column_names"] == sorted(config["column_names"])
        assert offs[-1] == len(raw)
        for a, b in zip(offs[:-1], offs[1:]):
            data = raw[a:b]
            k = len(sh["column_names"])
            sizes = struct.unpack_from(f"<{k}I", data)
            pos = 4 * k
            sample = {}
            for name, enc, size in zip(sh["column_names"], sh["column_encodings"], sizes):
                v = data[pos:pos + size]
                pos += size
                if enc == "str":
                    sample[name] = v.decode()
                elif enc == "json":
                    sample[name] = json.loads(v)
                else:
                    dt = enc.split(":")[1]
                    ndim, code = v[0] >> 2, v[0] & 3
                    sdt = ["<u1", "<u2", "<u4", "<u8"][code]
                    shape = np.frombuffer(v, sdt, ndim, 1)
                    sample[name] = np.frombuffer(v, np.dtype(dt).newbyteorder("<"), offset=1 + ndim * (2 ** code)).reshape(shape)
            out.append(sample)
    return out


@pytest.mark.parametrize("node", NODES)
def test_megatron_spec(run2, exported, node):
    out = exported("megatron", node)
    want = expected(run2, node)
    seqs, sizes = [], []
    for prefix in shard_paths(out, ""):
        dtype, s, docs = spec_megatron(prefix)
        assert dtype == np.dtype("<u2")
        seqs += s
        assert docs[0] == 0 and docs[-1] == len(s)
        sizes += np.diff(docs).tolist()
    assert same_tokens(seqs, [d[2] for d in want["docs"]])
    assert sizes == (want["groups"] if want["packed"] else [1] * len(want["docs"]))


@pytest.mark.parametrize("node", NODES)
def test_nanotron_spec(run2, exported, node):
    out = exported("nanotron", node)
    m = manifest(out)
    got = []
    for p in shard_paths(out, ".ds"):
        docs, meta = spec_nanotron(p)
        assert meta[0] == f"{m['tokenizer']['dir']}|2"
        got += docs
    assert same_tokens(got, [d[2] for d in expected(run2, node)["docs"]])


@pytest.mark.parametrize("node", NODES)
def test_olmo_spec(run2, exported, node):
    out = exported("olmo", node)
    want = expected(run2, node)["docs"]
    got = [d for p in shard_paths(out, ".npy") for d in spec_olmo(p, "<u2")]
    assert same_tokens([g[0] for g in got], [w[2] for w in want])
    assert [(g[1], g[2]) for g in got] == [(w[0], w[1] or "") for w in want]


@pytest.mark.parametrize("node", NODES)
def test_mds_spec(run2, exported, node):
    out = exported("mds", node)
    want = expected(run2, node)
    samples = spec_mds(out)
    if want["packed"]:
        assert [(s["input_ids"].tolist(), s["doc_lens"].tolist(), s["doc_ids"], s["source"]) for s in samples] == \
            [(r[0].tolist(), r[1], r[2], r[3]) for r in want["rows"]]
    else:
        assert same_tokens([s["input_ids"] for s in samples], [d[2] for d in want["docs"]])
        assert [(s["id"], s["source"]) for s in samples] == [(d[0], d[1]) for d in want["docs"]]


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_text_spec(run2, exported, fmt):
    out = exported(fmt, "tokenize")
    want = expected(run2, "tokenize")["docs"]
    if fmt == "parquet":
        rows = [r for p in shard_paths(out, ".parquet") for r in pq.read_table(p).to_pylist()]
    else:
        rows = [json.loads(line) for p in shard_paths(out, ".jsonl") for line in p.read_text().splitlines()]
    assert [(r["id"], r["source"], r["input_ids"]) for r in rows] == [(d[0], d[1], d[2].tolist()) for d in want]


# ---------------------------------------------------------------------------------------------
# the writers on their own: dtypes chosen from the vocabulary, MDS parts, empty input


def _docs(rng, n: int, vocab: int) -> Docs:
    lens = rng.integers(1, 300, n)
    return Docs(rng.integers(0, vocab, int(lens.sum())).astype(np.int32), lens.astype(np.int64),
                [f"d{i}" for i in range(n)], ["web" if i % 2 else "code" for i in range(n)])


@pytest.mark.parametrize("vocab,megatron_code,nanotron_size,olmo_dtype",
                         [(200, 8, 2, "<u1"), (50_000, 8, 2, "<u2"), (65_500, 4, 2, "<u2"), (70_000, 4, 4, "<u4")])
def test_token_dtype_follows_the_vocabulary(tmp_path, vocab, megatron_code, nanotron_size, olmo_dtype):
    rng = np.random.default_rng(vocab)
    info = TokenInfo("bpe", "f" * 64, vocab, 0, 1)
    batches = [_docs(rng, 20, vocab), _docs(rng, 7, vocab)]
    want = [b.doc(i) for b in batches for i in range(len(b))]
    for fmt in ("megatron", "nanotron", "olmo", "mds"):
        w = format_module(fmt).WRITER(tmp_path / fmt, "s", info, 0, {"size_limit": 4096})
        for b in batches:
            w.write_docs(b)
        files = w.close()
        for f in files:  # the sha256 computed while writing is the file's
            assert hashlib.sha256((tmp_path / fmt / f["path"]).read_bytes()).hexdigest() == f["sha256"]
        if fmt == "mds":
            format_module(fmt).finish(tmp_path / fmt, [w.extra()], info)
    assert (tmp_path / "megatron" / "s.idx").read_bytes()[17] == megatron_code
    _, seqs, _ = spec_megatron(tmp_path / "megatron" / "s")
    assert same_tokens(seqs, want)
    docs, meta = spec_nanotron(tmp_path / "nanotron" / "s.ds")
    assert meta[0].endswith(f"|{nanotron_size}") and same_tokens(docs, want)
    assert same_tokens([d[0] for d in spec_olmo(tmp_path / "olmo" / "s.npy", olmo_dtype)], want)
    samples = spec_mds(tmp_path / "mds")
    index = json.loads((tmp_path / "mds" / "index.json").read_text())
    assert len(index["shards"]) > 1 and all(s["raw_data"]["bytes"] <= 4096 for s in index["shards"])  # cut at size_limit
    assert same_tokens([s["input_ids"] for s in samples], want)


def test_packed_rows_drop_padding_in_token_streams_and_keep_it_in_mds(tmp_path):
    tokens = np.array([[5, 6, 7, 9, 1, 1], [8, 8, 8, 8, 8, 8], [4, 0, 1, 1, 1, 1]], np.int32)
    rows = Rows(tokens, np.array([3, 1, 6, 2]), np.array([2, 1, 1]), ["a@0/1", "b@1/2", "c@0/1", "b@0/2"],
                ["web", "web", "code"], ["web", "web", "web", "code"])
    info = TokenInfo("bpe", "f" * 64, 100, 0, 1)
    for fmt in ("megatron", "olmo", "mds"):
        w = format_module(fmt).WRITER(tmp_path / fmt, "p", info, 0, {})
        w.write_rows(rows)
        w.close()
        if fmt == "olmo":
            assert w.extra() == {"docs_without_eos": 3}  # only c's piece ends with EOS (0)
        if fmt == "mds":
            format_module(fmt).finish(tmp_path / fmt, [w.extra()], info)
    _, seqs, docs = spec_megatron(tmp_path / "megatron" / "p")
    assert [s.tolist() for s in seqs] == [[5, 6, 7], [9], [8, 8, 8, 8, 8, 8], [4, 0]] and docs.tolist() == [0, 2, 3, 4]
    olmo = spec_olmo(tmp_path / "olmo" / "p.npy", "<u1")
    assert [(d.tolist(), i, s) for d, i, s in olmo] == [([5, 6, 7], "a@0/1", "web"), ([9], "b@1/2", "web"),
                                                         ([8] * 6, "c@0/1", "web"), ([4, 0], "b@0/2", "code")]
    assert [s["input_ids"].tolist() for s in spec_mds(tmp_path / "mds")] == tokens.tolist()


def test_megatron_data_path_weights_prefixes_by_source_share():
    shards = [{"files": ["a.bin", "a.idx"], "source_tokens": {"web": 300}},
              {"files": ["b.bin", "b.idx"], "source_tokens": {"web": 100}},
              {"files": ["c.bin", "c.idx"], "source_tokens": {"math": 50}},
              {"files": ["d.bin", "d.idx"], "source_tokens": {"code": 10}}]
    m = {"format": "megatron", "tokenizer": {}, "shards": shards}
    assert hand_off(m, "/x") == "--data-path /x/a /x/b /x/c /x/d"
    assert hand_off(m, "/x", {"web": 0.8, "math": 0.2}) == "--data-path 0.6 /x/a 0.2 /x/b 0.2 /x/c"


# ---------------------------------------------------------------------------------------------
# the manifest, refusals, the stage in a DAG, resume


@pytest.mark.parametrize("node", ["tokenize", "pack"])
def test_manifest_counts_tokens_per_source_and_hashes_every_file(run2, exported, node):
    out = exported("megatron", node)
    m = manifest(out)
    tok = Tokenizer.load(mix_multi_tokenizer(run2.parent))
    assert m["tokenizer"]["fingerprint"] == tok.fingerprint and m["tokenizer"]["vocab_size"] == tok.vocab_size
    assert m["tokenizer"]["dir"] == str(tok.path.parent) and m["token_dtype"] == "uint16"
    for f in m["files"]:
        assert hashlib.sha256((out / f["path"]).read_bytes()).hexdigest() == f["sha256"]
        assert (out / f["path"]).stat().st_size == f["bytes"]
    listed = {f["path"] for f in m["files"]}
    assert {p.name for p in out.iterdir() if not p.name.startswith("_") and p.name != EXPORT_MANIFEST} == listed
    per_source: dict[str, int] = {}
    for _, t in stage_tables(run2, node):
        if node == "pack":
            for st in t["source_tokens"].to_pylist():
                for s, n in json.loads(st).items():
                    per_source[s] = per_source.get(s, 0) + n
        else:
            for s, n in zip(t["source"].to_pylist(), t["num_tokens"].to_pylist()):
                per_source[s] = per_source.get(s, 0) + n
    assert m["tokens_by_source"] == per_source and m["tokens"] == sum(per_source.values())
    assert [s["name"] for s in m["shards"]] == sorted(s["name"] for s in m["shards"])  # the run's order
    if node == "pack":
        assert m["rows"] == sum(len(t) for _, t in stage_tables(run2, node))
        assert m["padding"] == m["rows"] * 513 - m["tokens"]


def test_refuses_a_stage_without_tokens_and_a_mismatched_tokenizer(run2, tmp_path):
    with pytest.raises(ExportError) as e:
        export_stage(run2 / "extract", "megatron", tmp_path / "a")
    assert "no input_ids" in str(e.value) and "\n" not in str(e.value)
    other = train_tokenizer(run2.parent / "corpus" / "texts.parquet", tmp_path / "other", vocab_size=1024,
                            progress=False)
    with pytest.raises(ExportError) as e:
        export_stage(run2 / "pack", "olmo", tmp_path / "b", tokenizer=other.path.parent)
    assert "tokenizer mismatch" in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "b").exists()
    # the command: exit 2 and one line
    res = CliRunner(env={"COLUMNS": "400"}).invoke(
        __import__("curation.cli", fromlist=["app"]).app,
        ["export", str(run2 / "tokenize"), "--format", "megatron", "--out", str(tmp_path / "c"),
         "--tokenizer", str(other.path.parent)])
    assert res.exit_code == 2 and res.output.count("\n") == 1 and "tokenizer mismatch" in res.output
    res = CliRunner().invoke(__import__("curation.cli", fromlist=["app"]).app,
                             ["export", str(run2 / "extract"), "--format", "nope", "--out", str(tmp_path / "d")])
    assert res.exit_code == 2 and "--format" in res.output


def test_export_stage_at_the_end_of_a_dag_writes_what_the_command_writes(run2, exported, tmp_path):
    def edit(d):
        d["stages"]["export"] = {"type": "export", "input": "pack", "format": "megatron"}
        d["output"] = "export"

    run = tmp_path / "run"
    run_dag(mix_multi_dag(mix_multi_tokenizer(run2.parent), edit), run, workers=2, quiet=True)
    m = manifest(run / "export")
    cli = manifest(exported("megatron", "pack"))
    assert [(f["path"], f["sha256"]) for f in m["files"]] == [(f["path"], f["sha256"]) for f in cli["files"]]
    assert not (run / "export" / "_work").exists()
    before = (run / "export" / "_manifest.jsonl").read_text()
    run_dag(mix_multi_dag(mix_multi_tokenizer(run2.parent), edit), run, workers=2, quiet=True)  # nothing to redo
    assert json.loads((run / "export" / "_phases.json").read_text())["phases"]["export"]["ran"] == 0
    assert (run / "export" / "_manifest.jsonl").read_text() == before


def test_rerun_resumes_and_output_is_the_same_on_one_or_two_workers(run2, exported, tmp_path):
    two = exported("nanotron", "tokenize")
    out = tmp_path / "one"
    export_stage(run2 / "tokenize", "nanotron", out, workers=1)
    first = manifest(out)
    assert {**first, "stage": None} == {**manifest(two), "stage": None}
    for f in first["files"]:
        assert (out / f["path"]).read_bytes() == (two / f["path"]).read_bytes()
    victim = out / first["files"][3]["path"]
    victim.unlink()
    export_stage(run2 / "tokenize", "nanotron", out, workers=1)
    assert json.loads((out / "_phases.json").read_text())["phases"]["export"]["ran"] == 1  # only its shard
    assert manifest(out)["files"] == first["files"]
    # another format into the same folder replaces the earlier export's files
    export_stage(run2 / "tokenize", "olmo", out, workers=1)
    assert not list(out.glob("*.ds*")) and len(list(out.glob("*.npy"))) == len(first["shards"])


def test_weights_from_a_mix_stage(run2, tmp_path):
    w = parse_weights(str(run2 / "mix"))
    assert w == pytest.approx({"web": 0.4, "math": 0.2, "code": 0.15, "multilingual": 0.25}, abs=1e-9)
    # the command prints Megatron's --data-path with each source's share split over its files
    res = CliRunner(env={"COLUMNS": "4000"}).invoke(
        __import__("curation.cli", fromlist=["app"]).app,
        ["export", str(run2 / "tokenize"), "--format", "megatron", "--out", str(tmp_path / "m"),
         "--weights", str(run2 / "mix")])
    assert res.exit_code == 0, res.output
    line = next(x for x in res.output.splitlines() if x.startswith("--data-path "))
    parts = line.split()[1:]
    weights = dict(zip(parts[1::2], map(float, parts[0::2])))
    m = manifest(tmp_path / "m")
    by_source: dict[str, float] = {}
    for s in m["shards"]:
        (src,) = s["source_tokens"]  # a tokenize shard holds one input's documents: one source
        by_source[src] = by_source.get(src, 0) + weights[str(tmp_path / "m" / s["name"])]
    assert by_source == pytest.approx(w, abs=1e-5)
    assert parse_weights("web=0.3, math=0.7") == {"web": 0.3, "math": 0.7}
    with pytest.raises(ExportError):
        parse_weights("web:0.3")


def test_mds_size_limit_is_checked():
    with pytest.raises(ExportError):
        mds_format.MdsWriter(Path("/nonexistent"), "x", TokenInfo(None, "f", 10, 0, 1), 0, {"size_limit": 1 << 32})
