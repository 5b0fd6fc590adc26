"""What every reader returns: the documents it could read and a row per problem it met."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pyarrow as pa

from curation.io.inputs import InputShard, InputSpec
from curation.formats.documents import DOC_SCHEMA, HTML_SCHEMA, READ_REJECT_SCHEMA

PREVIEW_CHARS = 2000


@dataclass
class ReadResult:
    """Column builders for documents and read-time rejections of one input shard."""

    shard: InputShard
    spec: InputSpec
    html: bool = False  # WARC response records carry raw HTML for the extract stage
    docs: dict[str, list] = field(default_factory=dict)
    rejects: dict[str, list] = field(default_factory=dict)

    def __post_init__(self) -> None:
        schema = HTML_SCHEMA if self.html else DOC_SCHEMA
        self.docs = {f.name: [] for f in schema}
        self.rejects = {f.name: [] for f in READ_REJECT_SCHEMA}

    def doc_id(self, index: int) -> str:
        return f"{self.shard.input}/{self.shard.relpath}#{index}"

    def add(self, index: int, text: str | None, url: str | None = None, meta: dict | None = None,
            doc_id: str | None = None, html: bytes | None = None, charset: str | None = None) -> None:
        d = self.docs
        d["id"].append(doc_id or self.doc_id(index))
        d["text"].append(text)
        d["source"].append(self.spec.source)
        d["url"].append(url)
        d["meta"].append(json.dumps(meta, sort_keys=True, ensure_ascii=False) if meta else None)
        if self.html:
            d["html"].append(html)
            d["charset"].append(charset)

    def reject(self, index: int | None, reason: str, offset: int | None, detail: str = "",
               text: str | None = None) -> None:
        r = self.rejects
        r["id"].append(self.doc_id(index) if index is not None else f"{self.shard.input}/{self.shard.relpath}@{offset}")
        r["source"].append(self.spec.source)
        r["reason"].append(f"read:{reason}")
        r["file"].append(self.shard.path)
        r["offset"].append(offset)
        r["detail"].append(detail[:500])
        r["text"].append(text[:PREVIEW_CHARS] if text else None)

    def tables(self) -> tuple[pa.Table, pa.Table]:
        schema = HTML_SCHEMA if self.html else DOC_SCHEMA
        return (pa.Table.from_pydict(self.docs, schema=schema),
                pa.Table.from_pydict(self.rejects, schema=READ_REJECT_SCHEMA))
