"""What a stage is: typed parameters (a pydantic model) plus one batch method.

Three kinds:
- ``MapStage``: row-local. ``process(batch, text=None) -> StageResult``. Consecutive map
  stages fuse into one Ray task per shard (read once, write once).
- ``GlobalStage``: needs to see the whole corpus (dedup, mix, pack, corpus quantiles).
  ``run(ctx)`` drives its own Ray phases through a ``StageContext`` (``curation.stages.context``).
- ``UnionStage``: concatenates several upstreams; writes nothing itself.

A filter never silently drops: ``StageResult.reasons`` holds, per row, ``None`` (kept)
or a reason string such as ``gopher_quality:mean_word_length``. The executor sends
rejected rows, with every signal column the stage measured, to ``rejected/STAGE/``.

Text state (``curation.text.state.TextState``): the words, lines and paragraphs of a batch's
text, computed lazily and at most once, handed from one fused stage to the next instead of
being split again. A map stage is called as ``stage.run_batch(batch, text)`` (the executor's
entry point) with the state of ``batch``'s text column or ``None`` (then the stage builds one
if it needs one); ``StageResult.text`` is the state of ``result.table``'s text (row for row),
or ``None`` when the stage does not provide one. The executor passes
``result.text.take(kept_indices)`` to the next stage, together with the kept rows.
Stages written before text states (``process(self, batch)``) keep working: such a
``process`` is wrapped when the class is created so that ``process(batch, text)`` ignores
``text``, and their results carry no state (the next stage builds its own).

Measure once, decide cheaply: a stage with ``rules`` (the heuristic filters, langid)
separates what it *measures* (signal columns, and for C4 the rewritten text:
``measure(batch, text) -> (table, text_state)``) from what it *decides* from them
(``decide(table) -> reasons``: its ``Rule`` table, checked in order, the first violated
rule giving the reason). ``decide`` reads only the table's columns, so the rows ``run_batch``
returned, written to Parquet and read back, can be re-decided with other thresholds without
any text processing. The parameters that only feed rules (thresholds) are left out of
``signal_params()`` / ``signals_hash()``; everything else (and ``params_hash``) covers them.
``run_batch`` of a stage with rules returns exactly ``measure`` + ``decide``; ``process`` is
the same except where a stage documents otherwise (C4's ``process`` puts the original text
back on the pages it drops, as it always did; its measured rows keep the text C4 would write
on pages only a threshold drops, so that re-deciding can keep them).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Iterable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import BaseModel, ConfigDict

from curation.io.shards import split_kept_rejected

if TYPE_CHECKING:  # pragma: no cover
    from curation.stages.context import StageContext
    from curation.text.state import TextState

#: Bump when a stage's output for the same parameters changes meaning; part of every params hash.
ALGORITHM_VERSION = 1


#: the reason a row dropped by a boolean keep mask gets (``StageResult(t, keep_mask)``)
MASK_REASON = "dropped"


def normalize_reasons(reasons: Any, n_rows: int) -> pa.Array:
    """A stage's reasons -> a string ``pa.Array`` of ``n_rows`` (null = keep).

    Accepted: a pyarrow Array or ChunkedArray of strings (null = keep; dictionary, large_string
    and all-null arrays are cast), a boolean pyarrow or numpy array or a list of bools: a keep mask
    (True = keep, False = dropped with reason ``MASK_REASON``), a numpy string/object array or a
    list of ``str | None``."""
    if isinstance(reasons, pa.ChunkedArray):
        reasons = reasons.combine_chunks() if reasons.num_chunks else pa.array([], pa.string())
    elif isinstance(reasons, np.ndarray):
        if reasons.ndim != 1:
            raise TypeError(f"StageResult reasons: a 1-d array is needed, got shape {reasons.shape}")
        reasons = pa.array(reasons) if reasons.dtype == bool else pa.array(reasons.tolist(), pa.string())
    elif isinstance(reasons, (list, tuple)):
        kinds = {type(r) for r in reasons if r is not None}
        reasons = pa.array(reasons, pa.bool_() if kinds <= {bool, np.bool_} and kinds else pa.string())
    elif not isinstance(reasons, pa.Array):
        raise TypeError("StageResult reasons: a pyarrow Array or ChunkedArray, a numpy array, a list or None, "
                        f"got {type(reasons).__name__}")
    if len(reasons) != n_rows:
        raise ValueError(f"StageResult reasons: {len(reasons)} values for a table of {n_rows} rows")
    t = reasons.type
    if pa.types.is_boolean(t):
        return pc.if_else(pc.fill_null(reasons, False), pa.scalar(None, pa.string()), pa.scalar(MASK_REASON))
    if pa.types.is_dictionary(t):
        reasons, t = reasons.dictionary_decode(), t.value_type
    if pa.types.is_string(t):
        return reasons
    if pa.types.is_large_string(t) or pa.types.is_string_view(t) or pa.types.is_null(t):
        return reasons.cast(pa.string())
    raise TypeError(f"StageResult reasons: strings (null = keep) or a boolean keep mask, got {t}")


@dataclass
class StageResult:
    """A processed batch: all rows (with signal columns added), a drop reason per row and,
    optionally, the text state of ``table``'s text column (row for row)."""

    table: pa.Table
    reasons: pa.Array | None = None  # string array, null = keep; None = keep everything
    text: TextState | None = None  # None: the next stage builds its own

    def __post_init__(self):
        # Normalised once here, so every consumer (executor, evals) sees one type: a user's stage
        # returns whatever its pyarrow/numpy idiom gives (a ChunkedArray from a table column, a
        # numpy keep mask, a list of strings or Nones).
        if self.reasons is not None:
            self.reasons = normalize_reasons(self.reasons, self.table.num_rows)

    @classmethod
    def keep_all(cls, table: pa.Table, text: TextState | None = None) -> StageResult:
        return cls(table, None, text)

    def split(self, stage: str) -> tuple[pa.Table, pa.Table | None]:
        """Kept rows, and rejected rows with ``stage`` and ``reason`` columns (None if none
        dropped): what a global stage's task writes through its ``out`` (``out.write(*r.split(
        out.stage), rows_in)``), with the reasons normalised as a map stage's are."""
        return split_kept_rejected(self.table, self.reasons, stage)


