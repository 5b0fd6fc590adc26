"""The stage manifest, ``RUN/STAGE/_manifest.jsonl``: one JSON line per committed shard.

A line names the shard key, the stage, the params hash it was made with, its file (relative to
the run directory), row counts and sha256. A shard is committed once its line exists; a later
line for the same key replaces the earlier one. This module only parses the format;
``curation.pipeline.rundir.RunDir`` owns reading and writing it. The trainer reads packed stages through
``committed`` too, which is why this lives in ``formats`` (no Ray, no pipeline imports).
"""

from __future__ import annotations

import json
from typing import Iterable

MANIFEST = "_manifest.jsonl"


class ManifestError(ValueError):
    """A manifest line that is not a torn last line yet cannot be parsed."""


def parse_lines(lines: Iterable[str], where: str = MANIFEST, strict: bool = False) -> dict[str, dict]:
    """``{shard key: entry}``, last line wins. A line torn by a kill mid-append is skipped
    (that shard is simply redone); with ``strict``, any bad line raises ``ManifestError``."""
    entries: dict[str, dict] = {}
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            e = json.loads(line)
            entries[e["shard"]] = e
        except (ValueError, KeyError, TypeError) as err:
            if strict:
                raise ManifestError(f"{where}:{n}: bad manifest line ({err})") from None
    return entries


#: On object storage, which has no append, each batch of appended lines is its own object
#: ``_manifest.jsonl.d/SEQ`` (SEQ sorts in commit order); the log is ``_manifest.jsonl`` followed by
#: them. Compaction folds them back into the one file.
SEGMENTS = ".d"


def log_lines(fs, path: str) -> list[str]:
    """The lines of the append-only log ``path`` in the fsspec filesystem ``fs``: the file, then
    its segments in order (empty when neither exists)."""
    try:
        parts = [fs.cat_file(path)]
    except FileNotFoundError:
        parts = []
    segs = sorted(fs.find(path + SEGMENTS))  # one listing; empty when there are none
    if segs:
        got = fs.cat(segs) if len(segs) > 1 else {segs[0]: fs.cat_file(segs[0])}
        parts += [got[s] for s in segs]
    return [ln for b in parts for ln in b.decode("utf-8").splitlines()]


def entry_files(entry: dict) -> list[str]:
    """The files an entry commits (paths relative to the run directory)."""
    return [f for f in (entry.get("file"), entry.get("rejected_file")) if f]
