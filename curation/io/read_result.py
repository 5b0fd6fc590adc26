"""What every reader returns: the documents it could read and a row per problem it met.

Readers produce ``ReadResult`` batches of bounded size (``iter_read``); ``read_shard`` is their
concatenation. A document id is ``INPUT/RELPATH#OFFSET``: the byte offset of the record in the
file as stored (the gzip member of a WARC record, the line of a JSONL file; the line offset in
the decompressed stream for compressed JSONL; the row index for Parquet).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from curation.io.inputs import InputShard, InputSpec
from curation.formats.documents import DOC_SCHEMA, HTML_SCHEMA, READ_REJECT_SCHEMA

#: built once per batch (one file per shard), not per document
_PER_BATCH = ("origin_file",)

PREVIEW_CHARS = 2000


@dataclass
class ReadResult:
    """Column builders for documents and read-time rejections of (a batch of) one input shard."""

    shard: InputShard
    spec: InputSpec
    html: bool = False  # WARC response records carry raw HTML for the extract stage
    docs: dict[str, list] = field(default_factory=dict)
    rejects: dict[str, list] = field(default_factory=dict)
    #: bytes taken from storage for this shard up to the end of this batch (cumulative)
    bytes_read: int = 0
    #: bytes produced by decompression for this shard up to the end of this batch (cumulative)
    bytes_decompressed: int = 0
    #: payload bytes held (html, text, previews): what bounds a batch's memory
    held_bytes: int = 0
    #: why a whole file gave no document and no problem (no line, no row, no record of the
    #: type read): 0 documents, noted on the input's manifest line, never a rejected row
    empty: str | None = None
    #: document columns beyond the schema's (an index's ``content_languages``...): their values
    #: for the documents added next are ``record_columns``'
    extra: tuple[pa.Field, ...] = ()
    record_columns: dict = field(default_factory=dict)
    #: documents come from several files (``at_file``): ``origin_file`` per document
    many_files: bool = False

    def __post_init__(self) -> None:
        self.docs = {f.name: [] for f in self.schema if f.name not in _PER_BATCH or self.many_files}
        self.rejects = {f.name: [] for f in READ_REJECT_SCHEMA}

    @property
    def schema(self) -> pa.Schema:
        base = HTML_SCHEMA if self.html else DOC_SCHEMA
        return pa.schema(list(base) + list(self.extra)) if self.extra else base

    def at_file(self, path: str, relpath: str) -> None:
        """The documents and problems added next come from ``path`` (ids say ``relpath``)."""
        self.many_files = True
        if "origin_file" not in self.docs:
            self.docs["origin_file"] = [self.origin_file] * self.num_docs
        self.shard = replace(self.shard, path=path, relpath=relpath)

    @property
    def num_docs(self) -> int:
        return len(self.docs["id"])

    @property
    def num_rejects(self) -> int:
        return len(self.rejects["id"])

    def __len__(self) -> int:
        return self.num_docs + self.num_rejects

    def doc_id(self, index: int | str) -> str:
        return f"{self.shard.input}/{self.shard.relpath}#{index}"

    @property
    def origin_file(self) -> str:
        """The shard's file as documents record it: a local path made absolute (a later run
        may start elsewhere), a URL as it is."""
        p = self.shard.path
        return p if "://" in p else os.path.abspath(p)

    def add(self, index: int | str, text: str | None, url: str | None = None, meta: dict | None = None,
            doc_id: str | None = None, html: bytes | None = None, charset: str | None = None,
            offset: int | None = None, length: int | None = None) -> None:
        """One document; ``offset``/``length``: where it lies in the file (``origin_*``;
        ``offset`` defaults to an int ``index``)."""
        d = self.docs
        d["id"].append(doc_id or self.doc_id(index))
        d["text"].append(text)
        d["source"].append(self.spec.source)
        d["url"].append(url)
        d["meta"].append(json.dumps(meta, sort_keys=True, ensure_ascii=False) if meta else None)
        d["origin_offset"].append(index if offset is None and isinstance(index, int) else offset)
        d["origin_length"].append(length)
        if self.many_files:
            d["origin_file"].append(self.origin_file)
        for f in self.extra:
            d[f.name].append(self.record_columns.get(f.name))
        if self.html:
            d["html"].append(html)
            d["charset"].append(charset)
        self.held_bytes += len(text) if text else 0
        self.held_bytes += len(html) if html else 0

    def reject(self, index: int | str | None, reason: str, offset: int | None, detail: str = "",
               text: str | None = None) -> None:
        r = self.rejects
        r["id"].append(self.doc_id(index) if index is not None else f"{self.shard.input}/{self.shard.relpath}@{offset}")
        r["source"].append(self.spec.source)
        r["reason"].append(f"read:{reason}")
        r["file"].append(self.shard.path)
        r["offset"].append(offset)
        r["detail"].append(detail[:500])
        r["text"].append(text[:PREVIEW_CHARS] if text else None)
        self.held_bytes += min(len(text), PREVIEW_CHARS) if text else 0

    def full(self, batch_rows: int | None, batch_bytes: int | None) -> bool:
        return bool((batch_rows and len(self) >= batch_rows) or (batch_bytes and self.held_bytes >= batch_bytes))

    def take(self) -> ReadResult:
        """Hand over what was built so far as a batch, and start an empty one."""
        out = ReadResult(self.shard, self.spec, self.html, bytes_read=self.bytes_read,
                         bytes_decompressed=self.bytes_decompressed, held_bytes=self.held_bytes, empty=self.empty,
                         extra=self.extra, record_columns=dict(self.record_columns), many_files=self.many_files)
        out.docs, out.rejects = self.docs, self.rejects
        self.__post_init__()
        self.held_bytes = 0
        return out

    def extend(self, other: ReadResult) -> None:
        """Append a later batch of the same shard."""
        if other.many_files and not self.many_files:
            self.at_file(self.shard.path, self.shard.relpath)
        for k, v in other.docs.items():
            self.docs[k].extend(v)
        for k, v in other.rejects.items():
            self.rejects[k].extend(v)
        self.held_bytes += other.held_bytes
        self.bytes_read, self.bytes_decompressed = other.bytes_read, other.bytes_decompressed
        self.empty = other.empty or self.empty

    def set_length(self, first: int, length: int) -> None:
        """``origin_length`` of the documents from ``first`` (an index in this batch) on: a WARC
        record's member length, known once the member was read to its end."""
        lengths = self.docs["origin_length"]
        lengths[first:] = [length] * (len(lengths) - first)

    def tables(self) -> tuple[pa.Table, pa.Table]:
        schema = self.schema
        n = self.num_docs
        if self.many_files:
            files = pa.array(self.docs["origin_file"], pa.string()).dictionary_encode()
        else:  # one file per shard: a dictionary of one value, its indices all 0
            files = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, np.int32)), pa.array([self.origin_file]))
        cols = {**self.docs, "origin_file": files}
        return (pa.Table.from_pydict({f.name: cols[f.name] for f in schema}, schema=schema),
                pa.Table.from_pydict(self.rejects, schema=READ_REJECT_SCHEMA))
