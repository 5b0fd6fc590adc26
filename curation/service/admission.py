"""Admission: what turns a DAG a client submits (untrusted YAML text) into a DAG the service
will run, every file it reads checked against the allowed roots and pinned.

A refusal is a ``SubmitError`` with its HTTP status (403: a location outside the roots or a stage
module not allowed; 422: invalid; 503: admission ran past its deadline); ``refusal`` is the one
place an exception raised while admitting becomes one. The text is read several times, each
for a reason:

1. ``prescan``: size, bracket nesting, indentation and stage count on the raw text, in linear
   time, before a parser (superlinear in nesting) sees it;
2. ``yaml.parse`` events, to refuse anchors and aliases ("billion laughs") before they expand;
3. ``load_yaml``: the data; input locations (paths, ``run``, ``warc_root``) and ``module:Class``
   stage types are checked on it, before anything is opened or imported;
4. ``parse_dag(data)``: the DAG validated, stage parameters that are paths checked by the
   path guard as they are validated; run parameters priced (Bloom filters, shards);
5. ``parse_dag(pinned)``: the DAG with every glob expanded to the resolved files it matched
   (what was checked is exactly what runs, and a resume reads the same files);
6. a YAML round trip of the pinned DAG: ``refinery run`` refuses a run directory whose
   ``dag.yaml`` reads back to another DAG, so the file the service writes must read back
   to this one. The run process then loads ``dag.yaml`` once more, as any run does.
"""

from __future__ import annotations

import os
import re
import sys
import time
from dataclasses import dataclass
from typing import Any

import yaml

from curation.service.auth import PathPolicy

_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_YamlDumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def dump_yaml(data: Any) -> str:
    """``yaml.safe_dump(data, sort_keys=False)``, with LibYAML when it is there."""
    return yaml.dump(data, Dumper=_YamlDumper, sort_keys=False, allow_unicode=False)


def read_dag_file(path: str | os.PathLike) -> Any:
    """A run's ``dag.yaml`` as data (trusted: the service wrote it), or None if it cannot be
    read or parsed."""
    try:
        with open(path) as f:
            return yaml.load(f.read(), Loader=_YamlLoader)
    except (OSError, yaml.YAMLError):
        return None


