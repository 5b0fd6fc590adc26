"""Shared fixtures: one Ray for the whole session (ray.init costs ~4 s here)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"


@pytest.fixture(scope="session")
def ray_session():
    import ray

    if not ray.is_initialized():
        # address="local": never the cluster a test (or `ray start`) recorded on this machine
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def two_ranks(request, tmp_path_factory):
    """The "model split by hand" jobs over two spawned CPU processes (gloo): each test module that
    uses this fixture names its job as ``TWO_RANK_JOB = (function name, extra args)``, and the
    jobs of every such module in the session run one after the other in ONE spawned pair (the
    processes start and import torch once, not once per module). Returns a function: module name
    -> that job's output folder (``rank{r}.json``), or the error that stopped the pair."""
    from train_helpers import spawn_two_rank_jobs

    modules = {item.module.__name__: item.module for item in request.session.items
               if "two_ranks" in getattr(item, "fixturenames", ()) and getattr(item, "module", None) is not None}
    outs, error = spawn_two_rank_jobs({name: mod.TWO_RANK_JOB for name, mod in sorted(modules.items())},
                                      tmp_path_factory.mktemp("two_ranks"))

    def out(module: str) -> Path:
        if not all((outs[module] / f"rank{r}.json").exists() for r in range(2)):
            raise RuntimeError(f"the spawned pair stopped before {module}'s job ended") from error
        return outs[module]

    return out


@pytest.fixture()
def in_repo(monkeypatch):
    """Run with the repo as CWD so DAGs' relative paths (tests/data/...) resolve."""
    monkeypatch.chdir(REPO)
    return REPO


def pytest_configure(config):
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    config.addinivalue_line("markers", "gpu: CUDA variants of the trainer tests (bf16 tolerances); run whenever torch sees a GPU")