@dataclass(frozen=True)
class Resources:
    """What one task of a stage needs, as NeMo Curator's ``Resources``: Ray reserves it, so a
    node runs only as many tasks as it has CPUs and memory for."""

    cpus: float = 1.0
    memory_mb: int | None = None
    gpus: float = 0.0

    def ray_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_cpus": self.cpus}
        if self.memory_mb:
            opts["memory"] = int(self.memory_mb) * 1024 * 1024
        if self.gpus:
            opts["num_gpus"] = self.gpus
        return opts

    @staticmethod
    def most(items: Iterable[Resources]) -> Resources:
        """What a fused task running several stages needs: the most of each."""
        items = list(items) or [Resources()]
        mems = [r.memory_mb for r in items if r.memory_mb]
        return Resources(max(r.cpus for r in items), max(mems) if mems else None, max(r.gpus for r in items))


# ---------------------------------------------------------------------------------------------
# Rules: a decision over measured columns
# ---------------------------------------------------------------------------------------------

#: A letter in any script, as RE2 sees it: on every character Python's Unicode tables know,
#: the same as Python's ``[^\W\d_]`` (letters and non-decimal numerals such as "½" or "²").
LETTER_RE2 = r"[\p{L}\p{Nl}\p{No}]"


@dataclass(frozen=True)
class Rule:
    """One drop rule of a stage: ``<stage type>:<name>`` when the signal column(s) fail ``op``.

    - ``name``: the reason's suffix. ``{value}`` in it is replaced by the row's signal value
      (langid's ``lang={value}``).
    - ``signal``: the column (or columns) the rule reads in the measured table.
    - ``op``: the comparison, one of ``OPS`` (``"<"``, ``">"``, ``"outside"``, ...).
    - ``param``: the stage field (or fields, in the order the op takes them) holding the
      threshold; ``None`` for a rule without threshold (always checked). A field whose value
      is ``None`` switches the rule off. A field holding a dict (Gopher's
      ``top_n_grams: {2: 0.2, ...}``) makes one rule per key, in the dict's order, with
      ``{n}`` in ``name`` and ``signal`` replaced by the key: the keys decide which signals are
      measured (they stay in ``signal_params``), the values are the thresholds.

    Comparisons never fire on NaN or null, except where the op says so (``"< or null"``,
    ``"empty"``, ...).
    """

    name: str
    signal: str | tuple[str, ...]
    op: str
    param: str | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise ValueError(f"rule {self.name!r}: unknown op {self.op!r} (one of {', '.join(OPS)})")
        if len(self.params) != OPS[self.op].n_params:
            raise ValueError(f"rule {self.name!r}: op {self.op!r} takes {OPS[self.op].n_params} param(s)")

    @property
    def params(self) -> tuple[str, ...]:
        return () if self.param is None else (self.param,) if isinstance(self.param, str) else tuple(self.param)

    @property
    def signals(self) -> tuple[str, ...]:
        return (self.signal,) if isinstance(self.signal, str) else tuple(self.signal)

    def bind(self, stage: Stage) -> list[BoundRule]:
        """This rule with the stage's thresholds: one ``BoundRule`` (or one per dict key)."""
        values = [getattr(stage, p) for p in self.params]
        keyed = [i for i, v in enumerate(values) if isinstance(v, dict)]
        if not keyed:
            return [BoundRule(self.name, self.signals, self.op, tuple(values), self.params)]
        if len(keyed) > 1:
            raise ValueError(f"rule {self.name!r}: at most one dict-valued param")
        k = keyed[0]
        out = []
        for key, value in values[k].items():
            vals = tuple(value if i == k else v for i, v in enumerate(values))
            names = tuple(f"{p}[{key}]" if i == k else p for i, p in enumerate(self.params))
            out.append(BoundRule(self.name.replace("{n}", str(key)),
                                 tuple(s.replace("{n}", str(key)) for s in self.signals), self.op, vals, names))
        return out


