"""Every `refinery ...` command line the docs show (README.md, ARCHITECTURE.md and every README
beside the code) names a real subcommand, with options that subcommand has, and its `--help` runs:
the docs' examples stay true as the CLI changes."""

from __future__ import annotations

import re
import shlex

import pytest
import typer
from typer.testing import CliRunner

from conftest import REPO
from curation.cli import app

#: the docs a reader is sent to: the two at the top and the pages beside what they document
DOCS = [REPO / "README.md", REPO / "ARCHITECTURE.md",
        *sorted(p for d in ("curation", "training", "pipelines", "tests/benchmarks", "infra")
                for p in (REPO / d).rglob("*.md"))]
README = "\n".join(p.read_text() for p in DOCS)
ROOT = typer.main.get_command(app)


def readme_command_lines() -> list[str]:
    """`refinery ...` lines of the README's code blocks and inline code spans."""
    lines: list[str] = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", README, flags=re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip().rstrip("\\").strip()
            if line.startswith("refinery "):
                lines.append(line)
    for span in re.findall(r"`(refinery [^`]+)`", README):
        # alternatives, `refinery index build|add` (`build\|add` in a table cell): one line each
        head, _, alts = span.replace("\\|", "|").partition("|")
        if not alts:
            lines.append(span)
            continue
        stem = head.rsplit(" ", 1)[0]
        lines += [head] + [f"{stem} {alt}" for alt in alts.split("|")]
    return sorted(set(lines))


def resolve(words: list[str]):
    """The subcommand path a command line names, its click command, and the rest of the words."""
    cmd, path = ROOT, []
    rest = list(words)
    while is_group(cmd) and rest and not rest[0].startswith("-"):
        sub = cmd.get_command(None, rest[0])
        if sub is None:
            break
        path.append(rest.pop(0))
        cmd = sub
    return path, cmd, rest


def is_group(cmd) -> bool:
    return hasattr(cmd, "list_commands")  # typer's group (it bundles its own click)


LINES = readme_command_lines()


def test_the_readme_shows_commands():
    assert len(LINES) >= 20, LINES  # the extraction itself works


def test_the_docs_checked_include_those_beside_the_code():
    names = {str(p.relative_to(REPO)) for p in DOCS}
    assert {"curation/service/README.md", "training/README.md", "pipelines/README.md",
            "tests/benchmarks/README.md"} <= names, names


@pytest.mark.parametrize("line", LINES)
def test_readme_command_line_names_real_subcommands_and_options(line):
    words = shlex.split(line.replace("[", " ").replace("]", " "))[1:]
    path, cmd, rest = resolve(words)
    assert path, f"{line!r}: {words[0]!r} is not a refinery subcommand"
    assert not is_group(cmd) or not rest, f"{line!r}: {rest[0]!r} is not a subcommand of {path}"
    known = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
    for w in rest:
        if w.startswith("--"):
            opt = w.split("=", 1)[0]
            assert opt in known, f"{line!r}: `refinery {' '.join(path)}` has no option {opt} (it has {sorted(known)})"
    res = CliRunner().invoke(app, [*path, "--help"])
    assert res.exit_code == 0, res.output


BENCH_HELP = """
import contextlib, glob, io, json, re, runpy, sys
out = {}
for p in sorted(glob.glob("tests/benchmarks/bench_*.py")):
    sys.argv, buf = [p, "--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            runpy.run_path(p, run_name="__main__")
        code = "ran without exiting"
    except SystemExit as e:
        code = e.code
    except BaseException as e:
        code = repr(e)[:300]
    usage = re.sub(r"\\s+", " ", buf.getvalue().split("\\n\\n")[0])
    while re.search(r"\\[[^\\[\\]]*\\]", usage):  # optional groups, innermost first
        usage = re.sub(r"\\[[^\\[\\]]*\\]", "", usage)
    out[p] = {"code": code, "required": re.findall(r"(?<=\\s)--[\\w-]+", usage)}
print(json.dumps(out))
"""


def test_make_bench_runs_every_cpu_benchmark_and_lists_the_skipped():
    """`make bench`'s own loop (from `make -n bench`), on the GPU benchmark, the one needing
    arguments and a failing script: it runs on past the failure, says bench_gpu.py was skipped (no
    CUDA) and which needs arguments, lists the failure and exits non-zero."""
    import subprocess

    import torch

    dry = subprocess.run(["make", "-n", "bench"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    loop = dry[dry.index("mkdir -p runs/bench"):]
    assert "tests/benchmarks/bench_*.py" in loop
    fail = REPO / "runs" / "bench_test_failing.py"
    fail.parent.mkdir(exist_ok=True)
    fail.write_text("import sys\nprint('failing on purpose')\nsys.exit(3)\n")
    try:
        some = "tests/benchmarks/bench_gpu.py tests/benchmarks/bench_kernels_vs_commit.py runs/bench_test_failing.py"
        res = subprocess.run(["sh", "-c", loop.replace("tests/benchmarks/bench_*.py", some)], cwd=REPO,
                             capture_output=True, text=True, timeout=300)
    finally:
        fail.unlink()
    lines = res.stdout.splitlines()
    assert res.returncode == 1 and "failing on purpose" in lines, res.stdout + res.stderr
    assert lines[-1] == "failed: runs/bench_test_failing.py", lines[-3:]
    skipped = lines[-2]
    assert "tests/benchmarks/bench_kernels_vs_commit.py(needs-arguments)" in skipped
    assert ("tests/benchmarks/bench_gpu.py(no-CUDA)" in skipped) == (not torch.cuda.is_available()), skipped


def test_every_benchmark_has_a_help_and_needs_no_argument_but_the_listed():
    """Each bench_*.py answers --help (its imports work here) and `make bench` can run it with no
    argument, but for those the Makefile lists in BENCH_NEEDS_ARGS (run by hand)."""
    import json
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", BENCH_HELP], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    found = json.loads(res.stdout.splitlines()[-1])
    assert len(found) >= 20
    assert {p: v["code"] for p, v in found.items() if v["code"] != 0} == {}
    needs = re.search(r"^BENCH_NEEDS_ARGS :=[ \t]*(.*)$", (REPO / "Makefile").read_text(), re.M).group(1).split()
    assert {p: v["required"] for p, v in found.items() if v["required"]} == {p: ["--base"] for p in needs}
