"""The dashboard's document browser: a stage's kept and rejected rows, page by page, and
per signal column a histogram with the stage's thresholds on it.

Everything goes through the run's manifests (``RunDir.committed`` with the DAG's params
hashes, as the SQL views do): a shard exists when its manifest line does, and its row
counts come from that line. Reads are bounded:

- a page of documents decodes only the row groups holding its rows (at most ``limit``
  rows, ``MAX_LIMIT``), shards before the page are skipped by their manifest counts;
- a reason filter skips shards by per-shard reason counts, computed once per rejected file
  (its ``reason`` column only) and cached by path, size and mtime;
- a histogram is two DuckDB aggregates over one column of the stage's shards, at most
  ``MAX_BINS`` bins, under a time limit; files without the column count as nulls from
  their manifest rows, unread.

Thresholds come from the DAG as run (``RUN/dag.yaml``, parsed into stage objects) and the
stage class's ``rules`` table: ``Stage.bound_rules()`` pairs each rule's signal column(s)
and comparison with the threshold values of this run.
"""

from __future__ import annotations

import datetime as _dt
import decimal
import functools
import math
import os
import threading
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from curation.io import location
from curation.pipeline.dag import Dag
from curation.pipeline.rundir import RunDir

MAX_LIMIT = 200
MAX_BINS = 100
MAX_TEXT_CHARS = 200_000
MAX_CELL_CHARS = 2_000
MAX_LIST_ITEMS = 32
MAX_REASONS = 500
MAX_SPAN = 1.7976931348623157e308  # hi - lo of a histogram: a double
MAX_WHOLE = 1 << 53  # integer histograms: whole-number bounds a double holds exactly
TEXT = "text"
REASON = "reason"
#: comparisons whose threshold is a point on the signal's axis: which side of it drops
_SIDES = {"<": ("below",), "< or null": ("below",), "< unless 0": ("below",), ">": ("above",),
          "outside": ("below", "above")}


class BrowseError(ValueError):
    """A request the browser cannot answer; ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


# ---------------------------------------------------------------------------------------------
# a stage's shards, from its manifest


@dataclass(frozen=True)
class Shard:
    key: str
    kept: str | None  # absolute path, None when the stage wrote no file for this shard
    kept_rows: int
    rejected: str | None
    rejected_rows: int

    def file(self, which: str) -> tuple[str | None, int]:
        return (self.kept, self.kept_rows) if which == "kept" else (self.rejected, self.rejected_rows)


def nodes(dag: Dag) -> list[str]:
    """Nodes with shards of their own, in DAG order: inputs, then stages (unions are views of
    their branches and have no rejected rows of their own)."""
    return list(dag.inputs) + [n for n, st in dag.stages.items() if st.kind != "union"]


def _inside(rd: RunDir, rel: str) -> str:
    if rd.remote:  # no symlinks on object storage: the key itself must stay under the root
        if ".." in rel.split("/"):
            raise BrowseError(f"manifest names a file outside the run directory: {rel!r}", 500)
        return rd.path(rel)
    p = Path(rd.path(rel)).resolve()
    if not str(p).startswith(rd.root + os.sep):
        raise BrowseError(f"manifest names a file outside the run directory: {rel!r}", 500)
    return str(p)


def stage_shards(rd: RunDir, dag: Dag, node: str, hashes: dict[str, str] | None = None) -> list[Shard]:
    """The committed shards of ``node`` (sorted by key), as the manifest states them."""
    if node not in nodes(dag):
        raise BrowseError(f"stage {node!r} is not a node with shards in this run "
                          f"(one of: {', '.join(nodes(dag))})", 404)
    hashes = hashes or dag.hashes()
    out = []
    for key, e in sorted(rd.committed(node, hashes[node]).items()):
        kept = _inside(rd, e["file"]) if e.get("file") else None
        rej = _inside(rd, e["rejected_file"]) if e.get("rejected_file") else None
        out.append(Shard(key, kept, int(e.get("rows", 0)) if kept else 0, rej,
                         int(e.get("rejected_rows", 0)) if rej else 0))
    return out


def _stat_key(path: str) -> tuple[str, int, int]:
    st = os.stat(path)
    return path, st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=8192)
def _schema(path: str, mtime_ns: int, size: int) -> pa.Schema:
    return location.read_schema(path)


def file_schema(path: str) -> pa.Schema:
    """A shard's schema (its footer), cached until the file changes."""
    return _schema(*_stat_key(path))


