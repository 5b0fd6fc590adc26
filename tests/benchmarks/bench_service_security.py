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

``--s5`` runs the availability review's (s5) attacks instead, one row each: the HTTP code, the
seconds, the server's RSS peak (VmRSS sampled every 50 ms) and bytes written where they apply:
/sql memory and time, the 500s, 199 slow-body logins against /healthz, a 90,000-file crawl
folder admitted while hostile glob DAGs are sent, Bloom and split_bytes quotas (a 1e8-key
Bloom filter is run to the end), submit-then-cancel churn, list-form stages. And issue 62's
rows: a run past its disk quota (25 selects writing whole rows over 52 MB of random text), a `where`
that builds ~0.8 GB of strings against the run's memory cap (the run's processes' RssAnon
sampled), `lang_config` naming a 1 GiB file, a session cookie after sign-out, /docs' scripts,
a run's recorded limits and `refinery delete`. A server whose `serve` knows `--max-run-bytes`
is started with ``--max-run-bytes 380000000 --max-run-memory 2147483648`` (the 1e8-key Bloom
filter, 343 MiB, fits).
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
import shutil
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


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024)
    return float("nan")


def sampled(pid: int, fn) -> tuple[object, float, float]:
    """fn()'s result, its seconds, and the server's RSS peak (MB) while it ran."""
    peak = [rss_mb(pid)]
    with cf.ThreadPoolExecutor(1) as pool:
        t0 = time.perf_counter()
        fut = pool.submit(fn)
        while not fut.done():
            peak.append(rss_mb(pid))
            time.sleep(0.05)
        return fut.result(), round(time.perf_counter() - t0, 2), max(peak)


def dir_bytes(d: Path) -> int:
    return sum(p.stat().st_size for p in d.rglob("*") if p.is_file())


S5_QUOTAS = ["--max-run-bytes", "380000000", "--max-run-memory", str(2 << 30)]


