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


def segment_keys(fs, path: str) -> list[str]:
    """The appended segments of the log ``path``, in commit order. Only objects: when the
    listing is empty, s3fs asks whether the prefix itself exists, and a segment written in
    between makes it answer with the folder ``path.d``, which is no segment."""
    found = fs.find(path + SEGMENTS, detail=True)
    return sorted(k for k, info in found.items() if info.get("type") != "directory")


def log_lines(fs, path: str, attempts: int = 5) -> list[str]:
    """The lines of the append-only log ``path`` in the fsspec filesystem ``fs``: the file, then
    its segments in order (empty when neither exists).

    The segments are listed before the file is read, so a compaction in between has already
    folded them into the file. A listed segment gone when read means a compaction ran after
    the file was read: read again, rather than return a log missing those lines. A reader may
    see a line twice (the file and a segment not yet removed); last-line-wins logs allow it."""
    for _ in range(attempts):
        segs = segment_keys(fs, path)
        try:
            parts = [fs.cat_file(path)]
        except FileNotFoundError:
            parts = []
        got = fs.cat(segs, on_error="return") if segs else {}
        if all(isinstance(got.get(s), bytes) for s in segs):
            parts += [got[s] for s in segs]
            return [ln for b in parts for ln in b.decode("utf-8").splitlines()]
    raise FileNotFoundError(f"{path}: its segments were removed while being read, {attempts} times in a row "
                            "(compactions faster than one read)")


def entry_files(entry: dict) -> list[str]:
    """The files an entry commits (paths relative to the run directory)."""
    return [f for f in (entry.get("file"), entry.get("rejected_file")) if f]


# The run directory's own entries (RUN/dag.yaml, RUN/progress.json, RUN/rejected/): here, below
# the pipeline, so that the DAG's node-name check and RunDir read the same names.
DAG_FILE = "dag.yaml"
PROGRESS_FILE = "progress.json"
REJECTED = "rejected"
#: names of a run directory's own entries: no node may be called so
RESERVED_NAMES = frozenset({DAG_FILE, PROGRESS_FILE, REJECTED})
