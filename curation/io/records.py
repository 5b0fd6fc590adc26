"""Re-reading WARC records where documents came from (``origin_file``, ``origin_offset``,
``origin_length``; see ``curation.formats.documents``), touching only their bytes.

- A record that owns its gzip member (Common Crawl's layout: the readers give it a length) is
  one byte range ``[offset, offset + length)``. ``plan_reads`` sorts a file's ranges by offset
  and joins those less than ``max_gap`` bytes apart into one read; ``read_records`` fetches a
  file's reads with fsspec's ``cat_ranges`` (concurrent requests on object storage) and parses
  each range's member with FastWARC.
- A record without a length (several records share its gzip member, a WARC that is not gzip)
  is found by reading forward from its offset until its ``WARC-Record-ID`` comes by: one
  forward pass per (file, offset) for all the records wanted there, at most ``max_scan_bytes``.

Nothing raises on bad data: a record that cannot be had gets a reason (``missing_file``,
``missing_record``, ``corrupt_record``, ``record_mismatch``, ``not_response``, ``no_origin``,
``truncated_record``), as the readers count their rejections.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import fsspec
from fastwarc.warc import ArchiveIterator, WarcRecordType

from curation.io.ranges import CountingRaw, open_raw
from curation.io.warc import HTML_TYPES, http_body

#: ranges closer than this are fetched as one read (a request costs more than this many bytes)
DEFAULT_MAX_GAP = 64 << 10
#: how far a record without a length is looked for past its offset
DEFAULT_MAX_SCAN_BYTES = 1 << 30


@dataclass(frozen=True)
class Wanted:
    """One record to re-read: where it is and, when known, its WARC-Record-ID (checked)."""

    file: str | None
    offset: int | None
    length: int | None
    record_id: str | None = None


@dataclass
class Page:
    """A re-read response record's HTML (or why there is none)."""

    html: bytes | None = None
    charset: str | None = None
    reason: str | None = None
    detail: str = ""


@dataclass
class ReadStats:
    """What re-reading cost: bytes taken from storage, reads (requests) and files."""

    bytes_read: int = 0
    reads: int = 0
    files: int = 0
    ranges: list[tuple[str, int, int]] = field(default_factory=list)  # (file, start, end) fetched

    def add(self, other: ReadStats) -> None:
        self.bytes_read += other.bytes_read
        self.reads += other.reads
        self.files += other.files
        self.ranges.extend(other.ranges)


def plan_reads(spans: Sequence[tuple[int, int]], max_gap: int = DEFAULT_MAX_GAP) -> list[tuple[int, int, list[int]]]:
    """``spans`` (start, end) of one file -> reads ``(start, end, [span indices])`` in offset
    order, a span joining the read before it when it starts less than ``max_gap`` bytes after
    that read's end (overlapping spans always join)."""
    order = sorted(range(len(spans)), key=lambda i: spans[i])
    out: list[tuple[int, int, list[int]]] = []
    for i in order:
        s, e = spans[i]
        if out and s - out[-1][1] < max(max_gap, 1):
            start, end, members = out[-1]
            out[-1] = (start, max(end, e), members + [i])
        else:
            out.append((s, e, [i]))
    return out


def parse_response(data: bytes, record_id: str | None) -> Page:
    """The first record of ``data`` (a gzip member or uncompressed bytes): its HTML, checked to
    be the response record ``record_id`` names (when given)."""
    try:
        for rec in ArchiveIterator(io.BytesIO(data), parse_http=False, quirks_mode=True):
            return _page(rec, record_id)
    except Exception as e:  # FastWARC on bytes that are no WARC record
        return Page(reason="corrupt_record", detail=f"{type(e).__name__}: {e}")
    return Page(reason="corrupt_record", detail="no WARC record in the range")


def _page(rec, record_id: str | None) -> Page:
    if record_id is not None and rec.record_id != record_id:
        return Page(reason="record_mismatch", detail=f"{rec.record_id} at the offset, not {record_id}")
    if rec.record_type != WarcRecordType.response:
        return Page(reason="not_response", detail=f"a {rec.headers.get('WARC-Type')} record")
    rec.parse_http()  # content_length is then the payload's
    body = rec.reader.read()
    if len(body) < rec.content_length:
        return Page(reason="truncated_record", detail=f"record body {len(body)} of {rec.content_length} bytes")
    ctype = (rec.http_content_type or "").lower()
    if rec.http_headers is None or not ctype.startswith(HTML_TYPES):
        return Page(reason="not_response", detail=f"content type {ctype or 'missing'!r}")
    return Page(html=http_body(rec, body), charset=rec.http_charset)  # as the reader gives it