class SubmitError(ValueError):
    """A DAG the service will not run; ``status`` is the HTTP status (403 path, 422 invalid)."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status



#: admission limits, checked on the raw text before the YAML parser sees it: a parser (and the
#: validators after it) costs time superlinear in nesting, so 32 KB of ``[`` once held a CPU
#: for minutes. Real DAGs are a few levels deep and a few dozen stages long.
MAX_DAG_CHARS = 1 << 20
MAX_FLOW_DEPTH = 32       # nested ``[`` / ``{``
MAX_INDENT = 160          # leading spaces, ``- `` and ``? `` of one line: block nesting
MAX_STAGES = 200          # stages (and inputs) of one DAG
MAX_PATTERNS = 256        # distinct input path patterns (globs or files) of one DAG
MAX_INPUT_FILES = 100_000  # files the input patterns of one DAG list (a 90,000-file crawl folder fits)
MAX_BLOOM_BYTES = 1 << 30  # an exact_dedup stage's Bloom filters at their configured size (1e8 keys: 343 MiB)
MIN_SPLIT_BYTES = 1024     # an input's split_bytes (``max_shards`` prices it against the input's size)
MAX_SHARDS = 200_000       # input shards of one DAG, from its files' sizes and split_bytes (90,000 files: 1 each)
MAX_ECHO = 200            # characters of a client's value echoed back in an error
MiB = 1 << 20


def prescan(text: str, where: str) -> None:
    """Refuse (422) a DAG whose size, nesting or stage count is out of bounds, in linear
    time and before any parse. Brackets inside quoted strings count too: a bound, not a parse."""
    if len(text) > MAX_DAG_CHARS:
        raise SubmitError(f"{where}: the DAG is {len(text)} characters; at most {MAX_DAG_CHARS} are accepted")
    depth = 0
    for m in re.finditer(r"[\[\]{}]", text):
        if m.group() in "[{":
            depth += 1
            if depth > MAX_FLOW_DEPTH:
                line = text.count("\n", 0, m.start()) + 1
                raise SubmitError(f"{where}: line {line}: nested more than {MAX_FLOW_DEPTH} levels of [ or {{; "
                                  "DAGs are not that deep")
        else:
            depth = max(0, depth - 1)
    for m in re.finditer(r"^[ \t?-]*", text, re.M):
        if m.end() - m.start() > MAX_INDENT:
            line = text.count("\n", 0, m.start()) + 1
            raise SubmitError(f"{where}: line {line}: indented more than {MAX_INDENT} characters; DAGs are not that deep")
    types = len(re.findall(r"""(?:^|[\s{,'"])type['"]?\s*:""", text))
    if types > 2 * MAX_STAGES:
        raise SubmitError(f"{where}: {types} `type:` keys; a DAG has at most {MAX_STAGES} stages")


def _refuse_aliases(text: str, where: str) -> None:
    # A few nested YAML aliases expand to gigabytes once validated ("billion laughs");
    # DAGs do not need them. The C parser: events in linear time (prescan bounded the depth).
    try:
        for ev in yaml.parse(text, Loader=_YamlLoader):
            if isinstance(ev, yaml.AliasEvent):
                raise SubmitError(f"{where}: YAML anchors/aliases (*name) are not accepted by the service; "
                                  "write the values out")
    except yaml.YAMLError as e:
        raise SubmitError(f"{where}: invalid YAML: {e}".replace("\n", " ")) from None


def check_stage_modules(data: Any, stage_modules: tuple[str, ...], where: str) -> None:
    """Refuse (403) a ``module:Class`` stage whose module the operator did not allow, before
    anything is imported: the service imports no module a client names."""
    from curation.pipeline.dag import refused_stage_types, stage_module_refusal

    refused = refused_stage_types(data, tuple(stage_modules))
    if refused:
        name, stype = refused[0]
        raise SubmitError(f"{where}: stages.{name}.type: {stage_module_refusal(stype, tuple(stage_modules))}", 403)


@dataclass(frozen=True)
class AdmissionLimits:
    """What admitting one DAG may cost: ``max_patterns`` distinct input path patterns (each is
    listed on disk once, however often the DAG repeats it), ``max_input_files`` files they
    match, summed over the inputs (a 90,000-file crawl folder fits), and ``deadline``
    (``time.monotonic()``) past which the work stops (503), checked between patterns and every
    thousand files. Run parameters that size disk or shards are priced before the run:
    ``max_bloom_bytes`` for a stage's Bloom filters (from ``expected_items`` and the
    false-positive rate), ``min_split_bytes`` for an input's ``split_bytes`` and ``max_shards``
    for the input shards it makes of the pinned files' sizes; ``max_run_bytes`` (the run's disk
    quota, ``None``: none) for the Bloom filters too, which must fit in it."""

    max_patterns: int = MAX_PATTERNS
    max_input_files: int = MAX_INPUT_FILES
    deadline: float | None = None
    max_bloom_bytes: int = MAX_BLOOM_BYTES
    min_split_bytes: int = MIN_SPLIT_BYTES
    max_shards: int = MAX_SHARDS
    max_run_bytes: int | None = None

    def check_time(self, where: str) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise SubmitError(f"{where}: validation took too long; stopped, and no run was created", 503)


def admit_dag(text: str, policy: PathPolicy, where: str = "submitted.yaml", stage_modules: tuple[str, ...] = (),
              limits: AdmissionLimits | None = None):
    """Validate a submitted DAG and pin its inputs: every glob is expanded now, every match
    resolved (symlinks followed) and checked against the allowed roots, and the DAG to run
    lists those resolved files. A file swapped for a symlink later is then not picked up by a
    resume, and what was checked is exactly what runs. Returns the resolved ``Dag``.

    ``module:Class`` stages load only from modules under ``stage_modules`` (default: none).
    ``limits``: the admission's caps and deadline (``AdmissionLimits``; 422 past a cap)."""
    from curation.pipeline.dag import stage_modules_allowed
    from curation.stages.paths import path_guard

    # stage parameters declared as paths are resolved and checked by the guard, in validation,
    # before any validator opens them; every other string is data
    with stage_modules_allowed(stage_modules), path_guard(policy.guard):
        try:
            return _admit_dag(text, policy, where, tuple(stage_modules), limits or AdmissionLimits())
        except SubmitError:
            raise
        except Exception as e:  # noqa: BLE001 - a client's DAG: an answer with one line, never a 500
            raise refusal(e, where) from None


def refusal(e: Exception, where: str) -> SubmitError:
    """What a client is told, and with which status, for an exception raised while admitting
    its DAG: the one place a refusal gets its HTTP status. 403: a location outside the roots
    (``PathRefused``, the service's ``PathDenied`` included) or a stage module not allowed;
    422: a DAG, input or value that is invalid; anything unexpected is logged here and is a
    422 with its first line (a client's input never makes a 500)."""
    from curation.io.inputs import InputError
    from curation.pipeline.dag import DagError, StageModuleRefused
    from curation.stages.paths import PathRefused

    message = str(e) if str(e).startswith(where) else f"{where}: {e}"
    if isinstance(e, (PathRefused, StageModuleRefused)):
        return SubmitError(message, 403)
    if isinstance(e, (DagError, InputError)):
        return SubmitError(message)
    if isinstance(e, RecursionError):  # a structure deeper than the validators handle
        return SubmitError(f"{where}: the DAG is nested too deeply to validate")
    import traceback

    print(f"[refinery serve] admission of {where}: unexpected {type(e).__name__}\n{traceback.format_exc()}",
          file=sys.stderr, flush=True)
    return SubmitError(f"{where}: the DAG could not be validated ({type(e).__name__}: {_first_line(e)})")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else "")[:MAX_ECHO]


