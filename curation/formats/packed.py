"""The packed training row: what ``pack`` writes and the trainer reads.

One row is ``seq_len + 1`` token ids holding whole documents or pieces of them, with each
piece's length (``doc_lens``), the ids of the documents they came from, the majority source
and the per-source token counts (JSON), and the row's mean quality.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute as pc

PACKED_SCHEMA = pa.schema([
    pa.field("input_ids", pa.list_(pa.int32())),
    pa.field("doc_lens", pa.list_(pa.int32())),
    pa.field("doc_ids", pa.list_(pa.string())),
    pa.field("source", pa.string()),
    pa.field("source_tokens", pa.string()),
    pa.field("quality", pa.float64()),
])

#: Parquet footer key under which ``tokenize`` records the tokenizer's description (JSON).
TOKENIZER_METADATA = b"refinery.tokenizer"
#: Written by ``pack`` once all its shards are committed; names the current params hash.
PACK_REPORT = "_pack_report.json"
#: Parquet footer key of a packed shard: ``{source: [rows, content tokens]}`` (JSON), so a
#: trainer learns each source's tokens per row from footers alone and can mix by tokens.
SOURCE_TOKENS_METADATA = b"refinery.source_tokens"


def source_token_counts(table: pa.Table) -> dict[str, list[int]]:
    """``{source: [rows, content tokens]}`` of packed rows (content: the ``doc_lens`` sum,
    i.e. every token that is not padding), for ``SOURCE_TOKENS_METADATA``."""
    if table.num_rows == 0:
        return {}
    lens = table.column("doc_lens").combine_chunks()
    parent = pc.list_parent_indices(lens)
    src = pc.fill_null(table.column("source").combine_chunks(), "unknown")
    per_row = pa.table({"row": parent, "n": pc.list_flatten(lens).cast(pa.int64())}).group_by("row").aggregate([("n", "sum")])
    tokens = pa.table({"source": pc.take(src, per_row.column("row")), "n": per_row.column("n_sum")})
    tok = dict(zip(*tokens.group_by("source").aggregate([("n", "sum")]).to_pydict().values()))
    rows = pa.table({"source": src}).group_by("source").aggregate([("source", "count")]).to_pydict()
    return {s: [int(n), int(tok.get(s, 0))] for s, n in zip(rows["source"], rows["source_count"])}


def with_source_tokens(table: pa.Table) -> pa.Table:
    """``table`` with its ``SOURCE_TOKENS_METADATA`` footer entry set."""
    meta = dict(table.schema.metadata or {})
    meta[SOURCE_TOKENS_METADATA] = json.dumps(source_token_counts(table), sort_keys=True).encode()
    return table.replace_schema_metadata(meta)