def read_records(wanted: Sequence[Wanted], max_gap: int = DEFAULT_MAX_GAP,
                 max_scan_bytes: int = DEFAULT_MAX_SCAN_BYTES) -> tuple[list[Page], ReadStats]:
    """The pages of ``wanted`` (same order) and what reading them cost."""
    pages = [Page() for _ in wanted]
    stats = ReadStats()
    by_file: dict[str, list[int]] = defaultdict(list)
    for i, w in enumerate(wanted):
        if not w.file or w.offset is None or w.offset < 0 or (w.length is not None and w.length <= 0):
            pages[i] = Page(reason="no_origin", detail="no origin_file/origin_offset to re-read it from")
        else:
            by_file[w.file].append(i)
    for path, rows in by_file.items():
        stats.files += 1
        ranged = [i for i in rows if wanted[i].length is not None]
        scanned = [i for i in rows if wanted[i].length is None]
        try:
            if ranged:
                _read_ranged(path, ranged, wanted, pages, stats, max_gap)
            if scanned:
                _read_scanned(path, scanned, wanted, pages, stats, max_scan_bytes)
        except FileNotFoundError as e:
            for i in rows:
                if pages[i].html is None and pages[i].reason is None:
                    pages[i] = Page(reason="missing_file", detail=str(e)[:300])
    return pages, stats


@dataclass(frozen=True)
class Miss:
    """Why a byte range could not be had: ``missing_file``, or ``past_end`` (the file ends
    before the range does)."""

    reason: str
    detail: str = ""


def fetch_spans(path: str, spans: Sequence[tuple[int, int]], stats: ReadStats,
                max_gap: int = DEFAULT_MAX_GAP) -> list[bytes | Miss]:
    """The bytes of each span ``[start, end)`` of one file (same order), fetched as
    ``plan_reads`` joins them with one ``cat_ranges`` call (concurrent requests on object
    storage), or a ``Miss``. A range the store refuses for another reason than the file's end
    (permissions, the network after the store's retries) raises: not a fact about the data."""
    out: list[bytes | Miss] = [Miss("missing_file") for _ in spans]
    if not spans:
        return out
    stats.files += 1
    reads = plan_reads(spans, max_gap)
    fs, fpath = fsspec.core.url_to_fs(path)
    blobs = fs.cat_ranges([fpath] * len(reads), [s for s, _, _ in reads], [e for _, e, _ in reads], on_error="return")
    size: int | None = None
    for (start, end, members), blob in zip(reads, blobs):
        stats.reads += 1
        stats.ranges.append((path, start, end))
        if isinstance(blob, FileNotFoundError):
            detail = str(blob)[:300] or f"{path}: no such file"
            return [Miss("missing_file", detail) for _ in spans]
        if isinstance(blob, Exception):
            # a range starting at or past the end of the object (S3: 416): known by its size
            if size is None:
                try:
                    size = int(fs.size(fpath))
                except FileNotFoundError as e:
                    return [Miss("missing_file", str(e)[:300]) for _ in spans]
            if start < size:
                raise blob
            blob = b""
        stats.bytes_read += len(blob)
        for j in members:
            s, e = spans[j]
            piece = blob[s - start:e - start]
            if len(piece) < e - s:
                out[j] = Miss("past_end", f"{path} ends at {start + len(blob)}, before the record's end {e}")
            else:
                out[j] = piece
    return out


def _read_ranged(path: str, rows: list[int], wanted: Sequence[Wanted], pages: list[Page], stats: ReadStats,
                 max_gap: int) -> None:
    spans = [(wanted[i].offset, wanted[i].offset + wanted[i].length) for i in rows]
    got = fetch_spans(path, spans, stats, max_gap)
    stats.files -= 1  # read_records counts the file once, whatever reads it
    for j, piece in enumerate(got):
        if isinstance(piece, Miss):
            if piece.reason == "missing_file":
                raise FileNotFoundError(piece.detail)
            pages[rows[j]] = Page(reason="missing_record", detail=piece.detail)
        else:
            pages[rows[j]] = parse_response(piece, wanted[rows[j]].record_id)


def _read_scanned(path: str, rows: list[int], wanted: Sequence[Wanted], pages: list[Page], stats: ReadStats,
                  max_scan_bytes: int) -> None:
    """Records without a length: per offset, one forward pass until every id wanted there came
    by (without an id: the first record at the offset)."""
    at: dict[int, list[int]] = defaultdict(list)
    for i in rows:
        at[wanted[i].offset].append(i)
    for offset, here in sorted(at.items()):
        by_id = {wanted[i].record_id: i for i in here if wanted[i].record_id}
        first = [i for i in here if not wanted[i].record_id]
        raw = CountingRaw(open_raw(path))
        stats.reads += 1
        try:
            with raw:
                raw.seek(offset)
                stream = io.BufferedReader(raw, 64 << 10)
                for rec in ArchiveIterator(stream, parse_http=False, quirks_mode=True):
                    if first:
                        for i in first:
                            pages[i] = _page(rec, None)
                        first = []
                    else:
                        i = by_id.pop(rec.record_id, None)
                        if i is not None:
                            pages[i] = _page(rec, None)
                    if (not by_id and not first) or raw.bytes_read > max_scan_bytes:
                        break
        except FileNotFoundError:
            raise
        except Exception as e:  # bytes that are no WARC record
            for i in list(by_id.values()) + first:
                pages[i] = Page(reason="corrupt_record", detail=f"{type(e).__name__}: {e}"[:300])
            by_id, first = {}, []
        finally:
            stats.bytes_read += raw.bytes_read
            stats.ranges.append((path, offset, offset + raw.bytes_read))
        for i in list(by_id.values()) + first:
            pages[i] = Page(reason="missing_record", detail=f"not found within {raw.bytes_read} bytes after {offset}")
