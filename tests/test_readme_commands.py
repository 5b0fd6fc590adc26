"""Every `refinery ...` command line the README shows names a real subcommand, with options that
subcommand has, and its `--help` runs: the README's examples stay true as the CLI changes."""

from __future__ import annotations

import re
import shlex

import pytest
import typer
from typer.testing import CliRunner

from conftest import REPO
from curation.cli import app

README = (REPO / "README.md").read_text()
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
        lines.append(span)
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


def test_make_bench_runs_on_a_cpu_machine():
    """`make bench` runs every benchmark, the GPU acceptance one included: without CUDA it says it
    is skipped and exits 0, and one failing benchmark does not stop the loop."""
    import subprocess
    import sys

    import torch

    dry = subprocess.run(["make", "-n", "bench"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "tests/benchmarks/bench_*.py" in dry and "|| failed=" in dry and "exit 1; done" not in dry
    if not torch.cuda.is_available():
        res = subprocess.run([sys.executable, str(REPO / "tests" / "benchmarks" / "bench_gpu.py")], cwd=REPO,
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0 and "skipped, no CUDA device" in res.stdout, res.stdout + res.stderr
