"""JSON Lines reader (.jsonl, .jsonl.gz, .jsonl.zst, any fsspec URL).

An uncompressed file is read by byte range: a part seeks to ``start - 1``, skips through the
first newline (unless ``start == 0``) and reads the lines that start before ``end``. A
compressed file cannot be entered in the middle: one task reads it whole (the planner never
cuts it). A document id is ``INPUT/RELPATH#OFFSET`` with the line's byte offset (in the
decompressed stream for a compressed file), unless ``id_field`` names one.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

from fsspec.compression import compr

from curation.io.inputs import InputShard, InputSpec, compression_of
from curation.io import ranges
from curation.io.ranges import CountingRaw, chunk_size, open_counted
from curation.io.read_result import ReadResult


def _lines(shard: InputShard, res: ReadResult) -> Iterator[tuple[int, bytes]]:
    """(offset, raw line) of every line this shard owns; keeps ``res.bytes_*`` current."""
    comp = compression_of(shard.path)
    if comp is not None:
        if shard.start > 0:
            return  # compressed files are read whole by their first (only) part
        raw = CountingRaw(ranges.open_raw(shard.path))
        with raw, compr[comp](io.BufferedReader(raw, 1 << 20), mode="rb") as stream:
            f = stream if isinstance(stream, io.BufferedIOBase) else io.BufferedReader(stream, 1 << 20)
            offset = 0
            for line in f:
                yield offset, line
                offset += len(line)
                res.bytes_read, res.bytes_decompressed = raw.bytes_read, offset
        return
    f, raw = open_counted(shard.path, chunk_size(shard.start, shard.end))
    with f:
        pos = shard.start
        if pos > 0:
            f.seek(pos - 1)
            pos = pos - 1 + len(f.readline())  # the line that holds start - 1 is another part's
        while pos < shard.end:
            line = f.readline()
            if not line:
                break
            yield pos, line
            pos += len(line)
            res.bytes_read = raw.bytes_read
    res.bytes_read = raw.bytes_read


def iter_jsonl(shard: InputShard, spec: InputSpec, res: ReadResult) -> Iterator[None]:
    """Read the lines of this shard into ``res``; yield after each line."""
    seen = 0
    offset = shard.start
    whole = shard.start == 0 and shard.end >= shard.size
    try:
        for line_offset, raw in _lines(shard, res):
            offset = line_offset + len(raw)
            if not raw.strip():
                continue
            seen += 1
            _add_line(res, spec, line_offset, raw)
            yield
    except (FileNotFoundError, PermissionError):
        raise  # the file vanished or is unreadable: fail the task (retried), not bad data
    except Exception as e:  # corrupt gzip/zstd, truncated stream, unreadable file
        res.reject(None, "corrupt_stream", offset, f"{type(e).__name__}: {e} (after line {seen})")
    if whole and seen == 0 and not res.rejects["id"]:
        res.empty = "no JSON line in file"  # 0 documents, not a rejected one


def _add_line(res: ReadResult, spec: InputSpec, line_offset: int, raw: bytes) -> None:
    if len(raw) > spec.max_doc_bytes:
        preview = raw[:4000].decode("utf-8", "replace")
        res.reject(line_offset, "doc_too_large", line_offset, f"{len(raw)} bytes > max_doc_bytes", preview)
        return
    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        res.reject(line_offset, "invalid_utf8", line_offset, str(e), raw.decode("utf-8", "replace"))
        return
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        res.reject(line_offset, "invalid_json", line_offset, str(e), line)
        return
    text = obj.get(spec.text_field) if isinstance(obj, dict) else None
    if not isinstance(text, str):
        res.reject(line_offset, "missing_text", line_offset, f"no string field {spec.text_field!r}", line)
        return
    doc_id = None
    if spec.id_field and obj.get(spec.id_field) is not None:
        doc_id = f"{res.shard.input}/{obj[spec.id_field]}"
    url = obj.get(spec.url_field) if spec.url_field else None
    meta = {k: v for k, v in obj.items() if k not in (spec.text_field, spec.url_field, spec.id_field)}
    res.add(line_offset, text, url if isinstance(url, str) else None, meta or None, doc_id=doc_id, length=len(raw))
