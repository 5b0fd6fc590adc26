"""The code's shape, checked: imports only go down the layers of ARCHITECTURE.md, no stage
imports another stage, no import cycle, and the trainer never imports curation beyond the
on-disk formats. Imports under ``if TYPE_CHECKING:`` are annotations, not dependencies, except
that a stage does not import the pipeline even for its types (stages are typed against
``curation.stages.context``, which the pipeline implements)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: layer of each package (a module may import its own layer or lower ones, except as noted)
LAYERS = {
    "curation.formats": 0, "curation.hashing": 0,
    "curation.io": 1, "curation.text": 1, "curation.dedup": 1, "curation.quality": 1, "curation.tokenizer": 1,
    "curation.export": 1,
    "curation.sampling": 1,
    # HTML -> main text: above io/ and text/ (it reads gold files, measures Markdown's plain view)
    "curation.extract": 1.5,
    "curation.stages": 2,
    "curation.pipeline": 3,
    "curation.experiments": 4, "curation.service": 4, "curation.cli": 4,
}


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in ("curation", "training"):
        for f in (REPO / pkg).rglob("*.py"):
            parts = list(f.relative_to(REPO).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(path: Path, module: str, known: dict[str, Path], types: bool = False) -> set[str]:
    """Project modules ``module`` imports (anywhere in the file; TYPE_CHECKING blocks excluded
    unless ``types``)."""
    tree = ast.parse(path.read_text())
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child) and not types:
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.add(child.module)
                found.update(f"{child.module}.{a.name}" for a in child.names)
            visit(child)

    visit(tree)
    return {m for m in found if m in known and m != module}


def _layer(module: str) -> tuple[str, int] | None:
    best = None
    for pkg, rank in LAYERS.items():
        if module == pkg or module.startswith(pkg + "."):
            if best is None or len(pkg) > len(best[0]):
                best = (pkg, rank)
    return best


def _graph(types: bool = False) -> dict[str, set[str]]:
    known = _modules()
    return {m: _imports(f, m, known, types) for m, f in known.items()}


#: what every stage may import from its own layer: the stage API, the context it is handed, the
#: declared path parameter type (``PathStr``: what the service checks against its roots) and the
#: bases two stage types share (the heuristic filters' per-language rules, the quality stages'
#: classifier); never another stage type's file
STAGE_FACILITIES = ("curation.stages.base", "curation.stages.context", "curation.stages.paths",
                    "curation.stages.language_rules", "curation.stages.quality_model")


def test_imports_only_go_down_the_layers():
    bad = []
    for mod, deps in _graph().items():
        me = _layer(mod)
        if me is None:
            continue
        for d in deps:
            if d.startswith("training"):
                if not mod.startswith(("curation.cli", "curation.experiments")):
                    bad.append(f"{mod} -> {d} (only the CLI and experiments drive the trainer)")
                continue
            other = _layer(d)
            if other and other[1] > me[1]:
                bad.append(f"{mod} ({me[0]}) -> {d} ({other[0]}): imports upward")
    assert not bad, "\n".join(sorted(bad))


def test_no_stage_imports_another_stage():
    bad = [f"{mod} -> {d}" for mod, deps in _graph().items() if mod.startswith("curation.stages.")
           for d in deps if d.startswith("curation.stages.") and d not in STAGE_FACILITIES
           and not mod.endswith("__init__") and mod != "curation.stages"]
    assert not bad, "\n".join(sorted(bad))


def test_no_stage_imports_the_pipeline_even_for_types():
    """The stage layer owns its contract: ``run(ctx: StageContext)``, ``ShardSink``,
    ``RunSource``; no type-level arrow runs back up from stages to the pipeline."""
    bad = [f"{mod} -> {d}" for mod, deps in _graph(types=True).items() if mod.startswith("curation.stages")
           for d in deps if d.startswith("curation.pipeline")]
    assert not bad, "\n".join(sorted(bad))


def test_algorithms_import_no_stage_and_no_pipeline_even_for_types():
    """What stages share lives below them and knows neither stages nor the run directory."""
    below = tuple(p for p, rank in LAYERS.items() if rank < LAYERS["curation.stages"])
    bad = [f"{mod} -> {d}" for mod, deps in _graph(types=True).items() if mod.startswith(below)
           for d in deps if d.startswith(("curation.stages", "curation.pipeline"))]
    assert not bad, "\n".join(sorted(bad))


def test_training_imports_only_the_curation_formats():
    bad = [f"{mod} -> {d}" for mod, deps in _graph().items() if mod.startswith("training")
           for d in deps if d.startswith("curation") and not d.startswith("curation.formats")]
    assert not bad, "\n".join(sorted(bad))


@pytest.mark.parametrize("types", [False, True], ids=["run time", "with type-only imports"])
def test_no_import_cycle(types):
    graph = _graph(types)
    # a package's __init__ that re-exports its modules is not a cycle through its children
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[str] = []

    def dfs(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if m.startswith(d + ".") or d.startswith(m + "."):
                continue  # parent package <-> its own module
            if state.get(d) == 1:
                cycles.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                dfs(d)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            dfs(m)
    assert not cycles, "\n".join(cycles)


def test_the_checker_sees_a_violation(tmp_path):
    """The walk above really finds imports (so a clean result means something)."""
    f = tmp_path / "m.py"
    f.write_text("from typing import TYPE_CHECKING\nimport curation.pipeline.dag\n"
                 "if TYPE_CHECKING:\n    from curation.pipeline.rundir import RunDir\n"
                 "def f():\n    from curation.stages.base import Stage\n")
    known = {"curation.pipeline.dag": f, "curation.pipeline.rundir": f, "curation.stages.base": f}
    assert _imports(f, "x", known) == {"curation.pipeline.dag", "curation.stages.base"}


#: modules that may still rename a temporary file into place themselves, and why
OWN_RENAMES = {
    "curation.io.files": "the one home of atomic writes (StagedFile, atomic_path)",
    "curation.service.runs": "a deleted run's directory renamed aside (off the listing at once), then removed",
}


def _renames(path: Path) -> list[int]:
    """Lines where ``path`` calls ``os.replace``/``os.rename`` or a path's ``.replace``/``.rename``
    with one argument (how a temporary file is put into place)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        f = node.func
        if f.attr in ("replace", "rename") and isinstance(f.value, ast.Name) and f.value.id == "os":
            out.append(node.lineno)
        elif f.attr == "rename" and len(node.args) == 1:
            out.append(node.lineno)
        elif (f.attr == "replace" and len(node.args) == 1 and not node.keywords
              and not (isinstance(f.value, ast.Constant) or isinstance(node.args[0], ast.Constant))):
            out.append(node.lineno)  # Path.replace(target); str.replace takes two arguments
    return out


