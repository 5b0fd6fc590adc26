"""The trainer's small files written whole or not at all (meta.json, the ``latest`` pointer,
summary.json, profile tables, trimmed metrics and trace logs; the GPU bench's results): a
temporary sibling, fsync, rename. ``metrics.jsonl`` itself is an append log (one whole line per
write, flushed); a line torn by a kill is dropped by ``truncate_jsonl`` when a run resumes. Checkpoint directories are
renamed into place by ``training.checkpoint`` itself (a directory, not a file)."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary sibling to write ``path`` through (for writers that take a file name, such as
    the profiler's trace export), renamed into place when the block ends without an error.

    The sibling is unique (same directory, so the rename stays on one file system and is
    atomic; unique, so two writers never share it). A write that fails midway removes it and
    leaves ``path`` as it was; a process killed midway leaves ``path`` as it was and a hidden
    ``.NAME.*.tmp`` beside it."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would make results unreadable to others
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text``: readers see the old content or the new, never a part."""
    with atomic_path(path) as tmp:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_TRUNC), "w") as f:
            f.write(text)


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
