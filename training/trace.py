"""Every step traceable: which packed rows, hence which documents, went into each step.

Rank 0 of a run appends, for every step, the global batch's row ids to
``RUN_DIR/trace/rows.bin`` (a 16-byte header ``<qII``: step, row count, bytes per id; then the
ids, uint32 or int64 little-endian: 4 bytes a row for any pack under 4G rows). Records are
buffered and written, flushed and fsynced before every checkpoint (and when the run ends), so
every step a checkpoint covers is on disk; a resume drops the records at or after its step
(steps it will redo), as it does for metrics.jsonl. ``RUN_DIR/trace/data.jsonl`` gets one
line per start of the trainer: the step it started at, the data fingerprint and the shard
list (file, rows, URL), so a row id maps to a shard and a row even after the pack directory
has changed (``data.allow_data_change``).

A row's documents are in the shards themselves (``doc_ids``, ``doc_lens``: see
``curation.formats.packed``), so ``step_documents`` needs nothing else: it reads the step's
row ids, then only the row groups holding them. Joining documents with their curation
signals needs the curation run's views; that is ``refinery trace`` (curation/cli/train.py).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import fsspec
import numpy as np
import pyarrow.parquet as pq

from training.files import truncate_jsonl

TRACE_DIR = "trace"
ROWS_FILE = "rows.bin"
DATA_FILE = "data.jsonl"
HEADER = struct.Struct("<qII")  # step, number of row ids, bytes per row id (4 or 8)
#: guard events whose step is flagged by ``--loss-spikes``
FLAGGED_EVENTS = ("skip", "spike_taken")


class TraceError(LookupError):
    """No trace for what was asked (a step never recorded, a run without a trace)."""


# ---------------------------------------------------------------------------------------------
# writing (the trainer, rank 0)


def _records(path: Path):
    """(step, offset, count, itemsize) of every complete record in a rows file."""
    if not path.exists():
        return
    size = path.stat().st_size
    with open(path, "rb") as f:
        offset = 0
        while offset + HEADER.size <= size:
            f.seek(offset)
            step, count, itemsize = HEADER.unpack(f.read(HEADER.size))
            end = offset + HEADER.size + count * itemsize
            if itemsize not in (4, 8) or end > size:
                return  # a torn last record (killed mid-write)
            yield step, offset, count, itemsize
            offset = end


class TraceWriter:
    """Appends each step's global row ids; ``flush`` before a checkpoint makes them durable.

    ``enabled=False`` (ranks other than 0) makes every call a no-op.
    """

    def __init__(self, run_dir: str | Path, start_step: int, dataset, enabled: bool = True):
        self.enabled = enabled
        self._pending: list[bytes] = []
        if not enabled:
            return
        self.dir = Path(run_dir) / TRACE_DIR
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / ROWS_FILE
        # Keep the records of steps before the start (a resume redoes the rest), and a torn tail never.
        keep = 0
        for step, offset, count, itemsize in _records(self.path):
            if step >= start_step:
                break
            keep = offset + HEADER.size + count * itemsize
        if self.path.exists() and self.path.stat().st_size != keep:
            with open(self.path, "r+b") as f:
                f.truncate(keep)
        data = self.dir / DATA_FILE
        truncate_jsonl(data, start_step)
        with open(data, "a") as f:
            f.write(json.dumps({
                "step": start_step,
                "fingerprint": dataset.fingerprint,
                "path": dataset.fs.unstrip_protocol(dataset.root),
                "shards": [[s.file, s.rows, dataset.url(s)] for s in dataset.shards],
            }) + "\n")
        self._wide = dataset.num_rows >= 2**32

    def add(self, step: int, rows: np.ndarray) -> None:
        if not self.enabled:
            return
        ids = np.asarray(rows, dtype="<i8" if self._wide else "<u4")
        self._pending.append(HEADER.pack(step, len(ids), ids.itemsize) + ids.tobytes())

    def flush(self) -> None:
        if not self.enabled or not self._pending:
            return
        with open(self.path, "ab") as f:
            f.write(b"".join(self._pending))
            f.flush()
            os.fsync(f.fileno())
        self._pending.clear()

    close = flush


# ---------------------------------------------------------------------------------------------
# reading


def trace_dir(run_dir: str | Path) -> Path:
    d = Path(run_dir) / TRACE_DIR
    if not (d / ROWS_FILE).exists():
        raise TraceError(f"{run_dir}: no step trace ({TRACE_DIR}/{ROWS_FILE}); was it trained by this trainer and checkpointed?")
    return d


def step_rows(run_dir: str | Path, step: int) -> np.ndarray:
    """The global row ids of ``step``, in the global batch's order."""
    path = trace_dir(run_dir) / ROWS_FILE
    first = next(_records(path), None)
    if first is not None:
        # Fast path: a run's records all have the same size (fixed global batch), steps in order.
        s0, _, count, itemsize = first
        size = HEADER.size + count * itemsize
        offset = (step - s0) * size
        if step >= s0 and offset + size <= path.stat().st_size:
            with open(path, "rb") as f:
                f.seek(offset)
                got, n, width = HEADER.unpack(f.read(HEADER.size))
                if got == step and (n, width) == (count, itemsize):
                    return np.frombuffer(f.read(n * width), dtype="<u4" if width == 4 else "<i8").astype(np.int64)
    for got, offset, n, width in _records(path):
        if got == step:
            with open(path, "rb") as f:
                f.seek(offset + HEADER.size)
                return np.frombuffer(f.read(n * width), dtype="<u4" if width == 4 else "<i8").astype(np.int64)
    steps = [s for s, *_ in _records(path)]
    span = f"steps {steps[0]}..{steps[-1]}" if steps else "no steps"
    raise TraceError(f"{run_dir}: step {step} is not in the trace ({span} recorded)")


