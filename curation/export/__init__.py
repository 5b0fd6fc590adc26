"""Export tokenized documents and packed rows to the formats other trainers read: algorithms only
(numpy arrays in, files out; no Ray, no run directory). One module per format:

| format | module | files per output shard | read by |
|---|---|---|---|
| ``megatron`` | ``megatron.py`` | ``NAME.bin`` + ``NAME.idx`` | Megatron-LM / NeMo ``IndexedDataset`` |
| ``nanotron`` | ``nanotron.py`` | ``NAME.ds`` + ``.ds.index`` + ``.ds.metadata`` | datatrove ``DatatroveFolderDataset``, nanotron Nanoset |
| ``olmo`` | ``olmo.py`` | ``NAME.npy`` + ``NAME.csv.gz`` | OLMo-core numpy datasets |
| ``mds`` | ``mds.py`` | ``shard.NNNNN.PPP.mds`` (+ ``index.json``) | MosaicML ``streaming.StreamingDataset`` |
| ``parquet`` / ``jsonl`` | ``text.py`` | ``NAME.parquet`` / ``NAME.jsonl`` | Hugging Face ``datasets``, anyone |

A format module has ``WRITER`` (a ``common.Writer``: one output shard, written batch by batch
with bounded memory) and ``finish(out_dir, results, info)`` (folder-level files, e.g. MDS's
``index.json``). ``curation/stages/export.py`` runs them over a stage's shards.
"""

from __future__ import annotations

from types import SimpleNamespace

from curation.export import mds, megatron, nanotron, olmo, text
from curation.export.common import Docs, ExportError, Rows, TokenInfo, Writer  # noqa: F401

FORMATS = ("megatron", "nanotron", "olmo", "mds", "parquet", "jsonl")


def format_module(fmt: str):
    """``WRITER`` and ``finish`` of a format."""
    mods = {"megatron": megatron, "nanotron": nanotron, "olmo": olmo, "mds": mds}
    if fmt in mods:
        return mods[fmt]
    if fmt in ("parquet", "jsonl"):
        return SimpleNamespace(WRITER=text.writer(fmt), finish=text.finish)
    raise ExportError(f"format {fmt!r} is not one of {', '.join(FORMATS)}")


def hand_off(manifest: dict, out_dir: str, weights: dict[str, float] | None = None) -> str:
    """The one line that points a trainer at an export (``manifest``: its ``export.json``).
    ``weights`` (per source, e.g. a mix report's target shares) weight Megatron's prefixes."""
    fmt, tok = manifest["format"], manifest["tokenizer"]
    if fmt == "megatron":
        return f"--data-path {megatron.data_path(manifest['shards'], out_dir, weights)}"
    if fmt == "nanotron":
        return (f"data_stages[].data.dataset: {{dataset_folder: [{out_dir}], dataset_weights: [1.0]}}  "
                f"# token size {nanotron.token_size(tok['vocab_size'])}")
    if fmt == "olmo":
        return (f"NumpyFSLDatasetConfig.glob('{out_dir}/*.npy', sequence_length=SEQ_LEN, tokenizer=TokenizerConfig("
                f"vocab_size={tok['vocab_size']}, eos_token_id={tok['eos_id']}, pad_token_id={tok['pad_id']}))")
    if fmt == "mds":
        return f"streaming.StreamingDataset(local='{out_dir}', shuffle=True, batch_size=BATCH)"
    # [!_]: not the export's own _manifest.jsonl beside the shards
    return f"datasets.load_dataset('{'json' if fmt == 'jsonl' else fmt}', data_files='{out_dir}/[!_]*.{fmt}', split='train')"
