"""Reading a crawl through its columnar index (``format: cc_index``): select records by SQL over
the index, then read only their byte ranges of the WARCs.

```yaml
inputs:
  swedish:
    format: cc_index
    paths: ["s3://commoncrawl/cc-index/table/cc-main/warc/crawl=CC-MAIN-2024-51/subset=warc/*.parquet"]
    where: "content_languages LIKE 'swe%' AND fetch_status = 200"
    warc_root: "s3://commoncrawl/"
    source: web
```

The index is Common Crawl's columnar index (one Parquet row per capture: ``url``,
``url_host_registered_domain``, ``content_languages``, ``content_mime_detected``,
``fetch_status``, ``warc_filename``, ``warc_record_offset``, ``warc_record_length``, ...), or one
``refinery index cc`` built from any WARCs in the same schema (``curation/io/warc_index.py``).

- **Selection** (the driver, at planning; ``curation/io/cc_select.py``): ``where`` is the
  ``select`` stage's sandboxed expression (columns only), its column names checked against the
  index's before anything is read, pushed into the Parquet scan (row groups skipped by their
  statistics); the records come out sorted by WARC file and offset, one per (file, offset),
  streamed into selection files below the run (``curation/io/cc_selection.py``).
- **Reading** (a task): a shard is a run of WARC files' selected records of about
  ``split_bytes`` to read (``curation.io.inputs.plan_index``), rows of the selection files
  that the task reads itself (the row groups holding them); each file's ranges are fetched
  as ``io/records.fetch_spans`` joins them (ranges less than ``max_gap`` apart as one read,
  concurrent requests on object storage), a window of ``WINDOW_BYTES`` at a time. Each range
  must be a gzip member holding a response record of the URL the index names, and is then the
  document a WARC input gives for it (``io/warc``'s record handling: the same id, url, meta,
  html, charset and origin columns, the same ``http_status``/``non_html``/... rejections),
  plus the index's ``content_languages`` and ``content_mime_detected``.
- **What cannot be had is a counted rejection** (``rejected/INPUT/``, reason ``read:...``,
  never a crash): ``missing_file``, ``past_end`` (the file ends before the index's range),
  ``corrupt_record`` (no gzip member, or no WARC record, at the offset), ``not_response``
  (another record type there), ``url_mismatch`` (a response for another URL),
  ``bad_warc_filename`` (an absolute path, a URL or ``..`` in ``warc_filename``).
"""

from __future__ import annotations

import io
import zlib
from collections.abc import Iterator

from fastwarc.warc import ArchiveIterator, WarcRecordType

from curation.io.cc_select import DOC_COLUMNS, DOC_FIELDS, warc_path  # noqa: F401 (DOC_FIELDS: the reader's columns)
from curation.io.cc_selection import read_slice
from curation.io.inputs import InputShard, InputSpec
from curation.io.ranges import GZIP_MAGIC, fast_inflate
from curation.io.read_result import ReadResult
from curation.io.records import Miss, ReadStats, fetch_spans
from curation.io.warc import WalkState, add_record

try:
    from isal import isal_zlib
except ImportError:  # pragma: no cover
    isal_zlib = None

#: compressed record bytes fetched (and held) at a time by a task
WINDOW_BYTES = 32 << 20


# ---------------------------------------------------------------------------------------------
# reading (a task)


def _inflate(data: bytes) -> tuple[bytes, int]:
    """A gzip member's bytes and its compressed length; zlib.error if it is none."""
    d = isal_zlib.decompressobj(31) if (isal_zlib is not None and fast_inflate()) else zlib.decompressobj(31)
    try:
        raw = d.decompress(data)
    except Exception as e:  # isal's error class is its own
        raise zlib.error(str(e)) from None
    if not d.eof:
        raise zlib.error(f"the gzip member does not end within the index's {len(data)} bytes")
    return raw, len(data) - len(d.unused_data)


def _target(rec) -> str | None:
    url = rec.headers.get("WARC-Target-URI")
    if url and url.startswith("<") and url.endswith(">"):
        url = url[1:-1]
    return url


