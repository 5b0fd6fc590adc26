"""A columnar index of WARC files in Common Crawl's schema, built from the WARCs themselves
(``refinery index cc``), so a ``cc_index`` input selects records of any crawl the way it does
Common Crawl's (``curation/io/cc_index.py``).

One row per response record that owns its gzip member (Common Crawl's layout; a record sharing
a member, or a WARC that is not gzip per record, has no byte range of its own and is counted,
not indexed), with the columns of Common Crawl's ``cc-index-table`` flat schema
(``INDEX_SCHEMA``): where the record is (``warc_filename`` relative to the WARC root,
``warc_record_offset``, ``warc_record_length``: its member's compressed bytes), the URL and its
parts (host, registered and private domains from the public suffix list bundled with ``tld``,
path, query; ``url_surtkey`` a SURT-like key: reversed host without ``www``, then the path,
lower-cased), the fetch (``fetch_time`` from WARC-Date, ``fetch_status``, ``fetch_redirect``),
the content (``content_digest``, ``content_mime_type`` from the HTTP header,
``content_mime_detected`` from WARC-Identified-Payload-Type, ``content_charset``,
``content_truncated``) and a cheap language guess, ``content_languages``: CLD2 on the HTML
bytes (tags skipped by CLD2 itself, no extraction), up to three ISO-639-3 codes, the primary
first, as Common Crawl computes it (its codes; a page CLD2 cannot place has none).

Each WARC's rows go to their own Parquet file (``INDEX/<warc path, '/' -> '__'>.parquet``),
sorted by ``url_surtkey`` (row groups then cover host ranges, so a selection by host or domain
skips most of them), written whole or not at all: a rerun skips the WARCs already indexed.
``INDEX/_index.json`` lists the WARC root, the files and what each held.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import re
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import datetime
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from fastwarc.warc import ArchiveIterator, WarcRecordType

from curation.io import location
from curation.io.files import atomic_path, write_json
from curation.io.ranges import GZIP_MAGIC, Member, Source, first_member
from curation.io.warc import HTML_TYPES, http_body
from curation.formats.lang_codes import iso639_3

#: Common Crawl's cc-index-table flat schema (``crawl`` and ``subset`` are columns here, where
#: Common Crawl has them as hive partitions ``crawl=.../subset=...``)
INDEX_SCHEMA = pa.schema([
    ("url_surtkey", pa.string()), ("url", pa.string()), ("url_host_name", pa.string()),
    ("url_host_tld", pa.string()), ("url_host_2nd_last_part", pa.string()),
    ("url_host_3rd_last_part", pa.string()), ("url_host_4th_last_part", pa.string()),
    ("url_host_5th_last_part", pa.string()), ("url_host_registry_suffix", pa.string()),
    ("url_host_registered_domain", pa.string()), ("url_host_private_suffix", pa.string()),
    ("url_host_private_domain", pa.string()), ("url_host_name_reversed", pa.string()),
    ("url_protocol", pa.string()), ("url_port", pa.int32()), ("url_path", pa.string()), ("url_query", pa.string()),
    ("fetch_time", pa.timestamp("ms", tz="UTC")), ("fetch_status", pa.int16()), ("fetch_redirect", pa.string()),
    ("content_digest", pa.string()), ("content_mime_type", pa.string()), ("content_mime_detected", pa.string()),
    ("content_charset", pa.string()), ("content_languages", pa.string()), ("content_truncated", pa.string()),
    ("warc_filename", pa.string()), ("warc_record_offset", pa.int64()), ("warc_record_length", pa.int64()),
    ("warc_segment", pa.string()), ("crawl", pa.string()), ("subset", pa.string()),
])

#: rows per row group: small enough that a selection by host range skips most of a file
ROW_GROUP_ROWS = 20_000
MANIFEST = "_index.json"

_SEGMENT = re.compile(r"/segments/([^/]+)/")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


# ---------------------------------------------------------------------------------------------
# one record's columns


#: CLD2's codes that are not ISO 639-1, or that Common Crawl writes otherwise
_CLD2_ISO3 = {"iw": "heb", "in": "ind", "ji": "yid", "jw": "jav", "mo": "ron", "zh": "zho", "no": "nor",
              "sh": "hbs", "tl": "tgl"}


@functools.lru_cache(maxsize=512)
def _iso3(code: str) -> str | None:
    """A CLD2 code (ISO 639-1 where there is one, else its own 3 letters) as ISO 639-3."""
    base = code.split("-")[0].lower()
    return _CLD2_ISO3.get(base) or iso639_3(base) or (base if len(base) == 3 else None)


def languages(html: bytes, charset: str | None = None) -> str | None:
    """CLD2 on a page's HTML (its markup skipped by CLD2): up to three ISO-639-3 codes, the
    primary first (``"fra,eng"``), None when CLD2 places nothing. UTF-8 bytes go to CLD2 as
    they are; a page in another charset, or one CLD2 refuses (invalid UTF-8, C0/C1 control
    characters), is decoded and cleaned first."""
    import pycld2

    details = None
    if not charset or charset.lower().replace("-", "").replace("_", "") in ("utf8", "usascii", "ascii"):
        try:
            _, _, details = pycld2.detect(html, isPlainText=False)
        except pycld2.error:
            details = None
    if details is None:
        text = None
        if charset:
            try:
                text = html.decode(charset, errors="replace")
            except LookupError:
                text = None
        if text is None:
            text = html.decode("utf-8", errors="replace")
        try:
            _, _, details = pycld2.detect(_CONTROL.sub(" ", text), isPlainText=False)
        except pycld2.error:
            return None
    codes = []
    for _name, code, percent, _score in details:
        if percent <= 0 or code in ("un", "xx") or code.startswith("xx-"):
            continue
        c = _iso3(code)
        if c and c not in codes:
            codes.append(c)
    return ",".join(codes) or None


@functools.lru_cache(maxsize=1 << 16)
def url_columns(url: str) -> dict:
    """The URL columns of Common Crawl's index for one URL."""
    from tld import get_tld

    try:
        u = urlsplit(url)
        port = u.port
    except ValueError:
        u, port = urlsplit(""), None
    host = (u.hostname or "").lower().rstrip(".")
    labels = host.split(".") if host else []
    is_ip = bool(host) and (host.replace(".", "").isdigit() or ":" in host)
    icann = None if is_ip or not host else get_tld("http://" + host, as_object=True, fail_silently=True,
                                                     search_private=False)
    private = None if is_ip or not host else get_tld("http://" + host, as_object=True, fail_silently=True,
                                                       search_private=True)
    bare = host[4:] if host.startswith("www.") else host
    path = u.path or "/"
    part = lambda k: labels[-k] if len(labels) >= k and not is_ip else None  # noqa: E731
    return {
        "url_surtkey": (",".join(reversed(bare.split("."))) + ")" + path + ("?" + u.query if u.query else "")).lower(),
        "url_host_name": host or None,
        "url_host_tld": part(1), "url_host_2nd_last_part": part(2), "url_host_3rd_last_part": part(3),
        "url_host_4th_last_part": part(4), "url_host_5th_last_part": part(5),
        "url_host_registry_suffix": icann.tld if icann else None,
        "url_host_registered_domain": icann.fld if icann else None,
        "url_host_private_suffix": private.tld if private else None,
        "url_host_private_domain": private.fld if private else None,
        "url_host_name_reversed": ".".join(reversed(labels)) if labels and not is_ip else None,
        "url_protocol": u.scheme or None, "url_port": port, "url_path": path, "url_query": u.query or None,
    }