def load_yaml(text: str, where: str) -> Any:
    """The YAML's data; every parser failure is the client's (422 with one line): a syntax
    error, and a value that YAML's resolver reads as something it cannot build (``2024-13-45``
    as a date, a 5,000-digit integer, ``!!timestamp xyz``, ``!!float abc``)."""
    try:
        return yaml.load(text, Loader=_YamlLoader)
    except yaml.YAMLError as e:
        raise SubmitError(f"{where}: invalid YAML: {e}".replace("\n", " ")) from None
    except RecursionError:
        raise SubmitError(f"{where}: the DAG is nested too deeply to validate") from None
    except Exception as e:  # noqa: BLE001 - ValueError, AttributeError, OverflowError from a constructor
        raise SubmitError(f"{where}: invalid YAML value ({_first_line(e)}); quote a value that YAML reads as a "
                          "date, number or tagged value but is meant as text") from None


def _count_matches(pattern: str, stop: int) -> int:
    """Paths a local pattern matches, counted up to ``stop + 1`` by a plain directory scan (no
    stat of each match): ``glob`` without ``recursive`` never finds more than the input
    reader's glob does but for folders, which are few where files are many."""
    import glob

    if not any(c in pattern for c in "*?["):
        return int(os.path.lexists(pattern))
    n = 0
    for _ in glob.iglob(pattern):
        n += 1
        if n > stop:
            break
    return n


def _check_input_caps(dag, policy: PathPolicy, where: str, limits: AdmissionLimits) -> None:
    """The admission caps, from counts alone, before any pattern is listed in full (the input
    reader stats every match): ``max_patterns`` distinct local patterns, ``max_input_files``
    matches summed over them. A pattern that matches nothing is refused here too (422, the
    reader's own message), so a DAG whose last input is empty costs no listing of its first."""
    from curation.io.inputs import expand_paths

    distinct: dict[str, tuple[str, Any, str]] = {}
    for name, spec in dag.inputs.items():
        if spec.run is not None:
            continue
        for i, pattern in enumerate(spec.paths):
            loc = f"inputs.{name}.paths[{i}]"
            if "\0" in pattern:
                raise SubmitError(f"{where}: {loc}: a path with a NUL character")
            if policy.is_url(pattern):
                continue
            key = policy.absolute(pattern)
            if key not in distinct:
                if len(distinct) >= limits.max_patterns:
                    raise SubmitError(f"{where}: {loc}: more than {limits.max_patterns} distinct input path patterns "
                                      "in one DAG (the service's max_patterns); use a glob")
                distinct[key] = (name, spec, loc)
    counted = 0
    for key, (name, spec, loc) in distinct.items():
        limits.check_time(where)
        n = _count_matches(key, limits.max_input_files - counted)
        if n == 0:  # the reader's verdict (and its message): it may see what a plain scan does not
            expand_paths(name, spec.model_copy(update={"paths": [key]}))
        counted += n
        if counted > limits.max_input_files:
            raise SubmitError(f"{where}: {loc}: the DAG's input patterns match more than {limits.max_input_files} "
                              "files or folders (the service's max_input_files); split the input over several runs")