@functools.lru_cache(maxsize=8192)
def _reasons(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, int], ...]:
    if REASON not in location.read_schema(path).names:
        return ()
    col = location.read_parquet(path, columns=[REASON]).column(REASON)
    vc = pc.value_counts(col.combine_chunks() if col.num_chunks != 1 else col.chunk(0))
    return tuple((str(v) if v is not None else "", int(n))
                 for v, n in zip(vc.field("values").to_pylist(), vc.field("counts").to_pylist()))


def reason_counts(path: str) -> dict[str, int]:
    """Rows per reason in one rejected file (its ``reason`` column only), cached."""
    return dict(_reasons(*_stat_key(path)))


# ---------------------------------------------------------------------------------------------
# rules and thresholds


def _number(v: Any) -> float | int | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return v if math.isfinite(v) else None


def stage_rules(dag: Dag, node: str) -> list[dict[str, Any]]:
    """The stage's rules with this run's thresholds, in the order they are checked."""
    st = dag.stages.get(node)
    if st is None or not getattr(st, "rules", ()):
        return []
    out = []
    for r in st.bound_rules():
        out.append({"reason": f"{st.type}:{r.name}", "signals": list(r.signals), "op": r.op,
                    "params": list(r.params), "values": [_jsonable(v) for v in r.values]})
    return out


def thresholds(dag: Dag, node: str) -> dict[str, list[dict[str, Any]]]:
    """Per signal column, the points on its axis where a rule of the stage starts dropping:
    ``{column: [{value, drops: below|above, param, reason, op}]}``. Rules that are switched
    off (a ``None`` threshold) or have no numeric threshold (``true``, ``not in``...) have none."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in stage_rules(dag, node):
        sides = _SIDES.get(r["op"])
        if not sides:
            continue
        for side, param, value in zip(sides, r["params"], r["values"]):
            v = _number(value)
            if v is None:
                continue
            t = {"value": v, "drops": side, "param": param, "reason": r["reason"], "op": r["op"]}
            if r["op"] == "< unless 0" and len(r["values"]) > 1 and r["values"][1]:
                t["note"] = "0 passes"
            out.setdefault(r["signals"][0], []).append(t)
    return out


# ---------------------------------------------------------------------------------------------
# the stage summary


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t) or pa.types.is_decimal(t)


def stage_columns(shards: list[Shard]) -> dict[str, pa.DataType]:
    """Every column of the stage's kept and rejected files (first type seen wins)."""
    cols: dict[str, pa.DataType] = {}
    for s in shards:
        for path in (s.kept, s.rejected):
            if path:
                for f in file_schema(path):
                    cols.setdefault(f.name, f.type)
    return cols


def list_stages(rd: RunDir) -> list[dict[str, Any]]:
    """Every node with shards, with its kept / rejected row counts (manifests only)."""
    dag = rd.load_dag()
    hashes = dag.hashes()
    out = []
    for node in nodes(dag):
        shards = stage_shards(rd, dag, node, hashes)
        st = dag.stages.get(node)
        out.append({"stage": node, "type": "input" if st is None else st.type,
                    "kind": "input" if st is None else st.kind, "shards": len(shards),
                    "kept": sum(s.kept_rows for s in shards), "rejected": sum(s.rejected_rows for s in shards),
                    "kept_written": any(s.kept for s in shards),
                    "rules": len(st.rules) if st is not None and hasattr(st, "bound_rules") else 0})
    return out


def describe_stage(rd: RunDir, node: str) -> dict[str, Any]:
    """A stage's counts, columns (and which are numeric signals), rules with thresholds, and
    its rejection reasons with counts."""
    dag = rd.load_dag()
    shards = stage_shards(rd, dag, node)
    cols = stage_columns(shards)
    thr = thresholds(dag, node)
    rules = stage_rules(dag, node)
    rule_signals = list(dict.fromkeys(s for r in rules for s in r["signals"] if s in cols))
    numeric = [c for c, t in cols.items() if _numeric(t)]
    # the stage's own rule signals first, then the rest (upstream stages' signals...)
    signals = [c for c in rule_signals if c in numeric] + [c for c in numeric if c not in rule_signals]
    reasons: Counter[str] = Counter()
    for s in shards:
        if s.rejected:
            reasons.update(reason_counts(s.rejected))
    st = dag.stages.get(node)
    return {"stage": node, "type": "input" if st is None else st.type, "kind": "input" if st is None else st.kind,
            "shards": len(shards), "kept": sum(s.kept_rows for s in shards),
            "rejected": sum(s.rejected_rows for s in shards), "kept_written": any(s.kept for s in shards),
            "columns": [{"name": c, "type": str(t), "numeric": c in numeric} for c, t in cols.items()],
            "signals": signals, "rule_signals": rule_signals, "rules": rules, "thresholds": thr,
            "reasons": [{"reason": r, "docs": n} for r, n in sorted(reasons.items(), key=lambda x: (-x[1], x[0]))
                        ][:MAX_REASONS],
            "reasons_total": len(reasons)}


