"""Object-storage requests retried in this process: botocore's retries (throttling such as 503
SlowDown, connection errors; standard and legacy modes) and s3fs's own retry loop. Neither
library counts them anywhere readable, but both log each decision at DEBUG; a filter on those
loggers counts the decisions and drops every record below the level the logger had before, so
nothing more is printed. ``install()`` in every process that may talk to object storage (every task
of ``curation.pipeline.tasks.run_bounded`` and the run's driver do); ``count()`` is the
running total: ``curation.pipeline.tasks`` hands each task's share back
to the driver, which adds its own and writes the sum to ``progress.json`` (``retries``).

Not counted: a request aiohttp resends by itself (a reset on a reused keep-alive connection,
retried once below botocore, which never sees it)."""

from __future__ import annotations

import logging
import threading

#: logger -> message prefixes that mean "this request is sent again"
_RETRY_MESSAGES = {
    "botocore.retries.standard": ("Retry needed, retrying",),
    "botocore.retryhandler": ("Retry needed, action of",),
    "s3fs": ("Retryable error",),  # S3_RETRYABLE_ERRORS (connection resets, timeouts)
}
#: s3fs retries a ClientError whose text names one of these (its _error_wrapper's patterns)
_S3FS_CLIENT_RETRIED = ("SlowDown", "reduce your request rate", "XAmzContentSHA256Mismatch")

_lock = threading.Lock()
_count = 0
_installed = False


class _Counter(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...], keep_level: int):
        super().__init__()
        self.prefixes, self.keep_level = prefixes, keep_level

    def filter(self, record: logging.LogRecord) -> bool:
        global _count
        msg = record.msg if isinstance(record.msg, str) else ""
        if msg.startswith(self.prefixes) or (
                msg.startswith("Client error (maybe retryable)")
                and any(p in str(record.args) for p in _S3FS_CLIENT_RETRIED)):
            with _lock:
                _count += 1
        return record.levelno >= self.keep_level


def install() -> None:
    """Start counting in this process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True
    for name, prefixes in _RETRY_MESSAGES.items():
        log = logging.getLogger(name)
        keep = log.getEffectiveLevel()
        log.addFilter(_Counter(prefixes, keep))
        if keep > logging.DEBUG:
            log.setLevel(logging.DEBUG)


def count() -> int:
    """Requests retried in this process since it started counting."""
    return _count