@dataclass(frozen=True)
class BoundRule:
    """A rule with its thresholds (``values``, one per ``Rule.params``) filled in."""

    name: str
    signals: tuple[str, ...]
    op: str
    values: tuple[Any, ...]
    params: tuple[str, ...] = ()

    def violated(self, table: pa.Table) -> np.ndarray:
        """Per row, whether the rule fires (all false when switched off)."""
        n = table.num_rows
        op = OPS[self.op]
        if op.n_params and any(v is None for v in self.values[: op.required]):
            return np.zeros(n, dtype=bool)
        missing = [s for s in self.signals if s not in table.column_names]
        if missing:
            raise KeyError(f"rule {self.name!r} reads column(s) {missing} the table does not have")
        return op.check([table.column(s) for s in self.signals], self.values)

    def reasons(self, prefix: str, table: pa.Table) -> pa.Array | None:
        """Per-row reason strings when the name holds ``{value}``, else None."""
        if "{value}" not in self.name:
            return None
        head, _, tail = self.name.partition("{value}")
        col = table.column(self.signals[0]).cast(pa.string())
        return pc.binary_join_element_wise(pa.scalar(prefix + head), col, pa.scalar(tail), "")


def _values(col) -> np.ndarray:
    """A numeric column as numpy (nulls as NaN)."""
    return col.to_numpy() if isinstance(col, pa.ChunkedArray) else col.to_numpy(zero_copy_only=False)


def _flags(arr, null: bool = False) -> np.ndarray:
    """A boolean Arrow column as numpy, nulls as ``null``."""
    arr = pc.fill_null(arr, null)
    return _values(arr).astype(bool)