# ---------------------------------------------------------------------------------------------
# documents


def _jsonable(v: Any, max_chars: int = MAX_CELL_CHARS) -> Any:
    if v is None or isinstance(v, (bool, int, str)):
        if isinstance(v, str) and len(v) > max_chars:
            return v[:max_chars] + "…"
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)  # NaN / inf are not JSON
    if isinstance(v, (bytes, bytearray, memoryview)):
        return f"<{len(bytes(v))} bytes>"
    if isinstance(v, (list, tuple, np.ndarray)):
        items = [_jsonable(x, max_chars) for x in list(v)[:MAX_LIST_ITEMS]]
        if len(v) > MAX_LIST_ITEMS:
            items.append(f"… {len(v)} items")
        return items
    if isinstance(v, dict):
        return {str(k): _jsonable(x, max_chars) for k, x in list(v.items())[:MAX_LIST_ITEMS]}
    if isinstance(v, (_dt.date, _dt.datetime, _dt.time)):
        return v.isoformat()
    if isinstance(v, (np.integer, np.floating)):
        return _jsonable(v.item(), max_chars)
    if isinstance(v, decimal.Decimal):
        return float(v)
    return str(v)


def _group_starts(pf: pq.ParquetFile) -> np.ndarray:
    sizes = [pf.metadata.row_group(g).num_rows for g in range(pf.num_row_groups)]
    return np.r_[0, np.cumsum(sizes)].astype(np.int64)


def read_rows(path: str, rows: np.ndarray) -> pa.Table:
    """Rows at sorted positions ``rows`` of a shard, decoding only the row groups holding them."""
    pf = location.parquet_file(path)
    starts = _group_starts(pf)
    rows = np.asarray(rows, dtype=np.int64)
    if not len(rows):
        return pf.schema_arrow.empty_table()
    groups = np.unique(np.searchsorted(starts, rows, side="right") - 1)
    t = pf.read_row_groups(groups.tolist())
    local = np.concatenate([np.arange(starts[g], starts[g + 1]) for g in groups])
    return t.take(pa.array(np.searchsorted(local, rows)))


def whole_rows(rd: RunDir, dag: Dag, node: str, key: str, rows: pa.Table) -> pa.Table:
    """``rows`` of a stage's shard ``key`` as whole rows. A stage that writes its signals only
    (``Dag.writes_rows``) holds ``id`` and its own columns; the rest is its input's row of the
    same key (the same task wrote both), found by id, recursively; only the row groups holding
    those ids are decoded."""
    if node not in dag.stages or dag.writes_rows(node) or not rows.num_rows:
        return rows
    hashes = dag.hashes()
    for f in dag.feeders(node):
        e = rd.committed(f, hashes[f]).get(key)
        if e and e.get("file"):
            break
    else:
        return rows
    path = _inside(rd, e["file"])
    up_ids = location.read_parquet(path, columns=["id"]).column("id")
    wanted = pc.is_valid(pc.index_in(up_ids, value_set=rows.column("id"))).to_numpy(zero_copy_only=False)
    up = whole_rows(rd, dag, f, key, read_rows(path, np.flatnonzero(wanted)))
    up = up.take(pc.index_in(rows.column("id"), value_set=up.column("id")))
    own = [c for c in rows.column_names if c != "id"]
    up = up.drop_columns([c for c in own if c in up.column_names])
    for c in own:
        up = up.append_column(c, rows.column(c))
    return up


def _matching_rows(path: str, reason: str) -> np.ndarray:
    col = location.read_parquet(path, columns=[REASON]).column(REASON)
    return np.flatnonzero(pc.fill_null(pc.equal(col, pa.scalar(reason)), False).to_numpy(zero_copy_only=False))