def bloom_bytes(stage: Any) -> int:
    """The bytes a stage's Bloom filters take at their configured size: one filter per
    partition, each for ``expected_items / partitions`` keys at ``false_positive_rate`` (a
    partition with more distinct keys than that gets a larger one, sized by the data)."""
    from curation.dedup.bloom import bloom_size

    bloom = stage.bloom
    parts = max(1, int(getattr(stage, "partitions", 1)))
    m, _ = bloom_size(max(1, -(-int(bloom.expected_items) // parts)), float(bloom.false_positive_rate))
    return parts * -(-m // 8)


def _price_run(dag, where: str, limits: AdmissionLimits) -> None:
    """Refuse (422) run parameters whose disk or shard count is out of the service's bounds,
    from the parameters alone, before anything runs."""
    for name, spec in dag.inputs.items():
        if spec.split_bytes < limits.min_split_bytes:
            raise SubmitError(f"{where}: inputs.{name}.split_bytes: {spec.split_bytes} is below the service's "
                              f"min_split_bytes of {limits.min_split_bytes}")
    total = 0  # every stage's filters: the run's disk quota holds them all
    for name, st in dag.stages.items():
        if not hasattr(getattr(st, "bloom", None), "expected_items"):
            continue
        size = bloom_bytes(st)
        if size > limits.max_bloom_bytes:
            raise SubmitError(f"{where}: stages.{name}.bloom: expected_items {st.bloom.expected_items} at "
                              f"false_positive_rate {st.bloom.false_positive_rate:g} makes Bloom filters of "
                              f"{size / MiB:,.0f} MiB; the service's max_bloom_bytes is "
                              f"{limits.max_bloom_bytes / MiB:,.0f} MiB")
        total += size
        if limits.max_run_bytes is not None and total > limits.max_run_bytes:
            what = "makes Bloom filters" if total == size else "brings the DAG's Bloom filters to"
            raise SubmitError(f"{where}: stages.{name}.bloom: expected_items {st.bloom.expected_items} at "
                              f"false_positive_rate {st.bloom.false_positive_rate:g} {what} "
                              f"{total / MiB:,.0f} MiB, more than a run's disk quota of "
                              f"{limits.max_run_bytes / MiB:,.0f} MiB (the service's max_run_bytes)")


def _admit_dag(text: str, policy: PathPolicy, where: str, stage_modules: tuple[str, ...], limits: AdmissionLimits):
    """The admission, in the order of the module docstring; every exception is turned into
    the client's answer by ``refusal``."""
    from curation.pipeline.dag import parse_dag

    prescan(text, where)
    _refuse_aliases(text, where)
    data = load_yaml(text, where)
    if not isinstance(data, dict):
        raise SubmitError(f"{where}: a DAG is a YAML mapping with name, inputs, stages, output")
    for part in ("inputs", "stages"):  # a mapping, or for stages a list of one-entry mappings
        if isinstance(data.get(part), (dict, list)) and len(data[part]) > MAX_STAGES:
            raise SubmitError(f"{where}: {part}: {len(data[part])} entries; at most {MAX_STAGES} are accepted")
    check_stage_modules(data, stage_modules, where)
    _check_raw_locations(data.get("inputs"), policy, where)
    dag = parse_dag(data, where, policy.base_dir)
    for part, nodes in (("inputs", dag.inputs), ("stages", dag.stages)):  # what was parsed decides
        if len(nodes) > MAX_STAGES:
            raise SubmitError(f"{where}: {part}: {len(nodes)} entries; at most {MAX_STAGES} are accepted")
    _price_run(dag, where, limits)
    _check_input_caps(dag, policy, where, limits)
    resolved = _pin_inputs(dag, policy, where, limits)
    limits.check_time(where)
    pinned_dag = parse_dag(resolved, where, policy.base_dir)
    # `refinery run` refuses a run directory whose dag.yaml differs from the DAG it loads; the
    # file we write must read back to the same DAG.
    # LibYAML both ways: the Python emitter and parser take ~30 s over 90,000 pinned paths
    if parse_dag(load_yaml(dump_yaml(pinned_dag.to_dict()), where), where).to_dict() != pinned_dag.to_dict():
        raise SubmitError(f"{where}: the DAG does not survive a YAML round trip; simplify its parameters")
    return pinned_dag


def _check_raw_locations(inputs: Any, policy: PathPolicy, where: str) -> None:
    """Every location an input names, checked against the roots on the raw data, before the
    DAG is validated: its path patterns, a ``format: run`` input's run directory and a
    ``format: cc_index`` input's ``warc_root``. Stage parameters that are paths are checked by
    the path guard as they are validated, before their validators open them."""
    if not isinstance(inputs, dict):
        return
    for name, spec in inputs.items():
        if not isinstance(spec, dict):
            continue
        paths = spec.get("paths")
        named = [("run", spec.get("run")), ("warc_root", spec.get("warc_root"))]
        named += [(f"paths[{i}]", p) for i, p in enumerate(paths if isinstance(paths, list) else [])]
        for field, value in named:
            if not isinstance(value, str):
                continue
            if "\0" in value:
                raise SubmitError(f"{where}: inputs.{name}.{field}: a path with a NUL character")
            policy.check_pattern(value, f"inputs.{name}.{field}")


def _pin_inputs(dag, policy: PathPolicy, where: str, limits: AdmissionLimits) -> dict:
    """The DAG's data with every input pinned: each distinct pattern listed and its matches
    resolved and checked once (an input's files keep their first-seen order), a ``format: run``
    directory resolved; the caps on files listed, files pinned and shards checked as it goes."""
    from curation.io.inputs import expand_paths

    resolved = dag.to_dict()
    expanded: dict[str, list[tuple[str, int | None]]] = {}
    listed = files_total = shards = 0  # files the patterns listed (the work); pinned (dag.yaml's size); shards
    for name, spec in dag.inputs.items():
        if spec.run is not None:  # format: run: the run directory resolved (symlinks followed) and pinned
            if not policy.is_url(spec.run):  # a URL was checked against the URL roots already
                resolved["inputs"][name]["run"] = policy.check_local(spec.run, f"inputs.{name}.run")
            continue
        pinned: dict[str, int | None] = {}  # resolved path -> size (None: a URL, listed at run time)
        for i, pattern in enumerate(spec.paths):
            loc = f"inputs.{name}.paths[{i}]"
            if policy.is_url(pattern):
                pinned[pattern] = None  # checked against the URL roots already; listed at run time
                continue
            key = policy.absolute(pattern)
            if key not in expanded:
                limits.check_time(where)
                found = expand_paths(name, spec.model_copy(update={"paths": [key]}))
                listed += len(found)
                if listed > limits.max_input_files:
                    raise SubmitError(f"{where}: {loc}: the DAG's input patterns list more than "
                                      f"{limits.max_input_files} files (a file counts once per pattern matching it; "
                                      "the service's max_input_files); split the input over several runs")
                checked = []
                for j, (path, size) in enumerate(found):
                    if j % 1000 == 999:
                        limits.check_time(where)
                    checked.append((policy.check_local(path, loc), size))
                expanded[key] = checked
            before = len(pinned)
            pinned.update(expanded[key])
            files_total += len(pinned) - before
            if files_total > limits.max_input_files:
                raise SubmitError(f"{where}: {loc}: the DAG's inputs pin more than {limits.max_input_files} "
                                  "files (the service's max_input_files); split the input over several runs")
        resolved["inputs"][name]["paths"] = list(pinned)
        # the shards `refinery run` will cut these files into (an upper bound: a compressed file is one)
        shards += sum(max(1, -(-size // spec.split_bytes)) for size in pinned.values() if size is not None)
        if shards > limits.max_shards:
            raise SubmitError(f"{where}: inputs.{name}.split_bytes: {spec.split_bytes} cuts the DAG's input files into "
                              f"more than {limits.max_shards} shards (the service's max_shards); use a larger "
                              "split_bytes")
    return resolved
