"""JSON Lines reader (.jsonl, .jsonl.gz, .jsonl.zst, any fsspec URL)."""

from __future__ import annotations

import json

import fsspec

from curation.io.inputs import InputShard, InputSpec
from curation.io.read_result import ReadResult


def _compression(path: str) -> str | None:
    if path.endswith(".gz"):
        return "gzip"
    if path.endswith((".zst", ".zstd")):
        return "zstd"
    return None


def read_jsonl(shard: InputShard, spec: InputSpec) -> ReadResult:
    """Read the lines dealt to this shard. Offsets are byte offsets in the decompressed stream."""
    res = ReadResult(shard, spec)
    index = -1
    offset = 0
    try:
        with fsspec.open(shard.path, "rb", compression=_compression(shard.path)) as f:
            for raw in f:
                line_offset, offset = offset, offset + len(raw)
                if not raw.strip():
                    continue
                index += 1
                if index % shard.nparts != shard.part:
                    continue
                if len(raw) > spec.max_doc_bytes:
                    preview = raw[:4000].decode("utf-8", "replace")
                    res.reject(index, "doc_too_large", line_offset, f"{len(raw)} bytes > max_doc_bytes", preview)
                    continue
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as e:
                    res.reject(index, "invalid_utf8", line_offset, str(e), raw.decode("utf-8", "replace"))
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    res.reject(index, "invalid_json", line_offset, str(e), line)
                    continue
                text = obj.get(spec.text_field) if isinstance(obj, dict) else None
                if not isinstance(text, str):
                    res.reject(index, "missing_text", line_offset, f"no string field {spec.text_field!r}", line)
                    continue
                doc_id = None
                if spec.id_field and obj.get(spec.id_field) is not None:
                    doc_id = f"{shard.input}/{obj[spec.id_field]}"
                url = obj.get(spec.url_field) if spec.url_field else None
                meta = {k: v for k, v in obj.items() if k not in (spec.text_field, spec.url_field, spec.id_field)}
                res.add(index, text, url if isinstance(url, str) else None, meta or None, doc_id=doc_id)
    except (FileNotFoundError, PermissionError):
        raise  # the file vanished or is unreadable: fail the task (retried), not bad data
    except Exception as e:  # corrupt gzip/zstd, truncated stream, unreadable file
        res.reject(None, "corrupt_stream", offset, f"{type(e).__name__}: {e} (after line {index})")
    if index < 0 and not res.rejects["id"]:
        res.reject(None, "empty_file", 0, "no JSON line in file")
    return res
