"""Byte ranges of input files: counted reads, and where a record of a part of a file starts.

A file larger than ``split_bytes`` is cut into byte ranges ``[start, end)``; a part owns the
records that *start* inside its range (the last may run past ``end``). For that to lose and
repeat nothing, every part must find the same record starts, whoever looks:

- gzip WARC/WET (one gzip member per record, Common Crawl's layout): a record start is a gzip
  member header (``1f 8b 08``, reserved flag bits clear) whose member decompresses to bytes
  beginning ``WARC/`` (after optional CR/LF). ``first_member(src, x, limit)`` is the first such
  offset at or after ``x``; a part walks members one after the other from there, so the
  member after its last one is exactly where the next part's scan stops.
- uncompressed JSON Lines: a line starts after a ``\\n`` (or at 0); a part seeks to
  ``start - 1`` and skips through the first newline.
- Parquet: a row group belongs to the part holding its middle byte.

``Source`` reads a file (local or any fsspec URL) through one buffer with absolute offsets and
counts the bytes it took from storage (``bytes_read``).
"""

from __future__ import annotations

import contextlib
import io
import os
import zlib

import fsspec

try:  # ISA-L's inflate: the same bytes as zlib, about 2x faster (the reader's largest own cost)
    from isal import isal_zlib
except ImportError:  # pragma: no cover - isal is a dependency; zlib stays the reference
    isal_zlib = None
_ISAL_ERROR = isal_zlib.error if isal_zlib is not None else zlib.error

KiB = 1 << 10
MiB = 1 << 20

GZIP_MAGIC = b"\x1f\x8b\x08"
#: how much of a file's head the planner may read to find the end of its first gzip member
HEAD_PROBE_BYTES = 4 * MiB
#: compressed bytes fed to zlib at a time when reading a member
FEED_BYTES = 16 * KiB
#: compressed bytes a member validation may feed before giving up on seeing ``WARC/``
VALIDATE_BYTES = 64 * KiB


def fast_inflate() -> bool:
    """Whether members are inflated with ISA-L (``isal``) rather than zlib: yes when it is
    installed, unless ``REFINERY_INFLATE=zlib`` (the reference, for comparisons)."""
    return isal_zlib is not None and os.environ.get("REFINERY_INFLATE", "isal") != "zlib"


def open_raw(path: str):
    """An unbuffered-ish binary file object for ``path`` (local path, file:// or any fsspec URL)."""
    if "://" not in path or path.startswith("file://"):
        return open(path.removeprefix("file://"), "rb", buffering=0)
    return fsspec.open(path, "rb").open()


class CountingRaw(io.RawIOBase):
    """A raw stream over a file object that counts the bytes read from it."""

    def __init__(self, f):
        self.f = f
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if hasattr(self.f, "readinto"):
            n = self.f.readinto(b) or 0
        else:
            data = self.f.read(len(b))
            n = len(data)
            b[:n] = data
        self.bytes_read += n
        return n

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.f.seek(offset, whence)

    def tell(self) -> int:
        return self.f.tell()

    def close(self) -> None:
        try:
            self.f.close()
        finally:
            super().close()


def open_counted(path: str, buffer_size: int = 256 * KiB) -> tuple[io.BufferedReader, CountingRaw]:
    """A buffered reader of ``path`` and the raw stream under it (``raw.bytes_read``)."""
    raw = CountingRaw(open_raw(path))
    return io.BufferedReader(raw, buffer_size), raw


