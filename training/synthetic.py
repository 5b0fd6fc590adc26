"""Synthetic packed shards in the ``pack`` stage's format, for tests, benchmarks and drills.

Documents are learnable but not trivial: each repeats a short random motif drawn from its
source's slice of the vocabulary (so a model can predict the rest of a document once it
has seen one period), ends with EOS, and documents are packed back to back into rows of
``seq_len + 1`` tokens, split across rows where they do not fit. Some rows end early with
padding, as the last row of a packer's bin would.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from curation.formats.packed import PACKED_SCHEMA, with_source_tokens

EOS = 1


def _docs(rng: np.random.Generator, lo: int, hi: int, max_len: int):
    while True:
        motif = rng.integers(lo, hi, size=int(rng.integers(3, 9)))
        n = int(rng.integers(8, max_len))
        yield np.concatenate([np.resize(motif, n - 1), [EOS]])


def make_rows(source: str, n_rows: int, seq_len: int, vocab: int, rng: np.random.Generator, pad_id: int = 0, pad_prob: float = 0.15,
              max_doc: int | None = None) -> list[dict]:
    """``n_rows`` packed rows of one source (its motifs use a source-specific vocab slice);
    documents of 8 to ``max_doc`` tokens (default half a row)."""
    k = sum(source.encode()) % 4  # not hash(): that changes between processes
    span = max(16, (vocab - 2) // 4)
    lo = 2 + (k * span) % max(1, vocab - 2 - span)
    docs = _docs(rng, lo, min(vocab, lo + span), max_doc or max(16, seq_len // 2))
    width = seq_len + 1
    rows, carry = [], np.zeros(0, dtype=np.int64)
    for _ in range(n_rows):
        limit = width if rng.random() > pad_prob else int(rng.integers(width // 2, width))
        toks, lens = [], []
        used = 0
        while used < limit:
            if not len(carry):
                carry = next(docs)
            take = carry[: limit - used]
            carry = carry[len(take) :]
            toks.append(take)
            lens.append(len(take))
            used += len(take)
        if limit < width:
            carry = np.zeros(0, dtype=np.int64)  # the packer closes a padded bin: no split doc
        ids = np.full(width, pad_id, dtype=np.int32)
        ids[:used] = np.concatenate(toks)
        rows.append({
            "input_ids": ids.tolist(),
            "doc_lens": lens,
            "source": source,
            "quality": float(rng.random()),
            "source_tokens": json.dumps({source: used}),
        })
    return rows


def write_packed(
    out: str | Path,
    rows_per_source: dict[str, int],
    seq_len: int,
    vocab: int = 512,
    seed: int = 0,
    rows_per_shard: int = 200,
    row_group_size: int = 64,
    manifest: bool = True,
    quality: bool = True,
    pad_id: int = 0,
    pad_prob: float | dict[str, float] = 0.15,
    max_doc: dict[str, int] | None = None,
    footer_tokens: bool = True,
) -> Path:
    """Write ``out/*.parquet`` (+ ``_manifest.jsonl``) with rows of all sources shuffled together.

    ``pad_prob`` and ``max_doc`` may be given per source (a short-document source whose rows
    are often closed early); ``footer_tokens`` writes the per-source token footer ``pack``
    writes (without it a reader has to count ``doc_lens``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    rows = []
    for source in sorted(rows_per_source):
        pp = pad_prob.get(source, 0.15) if isinstance(pad_prob, dict) else pad_prob
        rows += make_rows(source, rows_per_source[source], seq_len, vocab, rng, pad_id, pp, (max_doc or {}).get(source))
    rows = [rows[i] for i in rng.permutation(len(rows))]
    # The pack stage's own columns and types; synthetic documents have no ids (no doc_ids).
    names = ["input_ids", "doc_lens", "source"] + (["quality"] if quality else []) + ["source_tokens"]
    fields = [PACKED_SCHEMA.field(n) for n in names]
    schema = pa.schema(fields)
    lines = []
    for n, a in enumerate(range(0, len(rows), rows_per_shard)):
        part = rows[a : a + rows_per_shard]
        table = pa.Table.from_pylist([{f.name: r[f.name] for f in fields} for r in part], schema=schema)
        if footer_tokens:
            table = with_source_tokens(table)
        name = f"part-{n:05d}"
        pq.write_table(table, out / f"{name}.parquet", row_group_size=row_group_size)
        lines.append(json.dumps({"shard": name, "file": f"{name}.parquet", "rows": len(part)}))
    if manifest:
        (out / "_manifest.jsonl").write_text("".join(line + "\n" for line in lines))
    return out