def _fetch_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def record_row(rec, filename: str, offset: int, length: int, crawl: str | None, langid: bool = True,
               clock: list[float] | None = None) -> dict:
    """One response record's index row (``rec`` read with ``parse_http=False``); the CPU
    seconds of the language guess are added to ``clock[0]``."""
    url = rec.headers.get("WARC-Target-URI") or ""
    if url.startswith("<") and url.endswith(">"):
        url = url[1:-1]
    rec.parse_http()
    http = rec.http_headers
    ctype = (rec.http_content_type or "").lower() or None
    body = rec.reader.read() if http is not None else b""
    lang = None
    if langid and http is not None and ctype and ctype.startswith(HTML_TYPES):
        t0 = time.process_time()
        lang = languages(http_body(rec, body), rec.http_charset)
        if clock is not None:
            clock[0] += time.process_time() - t0
    digest = rec.headers.get("WARC-Payload-Digest")
    seg = _SEGMENT.search("/" + filename)
    return {
        **url_columns(url), "url": url,
        "fetch_time": _fetch_time(rec.headers.get("WARC-Date")),
        "fetch_status": http.status_code if http is not None else None,
        "fetch_redirect": http.get("Location") if http is not None else None,
        "content_digest": digest.split(":", 1)[-1] if digest else None,
        "content_mime_type": ctype, "content_mime_detected": rec.headers.get("WARC-Identified-Payload-Type"),
        "content_charset": rec.http_charset, "content_languages": lang,
        "content_truncated": rec.headers.get("WARC-Truncated"),
        "warc_filename": filename, "warc_record_offset": offset, "warc_record_length": length,
        "warc_segment": seg.group(1) if seg else None, "crawl": crawl, "subset": "warc",
    }


