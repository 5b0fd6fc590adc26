"""A run's stats as the service answers them, and the caches that keep a finished run's answers
(keyed by its progress.json and dag.yaml modification times)."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

from curation.pipeline.rundir import RunDir


def stats_payload(run_dir: str | Path) -> dict[str, Any]:
    """``refinery stats`` as data: stage table, top reasons, output summary; language and
    quality histograms when ``kept`` has ``lang`` / ``quality``, tokens per source when it has
    ``num_tokens`` (or ``input_ids``)."""
    from curation.pipeline.stats import connect, output_summary, stage_table, top_reasons

    out: dict[str, Any] = {"stages": stage_table(run_dir), "top_reasons": top_reasons(run_dir),
                           "output": output_summary(run_dir), "languages": None, "quality_histogram": None,
                           "tokens_by_source": None}
    con = connect(run_dir, views=["kept"])
    described = con.execute("describe kept").fetchall()
    cols = [r[0] for r in described]
    types = {r[0]: str(r[1]) for r in described}
    out["columns"] = cols
    if "lang" in cols:
        rows = con.execute("select coalesce(lang, '?'), count(*) from kept group by 1 order by 2 desc, 1 limit 30").fetchall()
        out["languages"] = [{"lang": lang, "docs": int(n)} for lang, n in rows]
    if "quality" in cols:
        out["quality_histogram"] = _histogram(con, "quality")
    # Packed rows (input_ids + doc_lens) mix sources within a row: no per-source tokens there.
    if "num_tokens" in cols:
        expr = "sum(num_tokens)"
    elif "input_ids" in cols and "doc_lens" not in cols:
        expr = "sum(len(input_ids))"
    else:
        expr = None
    if expr and types.get("source") == "VARCHAR":
        rows = con.execute(f"select coalesce(source, '?'), coalesce({expr}, 0) from kept group by 1 order by 2 desc").fetchall()
        out["tokens_by_source"] = {s: int(n) for s, n in rows}
    con.close()
    return out


def _histogram(con, column: str, bins: int = 20) -> list[dict[str, Any]]:
    lo, hi, n = con.execute(f'select min("{column}"), max("{column}"), count("{column}") from kept').fetchone()
    if not n:
        return []
    lo, hi = float(lo), float(hi)
    if lo >= 0 and hi <= 1:  # probabilities: fixed bins read the same across runs
        lo, hi = 0.0, 1.0
    width = (hi - lo) / bins or 1.0
    counts = dict(con.execute(
        f'select least(greatest(floor(("{column}" - ?) / ?)::int, 0), ?) as b, count(*) from kept '
        f'where "{column}" is not null group by 1', [lo, width, bins - 1]).fetchall())
    return [{"lo": round(lo + i * width, 6), "hi": round(lo + (i + 1) * width, 6), "docs": int(counts.get(i, 0))}
            for i in range(bins)]


class StatsCache:
    """Stats of a run, recomputed only when its progress.json changes (every committed shard
    rewrites it), and computed once when many clients ask at the same moment."""

    def __init__(self, compute: Callable[[Path], bytes], size: int = 64):
        self._compute = compute
        self._size = size
        self._lock = threading.Lock()
        self._done: OrderedDict[tuple, bytes] = OrderedDict()
        self._pending: dict[tuple, threading.Event] = {}

    @staticmethod
    def _key(run_dir: Path) -> tuple:
        def mtime(path: Path) -> int | None:
            try:
                return path.stat().st_mtime_ns
            except OSError:
                return None
        rd = RunDir(run_dir)
        return (str(run_dir), mtime(Path(rd.progress_file)), mtime(Path(rd.dag_file)))

    def get(self, run_dir: Path) -> bytes:
        key = self._key(run_dir)
        while True:
            with self._lock:
                if key in self._done:
                    self._done.move_to_end(key)
                    return self._done[key]
                ev = self._pending.get(key)
                if ev is None:
                    ev = self._pending[key] = threading.Event()
                    break
            ev.wait()  # someone else computes it; take theirs (or compute if they failed)
        try:
            value = self._compute(run_dir)
            with self._lock:
                self._done[key] = value
                while len(self._done) > self._size:
                    self._done.popitem(last=False)
            return value
        finally:
            with self._lock:
                self._pending.pop(key, None)
            ev.set()


class RunCache:
    """Answers (JSON bytes) keyed by a run's progress.json and dag.yaml mtimes plus the
    request's parameters: a finished run's histograms are computed once."""

    def __init__(self, size: int = 256):
        self._size = size
        self._lock = threading.Lock()
        self._done: OrderedDict[tuple, bytes] = OrderedDict()

    def get(self, run_dir: Path, params: tuple, compute: Callable[[], Any]) -> bytes:
        key = StatsCache._key(run_dir) + params
        with self._lock:
            if key in self._done:
                self._done.move_to_end(key)
                return self._done[key]
        value = json.dumps(compute()).encode()
        with self._lock:
            self._done[key] = value
            while len(self._done) > self._size:
                self._done.popitem(last=False)
        return value
