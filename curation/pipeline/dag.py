"""A pipeline DAG in YAML -> a validated graph of stages.

```yaml
name: demo
inputs:
  crawl: {format: warc, paths: ["tests/data/warc/*.warc.gz"], source: web}
stages:
  extract: {type: extract, input: crawl}
  gopher:  {type: gopher_quality}          # input defaults to the stage above
  merged:  {type: union, inputs: [gopher, math]}
output: merged
```

``type`` defaults to the stage's name when that is a stage type, and ``input`` to the previous
stage in the file (or the only input). ``type: package.module:ClassName`` is a stage class of
the user's own (a ``MapStage`` or ``GlobalStage`` subclass; its module is imported, or found
next to the DAG file). ``stages`` may also be a list of one-key mappings.
Every mistake is reported as one line naming the file and the field, before anything runs.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from curation.formats.documents import DOC_SCHEMA, PAYLOAD_COLUMNS
from curation.io.inputs import InputSpec
from curation.stages import Stage, registry
from curation.stages.base import StageTypeError
from curation.stages.paths import PathRefused


class DagError(ValueError):
    """A DAG file that cannot run; the message names the file and the field."""


class StageModuleRefused(DagError):
    """A ``module:Class`` stage whose module is not on the allow-list in force (the service's
    ``--stage-modules``). Raised before anything is imported. ``brief``: the message without
    the DAG file's location (for clients that must not learn server paths)."""

    def __init__(self, where: str, stage: str, brief: str):
        super().__init__(f"{where}: {brief}")
        self.stage = stage
        self.brief = brief


# ---------------------------------------------------------------------------------------------
# which modules a ``type: module:Class`` stage may come from

#: None: any importable module (the CLI: the user owns the process). A tuple of module
#: prefixes: only those (``mypkg`` allows ``mypkg`` and ``mypkg.sub``, not ``mypkg2``), and no
#: error message names a file on this machine. The service sets it for every request; a
#: process's own (``refinery run --stage-modules``, or the service's run processes) is
#: ``REFINERY_STAGE_MODULES`` when that is set, even empty (built-in stages only): every DAG
#: the process parses is held to it, other runs' ``dag.yaml`` included, and Ray workers
#: started from the process inherit it.
_STAGE_MODULES: ContextVar[tuple[str, ...] | None] = ContextVar("refinery_stage_modules", default=None)
STAGE_MODULES_ENV = "REFINERY_STAGE_MODULES"
_MODULE_PREFIX = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_log = logging.getLogger("refinery.stage_modules")


def parse_stage_modules(values: Any) -> tuple[str, ...]:
    """Module prefixes from ``"a,b"`` or a list of them; ValueError on anything that is not a
    dotted Python name (a prefix never matches a path or a pattern)."""
    items = values.split(",") if isinstance(values, str) else list(values or ())
    out: list[str] = []
    for v in items:
        for part in str(v).split(","):
            part = part.strip()
            if not part:
                continue
            if not _MODULE_PREFIX.match(part):
                raise ValueError(f"stage module {part!r}: a module prefix is a dotted Python name (mypkg, mypkg.filters)")
            out.append(part)
    return tuple(dict.fromkeys(out))


@contextmanager
def stage_modules_allowed(prefixes: Any):
    """Within this block (this thread / task and what it spawns with the context), a
    ``module:Class`` stage type loads only from modules under ``prefixes``."""
    token = _STAGE_MODULES.set(parse_stage_modules(prefixes))
    try:
        yield
    finally:
        _STAGE_MODULES.reset(token)


def stage_modules_in_force() -> tuple[str, ...] | None:
    """The allow-list of this context, else the process's (``REFINERY_STAGE_MODULES``), else
    None (any module). ValueError if the variable holds something other than module names."""
    ctx = _STAGE_MODULES.get()
    if ctx is not None:
        return ctx
    env = os.environ.get(STAGE_MODULES_ENV)
    return None if env is None else _parse_env(env)


@lru_cache(maxsize=8)
def _parse_env(value: str) -> tuple[str, ...]:
    try:
        return parse_stage_modules(value)
    except ValueError as e:
        raise ValueError(f"{STAGE_MODULES_ENV}: {e}") from None


def stage_module_allowed(stype: str, allowed: tuple[str, ...] | None) -> bool:
    """Whether a stage ``type`` may be loaded under ``allowed`` (built-in names always may)."""
    if ":" not in stype or allowed is None:
        return True
    module = stype.partition(":")[0]
    return any(module == p or module.startswith(p + ".") for p in allowed)


