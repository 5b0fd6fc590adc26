"""What the ``select`` sandbox costs per batch (issue #52): a sandboxed connection made per
call versus the one cached per thread, side by side on the same batches.

    .venv/bin/python tests/benchmarks/bench_select_sandbox.py [--rows 2000] [--batches 200]
"""

from __future__ import annotations

import argparse
import time

import duckdb
import pyarrow as pa

from curation.stages.select import _TEMPLATE, SANDBOX_CONFIG, Select


def per_call(where: str, rows: pa.Table) -> pa.ChunkedArray:
    con = duckdb.connect(config=dict(SANDBOX_CONFIG))
    try:
        con.register("rows", rows)
        return con.sql(_TEMPLATE.format(where=where)).to_arrow_table().column("k")
    finally:
        con.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--batches", type=int, default=200)
    a = ap.parse_args()
    batch = pa.table({"id": [str(i) for i in range(a.rows)], "text": ["word " * (i % 300) for i in range(a.rows)],
                      "lang": ["en" if i % 3 else "de" for i in range(a.rows)]})
    where = "lang = 'en' AND length(text) / 5 > 20"
    stage = Select(where=where, name="s", input="docs")
    stage.process(batch)  # warm: the thread's connection, the parse cache
    cached = fresh = 0.0
    for _ in range(a.batches):  # alternating, so drift hits both alike
        t = time.perf_counter()
        stage.process(batch)
        cached += time.perf_counter() - t
        t = time.perf_counter()
        cols = sorted(stage.required_columns())
        per_call(where, batch.select(cols))
        fresh += time.perf_counter() - t
    print(f"rows/batch {a.rows}, batches {a.batches}")
    print(f"thread-cached connection: {1000 * cached / a.batches:.2f} ms/batch")
    print(f"connection per call:      {1000 * fresh / a.batches:.2f} ms/batch  (x{fresh / cached:.1f})")


if __name__ == "__main__":
    main()