# ---------------------------------------------------------------------------------------------
# one WARC


@dataclass
class WarcReport:
    """What indexing one WARC found and cost."""

    warc: str
    filename: str
    index_file: str
    rows: int = 0
    records: int = 0  # WARC records seen, every type
    skipped: dict = field(default_factory=dict)  # why records were not indexed -> count
    bytes: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    langid_seconds: float = 0.0
    done_before: bool = False


def index_rows(path: str, filename: str, crawl: str | None = None, langid: bool = True,
               report: WarcReport | None = None) -> list[dict]:
    """The index rows of one WARC (local path or URL), in file order."""
    rep = report or WarcReport(path, filename, "")
    rows: list[dict] = []
    skipped: Counter = Counter()
    clock = [0.0]
    with Source(path) as src:
        if src.read_at(0, 3) != GZIP_MAGIC:
            skipped["not_gzip_per_record"] += 1
            rep.skipped = dict(skipped)
            return rows
        pos = 0
        while pos >= 0:
            if src.read_at(pos, 3) != GZIP_MAGIC:
                if not src.read_at(pos, 1):
                    break
                skipped["corrupt_stream"] += 1
                pos = first_member(src, pos + 1, 1 << 62)
                continue
            m = Member(src, pos)
            recs = []
            try:
                for rec in ArchiveIterator(m, parse_http=False, quirks_mode=True):
                    recs.append((rec.stream_pos, rec.record_type))
                    if len(recs) == 1 and rec.record_type == WarcRecordType.response:
                        # its body is read now, before the iterator moves on; the length once
                        # the member has ended
                        rows.append(record_row(rec, filename, pos, -1, crawl, langid, clock))
            except Exception:  # FastWARC on bytes that are no WARC record
                skipped["corrupt_record"] += 1
                recs = recs or [(-1, None)]
            m.drain()
            rep.records += len(recs)
            if m.error is not None:
                skipped["corrupt_stream"] += 1
                if rows and rows[-1]["warc_record_offset"] == pos:
                    rows.pop()
                nxt = first_member(src, pos + 1, 1 << 62)
                pos = nxt
                continue
            if rows and rows[-1]["warc_record_offset"] == pos:
                if len(recs) == 1 and recs[0][0] == 0:
                    rows[-1]["warc_record_length"] = m.end - pos
                else:  # several records in one member: no byte range of its own
                    rows.pop()
                    skipped["shares_member"] += 1
            elif recs and recs[0][1] != WarcRecordType.response:
                skipped[_type_name(recs[0][1])] += 1
            pos = m.end
        rep.bytes = src.bytes_read
    rep.skipped = dict(skipped)
    rep.langid_seconds = clock[0]
    return rows


def _type_name(t) -> str:
    return str(t).rsplit(".", 1)[-1] if t is not None else "unknown"


def index_file_name(filename: str) -> str:
    """The index file of a WARC: its path below the root, '/' -> '__', ``.parquet``."""
    base = filename.replace("/", "__")
    for ext in (".warc.gz", ".gz", ".warc"):
        if base.endswith(ext):
            base = base[: -len(ext)]
            break
    return base + ".parquet"