def _cmp(fn, col, value) -> np.ndarray:
    if value is None:
        return np.zeros(len(col), dtype=bool)
    with np.errstate(invalid="ignore"):
        return np.asarray(fn(_values(col), value), dtype=bool)


def _below_unless_zero(cols, v) -> np.ndarray:
    low = _cmp(np.less, cols[0], v[0])
    return low & (_values(cols[0]) != 0) if v[1] else low


def _blank(cols, v) -> np.ndarray:
    from curation.text.chars import PY_WHITESPACE, re2_class  # noqa: PLC0415

    return _flags(pc.match_substring_regex(cols[0], f"^[{re2_class(PY_WHITESPACE)}]*$"), null=True)


@dataclass(frozen=True)
class Op:
    n_params: int
    check: Any  # (columns, threshold values) -> bool array
    render: Any  # (param names) -> comparison in words, for docs
    required: int | None = None  # how many leading params switch the rule off when None (None: all)

    def __post_init__(self) -> None:
        if self.required is None:
            object.__setattr__(self, "required", self.n_params)


#: What a ``Rule.op`` can be. ``check`` gets the signal columns and the threshold values.
OPS: dict[str, Op] = {
    "<": Op(1, lambda c, v: _cmp(np.less, c[0], v[0]), lambda p: f"< `{p[0]}`"),
    ">": Op(1, lambda c, v: _cmp(np.greater, c[0], v[0]), lambda p: f"> `{p[0]}`"),
    # either bound None: that side is off
    "outside": Op(2, lambda c, v: _cmp(np.less, c[0], v[0]) | _cmp(np.greater, c[0], v[1]),
                  lambda p: f"outside [`{p[0]}`, `{p[1]}`]", required=0),
    # FineWeb's line_punct_exclude_zero: with the flag set, 0 passes
    "< unless 0": Op(2, _below_unless_zero, lambda p: f"< `{p[0]}` (0 passes if `{p[1]}`)", required=1),
    "< or null": Op(1, lambda c, v: _flags(pc.is_null(c[0])) | _cmp(np.less, c[0], v[0]),
                    lambda p: f"null or < `{p[0]}`"),
    "not in": Op(1, lambda c, v: _flags(pc.invert(pc.is_in(c[0], value_set=pa.array(v[0], c[0].type))))
                 & _flags(pc.is_valid(c[0])), lambda p: f"not in `{p[0]}`"),
    "empty": Op(0, lambda c, v: _flags(pc.equal(pc.binary_length(c[0]), 0), null=True), lambda p: "null or empty"),
    "blank": Op(0, _blank, lambda p: "null or only whitespace"),
    "no letter": Op(0, lambda c, v: ~_flags(pc.match_substring_regex(c[0], LETTER_RE2)), lambda p: "no letter"),
    "= 0": Op(0, lambda c, v: np.logical_and.reduce([_values(x) == 0 for x in c]), lambda p: "all 0"),
    "true": Op(0, lambda c, v: _flags(c[0]), lambda p: "true"),
}


