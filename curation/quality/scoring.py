"""A table's documents scored by a fastText quality classifier: the scores both quality stages
write (``quality``, float32, null where a document has no text)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc


def has_text(texts: pa.Array) -> np.ndarray:
    if len(texts) == 0:
        return np.zeros(0, bool)
    m = pc.match_substring_regex(texts, r"\S")  # RE2 stops at the first non-space character
    return m.fill_null(False).to_numpy(zero_copy_only=False)


def score_table(table: pa.Table, model: str, positive_label: str | None) -> tuple[np.ndarray, np.ndarray]:
    """(scores float32, has_text bool) for a table's ``text`` column; no-text rows score NaN."""
    from curation.quality.classifier import load_scorer

    if "text" not in table.column_names:
        raise ValueError(f"quality: input has no 'text' column (columns: {table.column_names})")
    texts = table.column("text").combine_chunks() if table.num_rows else pa.array([], pa.string())
    has = has_text(texts)
    scores = np.full(len(texts), np.nan, np.float32)
    if has.any():
        scorer = load_scorer(model, "quality.model", positive_label)
        scores[has] = scorer.score(texts.filter(pa.array(has)))
    return scores, has


def with_quality(table: pa.Table, scores: np.ndarray) -> pa.Table:
    """The table with its ``quality`` column (replaced if there was one; NaN scores as null)."""
    table = table.drop_columns(["quality"]) if "quality" in table.column_names else table
    return table.append_column("quality", pa.array(scores, pa.float32(), mask=np.isnan(scores)))