def random_docs(path: Path, n: int, chars: int = 3200) -> None:
    """Documents of random words: they compress little, so a run's shards are about their size."""
    import base64

    with open(path, "w") as f:
        for i in range(n):
            raw = base64.b32encode(os.urandom(chars * 5 // 8)).decode().lower()
            f.write(json.dumps({"url": f"https://example.com/r/{i}",
                                "text": " ".join(raw[j:j + 7] for j in range(0, len(raw), 7))}) + "\n")


def session_anon_mb(sid: int) -> float:
    """Private resident memory (RssAnon) of every live process of a session: a run and what it started."""
    total = 0
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            fields = (d / "stat").read_bytes().rsplit(b")", 1)[1].split()
            if int(fields[3]) != sid or fields[0] in (b"Z", b"X"):
                continue
            for line in (d / "status").read_text().splitlines():
                if line.startswith("RssAnon:"):
                    total += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return round(total / 1024)


def issue62(base: Path, url: str, proc: subprocess.Popen, c: httpx.Client, submit, wait_end, row, repo: str) -> dict:
    """Issue 62's rows (see the module's docstring); before the churn row fills the queue."""
    out: dict = {}
    pid = proc.pid
    # a run's disk: 25 chained selects, each writing whole rows, over 52 MB of random text: ~800 MB
    random_docs(base / "data" / "random.jsonl", 14000)
    chain = {f"s{i}": {"type": "select", **({"input": f"s{i - 1}"} if i else {}), "where": "true", "materialize": True}
             for i in range(25)}
    r = submit(dag(chain, {"docs": {"format": "jsonl", "paths": ["data/random.jsonl"], "source": "web",
                                    "split_bytes": 8_000_000}}))
    if r.status_code == 201:
        info = wait_end(r.json()["id"])
        out["3_disk_25_selects_52MB"] = {"code": 201, "state": info.get("state"), "elapsed_s": info.get("elapsed_s"),
                                         "bytes_written": dir_bytes(base / "runs" / r.json()["id"]),
                                         "error": (info.get("error") or "")[:160]}
    else:
        out["3_disk_25_selects_52MB"] = row(r, 0)
    (base / "data" / "random.jsonl").unlink()
    # a run's memory: where builds ~0.8 GB of strings for one batch; its processes' RssAnon sampled
    r = submit(dag({"s": {"type": "select", "where": "length(repeat(text, 500000)) > 0"}}))
    bomb = r.json().get("id") if r.status_code == 201 else None
    if bomb:
        peak, t_end, info = 0, time.time() + 120, {}
        while time.time() < t_end:
            info = c.get(f"/runs/{bomb}").json()
            if info.get("pid"):
                peak = max(peak, session_anon_mb(int(info["pid"])))
            if info.get("state") in ("done", "failed", "cancelled"):
                break
            time.sleep(0.1)
        out["3_where_repeat_5e5"] = {"code": 201, "state": info.get("state"), "elapsed_s": info.get("elapsed_s"),
                                     "run_rss_anon_peak_mb": peak, "server_rss_mb": rss_mb(pid),
                                     "error": (info.get("error") or "")[-120:]}
        out["3_run_limits"] = c.get(f"/runs/{bomb}").json().get("limits")
    # 5: lang_config naming a 1 GiB file (sparse)
    with open(base / "data" / "big.json", "wb") as f:
        f.truncate(1 << 30)
    r, secs, peak = sampled(pid, lambda: submit(dag({"g": {"type": "gopher_quality", "lang_config": "data/big.json"}})))
    out["5_lang_config_1GiB"] = row(r, secs, peak)
    (base / "data" / "big.json").unlink()
    # 9: the session cookie after sign-out; /docs' scripts
    with httpx.Client(base_url=url, timeout=30) as b:
        login = b.post("/", data={"token": TOKEN}, follow_redirects=False)
        cookie = {"Cookie": f"refinery_session={login.cookies.get('refinery_session')}"}
        before = b.get("/runs", headers=cookie).status_code
        b.get("/logout", headers=cookie, follow_redirects=False)
        after = b.get("/runs", headers=cookie).status_code
    docs = c.get("/docs")
    out["9_session_after_logout"] = {"before_logout": before, "copied_cookie_after_logout": after}
    out["9_docs"] = {"code": docs.status_code, "scripts": docs.text.lower().count("<script"),
                     "cdn": "cdn" in docs.text.lower(), "csp": docs.headers.get("content-security-policy")}
    # 7: refinery delete
    if bomb:
        p = subprocess.run([sys.executable, "-m", "curation.cli", "delete", bomb, "--service", url, "--token-file",
                            str(base / "token")], cwd=repo, capture_output=True, text=True, timeout=120)
        said = " ".join(w for w in (p.stdout + p.stderr).replace("│", " ").split() if not set(w) <= set("─╭╮╰╯"))
        out["7_refinery_delete"] = {"exit": p.returncode, "said": said[-120:],
                                    "run_left": (base / "runs" / bomb).exists()}
    return out


def s5(base: Path, url: str, proc: subprocess.Popen, c: httpx.Client, run_wait: float, repo: str) -> dict:
    """The availability review's rows against a running server (see the module's docstring)."""
    out: dict = {}
    pid = proc.pid

    def submit(text: str, timeout: float = 60) -> httpx.Response:
        try:
            return c.post("/runs", content=text.encode(), timeout=timeout)
        except httpx.HTTPError as e:
            return httpx.Response(599, json={"detail": f"{type(e).__name__}"})

    def sql(q: str) -> httpx.Response:
        try:
            return c.get("/runs/browse/sql", params={"q": q}, timeout=120)
        except httpx.HTTPError as e:
            return httpx.Response(599, json={"detail": f"{type(e).__name__}"})

    def row(r: httpx.Response, secs: float, peak: float | None = None, **more) -> dict:
        try:
            detail = r.json().get("detail") if isinstance(r.json(), dict) else None
        except ValueError:
            detail = r.text[:120]
        d = {"code": r.status_code, "seconds": secs, **({"server_rss_peak_mb": peak} if peak is not None else {}),
             **more}
        if detail:
            d["detail"] = str(detail)[:140]
        return d

    def wait_end(rid: str) -> dict:
        deadline = time.time() + run_wait
        info: dict = {}
        while time.time() < deadline:
            info = c.get(f"/runs/{rid}").json()
            if info.get("state") in ("done", "failed", "cancelled"):
                break
            time.sleep(0.5)
        return info

    # 1 and 4: /sql memory and time
    out["server_rss_idle_mb"] = rss_mb(pid)
    r, secs, peak = sampled(pid, lambda: sql("select length(repeat(repeat('x', 100000000), 8)) as n"))
    out["1_sql_repeat_8x100MB"] = row(r, secs, peak)
    e = "repeat('ab', 10000000)"
    for i in range(30):
        e = f"regexp_replace({e}, '{'bc'[i % 2]}', '{'cb'[i % 2]}', 'g')"
    r, secs, peak = sampled(pid, lambda: sql("select length(" + e + ") as n"))
    out["4_sql_regexp_chain_30"] = row(r, secs, peak)
    # 8: the 500s
    body = ("inputs:\n  docs: {format: jsonl, paths: [data/docs.jsonl], source: web}\n"
            "stages:\n  s: {type: select, where: 'true'}\n")
    out["8_500s"] = {name: submit(text).status_code for name, text in {
        "date_2024-13-45": "name: 2024-13-45\n" + body, "int_5000_digits": "name: x\nz: " + "1" * 5000 + "\n" + body,
        "timestamp_xyz": "name: x\nz: !!timestamp xyz\n" + body,
        "nul_in_path": dag({"s": {"type": "select", "where": "true"}},
                           {"docs": {"format": "jsonl", "paths": ["data/docs.jsonl\0../token"], "source": "web"}}),
    }.items()}
    try:
        out["8_500s"]["histogram_1.7e308"] = c.get("/runs/browse/stages/quality/histogram", params={
            "column": "quality", "lo": -1.7e308, "hi": 1.7e308}).status_code
    except httpx.HTTPError as e:  # the connection dropped: shown as 599
        out["8_500s"]["histogram_1.7e308"] = f"599 {type(e).__name__}"
    # 9: list-form stages past the cap
    text = ("name: t\ninputs:\n  docs: {format: jsonl, paths: [data/docs.jsonl], source: web}\nstages:\n"
            + "".join(f'  - s{i}: {{"\\x74ype": select, input: docs, where: "true"}}\n' for i in range(1000))
            + "  - z: {type: select, input: docs, where: 'nosuchcol > 0'}\n")
    r, secs, _ = sampled(pid, lambda: submit(text))
    out["9_list_form_1000_stages"] = row(r, secs)
    # 6: 199 unauthenticated slow-body logins, then /healthz
    socks = []
    for _ in range(199):
        try:
            s = socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5)
            s.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-www-form-urlencoded\r\n"
                      b"Content-Length: 100000\r\n\r\ntoken=")
            socks.append(s)
        except OSError:  # refused or reset: the server shed it, which is what is measured
            continue
        time.sleep(0.01)
    time.sleep(2)
    codes = []
    for _ in range(3):
        for s in socks:
            with contextlib.suppress(OSError):
                s.send(b"x")
        try:
            codes.append(httpx.get(url + "/healthz", timeout=5).status_code)
        except httpx.HTTPError as e:
            codes.append(type(e).__name__)
        time.sleep(1)
    out["6_slow_login_bodies_199"] = {"healthz": codes, "sockets": len(socks)}
    for s in socks:
        s.close()
    time.sleep(1)
    # 2: a 90,000-file crawl folder, with hostile glob DAGs sent just before it
    crawl = base / "data" / "crawl"
    crawl.mkdir()
    for i in range(90_000):
        os.close(os.open(crawl / f"crawl-segment-{i:06d}.jsonl", os.O_CREAT | os.O_WRONLY, 0o644))
    j = lambda paths: {"format": "jsonl", "paths": paths, "source": "web"}  # noqa: E731
    sel = {"s": {"type": "select", "input": "a", "where": "true"}}
    hostile = dag(sel, {"a": j(["data/crawl/crawl-segment-0[0-1]*.jsonl"] * 6), "b": j(["data/nomatch-*"])})
    with cf.ThreadPoolExecutor(2) as pool:
        fh = [pool.submit(lambda: sampled(pid, lambda: submit(hostile, 120))) for _ in range(2)]
        time.sleep(2)
        r, secs, peak = sampled(pid, lambda: submit(dag(sel, {"a": j(["data/crawl/*.jsonl"])}), 120))
        hs = [f.result() for f in fh]
    out["2_crawl_90k_admitted"] = row(r, secs, peak)
    out["2_hostile_globrep_x2"] = [row(h[0], h[1], h[2]) for h in hs]
    if r.status_code == 201:
        c.post(f"/runs/{r.json()['id']}/cancel")
    shutil.rmtree(crawl)
    # 3: run parameters
    bloom = lambda n: dag({"ex": {"type": "exact_dedup", "bloom": {"expected_items": n}}})  # noqa: E731
    r = submit(bloom(1_000_000_000))
    out["3_bloom_1e9"] = row(r, 0)
    if r.status_code == 201:  # an unbounded server admits it: stop it before it writes GBs
        c.post(f"/runs/{r.json()['id']}/cancel")
    r = submit(dag({"s": {"type": "select", "where": "true"}},
                   {"docs": {"format": "jsonl", "paths": ["data/docs.jsonl"], "source": "web", "split_bytes": 1}}))
    out["3_split_bytes_1"] = row(r, 0)
    if r.status_code == 201:
        c.post(f"/runs/{r.json()['id']}/cancel")
    r = submit(bloom(100_000_000))
    if r.status_code == 201:
        info = wait_end(r.json()["id"])
        out["3_bloom_1e8_run"] = {"code": 201, "state": info.get("state"), "elapsed_s": info.get("elapsed_s"),
                                  "bytes_written": dir_bytes(base / "runs" / r.json()["id"])}
    else:
        out["3_bloom_1e8_run"] = row(r, 0)
    out.update(issue62(base, url, proc, c, submit, wait_end, row, repo))
    # 7: submit-then-cancel churn (0.5 MB DAGs), past the default --max-queued of 100
    for run in c.get("/runs").json():
        if run["state"] in ("queued", "running"):
            c.post(f"/runs/{run['id']}/cancel")
    time.sleep(2)
    before = dir_bytes(base / "runs")
    padded = dag({"s": {"type": "select", "where": "true"}}) + "# " + "x" * 500_000 + "\n"
    codes = Counter()
    t0 = time.perf_counter()
    for _ in range(120):
        r = submit(padded)
        codes[r.status_code] += 1
        if r.status_code == 201:
            c.post(f"/runs/{r.json()['id']}/cancel")
    out["7_submit_cancel_x120"] = {"codes": dict(codes), "seconds": round(time.perf_counter() - t0, 2),
                                  "bytes_written": dir_bytes(base / "runs") - before}
    out["server_rss_peak_mb_whole_bench"] = peak_rss_mb(pid)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", default=str(HERE.parents[1]))
    ap.add_argument("--serve-arg", action="append", default=[])
    ap.add_argument("--run-wait", type=float, default=90, help="seconds to wait for an admitted attack run to end")
    ap.add_argument("--s5", action="store_true", help="the availability review's (s5) attacks instead")
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
    quotas: list[str] = []
    if args.s5:  # issue 62's quotas, where this checkout's `serve` has them
        helptext = subprocess.run([sys.executable, "-m", "curation.cli", "serve", "--help"], cwd=args.repo,
                                  capture_output=True, text=True, env={**env, "COLUMNS": "200"}).stdout
        quotas = S5_QUOTAS if "--max-run-bytes" in helptext else []
    cmd = [sys.executable, "-m", "curation.cli", "serve", "--runs-dir", str(base / "runs"), "--token-file",
           str(base / "token"), "--port", str(port), "--base-dir", str(base), "--allowed-root", "data",
           "--address", "local", *quotas, *[a for s in args.serve_arg for a in s.split("=", 1)]]
    log = open(base / "server.log", "wb")
    proc = subprocess.Popen(cmd, cwd=args.repo, stdout=log, stderr=subprocess.STDOUT, env=env)
    out: dict = {"repo": args.repo, "base": "a temp dir", "serve_quotas": quotas}
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        c = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}",
                                                "Content-Type": "application/yaml"}, timeout=60)
        if args.s5:
            out.update(s5(base, url, proc, c, args.run_wait, args.repo))
            return
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
        if args.s5:  # the 1e8-key run's 343 MB of filters, the crawl folder
            shutil.rmtree(base, ignore_errors=True)
        print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
