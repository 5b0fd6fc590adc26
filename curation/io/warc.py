"""WARC and WET readers (FastWARC). Response records become HTML documents, WET conversion
records become text documents; everything else a crawl holds is skipped without a row.

A gzip WARC is walked gzip member by gzip member (``curation.io.ranges``): each member is
decompressed on its own and handed to FastWARC, so a part of a file reads only the members
that start in its byte range, and a broken member (truncated, corrupt, a ``Content-Length``
that lies, garbage after it) damages nothing outside itself: the walk reports it and goes on
at the next record's member. A record's id offset is its member's offset in the file; a record
that does not start its member (several records in one member, a file that is one gzip
stream) is ``MEMBER+OFFSET_IN_MEMBER``. A WARC that is not gzip (uncompressed, zstd) is read
whole by FastWARC, ids are its ``stream_pos``.

Each document records its ``origin_file``, ``origin_offset`` (the member's offset; the
``stream_pos`` of a WARC that is not gzip) and ``origin_length``: the member's compressed
length when the record is the only one of its type in the member and starts it, so that the
byte range ``[offset, offset + length)`` is a gzip member holding it first (``reextract``
re-reads it with one ranged read); null otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator

from fastwarc.warc import ArchiveIterator, WarcRecordType

from curation.io.inputs import InputShard, InputSpec
from curation.io.ranges import GZIP_MAGIC, Member, Source, chunk_size, first_member, open_counted
from curation.io.read_result import ReadResult

HTML_TYPES = ("text/html", "application/xhtml+xml")


def http_body(rec, body: bytes) -> bytes:
    """A response record's payload as the server meant it: wget stores chunked bodies as sent,
    and chunk sizes would leak into the text."""
    chunked = "chunked" in (rec.http_headers.get("Transfer-Encoding") or "").lower()
    return dechunk(body) if chunked else body


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


def _records(stream, wet: bool) -> ArchiveIterator:
    # quirks_mode: ClueWeb09 ends HTTP headers with a bare LF
    rtype = WarcRecordType.conversion if wet else WarcRecordType.response
    return ArchiveIterator(stream, record_types=rtype, parse_http=not wet, quirks_mode=True)


class WalkState:
    """What a shard's walk has seen so far (for an empty file's note and error details)."""

    def __init__(self) -> None:
        self.records = 0
        self.last_truncated = False


def add_record(res: ReadResult, spec: InputSpec, rec, wet: bool, index: int | str, offset: int,
                st: WalkState) -> None:
    """One response (WARC) or conversion (WET) record: a document, or a reject row."""
    st.records += 1
    st.last_truncated = False
    url = rec.headers.get("WARC-Target-URI")
    if url and url.startswith("<") and url.endswith(">"):
        url = url[1:-1]  # WARC/1.0 writers sometimes bracket the URI
    meta = {"warc_record_id": rec.headers.get("WARC-Record-ID"), "warc_date": rec.headers.get("WARC-Date")}
    if rec.content_length > spec.max_doc_bytes:
        res.reject(index, "doc_too_large", offset, f"{rec.content_length} bytes > max_doc_bytes")
        return
    body = rec.reader.read()
    if len(body) < rec.content_length:
        # Keep what we have (it usually extracts fine) and write the problem down.
        res.reject(index, "truncated_record", offset,
                   f"record body {len(body)} of {rec.content_length} bytes: stream ends early")
        meta["truncated"] = True
        st.last_truncated = True
    if wet:
        try:
            text = body.decode("utf-8")
        except UnicodeDecodeError as e:
            res.reject(index, "invalid_utf8", offset, str(e), body.decode("utf-8", "replace"))
            return
        lang = rec.headers.get("WARC-Identified-Content-Language")
        if lang:
            meta["cc_lang"] = lang
        res.add(index, text, url, meta, offset=offset)
        return
    status = rec.http_headers.status_code if rec.http_headers is not None else None
    ctype = (rec.http_content_type or "").lower()
    if status is not None and not 200 <= status < 300:
        res.reject(index, "http_status", offset, f"HTTP {status}")
    elif not ctype.startswith(HTML_TYPES):
        res.reject(index, "non_html", offset, f"content type {ctype or 'missing'!r}")
    else:
        meta["content_type"] = ctype
        res.add(index, None, url, meta, html=http_body(rec, body), charset=rec.http_charset, offset=offset)


def iter_warc(shard: InputShard, spec: InputSpec, res: ReadResult) -> Iterator[None]:
    """Read the records of this shard's byte range into ``res``; yield after each record (a
    point where the caller may take a batch). Never raises on bad data."""
    wet = shard.format == "wet"
    st = WalkState()
    whole = shard.start == 0 and shard.end >= shard.size
    with Source(shard.path, chunk=chunk_size(shard.start, shard.end)) as src:
        gz = src.read_at(0, 3) == GZIP_MAGIC if shard.start == 0 else True
        if gz:
            yield from _walk_members(shard, spec, res, src, wet, st)
        elif shard.start == 0:
            src.close()
            yield from _read_stream(shard, spec, res, wet, st)
        # a part after the first of a file that is not gzip owns nothing (the planner reads
        # such files whole; the first part reads them whole if they were cut anyway)
        res.bytes_read = max(res.bytes_read, src.bytes_read)
    if whole and st.records == 0 and not res.rejects["id"]:
        res.empty = "no WARC record of type " + ("conversion" if wet else "response")  # 0 documents


def _walk_members(shard: InputShard, spec: InputSpec, res: ReadResult, src: Source, wet: bool,
                  st: WalkState) -> Iterator[None]:
    """Members whose start offset lies in ``[shard.start, shard.end)``, one after the other."""
    end = shard.end
    inflated = 0
    # The first part starts at offset 0 whatever is there; later parts at the first real record.
    pos = 0 if shard.start == 0 else first_member(src, shard.start, end)
    while 0 <= pos < end:
        if src.read_at(pos, 3) != GZIP_MAGIC:
            if not src.read_at(pos, 1):
                break  # the end of the file
            nxt = first_member(src, pos + 1, end)
            upto = f"the next record at {nxt}" if nxt >= 0 else "the end of this part"
            res.reject(None, "corrupt_stream", pos, f"bytes that are not a gzip member, skipped to {upto}")
            pos = nxt
            continue
        m = Member(src, pos)
        n_before = st.records
        docs_before = res.num_docs
        within = -1
        try:
            for rec in _records(m, wet):
                if within >= 0:
                    yield  # the record before this one: several share this member
                within = rec.stream_pos
                add_record(res, spec, rec, wet, pos if within == 0 else f"{pos}+{within}", pos, st)
                res.bytes_read, res.bytes_decompressed = src.bytes_read, inflated + m.inflated
            parse_error = None
        except Exception as e:  # FastWARC on bytes that are no WARC record
            parse_error = f"{type(e).__name__}: {e}"
        m.drain()
        inflated += m.inflated
        res.bytes_read, res.bytes_decompressed = src.bytes_read, inflated
        if st.records == n_before + 1 and within == 0 and m.error is None and parse_error is None:
            # the record owns its member (Common Crawl's layout): [pos, end) re-reads it alone.
            # Known only now, so this member's yield waits until here (no batch was taken since)
            res.set_length(docs_before, m.end - pos)
        if within >= 0:
            yield
        if m.error is None and parse_error is None:
            pos = m.end
            continue
        if m.error == "truncated" and parse_error is None and st.records > n_before and st.last_truncated:
            break  # the file ends inside this record: reported as truncated_record already
        if m.error is None:  # the member decompressed fine but holds no readable record
            res.reject(None, "corrupt_stream", pos, f"gzip member at {pos}: {parse_error}")
            pos = m.end
            continue
        nxt = first_member(src, pos + 1, end)
        upto = f"the next record at {nxt}" if nxt >= 0 else "the end of this part"
        what = "ends early (file truncated)" if m.error == "truncated" else f"is corrupt ({m.error})"
        res.reject(None, "corrupt_stream", pos,
                   f"gzip member at {pos} {what} after {m.out_pos} bytes; skipped to {upto}")
        pos = nxt
        yield
    res.bytes_read, res.bytes_decompressed = src.bytes_read, inflated


def _read_stream(shard: InputShard, spec: InputSpec, res: ReadResult, wet: bool, st: WalkState) -> Iterator[None]:
    """A WARC that is not gzip (uncompressed, or a codec FastWARC detects): read whole."""
    f, raw = open_counted(shard.path)
    last_pos = 0
    try:
        with f:
            for rec in _records(f, wet):
                last_pos = rec.stream_pos
                add_record(res, spec, rec, wet, last_pos, last_pos, st)
                res.bytes_read = raw.bytes_read
                yield
    except (FileNotFoundError, PermissionError):
        raise  # the file vanished or is unreadable: fail the task (retried), not bad data
    except Exception as e:  # garbage bytes: keep what was read, record where it broke
        res.reject(None, "corrupt_stream", last_pos, f"{type(e).__name__}: {e} (after record {st.records})")
    res.bytes_read = raw.bytes_read
