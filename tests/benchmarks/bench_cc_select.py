"""Selection at snapshot scale (issue 63): the driver's peak RSS and wall time to plan a
``format: cc_index`` input against the records it selects, on simulated Common Crawl indexes,
with this tree's code and (``--base REV``) another commit's, each planning in a fresh process.
Prints figures and the per-record projection to a snapshot; asserts nothing.

    .venv/bin/python tests/benchmarks/bench_cc_select.py [--rows 1e6,5e6,2e7] [--base REV]
        [--base-max-rows 2e7] [--per-warc 20000] [--english 0.55]

The simulated index: the committed index's rows (tests/data/cc_index, Common Crawl's schema)
repeated ``--rows`` times, each copy its own URL, spread over WARC files of ``--per-warc``
records (a snapshot: ~1.8e9 records in 90,000 WARCs, ~20,000 a file) at increasing offsets, a
share ``--english`` of them ``content_languages = 'eng'`` (the others other languages), written
as Parquet files of 1M rows in row groups of 64k, rows in random order (Common Crawl's are in
URL order, which mixes every WARC file in every row group: the selection must be sorted). The
where is ``content_languages LIKE 'eng%'`` (no row group can be skipped, as on Common Crawl).
Cached under ``$BENCH_TMP/refinery-cc-select/`` by size.

Each plan runs in a child process (``plan_index``: the scan, the sort, the shards; the
selection files below a work folder for the code that writes them): its wall time, its peak
RSS (``ru_maxrss``), what it wrote, then, for the code that writes them, one task's read of
its rows. The projection is the slope between the two largest sizes, times 1.8e9 index
records.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
TMP = Path(os.environ.get("BENCH_TMP", "/tmp")) / "refinery-cc-select"
SNAPSHOT = 1.8e9
FILE_ROWS = 1 << 20
WHERE = "content_languages LIKE 'eng%'"


def build_index(rows: int, per_warc: int, english: float) -> Path:
    """The simulated index of ``rows`` records (cached)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    out = TMP / f"index-{rows}-{per_warc}-{english}"
    if (out / "_done").exists():
        return out
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    base = ds.dataset(str(REPO / "tests/data/cc_index"), format="parquet").to_table()
    base = base.select(["url_surtkey", "url", "url_host_registered_domain", "fetch_status", "content_mime_detected",
                        "warc_record_length"])
    rng = np.random.default_rng(rows)
    order = rng.permutation(rows)
    others = pa.array(["deu", "fra", "rus", "jpn", "spa", "zho", "por,eng", "ita", "pol", "swe"])
    for k, at in enumerate(range(0, rows, FILE_ROWS)):
        i = np.sort(order[at:at + FILE_ROWS])  # the copies this file holds: from every WARC file
        rng.shuffle(i)
        t = base.take(pa.array(i % base.num_rows))
        tag = pc.cast(pa.array(i), pa.string())
        for col in ("url", "url_surtkey"):
            t = t.set_column(t.schema.get_field_index(col), col, pc.binary_join_element_wise(t[col], tag, "?r="))
        warc = pa.DictionaryArray.from_arrays(
            pa.array(i // per_warc, pa.int32()),
            pa.array([f"crawl-data/CC-MAIN-SIM/segments/1/warc/CC-MAIN-SIM-{j:05d}.warc.gz"
                      for j in range(rows // per_warc + 1)])).cast(pa.string())
        lang = np.where(rng.random(len(i)) < english, -1, rng.integers(0, len(others), len(i)))
        langs = pc.if_else(pa.array(lang < 0), pa.scalar("eng"), others.take(pa.array(np.maximum(lang, 0))))
        t = t.append_column("content_languages", langs).append_column("warc_filename", warc)
        t = t.append_column("warc_record_offset", pa.array((i % per_warc) * 60_000, pa.int64()))
        pq.write_table(t, out / f"part-{k:05d}.parquet", row_group_size=1 << 16)
    (out / "_done").write_text("")
    return out


def child(index: str, work: str) -> None:
    """Plan the input (in this process: its peak RSS is the plan's) and print the figures as JSON."""
    import inspect
    import threading

    spool = Path(work).with_name("spool")  # the sort's spill: its peak size sampled
    spool.mkdir(parents=True, exist_ok=True)
    os.environ["REFINERY_SPOOL"] = str(spool)
    peak = [0]

    def sample() -> None:
        while True:
            peak[0] = max(peak[0], sum(f.stat().st_size for f in spool.rglob("*") if f.is_file()))
            time.sleep(1)

    threading.Thread(target=sample, daemon=True).start()
    from curation.io.inputs import InputSpec, plan_index

    spec = InputSpec(format="cc_index", paths=[index + "/*.parquet"], where=WHERE, warc_root="/nowhere",
                     source="web")
    t0 = time.perf_counter()
    writes = "work_dir" in inspect.signature(plan_index).parameters
    p = plan_index("crawl", spec, None, work) if writes else plan_index("crawl", spec)
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    shipped = sum(len(getattr(s, "records", b"") or b"") for s in p.shards)  # the old code: records in the tasks
    out = {"wall_s": wall, "rss": rss, "records": p.records, "bytes": p.bytes, "shards": len(p.shards),
           "warc_files": len(p.files), "shipped_bytes": shipped, "writes": writes,
           "code": str(Path(inspect.getfile(plan_index)).parents[2]), "spill_peak": peak[0]}
    if writes:
        from curation.io.cc_selection import read_slice

        out["written_bytes"] = sum(f.stat().st_size for f in Path(work).rglob("*") if f.is_file())
        s = p.shards[len(p.shards) // 2]
        t0 = time.perf_counter()
        n = read_slice(s.selection).num_rows
        out["task_read_s"], out["task_rows"] = time.perf_counter() - t0, n
    print("RESULT " + json.dumps(out), flush=True)


def measure(tree: Path, index: Path) -> dict:
    work = TMP / "work"
    shutil.rmtree(work, ignore_errors=True)
    env = {**os.environ, "PYTHONPATH": str(tree)}
    res = subprocess.run([sys.executable, __file__, "--child", str(index), str(work)], env=env, cwd=tree,
                         capture_output=True, text=True)
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(work.with_name("spool"), ignore_errors=True)
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        return {"error": (res.stderr or res.stdout)[-400:]}
    return json.loads(line[7:])


def show(label: str, rows: int, r: dict) -> None:
    if "error" in r:
        print(f"  {label:>6} {rows:>12,} index rows: failed: {r['error']}")
        return
    extra = (f"; spilled {r['spill_peak'] / max(r['records'], 1):,.0f} B a record at the peak"
             f"; wrote {r['written_bytes'] / 2**20:,.0f} MiB ({r['written_bytes'] / max(r['records'], 1):.1f} B a "
             f"record), a task read its {r['task_rows']:,} rows in {r['task_read_s'] * 1e3:.0f} ms") if r["writes"] \
        else f"; {r['shipped_bytes'] / 2**20:,.0f} MiB of records held for the tasks"
    print(f"  {label:>6} ({r['code']}) {rows:>12,} index rows: {r['records']:>11,} selected in {r['warc_files']:,} WARCs, "
          f"{r['shards']:,} shards: {r['wall_s']:7.1f} s, peak RSS {r['rss'] / 2**20:7,.0f} MiB{extra}", flush=True)


def project(label: str, pts: list[tuple[int, dict]]) -> None:
    pts = [(n, r) for n, r in pts if "error" not in r]
    if len(pts) < 2:
        return
    (n0, a), (n1, b) = pts[-2], pts[-1]
    k = SNAPSHOT / n1 * b["records"]  # the selected records of a snapshot at this share
    rss_rec = (b["rss"] - a["rss"]) / max(b["records"] - a["records"], 1)
    s_rec = (b["wall_s"] - a["wall_s"]) / max(b["records"] - a["records"], 1)
    print(f"  {label}: {rss_rec:,.1f} B of RSS and {s_rec * 1e6:.2f} us a selected record (between "
          f"{n0:,.0g} and {n1:,.0g} rows) -> a snapshot ({SNAPSHOT:.1e} index rows, {k:.2e} selected): "
          f"RSS {(b['rss'] + rss_rec * (k - b['records'])) / 2**30:,.1f} GiB, {(b['wall_s'] + s_rec * (k - b['records'])) / 3600:,.1f} h")


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1e6,5e6,2e7", help="index sizes, comma-separated")
    ap.add_argument("--base", help="git revision of the 'before' code (a detached worktree)")
    ap.add_argument("--base-max-rows", type=float, default=2e7, help="the largest size to plan with the base code")
    ap.add_argument("--per-warc", type=int, default=20_000)
    ap.add_argument("--english", type=float, default=0.55)
    a = ap.parse_args()
    sizes = [int(float(x)) for x in a.rows.split(",")]
    TMP.mkdir(parents=True, exist_ok=True)
    sides = [("after", REPO)]
    if a.base:
        from byte_identity import tree_of

        sides.insert(0, ("before", tree_of(a.base, TMP / "trees")[0]))
    got: dict[str, list[tuple[int, dict]]] = {s: [] for s, _ in sides}
    for n in sizes:
        t0 = time.perf_counter()
        index = build_index(n, a.per_warc, a.english)
        print(f"index of {n:,} rows: {index} ({time.perf_counter() - t0:.0f} s)", flush=True)
        for label, tree in sides:
            if label == "before" and n > a.base_max_rows:
                continue
            got[label].append((n, measure(tree, index)))
            show(label, n, got[label][-1][1])
    print("\nprojection:")
    for label, _ in sides:
        project(label, got[label])


if __name__ == "__main__":
    main()
