"""``reextract``: extract again, with another engine or format, only the documents kept so far,
re-reading their WARC records by byte range (``origin_file``/``origin_offset``/``origin_length``,
which every reader writes) instead of the whole crawl.

```yaml
# after quality_top (or a select) kept 10%: the survivors' records again, as Markdown by trafilatura
inputs:
  kept: {format: run, run: runs/first-pass, stage: top}
stages:
  again: {type: reextract, input: kept, engine: trafilatura, format: markdown}
```

or as a stage of the same DAG below the filters. The parameters are ``extract``'s (``engine``
or ``engines`` + ``policy``, ``format``, ``timeout_s``, ``min_chars``); ``text`` is replaced,
every other column is kept (signal columns upstream measured the first pass's text). Reads are
grouped by file, sorted by offset, ranges less than ``max_gap`` apart fetched as one read, a
window of rows at a time (at most ``window_bytes`` of compressed records held). A record that
cannot be had is a counted rejection (``reextract:missing_file``, ``missing_record``,
``corrupt_record``, ``record_mismatch`` (the WARC-Record-ID at the offset is not the
document's), ``not_response``, ``truncated_record``, ``no_origin``) and keeps its first text
in the rejected row; extraction's own reasons are ``extract``'s (``reextract:no_text``...).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from typing import ClassVar, Literal

import pyarrow as pa
from pydantic import Field

from curation.formats.documents import ORIGIN_COLUMNS
from curation.io.records import DEFAULT_MAX_GAP, DEFAULT_MAX_SCAN_BYTES, Wanted, read_records
from curation.io.shards import blocks
from curation.stages.base import MapStage, StageResult, registry
from curation.stages.paths import PathStr
from curation.extract.pages import ExtractOptions

log = logging.getLogger(__name__)


@registry.register("reextract")
class Reextract(MapStage, ExtractOptions):
    """Re-read each document's WARC record by byte range and extract it again into ``text``.
    Extraction parameters: ``ExtractOptions``, as ``extract``'s."""

    type: Literal["reextract"] = "reextract"
    #: a path: the service keeps it inside its roots, as every path parameter
    block_model: PathStr | None = None
    #: ranges of one file closer than this are fetched as one read
    max_gap: int = Field(default=DEFAULT_MAX_GAP, ge=0)
    #: compressed record bytes read (and pages held) at a time
    window_bytes: int = Field(default=32 << 20, gt=0)
    #: how far past its offset a record without a length is looked for
    max_scan_bytes: int = Field(default=DEFAULT_MAX_SCAN_BYTES, gt=0)

    rewrites_text: ClassVar[bool] = True

    def params(self) -> dict:
        # how the reads are cut (gaps, windows) does not change a document's text
        p = super().params()
        for k in ("max_gap", "window_bytes"):
            p.pop(k, None)
        return p

    def process(self, batch: pa.Table) -> StageResult:
        missing = [c for c in ORIGIN_COLUMNS if c not in batch.column_names]
        if missing:
            raise ValueError(f"reextract: input has no {', '.join(missing)} column(s): its rows must come from a "
                             "reader of this version (a WARC input, or a run made from one)")
        n = batch.num_rows
        files = batch.column("origin_file").to_pylist()
        offsets = batch.column("origin_offset").to_pylist()
        lengths = batch.column("origin_length").to_pylist()
        metas = batch.column("meta").to_pylist() if "meta" in batch.column_names else [None] * n
        old = batch.column("text").to_pylist() if "text" in batch.column_names else [None] * n
        texts: list[str | None] = []
        reasons: list[str | None] = []
        seen: Counter = Counter()
        bytes_read = reads = 0
        # windows of rows holding at most window_bytes of records: the blocks global stages cut shards into
        for lo, hi in blocks([length or 0 for length in lengths], self.window_bytes, 1):
            wanted = [Wanted(files[i], offsets[i], lengths[i], _record_id(metas[i])) for i in range(lo, hi)]
            pages, stats = read_records(wanted, self.max_gap, self.max_scan_bytes)
            bytes_read, reads = bytes_read + stats.bytes_read, reads + stats.reads
            got = [i for i, p in enumerate(pages) if p.html is not None]
            new, why = self.extract([pages[i].html for i in got], [pages[i].charset for i in got], "reextract")
            by_row = dict(zip(got, zip(new, why)))
            for k, page in enumerate(pages):
                if k in by_row:
                    text, reason = by_row[k]
                else:  # not re-read: the row keeps its first text, rejected with why
                    text, reason = old[lo + k], f"reextract:{page.reason}"
                    seen[reason] += 1
                    if seen[reason] == 1:
                        log.warning("%s (%s %s): %s", reason, files[lo + k], offsets[lo + k], page.detail)
                texts.append(text)
                reasons.append(reason)
        log.info("reextract: %d documents, %d bytes in %d reads; not re-read: %s", n, bytes_read, reads,
                 dict(seen) or "none")
        field = self.text_field()
        arr = pa.array(texts, pa.string())
        if "text" in batch.column_names:
            out = batch.set_column(batch.schema.get_field_index("text"), field, arr)
        else:
            out = batch.append_column(field, arr)
        return StageResult(out, pa.array(reasons, pa.string()))


def _record_id(meta: str | None) -> str | None:
    """The WARC-Record-ID the reader kept in ``meta`` (checked against the record re-read)."""
    if not meta or "warc_record_id" not in meta:
        return None
    try:
        rid = json.loads(meta).get("warc_record_id")
    except (ValueError, AttributeError):
        return None
    return rid if isinstance(rid, str) else None