def add_indexed(res: ReadResult, spec: InputSpec, data: bytes, offset: int, url: str | None, st: WalkState) -> None:
    """One index row's bytes: the WARC input's document for its record (or its rejection), or a
    rejection saying why the range holds no such record."""
    if data[:3] != GZIP_MAGIC:
        res.reject(offset, "corrupt_record", offset, f"no gzip member at offset {offset}")
        return
    try:
        raw, member = _inflate(data)
    except zlib.error as e:
        res.reject(offset, "corrupt_record", offset, f"gzip member at {offset}: {e}")
        return
    res.bytes_decompressed += len(raw)
    try:
        rec = next(iter(ArchiveIterator(io.BytesIO(raw), parse_http=False, quirks_mode=True)), None)
    except Exception as e:  # FastWARC on bytes that are no WARC record
        rec, err = None, f"{type(e).__name__}: {e}"
    else:
        err = "no WARC record in the gzip member"
    if rec is None:
        res.reject(offset, "corrupt_record", offset, err)
        return
    if rec.record_type != WarcRecordType.response:
        res.reject(offset, "not_response", offset, f"a {rec.headers.get('WARC-Type')} record at offset {offset}")
        return
    target = _target(rec)
    if url is not None and target != url:
        res.reject(offset, "url_mismatch", offset, f"the response at {offset} is for {target!r}, the index says {url!r}")
        return
    rec.parse_http()
    first = res.num_docs
    add_record(res, spec, rec, False, offset, offset, st)
    if res.num_docs > first:
        res.set_length(first, member)  # the member's length, as the WARC reader records it


def iter_cc_index(shard: InputShard, spec: InputSpec, res: ReadResult) -> Iterator[None]:
    """Read the records this shard selected (``shard.selection``: its rows of the selection
    files) into ``res``, yielding after each (a point where the caller may take a batch).
    Never raises on bad data."""
    from curation.io.records import DEFAULT_MAX_GAP

    if shard.selection is None:
        raise ValueError(f"inputs.{shard.input}: {shard.key} was planned without its selection's rows (a plan's)")
    sel, root = read_slice(shard.selection), shard.selection.warc_root
    files = sel["warc_filename"].to_pylist()
    offsets = sel["warc_record_offset"].to_pylist()
    lengths = sel["warc_record_length"].to_pylist()
    urls = sel["url"].to_pylist()
    extra = {c: sel[c].to_pylist() for c in DOC_COLUMNS}
    stats = ReadStats()
    st = WalkState()
    max_gap = spec.max_gap if spec.max_gap is not None else DEFAULT_MAX_GAP
    i, n = 0, sel.num_rows
    while i < n:
        j = i
        while j < n and files[j] == files[i]:
            j += 1
        name = files[i]
        path = warc_path(root, name)
        res.at_file(path or name, name)
        # windows of at most WINDOW_BYTES of records: what a task holds at once
        lo = i
        while lo < j:
            hi, held = lo, 0
            while hi < j and (hi == lo or held + max(lengths[hi], 0) <= WINDOW_BYTES):
                held += max(lengths[hi], 0)
                hi += 1
            if path is None:
                got: list = [Miss("bad_warc_filename", f"{name!r}: not a path below warc_root")] * (hi - lo)
            else:
                valid = [k for k in range(lo, hi) if offsets[k] >= 0 and lengths[k] > 0]
                fetched = fetch_spans(path, [(offsets[k], offsets[k] + lengths[k]) for k in valid], stats, max_gap)
                got = [Miss("corrupt_record", f"offset {offsets[k]}, length {lengths[k]}: not a byte range")
                       for k in range(lo, hi)]
                for k, piece in zip(valid, fetched):
                    got[k - lo] = piece
                res.bytes_read = stats.bytes_read
            for k in range(lo, hi):
                res.record_columns = {c: extra[c][k] for c in DOC_COLUMNS}
                piece = got[k - lo]
                if isinstance(piece, Miss):
                    detail = piece.detail or (f"{path}: no such file" if piece.reason == "missing_file" else "")
                    res.reject(offsets[k], piece.reason, offsets[k], detail)
                else:
                    add_indexed(res, spec, piece, offsets[k], urls[k], st)
                yield
            lo = hi
        i = j
    res.bytes_read = stats.bytes_read