def refused_stage_types(data: Any, allowed: tuple[str, ...] | None) -> list[tuple[str, str]]:
    """``(stage name, type)`` of every ``module:Class`` stage in a raw (unvalidated) DAG mapping
    that ``allowed`` does not cover: a check that imports nothing."""
    stages = data.get("stages") if isinstance(data, dict) else None
    items: list[tuple[Any, Any]] = []
    if isinstance(stages, dict):
        items = list(stages.items())
    elif isinstance(stages, list):
        items = [kv for item in stages if isinstance(item, dict) for kv in item.items()]
    out = []
    for name, params in items:
        stype = params.get("type") if isinstance(params, dict) else None
        if isinstance(stype, str) and not stage_module_allowed(stype, allowed):
            out.append((str(name), stype))
    return out


def stage_module_refusal(stype: str, allowed: tuple[str, ...]) -> str:
    """Why a ``module:Class`` stage type outside the operator's allow-list is refused (names
    the allowed modules, or how to allow some; never a file of this machine)."""
    if allowed:
        return (f"{stype!r}: this service loads stages of your own only from the modules its operator "
                f"allowed ({', '.join(allowed)}); use a built-in stage type or one of those")
    return (f"{stype!r}: this service runs built-in stage types only; its operator can allow modules "
            "with `refinery serve --stage-modules mypkg,...`")


#: an input, stage or output name: it becomes a folder of the run directory (``RUN/NAME/``), a
#: SQL view and a shard-key prefix, so it is one plain path part and nothing more
NODE_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def check_node_name(name: Any, field: str) -> str | None:
    """Why ``name`` cannot name a node (None if it can)."""
    from curation.formats.manifest import RESERVED_NAMES

    if not isinstance(name, str) or not NODE_NAME.match(name) or ".." in name:
        return (f"{field}: {str(name)[:80]!r} is not a node name (1-128 letters, digits, '_', '.', '-'; "
                "starting with a letter, digit or '_'; no '..')")
    if name in RESERVED_NAMES:
        return f"{field}: {name!r} is a name the run directory uses itself; choose another"
    return None


class _DagFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    inputs: dict[str, dict[str, Any]] = Field(min_length=1)
    stages: dict[str, dict[str, Any] | None] | list[dict[str, dict[str, Any] | None]] = Field(default_factory=dict)
    output: str | None = None
    batch_size: int = Field(default=2000, gt=0)
    #: a map task's read batch also closes at this many payload bytes (html, text): stages hold
    #: derived arrays of ~40x their text, so a worker's memory follows this, not the shard
    batch_bytes: int = Field(default=4 << 20, gt=0)
    #: text of rejected rows: a sample per reason per shard (``rejected_text_sample`` rows),
    #: every row, or none; the other columns (id, source, url, signals, reason) always stay
    rejected_text: Literal["sample", "all", "none"] = "sample"
    rejected_text_sample: int = Field(default=20, ge=0)


