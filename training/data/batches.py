"""Turning rows into model inputs: micro-batches, loss targets, per-step token counts, and
the background thread that prepares each step's batch ahead of the loop."""

from __future__ import annotations

import json
import queue
import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from training.attention import doc_ids_from_lens, positions_from_doc_ids, varlen_boundaries
from training.data.shards import DataError, PackedDataset, RowBatch
from training.static_shapes import boundary_slots, pad_boundaries

IGNORE = -100  # target id the loss ignores (padding, cross-document predictions)


@dataclass
class MicroBatch:
    """One forward/backward: (b, T) inputs and targets (IGNORE where no loss), masking inputs.

    ``cu_seqlens`` (int32, over the flattened b*T tokens) and ``max_seqlen`` (a power of two)
    are the varlen kernels' document boundaries, computed here on the data thread from the
    document ids so the forward never reads a length back from the device."""

    inputs: torch.Tensor
    targets: torch.Tensor
    doc_ids: torch.Tensor | None
    positions: torch.Tensor | None
    cu_seqlens: torch.Tensor | None = None
    max_seqlen: int = 0

    def _map(self, fn) -> MicroBatch:
        f = lambda t: None if t is None else fn(t)  # noqa: E731
        return MicroBatch(f(self.inputs), f(self.targets), f(self.doc_ids), f(self.positions), f(self.cu_seqlens), self.max_seqlen)

    def pin(self) -> MicroBatch:
        """Page-locked copies (data thread, CUDA only): ``to(cuda, non_blocking)`` is then a
        real asynchronous copy instead of a staged, synchronous one."""
        return self._map(torch.Tensor.pin_memory)

    def to(self, device: torch.device) -> MicroBatch:
        nb = device.type == "cuda"
        return self._map(lambda t: t.to(device, non_blocking=nb))


@dataclass
class StepBatch:
    """Everything one rank needs for one optimizer step."""

    step: int
    micro: list[MicroBatch]
    row_ids: np.ndarray
    n_tokens: int  # tokens that carry loss on this rank
    source_tokens: np.ndarray  # (n_sources,) non-padding tokens by the row's source
    content_tokens: dict[str, int] = field(default_factory=dict)  # from the rows' source_tokens JSON
    seq_len: int = 0
    global_rows: np.ndarray | None = None  # the whole global batch's row ids (for the step trace)
    counts: torch.Tensor | None = None  # (n_tokens,) float64, pinned on CUDA: summed over ranks on the device


