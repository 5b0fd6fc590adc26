"""The trainer's small files written whole or not at all (meta.json, the ``latest`` pointer,
trimmed metrics and trace logs): a temporary sibling, fsync, rename. Checkpoint directories are
renamed into place by ``training.checkpoint`` itself (a directory, not a file)."""

from __future__ import annotations

import json
import os
from pathlib import Path


def write_text_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``: readers see the old content or the new, never a part."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def truncate_jsonl(path: Path, before_step: int) -> None:
    """Keep only the records of steps before ``before_step`` (records without a step stay;
    a torn last line from a killed run goes)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text().splitlines():
        try:
            if json.loads(line).get("step", -1) < before_step:
                kept.append(line)
        except (ValueError, AttributeError):
            continue
    write_text_atomic(path, "".join(k + "\n" for k in kept))
