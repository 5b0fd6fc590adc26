"""Arrow <-> numpy helpers shared by the text measurements: a text column as one array, the
UTF-8 bytes of a string array as a zero-copy numpy view, byte or code-point spans back to Arrow
strings, boolean masks, and a division that is 0 on empty documents."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

def text_array(texts: pa.Array | pa.ChunkedArray) -> pa.Array:
    """One string array with nulls replaced by ``""``."""
    if isinstance(texts, pa.ChunkedArray):  # one chunk as it is: combine_chunks copies even one
        arr = texts.chunk(0) if texts.num_chunks == 1 else texts.combine_chunks()
    else:
        arr = texts
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = arr.cast(pa.string())
    return pc.fill_null(arr, "") if arr.null_count else arr


def text_column(batch: pa.Table, name: str = "text") -> pa.Array:
    """The text column as one string array with nulls replaced by ``""``."""
    return text_array(batch.column(name))


def to_numpy(arr) -> np.ndarray:
    """An Arrow array (chunked or not) as numpy."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return arr.to_numpy(zero_copy_only=False)


def mask(arr) -> np.ndarray:
    """Boolean Arrow array -> numpy bool (null counts as false)."""
    return to_numpy(pc.fill_null(arr, False)).astype(bool)


def safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """``num / den`` with 0 where the denominator is 0 (empty documents)."""
    num = np.asarray(num, dtype=np.float64)
    den = np.asarray(den, dtype=np.float64)
    out = np.zeros(np.broadcast(num, den).shape, dtype=np.float64)
    np.divide(num, den, out=out, where=den != 0)
    return out


def text_bytes(texts: pa.Array) -> tuple[np.ndarray, np.ndarray, pa.Buffer | None, int]:
    """UTF-8 bytes of all texts (a view), each text's byte offsets into it, the data buffer
    and where the view starts in it."""
    n = len(texts)
    bufs = texts.buffers()
    off_type = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    if n == 0 or bufs[2] is None:
        return readonly_bytes(b""), np.zeros(n + 1, np.int64), None, 0
    off = np.frombuffer(bufs[1], dtype=off_type)[texts.offset: texts.offset + n + 1].astype(np.int64)
    return readonly_bytes(bufs[2])[off[0]: off[-1]], off - off[0], bufs[2], int(off[0])


def readonly_bytes(buf) -> np.ndarray:
    """A buffer's bytes as a read-only uint8 view. numba compiles a kernel once per argument
    type, and read-only is part of the type: a buffer Arrow allocated (built in memory, read
    from Parquet) views as writable, one it maps from a file or wraps from Python bytes as
    read-only, and an empty batch's bytes were a new array of their own; each new kind compiled
    the text kernels again in the middle of a run (~3 s of a worker's CPU for the word measures
    alone). One kind for all of them."""
    out = np.frombuffer(buf, dtype=np.uint8)
    out.flags.writeable = False
    return out


def byte_spans(buf: pa.Buffer, base: int, start: np.ndarray, end: np.ndarray, gaps: bool = True) -> pa.Array:
    """Arrow strings for the byte spans [start, end) of the text data (sorted, disjoint)."""
    m = len(start)
    if m == 0 or buf is None:
        return pa.array([""] * m, pa.string())
    # Interleave spans and the gaps between them, then keep the spans.
    off = np.empty(2 * m, dtype=np.int64)
    off[0::2] = start + base
    off[1::2] = end + base
    large = off[-1] >= 2**31 - 1
    arr_type = pa.large_string() if large else pa.string()
    off_arr = off.astype(np.int64 if large else np.int32)
    both = pa.Array.from_buffers(arr_type, 2 * m - 1, [None, pa.py_buffer(off_arr), buf])
    return both.take(pa.array(np.arange(0, 2 * m, 2)))


def code_point_spans(cp: np.ndarray, a: np.ndarray, b: np.ndarray) -> pa.Array:
    """Arrow strings of the code point spans [a, b) (spans hold no newline)."""
    if len(a) == 0:
        return pa.array([], pa.string())
    lengths = (b - a) + 1
    base = np.repeat(a - (np.cumsum(lengths) - lengths), lengths)
    idx = base + np.arange(int(lengths.sum()))
    chars = cp[np.minimum(idx, len(cp) - 1)].copy()
    chars[np.cumsum(lengths) - 1] = 0x0A
    text = chars[:-1].tobytes().decode("utf-32-le")
    return pc.list_flatten(pc.split_pattern(pa.array([text]), "\n"))
