"""WARC and WET readers (FastWARC). Response records become HTML documents, WET conversion
records become text documents; everything else a crawl holds is skipped without a row."""

from __future__ import annotations

import fsspec
from fastwarc.warc import ArchiveIterator, WarcRecordType

from curation.io.inputs import InputShard, InputSpec
from curation.io.read_result import ReadResult

HTML_TYPES = ("text/html", "application/xhtml+xml")


def _open(path: str):
    if "://" not in path or path.startswith("file://"):
        return path.removeprefix("file://")  # FastWARC opens local paths itself (and detects gzip)
    return fsspec.open(path, "rb").open()


def dechunk(body: bytes) -> bytes:
    """Undo HTTP/1.1 chunked transfer encoding; return ``body`` unchanged if it is not chunked."""
    out, pos = [], 0
    while True:
        eol = body.find(b"\r\n", pos)
        if eol < 0:
            return body
        try:
            size = int(body[pos:eol].split(b";", 1)[0].strip(), 16)
        except ValueError:
            return body if not out else b"".join(out)
        if size == 0:
            return b"".join(out)
        start = eol + 2
        out.append(body[start:start + size])
        pos = start + size + 2
        if start + size > len(body):  # truncated mid-chunk: keep what there is
            return b"".join(out)


def read_warc(shard: InputShard, spec: InputSpec) -> ReadResult:
    """Read the response (WARC) or conversion (WET) records dealt to this shard."""
    wet = shard.format == "wet"
    res = ReadResult(shard, spec, html=not wet)
    rtype = WarcRecordType.conversion if wet else WarcRecordType.response
    index = -1
    last_pos = 0
    try:
        # quirks_mode: ClueWeb09 ends HTTP headers with a bare LF
        for rec in ArchiveIterator(_open(shard.path), record_types=rtype, parse_http=not wet, quirks_mode=True):
            index += 1
            last_pos = rec.stream_pos
            if index % shard.nparts != shard.part:
                continue  # another task's record: skip without reading the body
            url = rec.headers.get("WARC-Target-URI")
            if url and url.startswith("<") and url.endswith(">"):
                url = url[1:-1]  # WARC/1.0 writers sometimes bracket the URI
            meta = {"warc_record_id": rec.headers.get("WARC-Record-ID"), "warc_date": rec.headers.get("WARC-Date")}
            if rec.content_length > spec.max_doc_bytes:
                res.reject(index, "doc_too_large", rec.stream_pos, f"{rec.content_length} bytes > max_doc_bytes")
                continue
            body = rec.reader.read()
            truncated = len(body) < rec.content_length
            if truncated:
                # Keep what we have (it usually extracts fine) and write the problem down.
                res.reject(index, "truncated_record", rec.stream_pos,
                           f"record body {len(body)} of {rec.content_length} bytes: stream ends early")
                meta["truncated"] = True
            if wet:
                try:
                    text = body.decode("utf-8")
                except UnicodeDecodeError as e:
                    res.reject(index, "invalid_utf8", rec.stream_pos, str(e), body.decode("utf-8", "replace"))
                    continue
                lang = rec.headers.get("WARC-Identified-Content-Language")
                if lang:
                    meta["cc_lang"] = lang
                res.add(index, text, url, meta)
                continue
            status = rec.http_headers.status_code if rec.http_headers is not None else None
            ctype = (rec.http_content_type or "").lower()
            if status is not None and not 200 <= status < 300:
                res.reject(index, "http_status", rec.stream_pos, f"HTTP {status}")
            elif not ctype.startswith(HTML_TYPES):
                res.reject(index, "non_html", rec.stream_pos, f"content type {ctype or 'missing'!r}")
            else:
                meta["content_type"] = ctype
                if "chunked" in (rec.http_headers.get("Transfer-Encoding") or "").lower():
                    body = dechunk(body)  # wget stores bodies as sent; chunk sizes would leak into text
                res.add(index, None, url, meta, html=body, charset=rec.http_charset)
    except (FileNotFoundError, PermissionError):
        raise  # the file vanished or is unreadable: fail the task (retried), not bad data
    except Exception as e:  # corrupt gzip, garbage bytes: keep what was read, record where it broke
        res.reject(None, "corrupt_stream", last_pos, f"{type(e).__name__}: {e} (after record {index})")
    if index < 0 and not res.rejects["id"]:
        res.reject(None, "empty_file", 0, "no WARC record of type " + ("conversion" if wet else "response"))
    return res
