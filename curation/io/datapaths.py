"""``${REFINERY_DATA}`` in input paths: the folder of real sample data (Common Crawl WARCs,
web-text JSONL, eval texts) that example DAGs read, so no file in ``pipelines/`` names a path of
one machine. It is ``$REFINERY_DATA`` when set, else ``../shared/data`` beside the working
directory when that exists."""

from __future__ import annotations

import os
from pathlib import Path

VAR = "${REFINERY_DATA}"


class DataPathError(ValueError):
    """A path names ``${REFINERY_DATA}`` but no data folder is set or found."""


def data_root() -> Path:
    env = os.environ.get("REFINERY_DATA")
    if env:
        return Path(env).expanduser()
    default = Path.cwd().parent / "shared" / "data"
    if default.is_dir():
        return default
    raise DataPathError("${REFINERY_DATA} is not set and ../shared/data does not exist: set REFINERY_DATA to "
                        "the sample-data folder (warc/, jsonl/, text/; see tests/data/README.md for provenance)")


def expand(path: str) -> str:
    """``path`` with ``${REFINERY_DATA}`` replaced (unchanged when it does not name it)."""
    return path.replace(VAR, str(data_root())) if VAR in path else path