def documents(rd: RunDir, node: str, which: str = "kept", reason: str | None = None, offset: int = 0,
              limit: int = 20, max_chars: int = 1000) -> dict[str, Any]:
    """Rows ``offset .. offset+limit`` of a stage's kept or rejected documents (rejected ones
    optionally only those whose ``reason`` equals ``reason``), in shard-key then row order.
    Each document: its text cut to ``max_chars`` (with its full length) and every other
    column of the row."""
    if which not in ("kept", "rejected"):
        raise BrowseError("which: 'kept' or 'rejected'")
    if reason is not None and which != "rejected":
        raise BrowseError("reason: only rejected documents have a reason (which=rejected)")
    if not (1 <= limit <= MAX_LIMIT):
        raise BrowseError(f"limit: between 1 and {MAX_LIMIT}")
    if offset < 0:
        raise BrowseError("offset: not negative")
    max_chars = max(0, min(max_chars, MAX_TEXT_CHARS))
    dag = rd.load_dag()
    shards = stage_shards(rd, dag, node)
    # (shard, path, rows of this selection in it) in order; counts from the manifest or the
    # cached reason counts, so shards before the page are never opened
    parts = []
    for s in shards:
        path, n = s.file(which)
        if not path or not n:
            continue
        if reason is not None:
            n = reason_counts(path).get(reason, 0)
            if not n:
                continue
        parts.append((s, path, n))
    total = sum(n for _, _, n in parts)
    docs: list[dict[str, Any]] = []
    skip, want, pos = offset, limit, 0
    for s, path, n in parts:
        if want <= 0:
            break
        if skip >= n:
            skip -= n
            pos += n
            continue
        if reason is None:
            rows = np.arange(skip, min(n, skip + want))
        else:
            rows = _matching_rows(path, reason)[skip: skip + want]
        t = read_rows(path, rows)
        if which == "kept":
            t = whole_rows(rd, dag, node, s.key, t)
        for i, rec in enumerate(t.to_pylist()):
            text = rec.pop(TEXT, None)
            text_chars = len(text) if isinstance(text, str) else None
            docs.append({"index": pos + skip + i, "shard": s.key, "row": int(rows[i]),
                         "id": _jsonable(rec.get("id")), "reason": rec.get(REASON),
                         "text": text[:max_chars] if isinstance(text, str) else _jsonable(text),
                         "text_chars": text_chars,
                         "text_truncated": bool(text_chars is not None and text_chars > max_chars),
                         "fields": {k: _jsonable(v) for k, v in rec.items()}})
        pos += n
        want -= len(rows)
        skip = 0
    return {"stage": node, "which": which, "reason": reason, "offset": offset, "limit": limit, "total": total,
            "documents": docs}


# ---------------------------------------------------------------------------------------------
# histograms


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def _ident(s: str) -> str:
    return '"' + s.replace('"', '""') + '"'


def _run_bounded(con, timeout_s: float, fn):
    import duckdb

    timed_out = threading.Event()

    def interrupt() -> None:
        timed_out.set()
        con.interrupt()

    timer = threading.Timer(timeout_s, interrupt)
    timer.start()
    try:
        return fn()
    except duckdb.Error as e:
        if timed_out.is_set():
            raise BrowseError(f"histogram exceeded the {timeout_s:g} s time limit", 408) from None
        raise BrowseError(f"histogram: {str(e).splitlines()[0]}", 422) from None
    finally:
        timer.cancel()


