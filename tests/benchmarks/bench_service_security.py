"""The security review's (turn 4) availability and disclosure attacks against a real
`refinery serve`, with the figures the review asked for; run by hand, before and after a change:

    python tests/benchmarks/bench_service_security.py [--repo CHECKOUT] [--serve-arg=--sql-max-bytes=4194304]

``--repo`` is the checkout whose ``curation`` the server runs (a ``git worktree`` of an older
commit gives the "before"). Prints one JSON object: per attack the HTTP codes the client got and
what it saw, whether the secret appeared, files written outside the runs directory, /healthz
worst latency while 40 deep-YAML submissions are admitted, the server's peak RSS (VmHWM) for
``select repeat('x', 10000000) from range(100)`` on /sql, and the codes of 100 submissions sent
10 at a time. The deep-YAML flood goes last and the server is SIGKILLed after it (on an
unbounded server it would burn CPU for minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import concurrent.futures as cf
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from test_service import make_browse_run  # noqa: E402  (the test suite's finished-run fixture)

TOKEN = "bench-security-token-5c1b9e0a7f"
SECRET = "TOPSECRET-outside-root-9231"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def files_outside_runs(base: Path) -> set[str]:
    return {str(p.relative_to(base)) for p in base.rglob("*")
            if p.is_file() and p.relative_to(base).parts[0] not in ("runs", "ray") and p.name != "server.log"}


def dag(stages: dict, inputs: dict | None = None) -> str:
    return yaml.safe_dump({"name": "bench", "inputs": inputs or {"docs": {"format": "jsonl", "paths": ["data/docs.jsonl"],
                                                                         "source": "web"}},
                           "stages": stages}, sort_keys=False)


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return round(int(line.split()[1]) / 1024)
    return float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=str(HERE.parents[1]))
    ap.add_argument("--serve-arg", action="append", default=[])
    ap.add_argument("--run-wait", type=float, default=90, help="seconds to wait for an admitted attack run to end")
    args = ap.parse_args()
    base = Path(tempfile.mkdtemp(prefix="refinery-secbench-"))
    (base / "data").mkdir()
    (base / "data" / "docs.jsonl").write_text("".join(
        json.dumps({"url": f"https://example.com/p/{i}", "text": f"document {i} " + "word " * (5 + i)}) + "\n"
        for i in range(20)))
    (base / "secret.txt").write_text(SECRET + "\n")
    (base / "token").write_text(TOKEN + "\n")
    (base / "token").chmod(0o600)
    (base / "runs").mkdir()
    make_browse_run(base / "runs" / "browse")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "RAY_TMPDIR": str(base / "ray"), "AWS_SECRET_ACCESS_KEY": "FAKE-SECRET-for-bench-only"}
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "curation.cli", "serve", "--runs-dir", str(base / "runs"), "--token-file",
           str(base / "token"), "--port", str(port), "--base-dir", str(base), "--allowed-root", "data",
           "--address", "local", *[a for s in args.serve_arg for a in s.split("=", 1)]]
    log = open(base / "server.log", "wb")
    proc = subprocess.Popen(cmd, cwd=args.repo, stdout=log, stderr=subprocess.STDOUT, env=env)
    out: dict = {"repo": args.repo, "base": "a temp dir"}
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}",
                                                "Content-Type": "application/yaml"}, timeout=60)
        before = files_outside_runs(base)

        def submit(text: str) -> httpx.Response:
            try:
                return c.post("/runs", content=text.encode())
            except httpx.TransportError as e:  # the server dropped the connection: shown as 599
                return httpx.Response(599, json={"detail": f"connection dropped: {type(e).__name__}"})

        def wait_end(rid: str) -> dict:
            deadline = time.time() + args.run_wait
            info: dict = {}
            while time.time() < deadline:
                info = c.get(f"/runs/{rid}").json()
                if info.get("state") in ("done", "failed", "cancelled"):
                    break
                time.sleep(0.5)
            return info

        # 1: where reads a file outside the roots
        parts = str(base / "secret.txt").strip("/").split("/")
        expr = "chr(47)||" + "||chr(47)||".join(f"'{p}'" for p in parts)
        r = submit(dag({"sel": {"type": "select", "where": f"error((SELECT text FROM read_text({expr}) t(url, text))) IS NULL"}}))
        seen = r.text
        final = wait_end(r.json()["id"]) if r.status_code == 201 else {}
        seen += json.dumps(final)
        out["1_where_read_text"] = {"code": r.status_code, "secret_appeared": SECRET in seen, "saw": r.text[:160],
                                    "run_state": final.get("state"), "run_error": (final.get("error") or "")[-160:]}
        # 2: node names escaping the run directory
        r = submit(dag({"../../escaped_stage": {"type": "select", "input": "../../escaped_input", "where": "true"}},
                       {"../../escaped_input": {"format": "jsonl", "paths": ["data/docs.jsonl"], "source": "web"}}))
        if r.status_code == 201:
            wait_end(r.json()["id"])
        out["2_node_names"] = {"code": r.status_code, "saw": r.text[:160],
                               "files_written_outside_runs": sorted(files_outside_runs(base) - before)}
        # 9, 10, 11, 12
        codes = {}
        for name in ("token", "no_such_file"):
            r = submit(dag({"q": {"type": "quality", "model": name}}))
            codes[name] = (r.status_code, r.json().get("detail", "")[:160])
        out["9_bare_name_oracle"] = codes
        r = submit(dag({"sel": {"type": "select", "where": "length(text) / 2 > 10"},
                        "block": {"type": "url_filter", "input": "sel", "url_regexes": ['^https?://[^/]*\\.xxx(?:[:/]|$)']}}))
        out["10_legit_slash"] = {"code": r.status_code, "saw": r.text[:160]}
        if r.status_code == 201:
            out["10_legit_slash"]["final_state"] = wait_end(r.json()["id"]).get("state")
        t0 = time.perf_counter()
        r = submit("name: " + "{a: " * 100_000 + "1" + "}" * 100_000 + "\n")
        out["11_deep_mapping"] = {"code": r.status_code, "seconds": round(time.perf_counter() - t0, 2), "saw": r.text[:120]}
        r = submit(dag({"s": {"type": "select", "where": "true"}},
                       {"docs": {"format": "jsonl", "paths": ["secret.txt"], "source": "web"}}))
        out["12_403_body"] = {"code": r.status_code, "absolute_path": str(base) in r.text, "saw": r.text[:160]}
        r = submit(dag({"s": {"type": "select", "where": "true", "stop_words": list(range(60_000))}}))
        out["12_echo"] = {"code": r.status_code, "body_bytes": len(r.content)}
        details = [c.get(f"/runs/{x['id']}").text for x in c.get("/runs").json()]
        out["12_run_details_with_absolute_paths"] = sum(str(base) in d or sys.prefix in d for d in details)
        # 4: /sql memory
        rss0 = peak_rss_mb(proc.pid)
        r = c.get("/runs/browse/sql", params={"q": "select repeat('x', 10000000) from range(100)", "limit": 100})
        out["4_sql_100x10MB"] = {"code": r.status_code, "response_bytes": len(r.content),
                                 "server_peak_rss_mb_before": rss0, "server_peak_rss_mb_after": peak_rss_mb(proc.pid)}
        # 5: 100 submissions, 10 at a time (the DAG is refused late, by the select column check)
        late = dag({"a": {"type": "select", "where": "length(text) > 1"},
                    "b": {"type": "select", "input": "a", "where": "lower(url) LIKE '%p%'"},
                    "c": {"type": "select", "input": "b", "where": "no_such_column > 1"}})

        def one(_):
            code = submit(late).status_code
            return "dropped" if code == 599 else code

        with cf.ThreadPoolExecutor(10) as pool:
            out["5_concurrent_100"] = dict(Counter(pool.map(one, range(100))))
        # 3: 40 deep-YAML submissions at once, /healthz sampled meanwhile (5 s timeout, 30 s at most)
        n = 16000
        deep = ("name: deep\ninputs: {docs: {format: jsonl, paths: [data/docs.jsonl], source: web}}\n"
                "stages:\n  sel: {type: select, where: 'true', x: " + "[" * n + "]" * n + "}\n")
        lat, hcodes = [], Counter()
        pool = cf.ThreadPoolExecutor(40)
        dc = httpx.Client(base_url=url, headers=c.headers, timeout=35)
        futures = [pool.submit(lambda: dc.post("/runs", content=deep.encode()).status_code) for _ in range(40)]
        t_end = time.time() + 30
        while time.time() < t_end and not (all(f.done() for f in futures) and len(lat) >= 5):
            t0 = time.perf_counter()
            try:
                hcodes[httpx.get(url + "/healthz", timeout=5).status_code] += 1
            except httpx.HTTPError:
                hcodes["timeout"] += 1
            lat.append(time.perf_counter() - t0)
            time.sleep(0.1)
        done = [f.result() for f in futures if f.done() and not f.exception()]
        out["3_deep_yaml_40"] = {"answered_in_30s": dict(Counter(done)), "unanswered": 40 - len(done),
                                 "healthz": dict(hcodes), "healthz_worst_s": round(max(lat), 2)}
        # 13: SIGTERM with the flood in flight
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
            out["sigterm_stop_s"] = round(time.perf_counter() - t0, 2)
        except subprocess.TimeoutExpired:
            out["sigterm_stop_s"] = "still running after 15 s (SIGKILLed)"
        pool.shutdown(wait=False, cancel_futures=True)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for meta in (base / "runs").glob("*/service.json"):
            pid = json.loads(meta.read_text()).get("pid")
            if pid:
                with contextlib.suppress(ProcessLookupError, PermissionError):  # already gone
                    os.killpg(pid, signal.SIGKILL)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