def chunk_size(start: int, end: int) -> int:
    """Read size for a part: small parts read in small chunks so they stay near their range."""
    return min(1 * MiB, max(4 * KiB, (end - start) // 8))


class Source:
    """Sequential reads at absolute offsets with one buffer (re-reading inside it is free)."""

    def __init__(self, path: str, chunk: int = 256 * KiB):
        self.raw = CountingRaw(open_raw(path))
        self.chunk = chunk
        self.buf = b""
        self.buf_off = 0  # file offset of buf[0]
        self._fpos = 0  # where the raw file is positioned
        self.eof_at: int | None = None  # file size, once a read came back short

    @property
    def bytes_read(self) -> int:
        return self.raw.bytes_read

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> Source:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _fill(self, pos: int, n: int) -> None:
        """Make the buffer hold ``[pos, pos + max(n, chunk))`` (less only at the end of the file)."""
        want = max(n, self.chunk)
        buf_end = self.buf_off + len(self.buf)
        if self.buf_off <= pos <= buf_end:
            keep = self.buf[pos - self.buf_off:]
            self.buf = keep + self._read_at(buf_end, want - len(keep)) if len(keep) < want else keep
        else:
            self.buf = self._read_at(pos, want)
        self.buf_off = pos

    def _read_at(self, pos: int, n: int) -> bytes:
        if n <= 0 or (self.eof_at is not None and pos >= self.eof_at):
            return b""
        if pos != self._fpos:
            self.raw.seek(pos)
        out = bytearray(n)
        got = 0
        while got < n:
            k = self.raw.readinto(memoryview(out)[got:])
            if not k:
                self.eof_at = pos + got
                break
            got += k
        self._fpos = pos + got
        return bytes(out[:got])

    def read_at(self, pos: int, n: int | None = None) -> bytes:
        """``n`` bytes (default: one chunk) at ``pos``; fewer only at the end of the file."""
        n = n or self.chunk
        i = pos - self.buf_off
        if i < 0 or i + n > len(self.buf):
            self._fill(pos, n)
            i = 0
        return self.buf[i:i + n]

    def find(self, needle: bytes, pos: int, limit: int) -> int:
        """First offset ``p`` with ``pos <= p < limit`` where ``needle`` starts; -1 if none."""
        k = len(needle)
        while pos < limit:
            window = self.read_at(pos)
            if len(window) < k:
                return -1
            j = window.find(needle, 0, min(len(window), limit - pos + k - 1))
            if j >= 0:
                return pos + j
            if len(window) < self.chunk:  # the end of the file
                return -1
            pos += len(window) - k + 1
        return -1


# ---------------------------------------------------------------------------------------------
# gzip members


def is_warc_member_at(src: Source, pos: int) -> bool:
    """Does a gzip member start at ``pos`` whose decompressed bytes begin with ``WARC/``?"""
    head = src.read_at(pos, 10)
    if len(head) < 10 or head[:3] != GZIP_MAGIC or head[3] & 0xE0:
        return False
    d = zlib.decompressobj(31)
    out = b""
    fed = 0
    try:
        while fed < VALIDATE_BYTES:
            data = src.read_at(pos + fed, 512)
            if not data:
                break
            fed += len(data)
            out += d.decompress(data, 64)
            while d.unconsumed_tail and len(out) < 16:
                out += d.decompress(d.unconsumed_tail, 64)
            if len(out) >= 16 or d.eof:
                break
    except zlib.error:
        return False
    return out.lstrip(b"\r\n").startswith(b"WARC/")


def first_member(src: Source, pos: int, limit: int) -> int:
    """The first offset in ``[pos, limit)`` where a WARC record's gzip member starts; -1 if none.

    Every part that scans the bytes around an offset finds the same answer: the result depends
    only on the file's bytes, never on where the scan began (as long as it began at or before).
    """
    while pos < limit:
        p = src.find(GZIP_MAGIC, pos, limit)
        if p < 0:
            return -1
        if is_warc_member_at(src, p):
            return p
        pos = p + 1
    return -1


class Member(io.RawIOBase):
    """The decompressed bytes of the gzip member at ``offset``, read as a file (for FastWARC).

    Never raises on bad data: a zlib error or the end of the file inside the member ends the
    stream early and is kept in ``error`` (``"truncated"`` or the zlib message). After the
    stream ended cleanly, ``end`` is the offset of the byte after the member.

    Inflated with ISA-L when it is installed (``fast_inflate``), zlib otherwise; either way the
    bytes, ``error`` and ``end`` are zlib's (``tests/test_inflate.py`` checks it on real and
    corrupted members).
    """

    def __init__(self, src: Source, offset: int, fast: bool | None = None):
        self.src = src
        self.offset = offset
        # ISA-L inflates a sound member to zlib's bytes (the gzip CRC checks them); on anything
        # else (bad data, a truncated member) the member is replayed with zlib from its start,
        # so the bytes kept, the error and the salvage are zlib's exactly
        self.fast = fast_inflate() if fast is None else fast
        self.d = isal_zlib.decompressobj(31) if self.fast else zlib.decompressobj(31)
        self.skip = 0  # after a replay: zlib output already handed out by ISA-L
        self.in_pos = offset  # next compressed byte to feed
        self.tail = b""  # compressed input zlib has not consumed yet
        self.pending = b""
        self.out_pos = 0  # decompressed bytes handed out
        self.inflated = 0  # decompressed bytes produced
        self.done = False
        self.error: str | None = None
        self.end: int | None = None

    def readable(self) -> bool:
        return True

    def _step(self, want: int) -> None:
        if not self.tail:
            # a little at a time: on a zlib error, what came out before it is kept
            self.tail = self.src.read_at(self.in_pos, min(FEED_BYTES, self.src.chunk))
            self.in_pos += len(self.tail)
            if not self.tail:
                if self.fast:
                    return self._replay_with_zlib()
                self.done, self.error = True, "truncated"
                return
        try:
            out = self.d.decompress(self.tail, max(want, 64 * KiB))
        except zlib.error as e:
            self.done, self.error, self.tail = True, str(e), b""
            self._salvage()
            return
        except _ISAL_ERROR:
            return self._replay_with_zlib()
        self.inflated += len(out)
        self._emit(out)
        if self.d.eof:  # what was fed past the member's end is in unused_data (and, with a
            self.done = True  # max_length, also in unconsumed_tail: count it once)
            self.end = self.in_pos - len(self.d.unused_data)
            self.tail = b""
        else:
            self.tail = self.d.unconsumed_tail

    def _emit(self, out: bytes) -> None:
        if self.skip:  # replaying: these bytes were handed out already
            drop = min(self.skip, len(out))
            self.skip -= drop
            out = out[drop:]
        self.pending = self.pending + out if self.pending else out

    def _replay_with_zlib(self) -> None:
        """ISA-L stopped before the member's end: inflate it again with zlib from its start,
        dropping the bytes already handed out (both inflate a sound prefix to the same bytes)."""
        self.fast = False
        self.d = zlib.decompressobj(31)
        self.in_pos, self.tail = self.offset, b""
        self.skip = self.inflated - len(self.pending)
        self.pending = b""
        self.inflated = 0

    def _salvage(self) -> None:
        """After a zlib error: decompress the member again in small steps, up to the error,
        and keep what comes out past what was already produced (rare, so not fast)."""
        d, pos, out = zlib.decompressobj(31), self.offset, []
        # the replay stops at the same error (already in ``self.error``): keep what came before
        with contextlib.suppress(zlib.error):
            while pos < self.in_pos:
                piece = self.src.read_at(pos, 256)
                if not piece:
                    break
                pos += len(piece)
                b = d.decompress(piece)
                out.append(b)
                if d.eof:
                    break
        got = b"".join(out)[self.inflated:]
        self.inflated += len(got)
        self._emit(got)

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = 1 << 62
        while len(self.pending) < n and not self.done:
            self._step(min(n, 1 * MiB))
        if len(self.pending) <= n:
            out, self.pending = self.pending, b""
        else:
            out, self.pending = self.pending[:n], self.pending[n:]
        self.out_pos += len(out)
        return out

    def readinto(self, b) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def tell(self) -> int:
        return self.out_pos

    def seekable(self) -> bool:
        return False

    def drain(self) -> None:
        """Decompress (and drop) the rest of the member so that ``end`` or ``error`` is known."""
        self.pending = b""
        while not self.done:
            self._step(1 * MiB)
            self.out_pos += len(self.pending)
            self.pending = b""


def gzip_layout(path: str, probe: int = HEAD_PROBE_BYTES) -> str:
    """How a WARC file is stored, from its head only (at most ``probe`` bytes are read):
    ``"members"`` (its first gzip member ends before the file does: one member per record,
    splittable), ``"single"`` (one gzip stream: the first member spans the file or is larger
    than ``probe``) or ``"plain"`` (not gzip: uncompressed, or another codec)."""
    with Source(path, chunk=16 * KiB) as src:
        head = src.read_at(0, 3)
        if head != GZIP_MAGIC:
            return "plain"
        d = zlib.decompressobj(31)
        pos = 0
        try:
            while pos < probe:
                data = src.read_at(pos, 16 * KiB)
                if not data:
                    return "single"
                pos += len(data)
                d.decompress(data, 1)  # output is not needed: consume input only
                while d.unconsumed_tail and not d.eof:
                    d.decompress(d.unconsumed_tail, 64 * KiB)
                if d.eof:  # a member that spans the whole file is one stream too
                    return "members" if src.read_at(pos - len(d.unused_data), 1) else "single"
        except zlib.error:
            return "members"  # a damaged first member: let the reader resynchronise
        return "single"
