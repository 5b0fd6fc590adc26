"""The stage manifest, ``RUN/STAGE/_manifest.jsonl``: one JSON line per committed shard.

A line names the shard key, the stage, the params hash it was made with, its file (relative to
the run directory), row counts and sha256. A shard is committed once its line exists; a later
line for the same key replaces the earlier one. This module only reads and parses the format;
``curation.pipeline.rundir.RunDir`` owns writing it. The trainer reads packed stages through
``committed`` too, which is why this lives in ``formats`` (no Ray, no pipeline imports).
"""

from __future__ import annotations

import json
from pathlib import Path
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


def read(stage_dir: str | Path, strict: bool = False) -> dict[str, dict]:
    """Entries of the manifest in ``stage_dir`` (empty when there is none)."""
    path = Path(stage_dir) / MANIFEST
    if not path.exists():
        return {}
    with open(path) as f:
        return parse_lines(f, str(path), strict)


def entry_files(entry: dict) -> list[str]:
    """The files an entry commits (paths relative to the run directory)."""
    return [f for f in (entry.get("file"), entry.get("rejected_file")) if f]


def committed(stage_dir: str | Path, params_hash: str | None = None, strict: bool = False) -> dict[str, dict]:
    """Entries made with ``params_hash`` (any, when None) whose files exist. File paths are
    relative to the run directory, the stage directory's parent."""
    base = Path(stage_dir).parent
    return {k: e for k, e in read(stage_dir, strict).items()
            if (params_hash is None or e.get("params_hash") == params_hash)
            and all((base / f).exists() for f in entry_files(e))}
