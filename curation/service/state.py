"""What every route of one service shares: the run manager, the token, the allowed roots, the
stage-module allow-list, the caches and the query slots. ``create_app`` builds one
``ServiceState`` and hands it to each area's router (``curation.service.routes``)."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import HTTPException

from curation.pipeline.rundir import RunDir
from curation.service.auth import PathPolicy, TokenAuth
from curation.service.runs import RunManager
from curation.service.sql_box import SqlBox, server_paths
from curation.service.stats import RunCache, StatsCache, stats_payload


@dataclass
class ServiceState:
    runs: RunManager
    auth: TokenAuth
    policy: PathPolicy
    stage_modules: tuple[str, ...]
    sql_timeout_s: float = 10.0
    sql_max_rows: int = 1000
    sql_max_concurrent: int = 4
    sql_max_bytes: int = 4 << 20
    sql_memory_bytes: int = 1 << 30
    cookie_secure: bool = False  # the browser reaches the service through https (--behind-tls-proxy)
    admission_workers: int = 2
    admission_waiting: int = 30
    admission_timeout_s: float = 20.0
    # cached as JSON bytes: a warm hit is then a file stat and a copy, no validation or encoding
    stats_cache: StatsCache = field(default_factory=lambda: StatsCache(lambda d: json.dumps(stats_payload(d)).encode()))
    browse_cache: RunCache = field(default_factory=RunCache)
    sql_slots: threading.BoundedSemaphore = field(init=False)
    sql_box: SqlBox = field(init=False)
    admission_pool: ThreadPoolExecutor = field(init=False)
    admission_slots: threading.BoundedSemaphore = field(init=False)

    def __post_init__(self) -> None:
        self.sql_slots = threading.BoundedSemaphore(self.sql_max_concurrent)
        self.sql_box = SqlBox(timeout_s=self.sql_timeout_s, memory_bytes=self.sql_memory_bytes,
                              stage_modules=tuple(self.stage_modules), hide=server_paths(self.policy.base_dir))
        self.admission_pool = ThreadPoolExecutor(self.admission_workers, thread_name_prefix="refinery-admit")
        self.admission_slots = threading.BoundedSemaphore(self.admission_workers + self.admission_waiting)

    def started_run(self, run_id: str) -> tuple[Path, RunDir]:
        """A run's directory and ``RunDir``; 404 for an unknown run or one not started yet."""
        d = self.runs.run_dir(run_id)
        rd = RunDir(d)
        if not rd.exists():
            raise HTTPException(404, f"run {run_id!r} has no dag.yaml yet (not started)")
        return d, rd
