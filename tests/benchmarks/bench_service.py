"""Service latency under concurrent reads: print figures, exit 1 if any request fails.

50 concurrent ``GET /runs/{id}`` and 50 concurrent ``GET /runs/{id}/stats`` against a finished
run (stats twice: the first wave on a cold cache, where one request computes and the rest
wait for it, then warm), plus ``GET /runs`` and a wave of small SQL queries (at most 4 run at
once by design; the rest queue briefly or get 429).

Self-contained by default: starts a server on a free port over a temporary runs directory and
runs pipelines/demo.yaml through it first. Or point it at a running service:

    .venv/bin/python tests/benchmarks/bench_service.py
    .venv/bin/python tests/benchmarks/bench_service.py --url http://127.0.0.1:8080 --token-file token --run RUN_ID
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
for p in (REPO, REPO / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


async def wave(client: httpx.AsyncClient, path: str, n: int, params: dict | None = None) -> dict:
    """``n`` concurrent GETs of ``path``; latencies in ms and status counts."""
    async def one() -> tuple[int, float]:
        t0 = time.perf_counter()
        r = await client.get(path, params=params)
        return r.status_code, (time.perf_counter() - t0) * 1000

    t0 = time.perf_counter()
    results = await asyncio.gather(*(one() for _ in range(n)))
    wall = (time.perf_counter() - t0) * 1000
    lat = [ms for _, ms in results]
    codes: dict[int, int] = {}
    for c, _ in results:
        codes[c] = codes.get(c, 0) + 1
    return {"n": n, "ok": codes.get(200, 0), "codes": codes, "p50": statistics.median(lat), "p95": _pct(lat, 0.95),
            "max": max(lat), "wall": wall}


async def bench(url: str, token: str, run_id: str, n: int) -> list[tuple[str, dict]]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120,
                                 limits=limits) as c:
        out = [
            ("GET /healthz (HTTP floor)", await wave(c, "/healthz", n)),
            ("GET /runs/{id}/stats (cold)", await wave(c, f"/runs/{run_id}/stats", n)),
            ("GET /runs/{id}/stats (warm)", await wave(c, f"/runs/{run_id}/stats", n)),
            ("GET /runs/{id}", await wave(c, f"/runs/{run_id}", n)),
            ("GET /runs", await wave(c, "/runs", n)),
            ("GET /runs/{id}/sql (20, small)", await wave(c, f"/runs/{run_id}/sql", 20,
                                                          {"q": "select source, count(*) from kept group by 1"})),
        ]
    return out


def self_contained() -> tuple[object, str]:
    from test_service import DATA, DEMO, TOKEN, ServiceProcess, wait_state

    root = Path(tempfile.mkdtemp(prefix="bench-service-"))
    svc = ServiceProcess(root, [DATA])
    svc.start()
    print(f"server {svc.url}, runs in {svc.runs_dir}; running pipelines/demo.yaml first ...", flush=True)
    with svc.client() as c:
        r = c.post("/runs", files={"dag": ("demo.yaml", DEMO.read_bytes())}).raise_for_status()
        run_id = r.json()["id"]
        t0 = time.time()
        info = wait_state(c, run_id, ("done", "failed", "cancelled"), timeout=900)
        if info["state"] != "done":
            svc.stop()
            sys.exit(f"demo run ended {info['state']}: {info.get('error')}")
    print(f"demo run {run_id} done in {time.time() - t0:.1f} s (submit to done)", flush=True)
    return svc, run_id


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url")
    ap.add_argument("--token-file")
    ap.add_argument("--run", help="a finished run's id")
    ap.add_argument("-n", type=int, default=50, help="concurrent requests per wave")
    a = ap.parse_args()
    svc = None
    if a.url:
        if not (a.token_file and a.run):
            ap.error("--url needs --token-file and --run")
        url, token, run_id = a.url, Path(a.token_file).read_text().strip(), a.run
    else:
        from test_service import TOKEN

        svc, run_id = self_contained()
        url, token = svc.url, TOKEN
    try:
        results = asyncio.run(bench(url, token, run_id, a.n))
    finally:
        if svc is not None:
            svc.stop()
    print(f"\n{'endpoint':34} {'n':>4} {'ok':>4} {'p50 ms':>8} {'p95 ms':>8} {'max ms':>8} {'wall ms':>8}  statuses")
    for name, r in results:
        print(f"{name:34} {r['n']:>4} {r['ok']:>4} {r['p50']:>8.1f} {r['p95']:>8.1f} {r['max']:>8.1f} {r['wall']:>8.1f}  {r['codes']}")
    required = [r for name, r in results if "sql" not in name]
    failed = sum(r["n"] - r["ok"] for r in required)
    if failed:
        print(f"\n{failed} request(s) to run / stats endpoints failed", file=sys.stderr)
        return 1
    print("\nall run and stats requests succeeded")
    return 0


if __name__ == "__main__":
    sys.exit(main())
