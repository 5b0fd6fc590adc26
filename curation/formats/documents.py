"""The document schema shared by readers, stages and writers (see DESIGN.md)."""

from __future__ import annotations

import pyarrow as pa

#: Columns every document has once it leaves a reader. Stages add signal columns.
DOC_FIELDS = [
    pa.field("id", pa.string(), nullable=False),
    pa.field("text", pa.string()),
    pa.field("source", pa.string()),
    pa.field("url", pa.string()),
    pa.field("meta", pa.string()),  # JSON string
    # where the document came from, for re-reading it (``reextract``): the file (local paths
    # absolute, URLs as given), and in it, for a WARC record its gzip member's offset and
    # compressed length (length null where the record does not own its member: several records
    # in one member, an uncompressed WARC); for a JSON line its byte offset and length (in the
    # decompressed stream for a compressed file); for a Parquet row its row index
    pa.field("origin_file", pa.dictionary(pa.int32(), pa.string())),
    pa.field("origin_offset", pa.int64()),
    pa.field("origin_length", pa.int64()),
]
#: the provenance columns of ``DOC_FIELDS``
ORIGIN_COLUMNS = ("origin_file", "origin_offset", "origin_length")
DOC_SCHEMA = pa.schema(DOC_FIELDS)

#: the heavy columns of a row: what a signals-only shard and an unsampled rejected row leave out
PAYLOAD_COLUMNS = ("text", "html", "input_ids")

#: WARC readers emit raw HTML for the extract stage instead of text.
HTML_SCHEMA = pa.schema(DOC_FIELDS + [pa.field("html", pa.large_binary()), pa.field("charset", pa.string())])

#: Read-time problems (corrupt gzip, invalid UTF-8, oversized documents...) are rows like this.
READ_REJECT_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string()),
        pa.field("source", pa.string()),
        pa.field("reason", pa.string()),
        pa.field("file", pa.string()),
        pa.field("offset", pa.int64()),  # byte offset of the record (or line) in the file
        pa.field("detail", pa.string()),  # error message / what was seen
        pa.field("text", pa.string()),  # what could be recovered (truncated preview for huge docs)
    ]
)

#: Column added to rows sent to rejected/STAGE/.
REASON = "reason"
STAGE = "stage"
