"""The packed training row: what ``pack`` writes and the trainer reads.

One row is ``seq_len + 1`` token ids holding whole documents or pieces of them, with each
piece's length (``doc_lens``), the ids of the documents they came from, the majority source
and the per-source token counts (JSON), and the row's mean quality.
"""

from __future__ import annotations

import pyarrow as pa

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