@dataclass
class Dag:
    """A validated DAG: inputs, stages in topological order, the output node."""

    name: str
    inputs: dict[str, InputSpec]
    stages: dict[str, Stage]  # topological order
    output: str
    batch_size: int
    path: str = "<dag>"
    base_dir: str | None = None  # relative input paths resolve from here (the CWD by default)
    batch_bytes: int = 4 << 20
    rejected_text: str = "sample"
    rejected_text_sample: int = 20

    def upstreams(self, node: str) -> list[str]:
        return self.stages[node].upstreams() if node in self.stages else []

    def _input_hashes(self) -> dict[str, str]:
        return {name: hashlib.sha256(json.dumps(spec.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]
                for name, spec in self.inputs.items()}

    def hashes(self) -> dict[str, str]:
        """params hash per node; a node's hash covers everything upstream of it."""
        out = self._input_hashes()
        for name, st in self.stages.items():
            out[name] = st.params_hash([out[u] for u in st.upstreams()])
        return out

    def same_up_to_thresholds(self, other: dict) -> bool:
        """Whether ``other`` (a stored ``dag.yaml``) is this DAG up to rule thresholds: the same
        nodes and output and, per node, the same signal hash (every parameter but map filters'
        thresholds). Then a rerun into the same run directory re-decides from stored signals."""
        try:
            before = parse_dag(other, "dag.yaml")
        except (DagError, ValueError, TypeError, OSError):
            return False  # the stored DAG no longer parses (a stage module gone...): not the same DAG
        return (set(before.stages) == set(self.stages) and set(before.inputs) == set(self.inputs)
                and before.output == self.output and before.signal_hashes() == self.signal_hashes())

    def signal_hashes(self) -> dict[str, str]:
        """Per node, what a row's measured signals depend on: every parameter upstream of it
        except rule thresholds (``Stage.signals_hash``). A document reaching a stage with the
        same signal hash as before has the same content, so its stored signals can be reused
        whatever thresholds upstream filters used to let it through. Global stages see the
        whole corpus, so theirs is their full params hash."""
        out = self._input_hashes()
        full = self.hashes()
        for name, st in self.stages.items():
            out[name] = full[name] if st.kind == "global" else st.signals_hash([out[u] for u in st.upstreams()])
        return out

    def columns(self, node: str) -> set[str] | None:
        """The columns ``node``'s rows have, as far as the stages declare them (``columns``
        plus their rules' signals); None when a stage upstream does not say (a user stage
        without declarations, a stage that rewrites rows into something else)."""
        if node in self.inputs:
            if self.inputs[node].format == "run":
                return None  # another run's rows: their columns are known once read
            fmt = self.inputs[node].format
            extra = {"html", "charset"} if fmt in ("warc", "cc_index") else set()
            if fmt == "cc_index":  # the index's language and mime on every document
                from curation.io.cc_select import DOC_COLUMNS

                extra |= set(DOC_COLUMNS)
            return set(DOC_SCHEMA.names) | extra
        st = self.stages[node]
        if st.kind == "union":
            cols = [self.columns(u) for u in st.upstreams()]
            return None if any(c is None for c in cols) else set.intersection(*cols)
        return st.output_columns(self.columns(st.input) if st.input else set())

    def to_dict(self) -> dict[str, Any]:
        """The DAG as run, with defaults filled in (written to RUN/dag.yaml)."""
        return {
            "name": self.name,
            "inputs": {k: v.model_dump(mode="json") for k, v in self.inputs.items()},
            "stages": {k: v.model_dump(mode="json", exclude_none=True) for k, v in self.stages.items()},
            "output": self.output,
            "batch_size": self.batch_size,
            "batch_bytes": self.batch_bytes,
            "rejected_text": self.rejected_text,
            "rejected_text_sample": self.rejected_text_sample,
        }

    # -- what a map stage writes --------------------------------------------------------------

    def own_columns(self, node: str) -> tuple[str, ...] | None:
        """The columns a map stage sets itself (``text`` when it rewrites it, its declared
        ``columns``, its rules' signals); None when the stage does not declare them."""
        st = self.stages[node]
        if st.kind != "map" or not st.declares_columns():
            return None
        # a rule may read the text itself ("empty"): that is the input's, not the stage's
        signals = [s for s in st.signal_columns() if s not in PAYLOAD_COLUMNS]
        own = (["text"] if st.rewrites_text else []) + list(st.columns) + signals
        return tuple(dict.fromkeys(own))

    def leaves(self, node: str) -> list[str]:
        """The nodes whose shards make up ``node``: itself, or a union's branches (recursively).
        The one place a union is resolved."""
        st = self.stages.get(node)
        if st is None or st.kind != "union":
            return [node]
        return [leaf for u in st.upstreams() for leaf in self.leaves(u)]

    def read_from_disk(self) -> set[str]:
        """Nodes whose whole rows something reads back from their shards: the output's and every
        global stage's upstreams (unions resolved)."""
        ups = [self.output] + [u for st in self.stages.values() if st.kind == "global" for u in st.upstreams()]
        return {leaf for u in ups for leaf in self.leaves(u)}

    def writes_rows(self, node: str) -> bool:
        """Whether a map stage's shards hold whole rows; otherwise they hold ``id`` and the
        stage's own columns, and whole rows are its input's joined by id (the text is written
        once per branch: where it changes, and where something reads it back)."""
        st = self.stages[node]
        if st.kind != "map" or st.materialize or st.rewrites_text or node in self.read_from_disk():
            return True
        if self.own_columns(node) is None:
            return True
        # the rows it is joined to must be on disk: an input feeding it is read straight into
        # the task (not materialized) unless a union or global stage consumes it
        return any(leaf in self.inputs and not self.input_materialized(leaf) for leaf in self.feeders(node))

    def feeders(self, node: str) -> list[str]:
        """The nodes whose rows a map stage takes (its input, unions resolved)."""
        return self.leaves(self.stages[node].input)

    def input_materialized(self, name: str) -> bool:
        """An input's documents are written as shards when a union or global stage consumes it
        (a map stage's task streams them straight in)."""
        return any(name in s.upstreams() for s in self.stages.values() if s.kind != "map")


def _fmt_loc(prefix: str, loc: tuple) -> str:
    return ".".join([prefix] + [str(p) for p in loc if p != "__root__"])


def _first_error(e: ValidationError, prefix: str) -> str:
    err = e.errors()[0]
    more = f" (+{len(e.errors()) - 1} more)" if len(e.errors()) > 1 else ""
    got = f" (got {err['input']!r})" if err["type"] != "missing" and not isinstance(err.get("input"), dict) else ""
    return f"{_fmt_loc(prefix, err['loc'])}: {err['msg']}{got}{more}"


def _search_paths(path: str, base_dir: str | None, dag_dir: bool = True) -> list[str]:
    """Where a user stage's module is also looked for: the DAG file's folder (``dag_dir``),
    then the folder relative inputs resolve from (the CWD by default)."""
    out = [str(Path(path).resolve().parent)] if dag_dir and path and not path.startswith("<") else []
    return out + [str(Path(base_dir or ".").resolve())]


def parse_dag(data: Any, path: str = "<dag>", base_dir: str | None = None, dag_dir_code: bool = True) -> Dag:
    """Validate a DAG given as parsed YAML. Raises DagError with one clear line.

    A ``module:Class`` stage whose module is not importable is also looked for next to the DAG
    file (unless ``dag_dir_code`` is false: a run directory's ``dag.yaml``, whose folder holds
    data, never code) and in ``base_dir``; never under an allow-list (``stage_modules_in_force``),
    where only what the operator installed is importable."""
    where = path
    try:
        allowed = stage_modules_in_force()
    except ValueError as e:
        raise DagError(f"{where}: {e}") from None
    if not isinstance(data, dict):
        raise DagError(f"{where}: a DAG is a YAML mapping with name, inputs, stages, output")
    try:
        f = _DagFile.model_validate(data)
    except ValidationError as e:
        raise DagError(f"{where}: {_first_error(e, '')}".replace(": .", ": ")) from None

    inputs = _parse_inputs(f, where)
    search = _search_paths(path, base_dir, dag_dir_code) if allowed is None else []
    stages: dict[str, Stage] = {}
    prev: str | None = next(iter(inputs)) if len(inputs) == 1 else None  # a stage's default input
    seen_names = set(inputs)
    for name, params in _raw_stages(f, where):
        bad = check_node_name(name, "stages")
        if bad:
            raise DagError(f"{where}: {bad}")
        if name in seen_names:
            raise DagError(f"{where}: stages.{name}: name already used by an input or another stage")
        seen_names.add(name)
        stages[name] = _parse_stage(name, params, prev, where, allowed, search)
        prev = name

    nodes = set(inputs) | set(stages)
    for name, st in stages.items():
        for u in st.upstreams():
            if u not in nodes:
                field = "inputs" if st.kind == "union" else "input"
                raise DagError(f"{where}: stages.{name}.{field}: {u!r} is neither an input nor a stage")
    order = _toposort(stages, set(inputs), where)
    output = f.output or (list(stages)[-1] if stages else None)
    if output is None:
        raise DagError(f"{where}: output: a DAG needs at least one stage")
    if output not in stages:
        raise DagError(f"{where}: output: {output!r} is not a stage")
    dag = Dag(f.name, inputs, {n: stages[n] for n in order}, output, f.batch_size, path, base_dir, f.batch_bytes,
              f.rejected_text, f.rejected_text_sample)
    _check_unions(dag, where)
    _check_columns_needed(dag, where)
    return dag


def _parse_inputs(f: _DagFile, where: str) -> dict[str, InputSpec]:
    inputs: dict[str, InputSpec] = {}
    for name, spec in f.inputs.items():
        bad = check_node_name(name, "inputs")
        if bad:
            raise DagError(f"{where}: {bad}")
        try:
            inputs[name] = InputSpec.model_validate(spec)
        except ValidationError as e:
            raise DagError(f"{where}: {_first_error(e, f'inputs.{name}')}") from None
    return inputs


def _raw_stages(f: _DagFile, where: str) -> list[tuple[str, dict[str, Any]]]:
    """(name, params) of each stage: ``stages`` is a mapping, or a list of one-entry mappings."""
    if not isinstance(f.stages, list):
        return [(n, dict(p or {})) for n, p in f.stages.items()]
    out = []
    for i, item in enumerate(f.stages):
        if len(item) != 1:
            raise DagError(f"{where}: stages[{i}]: each list item is one `name: {{params}}` mapping")
        (name, params), = item.items()
        out.append((name, dict(params or {})))
    return out


def _parse_stage(name: str, params: dict[str, Any], prev: str | None, where: str, allowed, search: list[str]) -> Stage:
    """One stage entry validated: its type resolved (a ``module:Class`` only from an allowed
    module), the defaults a DAG fills in (``type`` from the name, ``input`` from the stage above,
    the type's ``node_defaults``), then its fields."""
    stype = params.setdefault("type", name if name in registry else None)
    if stype is None:
        raise DagError(f"{where}: stages.{name}.type: missing (known types: {', '.join(sorted(registry))})")
    if not stage_module_allowed(str(stype), allowed):
        raise StageModuleRefused(where, name, f"stages.{name}.type: {stage_module_refusal(str(stype), allowed)}")
    try:
        cls = registry.resolve(str(stype), search)
    except StageTypeError as e:
        if allowed is not None and ":" in str(stype):
            # the import error may name files on this machine: those go to the log only
            _log.warning("%s: stages.%s.type: %s", where, name, e)
            raise DagError(f"{where}: stages.{name}.type: cannot load {str(stype)!r} from an allowed module "
                           "(the service's log has the reason)") from None
        raise DagError(f"{where}: stages.{name}.type: {e}") from None
    for key, value in cls.node_defaults(name).items():
        params.setdefault(key, value)
    if cls.kind != "union" and "input" not in params:
        if prev is None:
            raise DagError(f"{where}: stages.{name}.input: missing (several inputs; say which one)")
        params["input"] = prev
    try:
        return cls.variant(params).model_validate(params)
    except ValidationError as e:
        raise DagError(f"{where}: {_first_error(e, f'stages.{name}')}") from None
    except PathRefused as e:  # a path parameter the guard in force refuses (the service's roots)
        raise type(e)(f"{where}: stages.{name}.{e}") from None


def _check_columns_needed(dag: Dag, where: str) -> None:
    """A stage naming a column its rows will not have (``Stage.columns_needed``) fails now,
    with the column list."""
    for name, st in dag.stages.items():
        needed = st.columns_needed() if st.input else {}
        have = dag.columns(st.input) if needed else None
        if have is None:
            continue  # nothing needed, or a stage upstream does not declare its columns: checked on the first batch
        for field, cols in needed.items():
            missing = sorted(cols - have)
            if missing:
                raise DagError(f"{where}: stages.{name}.{field}: no column {', '.join(map(repr, missing))} in the "
                               f"rows of {st.input!r}; they have: {', '.join(sorted(have))}")


def _toposort(stages: dict[str, Stage], inputs: set[str], where: str) -> list[str]:
    done: set[str] = set(inputs)
    order: list[str] = []
    pending = list(stages)
    while pending:
        ready = [n for n in pending if all(u in done for u in stages[n].upstreams())]
        if not ready:
            raise DagError(f"{where}: stages: cycle among {', '.join(pending)}")
        for n in ready:
            order.append(n)
            done.add(n)
        pending = [n for n in pending if n not in done]
    return order


def roots(dag: Dag, node: str) -> set[str]:
    """The inputs and global stages whose shards flow into ``node`` unchanged in key."""
    if node in dag.inputs:
        return {node}
    st = dag.stages[node]
    if st.kind == "global":
        return {node}
    out: set[str] = set()
    for u in st.upstreams():
        out |= roots(dag, u)
    return out


def _check_unions(dag: Dag, where: str) -> None:
    # Shards are named after the input (or global stage) they came from, so the branches a union
    # joins must come from different roots or two shards would share a name.
    for name, st in dag.stages.items():
        if st.kind != "union":
            continue
        seen: set[str] = set()
        for u in st.upstreams():
            r = roots(dag, u)
            if r & seen:
                raise DagError(f"{where}: stages.{name}.inputs: branches share the root {sorted(r & seen)[0]!r}; "
                               "a union joins branches of different inputs")
            seen |= r


def load_dag(path: str | Path) -> Dag:
    """Read and validate a DAG YAML file."""
    p = Path(path)
    if not p.exists():
        raise DagError(f"{path}: no such DAG file")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        raise DagError(f"{path}: invalid YAML: {e}".replace("\n", " ")) from None
    return parse_dag(data, str(path))
