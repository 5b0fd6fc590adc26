"""fastText models: safe loading (shared with language ID), training a quality classifier with a
card beside it, and scoring texts in whole batches.

Loading is guarded: fastText's C++ loader crashes the process (SIGSEGV, SIGFPE) or loops forever
on a truncated file, so ``check_fasttext_file`` walks the file format in Python first (header,
dictionary, matrices) and refuses a file whose size does not match what its header announces.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

#: fastText's file signature (``FASTTEXT_FILEFORMAT_MAGIC_INT32``) and the versions it loads.
FASTTEXT_MAGIC = 793712314
FASTTEXT_VERSIONS = (11, 12)
_KSUB = 256  # centroids per sub-quantizer in fastText's product quantizer

#: how many times this process loaded each model file (path -> count); tests read it to prove
#: that a worker loads a model once, not once per batch.
LOADS: Counter = Counter()
_MODELS: dict[tuple[str, int, int], Any] = {}


class ModelLoadError(ValueError):
    """A model file that is missing, unreadable or not a complete fastText model."""


class _Reader:
    """Bounds-checked little-endian reads over a buffer (fastText writes native x86 order)."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def take(self, fmt: str):
        n = struct.calcsize(fmt)
        if self.pos + n > self.size:
            raise ModelLoadError(f"file is truncated (ends at byte {self.size}, needs {self.pos + n})")
        v = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v if len(v) > 1 else v[0]

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > self.size:
            raise ModelLoadError(f"file is truncated (ends at byte {self.size}, needs {self.pos + max(n, 0)})")
        self.pos += n

    def cstring(self) -> None:
        end = self.buf.find(b"\0", self.pos)
        if end < 0:
            raise ModelLoadError("file is truncated inside the dictionary")
        self.pos = end + 1


def _skip_matrix(r: _Reader, quantized: bool, dim: int) -> tuple[int, int]:
    if not quantized:
        m, n = r.take("<qq")
        if m < 0 or n != dim:
            raise ModelLoadError(f"matrix shape {m}x{n} does not match dim {dim}")
        r.skip(m * n * 4)
        return m, n
    qnorm = r.take("<?")
    m, n = r.take("<qq")
    codesize = r.take("<i")
    if m < 0 or n != dim or codesize < 0:
        raise ModelLoadError(f"quantized matrix shape {m}x{n} (codes {codesize}) does not match dim {dim}")
    r.skip(codesize)
    pq_dim = r.take("<iiii")[0]
    r.skip(pq_dim * _KSUB * 4)
    if qnorm:
        r.skip(m)
        npq_dim = r.take("<iiii")[0]
        r.skip(npq_dim * _KSUB * 4)
    return m, n


def check_fasttext_file(path: str | Path) -> dict:
    """Walk a fastText ``.bin``/``.ftz`` without loading it; return its header facts.

    Raises ``ModelLoadError`` (without the field prefix) for a wrong signature, an unknown
    version, inconsistent sizes, or a file shorter or longer than its header announces."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 8:
            raise ModelLoadError(f"not a fastText model ({size} bytes)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            r = _Reader(buf, size)
            magic, version = r.take("<ii")
            if magic != FASTTEXT_MAGIC:
                raise ModelLoadError("not a fastText model (wrong file signature)")
            if version not in FASTTEXT_VERSIONS:
                raise ModelLoadError(f"unsupported fastText format version {version}")
            args = r.take("<12id")
            dim, loss, model_kind, bucket = args[0], args[6], args[7], args[8]
            if not 0 < dim <= 100_000:
                raise ModelLoadError(f"implausible dimension {dim}")
            nentries, nwords, nlabels = r.take("<iii")
            _ntokens, pruneidx = r.take("<qq")
            if nentries < 0 or nwords < 0 or nlabels < 0 or nwords + nlabels != nentries or pruneidx < -1:
                raise ModelLoadError("corrupt dictionary header")
            for _ in range(nentries):
                r.cstring()
                r.skip(9)  # int64 count + int8 entry type
            r.skip(max(pruneidx, 0) * 8)  # -1 = never pruned
            quant = r.take("<?")
            rows_in, _ = _skip_matrix(r, quant, dim)
            qout = r.take("<?")
            rows_out, _ = _skip_matrix(r, quant and qout, dim)
            if r.pos != size:
                raise ModelLoadError(f"{size - r.pos} unexpected bytes after the model")
    return {"version": version, "dim": dim, "words": nwords, "labels": nlabels, "bucket": bucket,
            "quantized": bool(quant), "input_rows": rows_in, "output_rows": rows_out,
            "loss": loss, "model": model_kind}


def load_fasttext(path: str | Path, field: str = "quality.model"):
    """The fastText model at ``path``, loaded once per process and file version (path, mtime,
    size): a retrained model is picked up, a batch never reloads. Errors name ``field`` and
    the file: ``quality.model: cannot load 'models/q.bin': file is truncated ...``."""
    import fasttext

    p = Path(path)
    try:
        st = p.stat()
    except OSError as e:
        raise ModelLoadError(f"{field}: cannot load {str(path)!r}: {e.strerror or e}") from None
    key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    model = _MODELS.get(key)
    if model is not None:
        return model
    try:
        if p.is_dir():
            raise ModelLoadError("is a directory, not a model file")
        check_fasttext_file(p)
        # fastText prints warnings on stderr for each load; they carry nothing for our users
        model = fasttext.load_model(str(p))
    except ModelLoadError as e:
        raise ModelLoadError(f"{field}: cannot load {str(path)!r}: {e}") from None
    except (OSError, ValueError, RuntimeError) as e:
        raise ModelLoadError(f"{field}: cannot load {str(path)!r}: {e}") from None
    _MODELS[key] = model
    LOADS[key[0]] += 1
    return model


def predict_batch(model, texts: list[str], k: int = -1) -> tuple[list[list[str]], list[np.ndarray]]:
    """fastText predictions for many texts in one C++ call. fastText reads one line per text,
    so newlines become spaces first (it raises on ``\\n`` otherwise)."""
    clean = [t.replace("\n", " ") if "\n" in t else t for t in texts]
    labels, probs = model.predict(clean, k=k)
    return labels, probs