def recorded_steps(run_dir: str | Path) -> list[int]:
    return [s for s, *_ in _records(trace_dir(run_dir) / ROWS_FILE)]


def data_segment(run_dir: str | Path, step: int) -> dict:
    """The data the trainer read at ``step``: the last start at or before it."""
    lines = [json.loads(x) for x in (trace_dir(run_dir) / DATA_FILE).read_text().splitlines() if x.strip()]
    segs = [s for s in lines if s["step"] <= step]
    if not segs:
        raise TraceError(f"{run_dir}: no data record covers step {step}")
    return segs[-1]


def _split_doc_id(piece: str) -> tuple[str, int, int]:
    """``"<document id>@<piece>/<pieces>"`` -> (document id, piece, pieces)."""
    doc, sep, tail = piece.rpartition("@")
    if sep and "/" in tail:
        i, _, n = tail.partition("/")
        if i.isdigit() and n.isdigit():
            return doc, int(i), int(n)
    return piece, 0, 1


def read_rows(segment: dict, rows: np.ndarray, columns=("doc_ids", "doc_lens", "source", "source_tokens")) -> list[dict]:
    """The packed rows ``rows`` (global ids of ``segment``'s shard list): each as a dict with
    ``row``, ``shard``, ``row_in_shard`` and the asked columns the shard has. Reads only the
    row groups holding them."""
    shards = segment["shards"]
    offsets = np.concatenate([[0], np.cumsum([s[1] for s in shards])])
    rows = np.asarray(rows, dtype=np.int64)
    if len(rows) and (rows.min() < 0 or rows.max() >= offsets[-1]):
        raise TraceError(f"row id out of range 0..{offsets[-1] - 1}")
    which = np.searchsorted(offsets, rows, side="right") - 1
    out: list[dict | None] = [None] * len(rows)
    for sh in np.unique(which).tolist():
        sel = np.flatnonzero(which == sh)
        file, _, url = shards[sh]
        with fsspec.open(url, "rb") as f:
            pf = pq.ParquetFile(f)
            cols = [c for c in columns if c in pf.schema_arrow.names]
            starts = np.cumsum([0] + [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)])
            local = rows[sel] - offsets[sh]
            group = np.searchsorted(starts, local, side="right") - 1
            for g in np.unique(group).tolist():
                t = pf.read_row_group(g, columns=cols).to_pylist()
                for i in sel[group == g].tolist():
                    lr = int(rows[i] - offsets[sh])
                    out[i] = {"row": int(rows[i]), "shard": file, "row_in_shard": lr, **t[lr - int(starts[g])]}
    return out


def step_documents(run_dir: str | Path, step: int) -> dict:
    """The documents behind ``step``: ``{"step", "rows": [...], "documents": [...]}``.

    A document is listed once (first appearance in the global batch's order) with the tokens
    it contributed to the step (pieces split across rows add up), its pieces in this step, the
    rows holding them and the row's majority source. Rows of a pack without ``doc_ids``
    (synthetic data) are listed with no documents.
    """
    rows = step_rows(run_dir, step)
    segment = data_segment(run_dir, step)
    detail = read_rows(segment, rows)
    docs: dict[str, dict] = {}
    for r in detail:
        for piece, n in zip(r.get("doc_ids") or [], r.get("doc_lens") or []):
            doc, i, count = _split_doc_id(piece)
            d = docs.setdefault(doc, {"id": doc, "tokens": 0, "pieces": [], "of_pieces": count, "rows": [],
                                      "row_source": r.get("source")})
            d["tokens"] += int(n)
            d["pieces"].append(i)
            if r["row"] not in d["rows"]:
                d["rows"].append(r["row"])
    return {"step": step, "fingerprint": segment["fingerprint"], "data": segment["path"],
            "rows": detail, "documents": list(docs.values())}


def flagged_steps(run_dir: str | Path) -> list[dict]:
    """The steps the guard flagged (skipped, or a spike taken clipped), from metrics.jsonl:
    ``{"step", "event", "loss", "grad_norm", "message"}``, one per step, in step order."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        raise TraceError(f"{run_dir}: no metrics.jsonl")
    out: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") == "event" and r.get("event") in FLAGGED_EVENTS:
            out.setdefault(r["step"], {k: r.get(k) for k in ("step", "event", "loss", "grad_norm", "message")})
    return [out[s] for s in sorted(out)]
