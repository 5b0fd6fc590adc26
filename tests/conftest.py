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


@pytest.fixture()
def in_repo(monkeypatch):
    """Run with the repo as CWD so DAGs' relative paths (tests/data/...) resolve."""
    monkeypatch.chdir(REPO)
    return REPO


def pytest_configure(config):
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    config.addinivalue_line("markers", "gpu: CUDA variants of the trainer tests (bf16 tolerances); run whenever torch sees a GPU")
