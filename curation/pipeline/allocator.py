"""The C allocator of a worker process, set for batch-sized arrays.

Every batch, the text kernels allocate a few dozen arrays of a few MB (word spans, their
measures and ids, n-gram tables) and free them. glibc serves blocks that large from fresh
``mmap`` and unmaps them on free, so the next batch takes a page fault, and the kernel zeroes
a page, for every 4 KB it touches. On the long bench pages (``tests/benchmarks/
bench_allocator.py``) that was 9-12 faults and 42-44 us of system time per document through
the filter chain; raising glibc's mmap threshold to 64 MB and its trim threshold to 128 MB
keeps freed blocks in the heap for the next batch: 3 faults, 13-28 us. (The default pages fault
little either way: 1.2-1.8 a document.) A worker holds at most ``trim_mb`` more
than it uses; peak RSS moved by less than the run-to-run noise (606-646 MB).

Arrow's buffers come from the same heap (``pa.system_memory_pool``). Arrow's default pool, its
bundled mimalloc, hands freed pages back to the kernel milliseconds after a batch, and a worker's
batches are seconds apart: in a whole run on the long bench pages (``bench_scale.py``, which prints
faults per stage) a worker took 38-41 faults a document through the full DAG and 12 through
extract-only, 8 and 2 with one heap for both and ``trim_mb`` 256 (a chain batch of long pages
peaks at ~270 MB of heap; at 128 the heap was trimmed between batches): system time 2.0 -> 0.8 s
per 7,483 documents (~2% of the DAG's CPU); peak RSS 620-645 -> 670-680 MB.

Set once per worker process, before its first batch (``executor._root_entries``); a process
without glibc's ``mallopt`` (musl, macOS) is left as it is. ``REFINERY_MALLOC_TUNING=0`` turns
it off.

The stages after the first ones of a task (after extraction: the filter chain) run on one
thread of their own, ``chain_thread``, in turn with the task's thread (never at once): glibc
gives each thread its own arena, so the parser's many small blocks are no longer carved out
of the chain's freed batch-sized ones. Side by side on the long bench pages, extraction inside
the full DAG's worker ran x0.95-0.98 of extract-only's in every one of seven rounds with one
heap, and x0.99-1.02 in three with two (``bench_scale.py --side-by-side``). The cost is memory:
each arena keeps its own freed blocks, so that worker peaked at 773-955 MB against 729-755 with
one heap (extract-only workers: unchanged, ~400). ``REFINERY_CHAIN_THREAD=0`` keeps the chain on
the task's thread.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import ctypes
import functools
import os
import sys
import threading
from typing import Any, Callable, TypeVar

T = TypeVar("T")

#: glibc's ``mallopt`` parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3


@functools.cache
def keep_batch_blocks(mmap_mb: int = 64, trim_mb: int = 256) -> bool:
    """Serve blocks under ``mmap_mb`` from the heap and keep up to ``trim_mb`` freed at its top,
    and take Arrow's buffers from it too; True if the allocator took both settings (once per
    process: later calls return the first answer)."""
    if os.environ.get("REFINERY_MALLOC_TUNING", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the libc this process runs on
    except (OSError, AttributeError):  # no mallopt: not glibc
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    if not (mallopt(M_MMAP_THRESHOLD, mmap_mb << 20) and mallopt(M_TRIM_THRESHOLD, trim_mb << 20)):
        return False
    import pyarrow as pa

    # Arrow's buffers from the same heap: its bundled mimalloc hands freed pages back to the
    # kernel within milliseconds, so every batch's columns faulted their pages in again
    pa.set_memory_pool(pa.system_memory_pool())
    return True


class ArenaThread:
    """One long-lived thread of this process that runs calls one at a time, the caller waiting
    for each: what they allocate comes from the thread's own glibc arena, apart from the
    caller's heap. Each call runs in a copy of the caller's context (``contextvars``)."""

    def __init__(self, name: str):
        self._ident: int | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=name, initializer=self._started)
        self._last: concurrent.futures.Future | None = None

    def _started(self) -> None:
        self._ident = threading.get_ident()

    def here(self) -> bool:
        """Whether this is the thread itself (a call from it runs in place)."""
        return threading.get_ident() == self._ident

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread; its result or its exception."""
        if self.here():
            return fn(*args)
        self._last = self._pool.submit(contextvars.copy_context().run, fn, *args)
        return self._last.result()

    def settle(self) -> None:
        """Wait for a call still running: one whose caller was interrupted while it waited
        (a cancelled task), before the caller cleans up what the call writes to."""
        if self._last is not None:
            concurrent.futures.wait([self._last])


@functools.cache
def chain_thread() -> ArenaThread | None:
    """This process's thread for the stages after a task's first ones; None when
    ``REFINERY_CHAIN_THREAD=0`` (once per process: later calls return the first answer)."""
    if os.environ.get("REFINERY_CHAIN_THREAD", "1") == "0":
        return None
    return ArenaThread("refinery-chain")