def test_only_io_files_renames_a_temporary_file_into_place():
    """Every atomic write goes through ``curation.io.files`` (``atomic_path``, ``StagedFile``,
    ``write_*``), which also knows object storage; the trainer keeps its own (its layer rule)."""
    bad = [f"{mod} ({_modules()[mod].relative_to(REPO)}:{line})" for mod, f in _modules().items()
           if mod.startswith("curation") and mod not in OWN_RENAMES for line in _renames(f)]
    assert not bad, "rename into place outside curation.io.files:\n" + "\n".join(sorted(bad))
    stale = [m for m in OWN_RENAMES if not _renames(_modules()[m])]
    assert not stale, f"exempt but no longer renaming anything (drop the exemption): {stale}"


#: the trainer's own homes of renames (it imports nothing from curation but its formats)
TRAINING_RENAMES = {
    "training.files": "atomic small files (meta.json, latest, trimmed logs)",
    "training.checkpoint": "checkpoint directories renamed into place (rank 0, after every rank wrote)",
}


def test_training_renames_only_in_its_two_homes():
    mods = _modules()
    bad = [f"{mod}:{line}" for mod, f in mods.items()
           if mod.startswith("training") and mod not in TRAINING_RENAMES for line in _renames(f)]
    assert not bad, "rename into place outside training.files / training.checkpoint: " + ", ".join(sorted(bad))
    assert all(_renames(mods[m]) for m in TRAINING_RENAMES)


def test_the_rename_checker_sees_renames(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("import os\nos.replace(a, b)\nos.rename(a, b)\ntmp.rename(p)\ntmp.replace(p)\n"
                 "s.replace('a', 'b')\nx = 'a'.replace(y)\n")
    assert _renames(f) == [2, 3, 4, 5]


#: imports of another module's private name still allowed, and why (none: keep it that way)
PRIVATE_IMPORTS: set[tuple[str, str]] = set()


def test_no_module_imports_another_modules_private_names():
    """A name another module needs is public (``init_ray``, ``text.arrow``'s helpers), so a
    reader can tell a module's API from its insides."""
    bad = []
    for mod, f in _modules().items():
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 \
                    and node.module.split(".")[0] in ("curation", "training"):
                bad += [(mod, f"{node.module}.{a.name}") for a in node.names
                        if a.name.startswith("_") and not a.name.startswith("__")]
    assert not set(bad) - PRIVATE_IMPORTS, "\n".join(sorted(f"{m} -> {n}" for m, n in set(bad) - PRIVATE_IMPORTS))
    stale = PRIVATE_IMPORTS - set(bad)
    assert not stale, f"exempt but no longer imported (drop the exemption): {sorted(stale)}"


def test_architecture_maps_every_stage_type_to_its_file():
    """ARCHITECTURE.md's "Stage types and their files" table names each registered type once, with
    the file its class is defined in: a newcomer finds any stage from its type."""
    import inspect
    import re

    import curation.stages  # noqa: F401 (registers every stage)
    from curation.stages.base import registry

    text = (REPO / "ARCHITECTURE.md").read_text()
    section = text.split("## Stage types and their files", 1)[1].split("\n## ", 1)[0]
    table = dict(re.findall(r"^\| `([a-z0-9_]+)` \| `([^`]+)` \|$", section, re.M))
    # built-in types only: a user stage (``module:Class``) another test loaded is in the registry too
    want = {t: str(Path(inspect.getsourcefile(c)).resolve().relative_to(REPO)) for t, c in registry.items()
            if ":" not in t}
    assert table == want, {"missing": sorted(set(want) - set(table)), "stale": sorted(set(table) - set(want)),
                           "wrong file": sorted(t for t in set(table) & set(want) if table[t] != want[t])}