class Stage(BaseModel):
    """Base of every stage config. Subclasses add typed parameters and register a ``type``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str
    input: str | None = None

    kind: ClassVar[str] = "map"
    #: what an output row is: a document, or (pack) a training row holding many documents
    output_unit: ClassVar[str] = "docs"
    #: what one task of this stage needs (Ray reserves it); heavy stages declare more
    resources: ClassVar[Resources] = Resources()
    #: the stage's drop rules in the order they are checked (see ``Rule``, ``MapStage.decide``)
    rules: ClassVar[tuple[Rule, ...]] = ()
    #: columns the stage adds to its rows besides its rules' signal columns (``select``
    #: expressions are checked against these before a run)
    columns: ClassVar[tuple[str, ...]] = ()
    #: a user stage's code identity (module version, source file hash), set when it is loaded
    #: from ``type: package.module:ClassName``; part of the params hash
    code_version: ClassVar[dict[str, str] | None] = None
    #: whether the stage changes ``text`` (its shards then always hold whole rows)
    rewrites_text: ClassVar[bool] = False

    #: write whole rows (text and every column) even where id + own columns would do
    materialize: bool = False

    @property
    def reason_prefix(self) -> str:
        """What drop reasons start with: the type (a user stage's class name)."""
        return self.type.rpartition(":")[2]

    def upstreams(self) -> list[str]:
        return [self.input] if self.input else []

    @classmethod
    def node_defaults(cls, node: str) -> dict[str, Any]:
        """Parameters a DAG fills in from the stage's node name where its entry leaves them out
        (``select`` names the reason of the rows it drops after its node)."""
        return {}

    def columns_needed(self) -> dict[str, set[str]]:
        """Columns the rows this stage reads must have, by the parameter that names them
        (``select``: its ``where``): the DAG checks them against what the stages upstream
        declare before anything runs."""
        return {}

    @classmethod
    def variant(cls, params: dict[str, Any]) -> type[Stage]:
        """The class a DAG entry of this ``type`` is read as (a type may stand for two stages
        whose kinds differ, e.g. ``quality`` with ``keep_top``)."""
        return cls

    def params(self) -> dict[str, Any]:
        """The parameters that define this stage's output (everything but the wiring)."""
        p = self.model_dump(mode="json", exclude={"input", "inputs", "keep_work", "materialize"})
        if self.code_version:
            p["code"] = self.code_version
        return p

    def params_hash(self, upstream_hashes: list[str]) -> str:
        """Hash of parameters, algorithm version and upstream hashes: changes when output would."""
        payload = json.dumps(
            {"params": self.params(), "version": ALGORITHM_VERSION, "upstream": upstream_hashes},
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def signal_params(self) -> dict[str, Any]:
        """``params()`` without the thresholds: every field a rule reads its threshold from is
        left out, except that a dict-valued one (n-gram size -> threshold) keeps its keys,
        which decide what is measured."""
        p = self.params()
        for field in dict.fromkeys(f for rule in self.rules for f in rule.params):
            value = getattr(self, field)
            if isinstance(value, dict):
                p[field] = sorted(value)
            else:
                p.pop(field, None)
        return p

    def signals_hash(self, upstream_hashes: list[str]) -> str:
        """Hash of the signal parameters, algorithm version and upstream (signal) hashes: what
        the measured rows depend on. Unchanged when only thresholds change; then stored
        measured rows can be re-decided instead of measured again."""
        payload = json.dumps(
            {"signals": self.signal_params(), "version": ALGORITHM_VERSION, "upstream": upstream_hashes},
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    @classmethod
    def declares_columns(cls) -> bool:
        """Whether the stage says which columns it adds (``columns`` or ``rules``): a built-in
        stage always does, a user stage (``code_version`` set) only by declaring them."""
        return "columns" in vars(cls) or bool(cls.rules) or not cls.code_version

    def signal_columns(self) -> list[str]:
        """The columns its rules read, in rule order (dict params expanded)."""
        return [s for rule in self.rules for bound in rule.bind(self) for s in bound.signals]

    def output_columns(self, upstream: set[str] | None) -> set[str] | None:
        """The columns of this stage's rows, given its input's (``upstream``; None: unknown):
        the input's, ``columns`` and its rules' signals; None when the stage does not declare
        them. A stage whose rows are something else overrides it (pack: training rows; export:
        files for other tools, None). ``Dag.columns`` asks this; ``select`` is checked with it."""
        if upstream is None or not self.declares_columns():
            return None
        return upstream | set(self.columns) | set(self.signal_columns())

    def setup(self) -> None:
        """Load models etc. Called once per worker process before the first batch."""


def _accepts_text(fn) -> bool:
    """Whether a ``process`` function takes the ``text`` argument (or any keyword)."""
    params = inspect.signature(fn).parameters.values()
    return any(p.name == "text" or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL) for p in params)


class MapStage(Stage):
    """Row-local stage. Either override ``process`` (a transform, or a filter with its own
    logic), or declare ``rules`` and implement ``measure``: then ``process`` and
    ``run_batch`` are ``measure`` followed by ``decide``.

    A subclass whose ``process`` takes only ``batch`` (written before text states) is
    adapted when the class is created: its ``process(batch, text)`` ignores ``text``.
    """

    kind: ClassVar[str] = "map"

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        own = cls.__dict__.get("process")
        if own is not None and not _accepts_text(own):
            @functools.wraps(own)
            def process(self, batch: pa.Table, text: TextState | None = None) -> StageResult:
                return own(self, batch)

            del process.__wrapped__  # its signature is this one
            cls.process = process
        for rule in cls.rules:
            for field in rule.params:
                if field not in cls.model_fields:
                    raise TypeError(f"{cls.__name__}: rule {rule.name!r} names {field!r}, not a field")

    def process(self, batch: pa.Table, text: TextState | None = None) -> StageResult:
        """Transform one batch of documents; return all rows plus a drop reason per row.

        ``text``: the state of ``batch``'s text column, or None. The default (stages with
        ``rules``) is ``measure`` then ``decide``."""
        if type(self).measure is MapStage.measure:
            raise NotImplementedError(f"{type(self).__name__} implements neither process nor measure")
        table, state = self.measure(batch, text)
        return StageResult(table, self.decide(table), state)

    def run_batch(self, batch: pa.Table, text: TextState | None = None) -> StageResult:
        """What the executor calls on every batch. For a stage with rules: ``measure`` then
        ``decide``, so that ``decide`` applies to ``result.table`` as stored (re-deciding it
        later with other thresholds gives what measuring afresh would). Otherwise
        ``process(batch, text)``."""
        if type(self).measure is not MapStage.measure:
            table, state = self.measure(batch, text)
            return StageResult(table, self.decide(table), state)
        return self.process(batch, text)

    def measure(self, batch: pa.Table, text: TextState | None = None) -> tuple[pa.Table, TextState | None]:
        """The batch with this stage's signal columns (every row, nothing dropped), and the
        state of the returned table's text. Must not depend on thresholds (rule params)."""
        raise NotImplementedError(f"{type(self).__name__} has no measure step")

    def text_state(self, batch: pa.Table, text: TextState | None = None, column: str = "text") -> TextState:
        """``text`` checked against ``batch`` (same rows and bytes), or a new state of its text."""
        from curation.text.state import TextState  # noqa: PLC0415 (the text layer loads compiled code)

        return TextState.of(batch, column) if text is None else text.check(batch, column)

    def bound_rules(self) -> list[BoundRule]:
        """The rules with this stage's thresholds, in order (dict params expanded)."""
        return [b for rule in self.rules for b in rule.bind(self)]

    def decide(self, table: pa.Table) -> pa.Array | None:
        """Per row, ``<type>:<rule>`` of the first rule violated (in order), or null; None when
        the stage has no rules. Reads only ``table``'s columns: no text is split or scanned
        (``empty``/``blank``/``no letter`` look at the text column itself)."""
        if not self.rules:
            return None
        n = table.num_rows
        bound = self.bound_rules()
        code = np.full(n, -1, dtype=np.int64)
        for i, rule in enumerate(bound):
            code[(code < 0) & rule.violated(table)] = i
        names = pa.array([f"{self.reason_prefix}:{r.name}" for r in bound] or [""], pa.string())
        reasons = names.take(pa.array(code, mask=code < 0))
        for i, rule in enumerate(bound):
            if "{value}" in rule.name and (code == i).any():
                reasons = pc.if_else(pa.array(code == i), rule.reasons(f"{self.reason_prefix}:", table), reasons)
        return reasons.combine_chunks() if isinstance(reasons, pa.ChunkedArray) else reasons

    @classmethod
    def rules_markdown(cls, header: bool = True) -> str:
        """The stage's rules as Markdown table rows: reason, signal column(s), comparison,
        default threshold (dict params expanded with their default keys)."""
        stage = cls.model_construct()
        lines = ["| reason | signal | drops when | default |", "|---|---|---|---|"] if header else []
        for rule in stage.bound_rules():
            signals = ", ".join(f"`{s}`" for s in rule.signals)
            default = ", ".join("off" if v is None else f"`{v}`" for v in rule.values) or "—"
            lines.append(f"| `{stage.type}:{rule.name}` | {signals} | {OPS[rule.op].render(rule.params)} | {default} |")
        return "\n".join(lines)


class GlobalStage(Stage):
    kind: ClassVar[str] = "global"

    #: keep the intermediate files (``RUN/STAGE/_work``) after the stage commits (for
    #: debugging); by default they are removed, their size recorded in ``_phases.json``
    keep_work: bool = False

    @abstractmethod
    def run(self, ctx: StageContext) -> None:
        """Read every upstream shard through ``ctx``, write output shards through ``ctx``."""


class StageTypeError(ValueError):
    """A ``type:`` that names no stage class (unknown name, module, class, or wrong base)."""


def _code_version(cls: type) -> dict[str, str]:
    """A user stage's module version and a hash of its source file (what its output depends on)."""
    import sys  # noqa: PLC0415

    module = sys.modules[cls.__module__]
    out = {"module": cls.__module__, "class": cls.__qualname__}
    version = getattr(module, "__version__", None)
    if version is not None:
        out["version"] = str(version)
    try:
        src = inspect.getsourcefile(module)
        if src:
            out["sha256"] = hashlib.sha256(open(src, "rb").read()).hexdigest()[:16]
    except (OSError, TypeError):
        pass  # a module without a source file (compiled, frozen): its version is all there is
    return out


class _Registry(dict):
    def register(self, name: str):
        def deco(cls):
            if name in self:
                raise ValueError(f"stage type {name!r} registered twice")
            self[name] = cls
            return cls

        return deco

    def resolve(self, name: str, search_paths: Iterable[str] = ()) -> type[Stage]:
        """The class of a stage ``type``: a built-in name, or ``package.module:ClassName`` of
        the user's own (imported; if the module is not importable, also looked for in
        ``search_paths``, e.g. the DAG file's folder). Raises ``StageTypeError``."""
        if name in self:
            return self[name]
        known = ", ".join(sorted(k for k in self if ":" not in k))
        if ":" not in name:
            raise StageTypeError(f"unknown stage type {name!r} (known: {known}; or your own as package.module:ClassName)")
        import importlib  # noqa: PLC0415
        import sys  # noqa: PLC0415

        module_name, _, class_name = name.partition(":")
        if not module_name or not class_name.isidentifier():
            raise StageTypeError(f"{name!r}: a stage of your own is named package.module:ClassName")
        try:
            try:
                module = importlib.import_module(module_name)
            except ModuleNotFoundError as e:
                extra = [p for p in dict.fromkeys(str(s) for s in search_paths) if p not in sys.path]
                if e.name != module_name.split(".")[0] or not extra:
                    raise
                sys.path[:0] = extra
                module = importlib.import_module(module_name)
        except Exception as e:  # noqa: BLE001 (any import failure is the user's module's)
            raise StageTypeError(f"cannot import module {module_name!r} for {name!r}: {type(e).__name__}: {e}") from None
        cls = getattr(module, class_name, None)
        if cls is None:
            raise StageTypeError(f"module {module_name!r} ({getattr(module, '__file__', '?')}) has no class {class_name!r}")
        if not (isinstance(cls, type) and issubclass(cls, (MapStage, GlobalStage))):
            raise StageTypeError(f"{name!r} is not a subclass of curation.stages.MapStage or GlobalStage")
        cls.code_version = _code_version(cls)
        self[name] = cls
        return cls

    def user_stages(self) -> dict[str, type[Stage]]:
        """The user stage classes loaded so far, by their ``type``."""
        return {k: v for k, v in self.items() if ":" in k}


#: stage ``type`` name -> class
registry: _Registry = _Registry()
