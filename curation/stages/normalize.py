"""``normalize``: ftfy's Unicode repair, symbol-only lines, whitespace (``curation.text.normalize``);
never drops. Signals ``normalize_fixed`` (ftfy changed the text), ``normalize_lines_removed``
(symbol lines), ``normalize_chars_delta`` (characters after minus before, all steps together). It
rewrites the text, so it returns a new ``TextState`` carrying the word counts of rows it left
unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field

from curation.io.shards import replace_column
from curation.stages.base import MapStage, StageResult, registry
from curation.text.normalize import Normalizer
from curation.text.state import rewritten_state

if TYPE_CHECKING:  # pragma: no cover
    from curation.text.state import TextState


@registry.register("normalize")
class Normalize(MapStage):
    """Unicode repair (ftfy), symbol-only lines, whitespace (``curation.text.normalize`` gives
    the steps and their order). Never drops a document (one left empty is dropped as
    ``empty`` by the filters after it).

    Signals: ``normalize_fixed`` (ftfy changed the text), ``normalize_lines_removed`` (symbol
    lines removed), ``normalize_chars_delta`` (characters after minus before)."""

    type: str = "normalize"
    columns: ClassVar[tuple[str, ...]] = ('normalize_fixed', 'normalize_lines_removed', 'normalize_chars_delta')
    rewrites_text: ClassVar[bool] = True
    fix_unicode: bool = True
    #: ftfy's HTML-entity decoding: "auto" decodes unless the text holds a "<"
    unescape_html: bool | Literal["auto"] = "auto"
    #: Unicode normalisation by ftfy (none by default, as FineWeb)
    normalization: Literal["NFC", "NFKC", "NFD", "NFKD"] | None = None
    strip_trailing_spaces: bool = True
    remove_symbol_lines: bool = True
    collapse_spaces: bool = True
    max_blank_lines: int | None = Field(1, ge=0)
    strip: bool = True

    def normalizer(self) -> Normalizer:
        return Normalizer(self.fix_unicode, self.unescape_html, self.normalization, self.strip_trailing_spaces,
                          self.remove_symbol_lines, self.collapse_spaces, self.max_blank_lines, self.strip)

    def params(self) -> dict[str, Any]:
        p = super().params()
        if self.fix_unicode:
            import ftfy  # noqa: PLC0415

            p["ftfy"] = ftfy.__version__  # its fixes change between versions
        return p

    def process(self, batch: pa.Table, text: TextState | None = None) -> StageResult:
        if text is not None:
            text = self.text_state(batch, text)
        old = batch.column("text").combine_chunks()
        if not pa.types.is_string(old.type):
            old = old.cast(pa.string())
        new, fixed, removed = self.normalizer().normalize(old)
        delta = (pc.fill_null(pc.utf8_length(new), 0).to_numpy(zero_copy_only=False).astype(np.int64)
                 - pc.fill_null(pc.utf8_length(old), 0).to_numpy(zero_copy_only=False).astype(np.int64))
        table = replace_column(batch, "text", new)
        table = replace_column(table, "normalize_fixed", pa.array(fixed, pa.bool_()))
        table = replace_column(table, "normalize_lines_removed", pa.array(removed, pa.int32()))
        table = replace_column(table, "normalize_chars_delta", pa.array(delta, pa.int32()))
        return StageResult.keep_all(table, rewritten_state(old, new, text, batch.schema.field("text")))
