"""The code's shape, for architecture notes: lines of Python per folder of ``curation/`` and
``training/`` (share of the total), the largest files, files over 700 lines, functions over 80
lines, imports that run up a layer (the layers of ``tests/test_layers.py``) and the import
graph's circles between folders and between modules (every ``import``/``from`` of a project
module, including those under ``if TYPE_CHECKING:`` and inside functions). Prints figures,
asserts nothing.

Run: ``.venv/bin/python tests/benchmarks/structure.py [TREE ...]`` (default: this checkout; give
a ``git worktree`` of another commit to compare).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter, defaultdict
from pathlib import Path

PACKAGES = ("curation", "training")
LONG_FILE, LONG_FUNCTION = 700, 80


def modules(root: Path) -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for f in sorted((root / pkg).rglob("*.py")):
            parts = list(f.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = f
    return out


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``name`` imports (a package import counts as its ``__init__``)."""
    tree = ast.parse(path.read_text(), str(path))
    pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" for a in node.names] + [base]
        for t in targets:
            while t and t not in known:
                t = t.rsplit(".", 1)[0] if "." in t else ""
            if t and t != name:
                found.add(t)
    return found


def folder(mod: str, packages: set[str]) -> str:
    """A module's second-level package (``curation.stages``); a module directly under a top
    package (``curation.cli``) is its own folder."""
    parts = mod.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or mod in packages else mod


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in list(graph):
        if v not in index:
            visit(v)
    return out


def long_functions(path: Path) -> list[tuple[str, int]]:
    """(name, lines) of every function or method longer than ``LONG_FUNCTION`` lines."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            n = node.end_lineno - node.lineno + 1
            if n > LONG_FUNCTION:
                out.append((node.name, n))
    return out


def layer_of(mod: str) -> float | None:
    """The layer of ``tests/test_layers.py`` a module sits in (None for the trainer's)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from test_layers import LAYERS
    best = None
    for pkg, rank in LAYERS.items():
        if (mod == pkg or mod.startswith(pkg + ".")) and (best is None or len(pkg) > len(best[0])):
            best = (pkg, rank)
    return best and best[1]


def report(root: Path) -> None:
    mods = modules(root)
    lines = {m: len(p.read_text().splitlines()) for m, p in mods.items()}
    total = sum(lines.values())
    packages = {m for m, p in mods.items() if p.name == "__init__.py"}
    by_folder = Counter()
    for m, n in lines.items():
        by_folder[folder(m, packages)] += n
    graph = {m: imports(m, p, set(mods)) for m, p in mods.items()}
    fgraph = defaultdict(set)
    for m, deps in graph.items():
        for d in deps:
            if folder(d, packages) != folder(m, packages):
                fgraph[folder(m, packages)].add(folder(d, packages))
    print(f"\n== {root}: {len(mods)} modules, {total:,} lines of Python in {', '.join(PACKAGES)}")
    for f, n in by_folder.most_common(6):
        print(f"  {f:24s} {n:6,d} lines  {n / total:6.1%}")
    for m, n in sorted(lines.items(), key=lambda kv: -kv[1])[:5]:
        print(f"  largest: {mods[m].relative_to(root)}  {n:,} lines")
    big = sorted(((n, m) for m, n in lines.items() if n > LONG_FILE), reverse=True)
    print(f"  files over {LONG_FILE} lines: {len(big)}"
          + "".join(f"\n    {mods[m].relative_to(root)} {n:,}" for n, m in big))
    longf = sorted(((n, f"{mods[m].relative_to(root)}:{fn}") for m in mods
                    for fn, n in long_functions(mods[m])), reverse=True)
    print(f"  functions over {LONG_FUNCTION} lines: {len(longf)}"
          + "".join(f"\n    {name} {n}" for n, name in longf))
    up = [(m, d) for m, deps in graph.items() for d in deps
          if layer_of(m) is not None and layer_of(d) is not None and layer_of(d) > layer_of(m)]
    print(f"  imports that run up a layer: {len(up)}" + "".join(f"\n    {m} -> {d}" for m, d in up))
    fc, mc = cycles(fgraph), cycles(graph)
    print(f"  folder circles: {fc or 'none'}")
    print(f"  module circles: {[len(c) for c in mc] or 'none'}" + (f"  e.g. {mc[0]}" if mc else ""))


if __name__ == "__main__":
    for tree in sys.argv[1:] or [str(Path(__file__).resolve().parents[2])]:
        report(Path(tree).resolve())