def index_warc(path: str, filename: str, out_dir: str, crawl: str | None = None, langid: bool = True,
               overwrite: bool = False) -> WarcReport:
    """Index one WARC into ``out_dir`` (skipped when its index file is there, unless
    ``overwrite``): rows sorted by ``url_surtkey``, row groups of ``ROW_GROUP_ROWS``."""
    out = location.join(out_dir, index_file_name(filename))
    rep = WarcReport(path, filename, out)
    if not overwrite and location.exists(out):
        rep.done_before = True
        rep.rows = location.parquet_file(out).metadata.num_rows
        return rep
    t0, c0 = time.perf_counter(), time.process_time()
    rows = index_rows(path, filename, crawl, langid, rep)
    table = pa.Table.from_pylist(rows, schema=INDEX_SCHEMA) if rows else INDEX_SCHEMA.empty_table()
    table = table.sort_by([("url_surtkey", "ascending"), ("warc_record_offset", "ascending")])
    with atomic_path(out) as tmp:
        pq.write_table(table, tmp, row_group_size=ROW_GROUP_ROWS, compression="zstd")
    rep.rows = table.num_rows
    rep.seconds, rep.cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    return rep


def _index_one(args: tuple) -> dict:
    return asdict(index_warc(*args))


def warc_root_of(warcs: list[str]) -> str:
    """The folder the WARCs are below (their common parent)."""
    parents = [posixpath.dirname(w) for w in warcs]
    if len(parents) == 1:
        return parents[0]
    if all("://" in w for w in warcs):
        proto = warcs[0].split("://", 1)[0] + "://"
        return proto + posixpath.commonpath([p.split("://", 1)[1] for p in parents])
    return posixpath.commonpath(parents)


def build_index(warcs: list[str], out_dir: str, root: str | None = None, crawl: str | None = None,
                workers: int = 1, langid: bool = True, overwrite: bool = False, progress=None) -> dict:
    """Index ``warcs`` (local paths or URLs) into ``out_dir``, ``workers`` processes at once;
    ``warc_filename`` is each WARC's path below ``root`` (default: their common folder).
    Writes and returns the summary (``_index.json``)."""
    if not warcs:
        raise ValueError("no WARC to index")
    warcs = sorted(w if "://" in w else os.path.abspath(w) for w in warcs)
    given = (root or warc_root_of(warcs)).rstrip("/")  # recorded as given: a relative root stays relative
    root = given if "://" in given else os.path.abspath(given)
    jobs = []
    for w in warcs:
        if not w.startswith(root + "/"):
            raise ValueError(f"{w} is not below the WARC root {root}")
        jobs.append((w, w[len(root) + 1:], out_dir, crawl, langid, overwrite))
    t0 = time.perf_counter()
    reports: list[dict] = []
    if workers <= 1 or len(jobs) == 1:
        for j in jobs:
            reports.append(_index_one(j))
            if progress:
                progress(reports[-1])
    else:
        with ProcessPoolExecutor(workers) as pool:
            for r in pool.map(_index_one, jobs):
                reports.append(r)
                if progress:
                    progress(r)
    skipped: Counter = Counter()
    for r in reports:
        skipped.update(r["skipped"])
    summary = {
        "schema": "cc-index-table flat (refinery index cc)", "warc_root": given, "crawl": crawl,
        "langid": "cld2 on the HTML bytes" if langid else None,
        "warcs": len(reports), "rows": sum(r["rows"] for r in reports),
        "records": sum(r["records"] for r in reports), "skipped": dict(skipped),
        "warc_bytes": sum(r["bytes"] for r in reports), "seconds": time.perf_counter() - t0,
        "cpu_seconds": sum(r["cpu_seconds"] for r in reports),
        "langid_cpu_seconds": sum(r["langid_seconds"] for r in reports),
        "files": [{**{k: r[k] for k in ("filename", "rows", "records", "skipped", "bytes", "seconds", "cpu_seconds",
                                        "done_before")}, "index_file": location.name(r["index_file"])}
                  for r in reports],
    }
    write_json(location.join(out_dir, MANIFEST), summary)
    return summary