def build_micro_batches(
    rows: RowBatch,
    seq_len: int,
    cur_len: int,
    micro_rows: int,
    document_mask: bool,
    vocab_size: int | None = None,
    max_docs: int | None = None,
) -> tuple[list[MicroBatch], int, np.ndarray]:
    """Rows of ``seq_len + 1`` tokens -> micro-batches of ``micro_rows`` rows.

    Targets are the next token; they are IGNORE on padding and, with document masking, on
    the first token of the next document (the model cannot see anything it depends on).
    With ``cur_len < seq_len`` (sequence-length warm-up) every row is cut into
    ``seq_len / cur_len`` sequences; positions restart in every piece.
    ``max_docs`` (CUDA graphs, ``training.static_shapes``): every micro-batch's varlen
    boundaries padded to one length, ``max_seqlen`` = ``cur_len``; a row with more documents
    is a ``DataError``.
    Returns (micro-batches, tokens with loss, non-padding tokens per row).
    """
    ids = rows.ids
    n = len(ids)
    if ids.shape[1] != seq_len + 1:
        raise DataError(f"packed rows have {ids.shape[1]} tokens, but data.seq_len + 1 = {seq_len + 1}")
    if vocab_size is not None and n and ids.max() >= vocab_size:
        raise DataError(f"token id {int(ids.max())} >= model.vocab_size {vocab_size}: the tokenizer and the model disagree")
    nonpad = np.array([int(np.sum(d)) for d in rows.doc_lens], dtype=np.int64)
    if (nonpad > seq_len + 1).any():
        raise DataError(f"doc_lens sum to {int(nonpad.max())} > row length {seq_len + 1}")
    docs_per_row = [int(np.count_nonzero(lens)) for lens in rows.doc_lens]
    if max_docs is not None and n and max(docs_per_row) > max_docs:
        raise DataError(f"a packed row holds {max(docs_per_row)} documents > data.max_docs_per_row {max_docs}: "
                        "raise it (CUDA-graph mode pads varlen boundaries to a length fixed by it) and resume")
    docs = doc_ids_from_lens(rows.doc_lens, seq_len + 1)
    inputs, targets = ids[:, :-1].copy(), ids[:, 1:].copy()
    valid = np.arange(1, seq_len + 1)[None, :] < nonpad[:, None]
    if document_mask:
        valid &= docs[:, 1:] == docs[:, :-1]
    targets[~valid] = IGNORE
    n_tokens = int(valid.sum())
    pieces = seq_len // cur_len
    shape = (n * pieces, cur_len)
    inputs, targets = inputs.reshape(shape), targets.reshape(shape)
    doc_ids = positions = None
    if document_mask:
        doc_ids = docs[:, :-1].reshape(shape)
        positions = positions_from_doc_ids(doc_ids)
    out = []
    step = micro_rows * pieces
    for a in range(0, n * pieces, step):
        mb = MicroBatch(
            torch.from_numpy(inputs[a : a + step]),
            torch.from_numpy(targets[a : a + step]),
            None if doc_ids is None else torch.from_numpy(doc_ids[a : a + step]),
            None if positions is None else torch.from_numpy(positions[a : a + step]),
        )
        if doc_ids is not None:
            cu, mb.max_seqlen = varlen_boundaries(doc_ids[a : a + step])
            if max_docs is not None:  # one shape for every micro-batch: a CUDA graph replays
                cu, mb.max_seqlen = pad_boundaries(cu, boundary_slots(micro_rows, seq_len, cur_len, max_docs)), cur_len
            mb.cu_seqlens = torch.from_numpy(cu)
        out.append(mb)
    return out, n_tokens, np.minimum(nonpad, seq_len)


def build_step(
    dataset: PackedDataset,
    row_ids: np.ndarray,
    step: int,
    seq_len: int,
    cur_len: int,
    micro_rows: int,
    document_mask: bool,
    pad_id: int,
    vocab_size: int | None,
    max_docs: int | None = None,
) -> StepBatch:
    """Read this rank's rows for ``step`` and prepare its micro-batches and token counts."""
    rows = dataset.read_rows(row_ids, pad_id)
    micro, n_tokens, row_tokens = build_micro_batches(rows, seq_len, cur_len, micro_rows, document_mask, vocab_size, max_docs)
    by_source = np.bincount(dataset.row_source[row_ids], weights=row_tokens, minlength=len(dataset.sources))
    content: dict[str, int] = {}
    for st in rows.source_tokens:
        if st:
            for k, v in json.loads(st).items():
                content[k] = content.get(k, 0) + int(v)
    return StepBatch(step, micro, row_ids, n_tokens, by_source.astype(np.int64), content, cur_len)


class Prefetcher:
    """Prepares steps ``[start, end)`` on a background thread, ``depth`` steps ahead.

    ``make(step) -> StepBatch`` runs on the thread (numpy and pyarrow release the GIL for
    the heavy parts). An exception on the thread is re-raised by ``get``.
    """

    def __init__(self, make, start: int, end: int, depth: int):
        self._make, self._q = make, queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(start, end), daemon=True, name="prefetch")
        self._thread.start()

    def _run(self, start: int, end: int) -> None:
        try:
            for step in range(start, end):
                item = self._make(step)
                while not self._stop.is_set():
                    try:
                        self._q.put(item, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self._stop.is_set():
                    return
        except BaseException as err:  # surfaced to the training thread by get()
            self._q.put(err)

    def get(self) -> StepBatch:
        item = self._q.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
