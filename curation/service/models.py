"""Response models of the service's routes (for /docs; extra keys pass through)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class RunSummary(_Open):
    """One run in the list: state and overall progress (0..1)."""

    id: str
    name: str | None = None
    state: str
    error: str | None = None
    submitted: float | None = None
    started: float | None = None
    finished: float | None = None
    elapsed_s: float | None = None
    progress: float = 0.0
    attempt: int | None = None


class RunDetail(RunSummary):
    """A run with per-phase progress and per-stage counters from progress.json."""

    phases: dict[str, dict[str, int]] = {}
    stages: list[dict[str, Any]] = []
    nodes: list[str] = []
    log_tail: str = ""


class RunStats(_Open):
    """The tables of ``refinery stats``, plus histograms when the columns exist."""

    stages: list[dict[str, Any]]
    top_reasons: list[dict[str, Any]]
    output: dict[str, Any]
    columns: list[str]
    languages: list[dict[str, Any]] | None = None
    quality_histogram: list[dict[str, Any]] | None = None
    tokens_by_source: dict[str, int] | None = None


class SqlAnswer(_Open):
    """Rows of a read-only query; ``truncated`` when the row limit cut it."""

    columns: list[str]
    types: list[str]
    rows: list[list[Any]]
    truncated: bool
    truncated_cells: int
    limit: int
    elapsed_s: float


class StageSummary(_Open):
    """A node with shards of its own: kept and rejected rows from its manifest."""

    stage: str
    type: str
    kind: str
    shards: int
    kept: int
    rejected: int
    kept_written: bool


class StageDetail(StageSummary):
    """A stage's columns, numeric signal columns (its own rules' first), rules with this run's
    thresholds, per-column threshold points, and rejection reasons with counts."""

    columns: list[dict[str, Any]]
    signals: list[str]
    rule_signals: list[str]
    rules: list[dict[str, Any]]
    thresholds: dict[str, list[dict[str, Any]]]
    reasons: list[dict[str, Any]]


class DocumentsPage(_Open):
    """Documents ``offset .. offset+limit`` of ``total``: text (cut to ``max_chars``, with its
    full length ``text_chars``) and every other column of the row under ``fields``."""

    stage: str
    which: str
    reason: str | None = None
    offset: int
    limit: int
    total: int
    documents: list[dict[str, Any]]


class SignalHistogram(_Open):
    """Bins [lo, hi) with kept / rejected counts; ``rows`` = bins + below + above + nulls.
    ``thresholds``: where the stage's rules drop, from the DAG as run."""

    stage: str
    column: str
    rows: int
    bins: list[dict[str, Any]]
    below: int
    above: int
    nulls: int
    thresholds: list[dict[str, Any]]


class EvalReport(_Open):
    """A stage's latest ``refinery eval`` report of one kind (``RUN/STAGE/_eval_<kind>.json``):
    when it was written (``modified``, epoch seconds), its headline figures (``unit``: share,
    count or rate) and the tables ``refinery eval`` printed; ``error`` when the file is not a
    report."""

    stage: str
    kind: str
    file: str
    modified: float | None = None
    target: str | None = None
    headline: list[dict[str, Any]] = []
    tables: list[dict[str, Any]] = []
    error: str | None = None