def histogram(rd: RunDir, node: str, column: str, bins: int = 30, clip: float = 0.0, lo: float | None = None,
              hi: float | None = None, timeout_s: float = 10.0, memory_limit: str = "512MB") -> dict[str, Any]:
    """The distribution of ``column`` over the stage's kept and rejected rows: at most ``bins``
    bins (integer columns get whole-number bins) from ``lo`` to ``hi`` (default: the values'
    range; ``clip`` cuts that fraction off each tail, by approximate quantiles), each bin with
    its kept and rejected counts, and the stage's thresholds for the column.

    ``rows`` = sum of bin ``docs`` + ``below`` + ``above`` + ``nulls`` (null, NaN or infinite,
    or a file without the column)."""
    import duckdb

    if not (1 <= bins <= MAX_BINS):
        raise BrowseError(f"bins: between 1 and {MAX_BINS}")
    if not (0 <= clip < 0.5):
        raise BrowseError("clip: a fraction in [0, 0.5)")
    if any(x is not None and not math.isfinite(x) for x in (lo, hi)):
        raise BrowseError("lo, hi: finite numbers")
    if lo is not None and hi is not None and not lo < hi:
        raise BrowseError("lo, hi: lo must be below hi")
    if lo is not None and hi is not None and not math.isfinite(hi - lo):
        raise BrowseError(f"lo, hi: hi - lo must be a finite number (at most {MAX_SPAN:.3g})")
    dag = rd.load_dag()
    shards = stage_shards(rd, dag, node)
    cols = stage_columns(shards)
    if column not in cols:
        raise BrowseError(f"column {column!r}: not a column of stage {node!r}", 404)
    ctype = cols[column]
    if not _numeric(ctype):
        raise BrowseError(f"column {column!r}: {ctype} is not numeric")
    integer = pa.types.is_integer(ctype) or pa.types.is_boolean(ctype)
    rows_total = 0
    files: dict[str, list[str]] = {"kept": [], "rejected": []}
    for s in shards:
        for which in ("kept", "rejected"):
            path, n = s.file(which)
            if not path:
                continue
            rows_total += n
            if column in file_schema(path).names:  # files without it: nulls, left unread
                files[which].append(path)
    selects = [f"select {_ident(column)}::double as v, {int(which == 'rejected')} as r "
               f"from read_parquet([{', '.join(_q(p) for p in paths)}], union_by_name=true)"
               for which, paths in files.items() if paths]
    thr = thresholds(dag, node).get(column, [])
    out: dict[str, Any] = {"stage": node, "column": column, "type": str(ctype), "integer": integer,
                           "rows": rows_total, "kept_rows": sum(s.kept_rows for s in shards),
                           "rejected_rows": sum(s.rejected_rows for s in shards), "thresholds": thr,
                           "bins": [], "below": 0, "above": 0, "nulls": rows_total, "min": None, "max": None,
                           "lo": None, "hi": None}
    if not selects:
        return out
    data = "(" + " union all ".join(selects) + ")"
    con = duckdb.connect(":memory:")
    try:
        con.execute("set threads = 2")
        con.execute(f"set memory_limit = '{memory_limit}'")
        con.execute("set temp_directory = ''")

        def stats():
            q = "select count(*), count(v) filter (where isfinite(v)), min(v) filter (where isfinite(v)), " \
                "max(v) filter (where isfinite(v))"
            if clip:
                q += f", approx_quantile(v, {clip!r}) filter (where isfinite(v)), " \
                     f"approx_quantile(v, {1 - clip!r}) filter (where isfinite(v))"
            return con.execute(q + f" from {data}").fetchone()

        st = _run_bounded(con, timeout_s, stats)
        n_finite, vmin, vmax = int(st[1]), st[2], st[3]
        out.update(nulls=rows_total - n_finite, min=vmin, max=vmax)
        if not n_finite:
            return out
        a = lo if lo is not None else (float(st[4]) if clip else float(vmin))
        b = hi if hi is not None else (float(st[5]) if clip else float(vmax))
        # a threshold just off the values' range widens it (up to half the range) so its line shows
        for t in thr:
            v = float(t["value"])
            if lo is None and v < a and a - v <= 0.5 * max(b - a, 0.0):
                a = v
            if hi is None and v > b and v - b <= 0.5 * max(b - a, 0.0):
                b = v
        if not math.isfinite(b - a):  # values (or one bound) near ±1.8e308: no bin width fits
            raise BrowseError(f"column {column!r}: its range is wider than {MAX_SPAN:.3g}; pass lo and hi closer "
                              "together")
        if integer:  # whole numbers a..b: bin i holds [a + i*w, a + (i+1)*w), the last one up to b
            # whole-number bounds past 2**53 mean nothing to a double (and make SQL literals of
            # 300 digits): clamped there, as the values (int64 read as doubles) are
            a, b = (min(max(math.floor(x), -MAX_WHOLE), MAX_WHOLE) for x in (a, b))
            width = max(1, math.ceil((b - a + 1) / bins))
            nb = max(1, math.ceil((b - a + 1) / width))
            top = b + 1
            inside = f"v >= {a!r} and v < {top!r}"
        else:
            if b <= a:  # one value (or a clipped range of one): one bin
                nb, width, b = 1, 1.0, a + 1.0
            else:
                nb, width = bins, (b - a) / bins
            top = b
            inside = f"v >= {a!r} and v <= {b!r}"
        bin_expr = f"least(greatest(floor((v - {a!r}) / {width!r})::bigint, 0), {nb - 1})"

        def count_bins():
            q = (f"select case when v < {a!r} then -1 when not ({inside}) then -2 else {bin_expr} end as b, r, "
                 f"count(*) from {data} where isfinite(v) group by 1, 2")
            return con.execute(q).fetchall()

        counts = _run_bounded(con, timeout_s, count_bins)
    finally:
        con.close()
    kept = [0] * nb
    rej = [0] * nb
    below = above = 0
    for b_, r, n in counts:
        if b_ == -1:
            below += n
        elif b_ == -2:
            above += n
        else:
            (rej if r else kept)[b_] += n
    out.update(lo=a, hi=top, below=below, above=above, bins=[
        {"lo": _round(a + i * width), "hi": _round(top if i == nb - 1 else a + (i + 1) * width),
         "docs": kept[i] + rej[i], "kept": kept[i], "rejected": rej[i]} for i in range(nb)])
    return out


def _round(x: float) -> float | int:
    if float(x).is_integer():
        return int(x)
    return float(f"{x:.6g}")
