"""text -> token ids with a trained tokenizer (see ``curation/tokenizer/``)."""

from __future__ import annotations

import json
from typing import Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import PrivateAttr, field_validator

from curation.formats.packed import TOKENIZER_METADATA
from curation.stages.base import MapStage, StageResult, registry
from curation.stages.paths import PathStr
from curation.tokenizer.model import Tokenizer, checked_tokenizer_dir, load_cached, tokenizer_fingerprint


def int32_lists(arrays: list[np.ndarray]) -> pa.ListArray:
    """list<int32> Arrow array from int32 numpy arrays, built from one buffer (no Python ints)."""
    lens = np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays) + 1, dtype=np.int32)
    np.cumsum(lens, out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.astype(np.int32, copy=False)))


@registry.register("tokenize")
class Tokenize(MapStage):
    """Adds ``input_ids: list<int32>`` and ``num_tokens: int32`` from the ``text`` column.

    ``add_eos`` appends the tokenizer's end-of-text id so packed rows keep document boundaries;
    ``keep_text: false`` drops ``text`` from the output (tokens are enough downstream). Empty
    or whitespace-only texts are rejected as ``tokenize:empty``. The params hash holds the
    tokenizer's fingerprint, not its path: retraining invalidates outputs, moving it does not.
    """

    type: Literal["tokenize"] = "tokenize"
    columns: ClassVar[tuple[str, ...]] = ('input_ids', 'num_tokens')
    tokenizer: PathStr
    add_eos: bool = True
    keep_text: bool = True

    _tok: Tokenizer | None = PrivateAttr(default=None)

    @field_validator("tokenizer")
    @classmethod
    def _tokenizer_exists(cls, v: str) -> str:
        return checked_tokenizer_dir(v)

    def params(self) -> dict[str, Any]:
        p = super().params()
        p["tokenizer"] = {"fingerprint": tokenizer_fingerprint(self.tokenizer)}
        return p

    def setup(self) -> None:
        self._tok = load_cached(self.tokenizer)

    def process(self, batch: pa.Table) -> StageResult:
        if "text" not in batch.column_names:
            raise ValueError(f"tokenize: input has no 'text' column (columns: {batch.column_names})")
        if self._tok is None:
            self.setup()
        tok = self._tok
        texts = batch.column("text").to_pylist()
        empty = [t is None or not t.strip() for t in texts]
        todo = [i for i, e in enumerate(empty) if not e]
        encoded = tok.encode_batch([texts[i] for i in todo])
        eos = np.array([tok.eos_id], dtype=np.int32)
        ids: list[np.ndarray] = [np.zeros(0, np.int32)] * len(texts)
        for i, arr in zip(todo, encoded):
            ids[i] = np.concatenate([arr, eos]) if self.add_eos else arr
        input_ids = int32_lists(ids)
        table = batch
        for name in ("input_ids", "num_tokens"):  # re-tokenizing replaces, never duplicates
            if name in table.column_names:
                table = table.drop_columns([name])
        if not self.keep_text:
            table = table.drop_columns(["text"])
        table = table.append_column("input_ids", input_ids)
        table = table.append_column("num_tokens", pc.list_value_length(input_ids).cast(pa.int32()))
        meta = dict(table.schema.metadata or {})
        meta[TOKENIZER_METADATA] = json.dumps(tok.describe(), sort_keys=True).encode()
        table = table.replace_schema_metadata(meta)
        reasons = pa.array(["tokenize:empty" if e else None for e in empty], pa.string()) if any(empty) else None
        return StageResult(table, reasons)
