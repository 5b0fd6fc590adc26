"""The service end to end: a real server process on a free port, real `refinery run` processes
on embedded Ray, real run directories. One server and one demo run are shared by this module
and tests/test_service_browser.py (Ray start-up alone costs seconds per process).

The demo run is also the restart test: the server is SIGKILLed while the run is running and
started again on the same runs directory; the run must finish and be listed, launched once.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx
import pyarrow as pa
import pytest
import yaml

from conftest import DATA, REPO

TOKEN = "service-test-token-7d1c0e6f9a"
DEMO = REPO / "pipelines" / "demo.yaml"
TERMINAL = ("done", "failed", "cancelled")


# ---------------------------------------------------------------------------------------------
# a server process


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServiceProcess:
    """`curation.service.app.serve` in a subprocess, restartable on the same port and runs dir."""

    def __init__(self, root: Path, allowed_roots: list[Path], max_concurrent: int = 2,
                 extra_args: list[str] = (), env: dict[str, str] | None = None):
        self.extra_args = list(extra_args)
        self.env = dict(env or {})
        self.root = root
        self.runs_dir = root / "runs"
        self.token_file = root / "token"
        self.token_file.write_text(TOKEN + "\n")
        self.token_file.chmod(0o600)
        self.log = root / "server.log"
        self.allowed_roots = [str(r) for r in allowed_roots]
        self.max_concurrent = max_concurrent
        self.port = _free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 120) -> None:
        # `refinery serve` as a user types it: no --address. With no cluster started here
        # (RAY_ADDRESS unset, a Ray temp dir without `ray start`'s address file) each run
        # starts an embedded Ray, and the server says so.
        cmd = [sys.executable, "-m", "curation.cli", "serve", "--runs-dir", str(self.runs_dir), "--token-file",
               str(self.token_file), "--port", str(self.port), "--base-dir", str(REPO),
               "--max-concurrent", str(self.max_concurrent)]
        for r in self.allowed_roots:
            cmd += ["--allowed-root", r]
        cmd += self.extra_args
        env = {**os.environ, "RAY_TMPDIR": str(self.root), **self.env}
        env.pop("RAY_ADDRESS", None)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):  # not listening yet
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise RuntimeError(f"server did not come up:\n{self.log.read_text()[-3000:]}")

    def kill(self) -> None:
        """SIGKILL: the harshest restart (no shutdown hook runs)."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        # runs are in their own sessions and outlive the server: stop whatever a failed test left
        for meta_file in self.runs_dir.glob("*/service.json"):
            pid = json.loads(meta_file.read_text()).get("pid")
            if pid and group_members(pid):
                os.killpg(pid, signal.SIGKILL)

    def client(self, token: str | None = TOKEN, **kw) -> httpx.Client:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=60, **kw)


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes in a process group."""
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            out.append(int(d.name))
    return out


def wait_state(client: httpx.Client, run_id: str, states: tuple[str, ...], timeout: float = 400,
               until=None) -> dict:
    deadline = time.time() + timeout
    info = {}
    while time.time() < deadline:
        info = client.get(f"/runs/{run_id}").raise_for_status().json()
        if info["state"] in states and (until is None or until(info)):
            return info
        time.sleep(0.3)
    raise AssertionError(f"run {run_id} never reached {states}: {info}")


# ---------------------------------------------------------------------------------------------
# shared between this module and the browser test (one server, one demo run per session)

_SHARED: dict = {}


def make_signal_run(run_dir: Path) -> None:
    """A finished run directory, written with the real shard writer and manifest, whose output
    has the columns the dashboard charts: lang, quality, num_tokens."""
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.rundir import RunDir

    dag = parse_dag({"name": "signals",
                     "inputs": {"docs": {"format": "parquet", "paths": [str(run_dir / "in.parquet")], "source": "web"}},
                     "stages": {"quality": {"type": "gopher_quality", "input": "docs"}}}, "signals.yaml")
    run_dir.mkdir(parents=True)
    (run_dir / "dag.yaml").write_text(yaml.safe_dump(dag.to_dict(), sort_keys=False))
    hashes = dag.hashes()
    n = 40
    kept = pa.table({"id": [f"d{i}" for i in range(n)], "text": ["word " * (i + 1) for i in range(n)],
                     "source": ["web" if i % 4 else "code" for i in range(n)],
                     "lang": [["en", "de", "fr"][i % 3] for i in range(n)],
                     "quality": [i / n for i in range(n)], "num_tokens": pa.array([10 + i for i in range(n)], pa.int32())})
    rejected = pa.table({"id": ["r0", "r1"], "text": ["x", "y"], "source": ["web", "web"],
                         "stage": ["quality", "quality"], "reason": ["gopher_quality:min_doc_words"] * 2})
    rundir = RunDir(run_dir)
    rundir.commit([rundir.write_stage_shard("docs", "docs-00000", None, None, n + 2, hashes["docs"]),
                   rundir.write_stage_shard("quality", "docs-00000", kept, rejected, n + 2, hashes["quality"])])
    now = time.time()
    (run_dir / "progress.json").write_text(json.dumps({"name": "signals", "state": "done", "started": now - 3,
                                                       "finished": now, "phases": {"read+map": {"done": 1, "total": 1}},
                                                       "stages": {}}))


#: the browse run: three shards of a gopher_quality stage with thresholds set in the DAG (not
#: the class defaults), row groups of 4 rows, and rejected rows under two reasons
BROWSE_MIN_WORDS = 7
BROWSE_MAX_WORDS = 60


def browse_rows(shard: int) -> tuple[pa.Table, pa.Table]:
    """(kept, rejected) rows of shard ``shard`` of the browse run."""
    kept_n, rej_n = 9 + shard, 5 + 2 * shard
    kept = pa.table({
        "id": [f"s{shard}-k{i}" for i in range(kept_n)],
        "text": [f"kept document {i} of shard {shard}\n" + "word " * (BROWSE_MIN_WORDS + i) for i in range(kept_n)],
        "source": ["web"] * kept_n,
        "gopher_n_words": pa.array([BROWSE_MIN_WORDS + 4 + i for i in range(kept_n)], pa.int64()),
        "gopher_stop_words": pa.array([3 + i % 4 for i in range(kept_n)], pa.int64()),
        "quality": [0.5 + i / 40 for i in range(kept_n)],  # only in kept files
    })
    reasons = ["gopher_quality:too_few_words" if i % 3 else "gopher_quality:stop_words" for i in range(rej_n)]
    rejected = pa.table({
        "id": [f"s{shard}-r{i}" for i in range(rej_n)],
        "text": [f"rejected document {i} of shard {shard}" for i in range(rej_n)],
        "source": ["web"] * rej_n,
        "gopher_n_words": pa.array([1 + i % (BROWSE_MIN_WORDS - 1) if r.endswith("few_words") else 20 + i
                                    for i, r in enumerate(reasons)], pa.int64()),
        "gopher_stop_words": pa.array([0 if r.endswith("stop_words") else 2 for r in reasons], pa.int64()),
        "stage": ["quality"] * rej_n, "reason": reasons,
    })
    return kept, rejected


def make_browse_run(run_dir: Path) -> None:
    """A finished run directory for the document browser, made with the real shard writer and
    manifests (the service lists it like a CLI-made run)."""
    from curation.pipeline.dag import parse_dag
    from curation.pipeline.rundir import RunDir

    dag = parse_dag({"name": "browse",
                     "inputs": {"docs": {"format": "parquet", "paths": [str(run_dir / "in.parquet")], "source": "web"}},
                     "stages": {"quality": {"type": "gopher_quality", "input": "docs", "min_doc_words": BROWSE_MIN_WORDS,
                                            "max_doc_words": BROWSE_MAX_WORDS, "min_stop_words": 1}}},
                    "browse.yaml")
    run_dir.mkdir(parents=True)
    (run_dir / "dag.yaml").write_text(yaml.safe_dump(dag.to_dict(), sort_keys=False))
    hashes = dag.hashes()
    rundir = RunDir(run_dir)
    entries = []
    for shard in (2, 0, 1):  # committed out of order: readers sort by shard key
        kept, rejected = browse_rows(shard)
        key = f"docs-{shard:05d}"
        n = kept.num_rows + rejected.num_rows
        entries += [rundir.write_stage_shard("docs", key, None, None, n, hashes["docs"]),
                    rundir.write_stage_shard("quality", key, kept, rejected, n, hashes["quality"], row_group_size=4)]
    rundir.commit(entries)
    # a stale shard of another params hash: not committed for this DAG, never shown
    stale = rundir.write_stage_shard("quality", "docs-00009", *browse_rows(0), 99, "0" * 16)
    rundir.commit([stale])
    now = time.time()
    (run_dir / "progress.json").write_text(json.dumps({"name": "browse", "state": "done", "started": now - 3,
                                                       "finished": now, "phases": {"read+map": {"done": 3, "total": 3}},
                                                       "stages": {}}))


def shared_service(tmp_path_factory, request) -> ServiceProcess:
    if "service" not in _SHARED:
        root = tmp_path_factory.mktemp("service")
        extra = root / "extra_root"
        extra.mkdir()
        (extra / "passwd.jsonl").symlink_to("/etc/passwd")  # inside a root, pointing outside
        (extra / "ok.jsonl").write_text('{"text": "hello there"}\n')
        svc = ServiceProcess(root, [DATA, extra])
        svc.runs_dir.mkdir(parents=True)
        make_signal_run(svc.runs_dir / "signals")  # made by "the CLI": no service.json
        make_browse_run(svc.runs_dir / "browse")
        svc.start()
        request.config.add_cleanup(svc.stop)
        _SHARED["service"] = svc
    return _SHARED["service"]


def shared_demo_run(svc: ServiceProcess) -> dict:
    """Submit pipelines/demo.yaml, SIGKILL and restart the server while it runs, wait for the end."""
    if "demo" not in _SHARED:
        with svc.client() as c:
            r = c.post("/runs", files={"dag": ("demo.yaml", DEMO.read_bytes(), "application/yaml")})
            assert r.status_code == 201, r.text
            run_id = r.json()["id"]
            before = wait_state(c, run_id, ("running",) + TERMINAL, timeout=120)
        svc.kill()
        pid = before.get("pid")
        alive_without_server = bool(pid) and bool(group_members(pid))
        svc.start()
        with svc.client() as c:
            listed = c.get("/runs").raise_for_status().json()
            after_restart = next((x for x in listed if x["id"] == run_id), None)
            final = wait_state(c, run_id, TERMINAL)
        _SHARED["demo"] = {"id": run_id, "run_dir": svc.runs_dir / run_id, "before": before,
                           "alive_without_server": alive_without_server, "after_restart": after_restart,
                           "final": final}
    return _SHARED["demo"]


@pytest.fixture(scope="module")
def service(tmp_path_factory, request) -> ServiceProcess:
    return shared_service(tmp_path_factory, request)


@pytest.fixture(scope="module")
def client(service):
    with service.client() as c:
        yield c


@pytest.fixture(scope="module")
def demo(service) -> dict:
    return shared_demo_run(service)


# ---------------------------------------------------------------------------------------------
# authentication


def test_every_route_but_healthz_needs_the_token(service, tmp_path):
    from curation.service.app import create_app

    app = create_app(tmp_path / "runs", "x", allowed_roots=[tmp_path], base_dir=tmp_path)  # for its route table
    checked = 0
    with service.client(token=None) as anon, service.client(token="wrong-token-wrong-token") as wrong:
        assert anon.get("/healthz").json() == {"status": "ok"}
        for route in app.routes:
            path = route.path.replace("{run_id}", "r1").replace("{name}", "app.js").replace("{stage}", "s1")
            for method in sorted(route.methods - {"HEAD"}):
                if path == "/healthz":
                    continue
                for c in (anon, wrong):
                    r = c.request(method, path)
                    assert r.status_code == 401, (method, path, r.status_code)
                    checked += 1
        # the page answers 401 with a sign-in form, not with the dashboard
        page = anon.get("/")
        assert 'name="token"' in page.text and "app.js" not in page.text
    assert checked >= 2 * 18


def test_dashboard_cookie_login_and_csrf(service):
    with service.client(token=None, follow_redirects=False) as c:
        r = c.get("/", params={"token": "not-it"})
        assert r.status_code == 401 and "not valid" in r.text
        r = c.get("/", params={"token": TOKEN})
        assert r.status_code == 303 and r.headers["location"] == "/"
        cookie = r.headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
        assert TOKEN not in cookie  # the cookie holds a derived value, not the API token
        page = c.get("/")
        assert page.status_code == 200 and "/static/app.js" in page.text
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert c.get("/runs").status_code == 200
        # cookie-authenticated writes need the custom header a cross-site form cannot send
        assert c.post("/runs/nope/cancel").status_code == 401
        assert c.post("/runs/nope/cancel", headers={"X-Refinery-CSRF": "1"}).status_code == 404
        assert c.get("/logout").status_code == 303
    with service.client(token=None, follow_redirects=False) as c:
        assert c.post("/", data={"token": TOKEN}).status_code == 303
        assert c.get("/runs").status_code == 200
    assert TOKEN not in service.log.read_text()  # the access log redacts ?token=


def test_openapi_documents_the_routes_and_the_bearer_scheme(client):
    spec = client.get("/openapi.json").raise_for_status().json()
    assert spec["components"]["securitySchemes"]["bearer"] == {"type": "http", "scheme": "bearer"}
    assert {"/runs", "/runs/{run_id}", "/runs/{run_id}/cancel", "/runs/{run_id}/resume", "/runs/{run_id}/stats",
            "/runs/{run_id}/sql", "/healthz", "/runs/{run_id}/stages", "/runs/{run_id}/stages/{stage}",
            "/runs/{run_id}/stages/{stage}/documents", "/runs/{run_id}/stages/{stage}/histogram"} <= set(spec["paths"])
    assert spec["paths"]["/healthz"]["get"]["security"] == []
    assert "multipart/form-data" in spec["paths"]["/runs"]["post"]["requestBody"]["content"]
    docs = client.get("/docs")  # the routes as plain HTML: no script (Swagger UI would load one from a CDN)
    assert "/runs/{run_id}/stats" in docs.text and "<script" not in docs.text


# ---------------------------------------------------------------------------------------------
# admission


def _dag(paths: list[str], stages: dict | None = None) -> str:
    return yaml.safe_dump({"name": "probe", "inputs": {"a": {"format": "jsonl", "paths": paths, "source": "web"}},
                           "stages": stages or {"g": {"type": "gopher_quality"}}})


@pytest.mark.parametrize("paths, stages", [
    (["/etc/passwd"], None),
    (["../../etc/passwd"], None),
    (["tests/data/../../../../etc/*"], None),
    (["/etc/*"], None),
    (["file:///etc/passwd"], None),
    (["http://169.254.169.254/latest/meta-data"], None),
    (["simplecache::file:///etc/passwd"], None),
    (["tests/data/jsonl/gsm8k_train_head400.jsonl.gz"], {"t": {"type": "tokenize", "tokenizer": "/etc"}}),
    (["tests/data/jsonl/gsm8k_train_head400.jsonl.gz"], {"t": {"type": "tokenize", "tokenizer": "../../etc"}}),
])
def test_dag_reading_outside_allowed_roots_is_403(client, service, paths, stages):
    n_before = len(list(service.runs_dir.iterdir()))
    r = client.post("/runs", content=_dag(paths, stages), headers={"Content-Type": "application/yaml"})
    assert r.status_code == 403, r.text
    assert "outside the allowed roots" in r.json()["detail"]
    assert len(list(service.runs_dir.iterdir())) == n_before  # nothing was created


def test_symlink_out_of_an_allowed_root_is_403(client, service):
    extra = service.root / "extra_root"
    r = client.post("/runs", content=_dag([str(extra / "passwd.jsonl")]))
    assert r.status_code == 403 and "after following symlinks" in r.json()["detail"], r.text
    r = client.post("/runs", content=_dag([str(extra / "*.jsonl")]))  # the glob matches it too
    assert r.status_code == 403, r.text


@pytest.mark.parametrize("body, expect", [
    (lambda d: d["stages"]["gopher"].update(type="gopher_qualty"), "stages.gopher.type: unknown stage type"),
    (lambda d: d["stages"]["gopher"].update(min_doc_words="many"), "stages.gopher.min_doc_words"),
    (lambda d: d["inputs"]["math"].update(paths=["tests/data/nope/*.jsonl"]), "inputs.math.paths: no file matches"),
    (lambda d: d["inputs"]["crawl"].update(format="warcz"), "inputs.crawl.format"),
    (lambda d: d.update(extra_key=1), "extra_key"),
])
def test_invalid_dag_is_422_naming_the_field(client, body, expect):
    d = yaml.safe_load(DEMO.read_text())
    body(d)
    r = client.post("/runs", files={"dag": ("mine.yaml", yaml.safe_dump(d).encode())})
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("mine.yaml: ") and expect in detail, detail


@pytest.mark.parametrize("content, expect", [
    (b"name: [unclosed", "invalid YAML"),
    (b"- just\n- a list\n", "a DAG is a YAML mapping"),
    (b"a: &x [1]\nb: *x\n", "anchors/aliases"),
    (b"", "empty"),
    (b"\xff\xfe", "not UTF-8"),
])
def test_malformed_submissions_are_422(client, content, expect):
    r = client.post("/runs", content=content, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 422 and expect in r.json()["detail"], r.text


def test_multipart_without_dag_field_is_422(client):
    r = client.post("/runs", files={"pipeline": ("x.yaml", b"name: x")})
    assert r.status_code == 422 and r.json()["detail"].startswith("dag: missing")


def test_request_size_limit_is_413(client):
    big = b"#" * (1 << 20) + b"\nname: x\n"
    assert client.post("/runs", content=big).status_code == 413
    # without a Content-Length (chunked), the body is cut off as it streams in
    r = client.post("/runs", content=(b"#" * 65536 for _ in range(20)))
    assert r.status_code == 413
    assert client.get("/runs/x/sql", params={"q": "select " + "1+" * 15000 + "1"}).status_code in (400, 414, 422, 431)


# ---------------------------------------------------------------------------------------------
# the demo run, through a server restart


def test_serve_without_address_runs_embedded_and_says_so(service, demo):
    """The demo run below was submitted to `refinery serve` started without --address."""
    text = service.log.read_text()
    assert "no cluster running" in text and "each run starts an embedded Ray" in text, text[-2000:]
    assert demo["final"]["state"] == "done"


def test_demo_run_survives_a_server_restart(demo):
    assert demo["before"]["state"] == "running", demo["before"]
    assert demo["alive_without_server"], "the run died with the server"
    assert demo["after_restart"] is not None, "the run was not listed after the restart"
    assert demo["after_restart"]["state"] in ("running", "done")
    final = demo["final"]
    assert final["state"] == "done", final
    assert final["attempt"] == 1 and final["progress"] == 1.0
    assert final["started"] <= final["finished"] and final["elapsed_s"] > 0
    log = (demo["run_dir"] / "service.log").read_text()
    assert log.count("--- attempt") == 1  # rediscovered, not launched a second time
    assert not group_members(demo["before"]["pid"])  # nothing left running


def test_run_detail_has_per_stage_progress_and_the_pinned_dag(client, demo):
    from curation.pipeline.stats import stage_table

    info = client.get(f"/runs/{demo['id']}").json()
    table = {r["stage"]: r for r in stage_table(demo["run_dir"])}
    by_stage = {s["stage"]: s for s in info["stages"]}
    assert set(by_stage) == set(table)
    for name, s in by_stage.items():
        assert (s["docs_in"], s["docs_out"], s["rejected"]) == \
            (table[name]["docs_in"], table[name]["kept"], table[name]["rejected"]), name
    assert info["phases"]["read+map"]["done"] == info["phases"]["read+map"]["total"] > 0
    dags = client.get(f"/runs/{demo['id']}/dag").json()
    assert dags["submitted"] == DEMO.read_text()
    resolved = yaml.safe_load(dags["resolved"])
    crawl = resolved["inputs"]["crawl"]["paths"]
    assert crawl == sorted(str(p.resolve()) for p in (DATA / "warc").glob("*.warc.gz"))


def test_stats_equal_refinery_stats_on_the_same_run_dir(client, demo):
    from curation.pipeline.stats import output_summary, stage_table, top_reasons

    stats = client.get(f"/runs/{demo['id']}/stats").raise_for_status().json()
    assert stats["stages"] == stage_table(demo["run_dir"])
    assert stats["top_reasons"] == top_reasons(demo["run_dir"])
    assert stats["output"] == output_summary(demo["run_dir"])
    rows = {r["stage"]: r for r in stats["stages"]}
    assert rows["gopher"]["rejected"] > 0 and stats["output"]["by_source"]["math"] > 0
    assert stats["languages"] is None and stats["quality_histogram"] is None  # no such columns in demo


def test_runs_list_has_demo_and_cli_made_runs(client, demo):
    runs = {r["id"]: r for r in client.get("/runs").json()}
    assert runs[demo["id"]]["state"] == "done" and runs[demo["id"]]["name"] == "demo"
    assert runs["signals"]["state"] == "done" and runs["signals"]["managed"] is False


def test_histograms_and_tokens_when_columns_exist(client):
    stats = client.get("/runs/signals/stats").raise_for_status().json()
    assert {x["lang"]: x["docs"] for x in stats["languages"]} == {"en": 14, "de": 13, "fr": 13}
    hist = stats["quality_histogram"]
    assert len(hist) == 20 and hist[0]["lo"] == 0 and hist[-1]["hi"] == 1 and sum(b["docs"] for b in hist) == 40
    assert stats["tokens_by_source"] == {"web": sum(10 + i for i in range(40) if i % 4),
                                         "code": sum(10 + i for i in range(40) if i % 4 == 0)}
    assert stats["top_reasons"] == [{"stage": "quality", "reason": "gopher_quality:min_doc_words", "docs": 2}]


# ---------------------------------------------------------------------------------------------
# SQL


def test_sql_select_answers_like_duckdb(client, demo):
    from curation.pipeline.stats import connect

    q = "select source, count(*) as n from kept group by 1 order by 1"
    r = client.get(f"/runs/{demo['id']}/sql", params={"q": q}).raise_for_status().json()
    assert r["columns"] == ["source", "n"]
    assert [tuple(x) for x in r["rows"]] == connect(demo["run_dir"]).execute(q).fetchall()
    r = client.get(f"/runs/{demo['id']}/sql", params={"q": "select * from rejected", "limit": 5}).json()
    assert len(r["rows"]) == 5 and r["truncated"] is True


@pytest.mark.parametrize("q, status", [
    ("copy kept to '/tmp/refinery-leak.csv'", 403),
    ("copy (select 1) to '/tmp/refinery-leak.csv'", 403),
    ("attach '/tmp/refinery-leak.db' as x", 403),
    ("install httpfs", 403),
    ("load httpfs", 403),
    ("create table t as select 1", 403),
    ("pragma version", 403),
    ("set enable_external_access = true", 403),
    ("export database '/tmp/refinery-export'", 403),
    ("call pragma_version()", 403),
    ("select 1; select 2", 400),
    ("select 1; copy kept to '/tmp/refinery-leak.csv'", 400),
    ("select * from read_csv('/etc/passwd')", 403),
    ("select * from read_text('/etc/hostname')", 403),
    ("select * from read_csv('{run}/../../../../etc/passwd')", 403),
    ("select * from glob('/*')", 403),
    ("select * from read_parquet('http://127.0.0.1:1/x.parquet')", 403),
    ("select * from query('copy kept to ''/tmp/refinery-leak.csv''')", 400),
    ("", 400),
    ("select from where", 400),
])
def test_sql_refuses_writes_files_and_extensions(client, demo, q, status):
    q = q.replace("{run}", str(demo["run_dir"]))
    r = client.get(f"/runs/{demo['id']}/sql", params={"q": q})
    assert r.status_code == status, r.text
    assert not Path("/tmp/refinery-leak.csv").exists() and not Path("/tmp/refinery-leak.db").exists()


def test_sql_time_limit_interrupts_the_query(demo):
    from curation.service.sql_guard import SqlRejected, run_select

    t0 = time.time()
    with pytest.raises(SqlRejected) as e:
        run_select(demo["run_dir"], "select sum(a.range * b.range) from range(100000) a, range(100000) b",
                   timeout_s=0.5)
    assert e.value.status == 408 and time.time() - t0 < 5
    assert run_select(demo["run_dir"], "select count(*) from kept").rows[0][0] > 0


# ---------------------------------------------------------------------------------------------
# the document browser: pages of a stage's documents, reasons, histograms with thresholds


def _browse_expected(which: str, reason: str | None = None) -> list[dict]:
    rows = []
    for shard in range(3):  # shard-key order, then row order
        kept, rejected = browse_rows(shard)
        t = kept if which == "kept" else rejected
        rows += [r for r in t.to_pylist() if reason is None or r["reason"] == reason]
    return rows


def test_browser_stage_list_and_detail(client):
    stages = client.get("/runs/browse/stages").raise_for_status().json()
    assert [(s["stage"], s["kept"], s["rejected"], s["shards"]) for s in stages] == [
        ("docs", 0, 0, 3), ("quality", 9 + 10 + 11, 5 + 7 + 9, 3)]
    d = client.get("/runs/browse/stages/quality").raise_for_status().json()
    assert d["type"] == "gopher_quality" and d["kept_written"] is True
    assert {r["reason"]: r["docs"] for r in d["reasons"]} == Counter(r["reason"] for r in _browse_expected("rejected"))
    assert d["signals"][:2] == ["gopher_n_words", "gopher_stop_words"] and "quality" in d["signals"]
    assert "text" not in d["signals"] and "text" in {c["name"] for c in d["columns"]}
    # thresholds from RUN/dag.yaml (not the class defaults), paired with columns by the rules table
    assert d["thresholds"]["gopher_n_words"] == [
        {"value": BROWSE_MIN_WORDS, "drops": "below", "param": "min_doc_words",
         "reason": "gopher_quality:too_few_words", "op": "<"},
        {"value": BROWSE_MAX_WORDS, "drops": "above", "param": "max_doc_words",
         "reason": "gopher_quality:too_many_words", "op": ">"}]
    assert d["thresholds"]["gopher_stop_words"][0]["value"] == 1
    assert {"reason": "gopher_quality:empty", "signals": ["text"], "op": "empty", "params": [], "values": []} in d["rules"]
    assert client.get("/runs/browse/stages/nope").status_code == 404
    assert client.get("/runs/no-such-run/stages").status_code == 404


@pytest.mark.parametrize("which", ["kept", "rejected"])
def test_browser_documents_page_through_a_stage(client, which):
    expected = _browse_expected(which)
    got, offset = [], 0
    while True:  # pages of 4 cross row groups (4 rows) and shards (9..11 rows)
        page = client.get("/runs/browse/stages/quality/documents",
                          params={"which": which, "offset": offset, "limit": 4}).raise_for_status().json()
        assert page["total"] == len(expected) and page["which"] == which
        if not page["documents"]:
            break
        assert [d["index"] for d in page["documents"]] == list(range(offset, offset + len(page["documents"])))
        got += page["documents"]
        offset += 4
    assert [d["id"] for d in got] == [r["id"] for r in expected]
    assert [d["text"] for d in got] == [r["text"] for r in expected]
    for d, r in zip(got, expected):
        assert d["fields"]["gopher_n_words"] == r["gopher_n_words"]  # every signal column of the row
        assert d["fields"]["gopher_stop_words"] == r["gopher_stop_words"]
        assert d["text_chars"] == len(r["text"]) and d["text_truncated"] is False
        assert (d["reason"], d["fields"].get("reason")) == ((None, None) if which == "kept" else (r["reason"],) * 2)
    assert not any(d["shard"] == "docs-00009" for d in got)  # another params hash: not this run's
    # text cut to max_chars, full length reported
    one = client.get("/runs/browse/stages/quality/documents",
                     params={"which": which, "offset": 5, "limit": 1, "max_chars": 8}).json()["documents"][0]
    assert one["text"] == expected[5]["text"][:8] and one["text_chars"] == len(expected[5]["text"])
    assert one["text_truncated"] is True


@pytest.mark.parametrize("reason", ["gopher_quality:too_few_words", "gopher_quality:stop_words"])
def test_browser_reason_filter_returns_only_that_reason(client, reason):
    expected = _browse_expected("rejected", reason)
    assert 0 < len(expected) < len(_browse_expected("rejected"))
    page = client.get("/runs/browse/stages/quality/documents",
                      params={"which": "rejected", "reason": reason, "limit": 200}).raise_for_status().json()
    assert page["total"] == len(expected) and page["reason"] == reason
    assert {d["reason"] for d in page["documents"]} == {reason}
    assert [d["id"] for d in page["documents"]] == [r["id"] for r in expected]
    tail = client.get("/runs/browse/stages/quality/documents",
                      params={"which": "rejected", "reason": reason, "offset": 3, "limit": 5}).json()
    assert [d["id"] for d in tail["documents"]] == [r["id"] for r in expected[3:8]]
    assert [d["index"] for d in tail["documents"]] == list(range(3, 3 + len(tail["documents"])))
    none = client.get("/runs/browse/stages/quality/documents",
                      params={"which": "rejected", "reason": "gopher_quality:no_such_rule"}).json()
    assert none["total"] == 0 and none["documents"] == []


@pytest.mark.parametrize("params, status", [
    ({"which": "kept", "reason": "gopher_quality:stop_words"}, 422),  # kept rows have no reason
    ({"which": "deleted"}, 422),
    ({"limit": 0}, 422),
    ({"limit": 201}, 422),  # bounded: never a whole run
    ({"offset": -1}, 422),
    ({"max_chars": 10**7}, 422),
])
def test_browser_documents_refuses_bad_parameters(client, params, status):
    assert client.get("/runs/browse/stages/quality/documents", params=params).status_code == status


def test_browser_documents_read_only_the_row_groups_of_the_page(service, monkeypatch):
    import pyarrow.parquet as pq

    from curation.pipeline.rundir import RunDir
    from curation.service import browse

    opened, groups = [], []
    real_open, real_read = pq.ParquetFile.__init__, pq.ParquetFile.read_row_groups
    monkeypatch.setattr(pq.ParquetFile, "__init__", lambda self, src, *a, **k: (opened.append(str(src)),
                                                                                real_open(self, src, *a, **k))[1])
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", lambda self, gs, *a, **k: (groups.append(list(gs)),
                                                                                      real_read(self, gs, *a, **k))[1])
    page = browse.documents(RunDir(service.runs_dir / "browse"), "quality", "kept", offset=9 + 10 + 5, limit=2)
    assert [d["id"] for d in page["documents"]] == ["s2-k5", "s2-k6"]
    assert [Path(p).name for p in opened] == ["docs-00002.parquet"]  # shards before the page: skipped by count
    assert groups == [[1]]  # rows 5..6 of the shard: its second row group of 4, nothing else


def test_browser_histogram_bins_sum_to_the_rows_with_dag_thresholds(client):
    kept, rejected = _browse_expected("kept"), _browse_expected("rejected")
    h = client.get("/runs/browse/stages/quality/histogram",
                   params={"column": "gopher_n_words", "bins": 10}).raise_for_status().json()
    values = [r["gopher_n_words"] for r in kept + rejected]
    assert h["rows"] == len(values) and h["nulls"] == 0 and h["below"] == h["above"] == 0
    assert sum(b["docs"] for b in h["bins"]) == h["rows"]
    assert sum(b["kept"] for b in h["bins"]) == len(kept) and sum(b["rejected"] for b in h["bins"]) == len(rejected)
    assert 1 <= len(h["bins"]) <= 10 and h["integer"] is True
    assert (h["min"], h["max"], h["bins"][0]["lo"]) == (min(values), max(values), min(values))
    for b in h["bins"]:  # each bin holds exactly the values in [lo, hi)
        assert b["docs"] == sum(b["lo"] <= v < b["hi"] for v in values), b
    assert [(t["param"], t["value"], t["drops"]) for t in h["thresholds"]] == [
        ("min_doc_words", BROWSE_MIN_WORDS, "below"), ("max_doc_words", BROWSE_MAX_WORDS, "above")]
    # a float column only the kept files have: the rejected rows count as nulls, unread
    q = client.get("/runs/browse/stages/quality/histogram", params={"column": "quality", "bins": 7}).json()
    assert len(q["bins"]) == 7 and sum(b["docs"] for b in q["bins"]) == len(kept)
    assert q["nulls"] == len(rejected) and q["thresholds"] == []
    # an explicit range: what falls outside is counted below / above, never lost
    z = client.get("/runs/browse/stages/quality/histogram",
                   params={"column": "gopher_n_words", "lo": 5, "hi": 15, "bins": 5}).json()
    assert z["below"] == sum(v < 5 for v in values) and z["above"] == sum(v > 15 for v in values)
    assert z["bins"][0]["lo"] == 5 and z["bins"][-1]["hi"] == 16
    assert sum(b["docs"] for b in z["bins"]) + z["below"] + z["above"] == len(values)
    for params, status in [({"column": "text"}, 422), ({"column": "nope"}, 404), ({"column": "quality", "bins": 0}, 422),
                           ({"column": "quality", "bins": 101}, 422), ({"column": "quality", "clip": 0.5}, 422),
                           ({"column": "quality", "lo": 2, "hi": 1}, 422)]:
        assert client.get("/runs/browse/stages/quality/histogram", params=params).status_code == status, params


def test_browser_on_the_demo_run(client, demo):
    from curation.pipeline.stats import connect, stage_table

    gopher = next(r for r in stage_table(demo["run_dir"]) if r["stage"] == "gopher")
    h = client.get(f"/runs/{demo['id']}/stages/gopher/histogram", params={"column": "gopher_n_words"}).json()
    assert sum(b["docs"] for b in h["bins"]) == h["rows"] == gopher["kept"] + gopher["rejected"]
    dag = yaml.safe_load((demo["run_dir"] / "dag.yaml").read_text())["stages"]["gopher"]
    assert {t["param"]: t["value"] for t in h["thresholds"]} == {
        "min_doc_words": dag["min_doc_words"], "max_doc_words": dag["max_doc_words"]}
    con = connect(demo["run_dir"])
    reason, n = con.execute("select reason, count(*) from rejected where stage = 'gopher' "
                            "group by 1 order by 2 desc, 1 limit 1").fetchone()
    page = client.get(f"/runs/{demo['id']}/stages/gopher/documents",
                      params={"which": "rejected", "reason": reason, "limit": 50}).json()
    assert page["total"] == n == len(page["documents"]) and {d["reason"] for d in page["documents"]} == {reason}
    ids = {r[0] for r in con.execute("select id from rejected where stage = 'gopher' and reason = ?", [reason]).fetchall()}
    assert {d["id"] for d in page["documents"]} == ids
    assert all(d["text"] and "gopher_n_words" in d["fields"] for d in page["documents"])


def test_browser_routes_need_the_token(service):
    paths = ["/runs/browse/stages", "/runs/browse/stages/quality",
             "/runs/browse/stages/quality/documents?which=rejected",
             "/runs/browse/stages/quality/histogram?column=gopher_n_words"]
    with service.client(token=None) as anon, service.client(token="wrong-token-wrong-token") as wrong:
        for path in paths:
            for c in (anon, wrong):
                r = c.get(path)
                assert r.status_code == 401 and "gopher" not in r.text, (path, r.status_code)
    with service.client(token=None, follow_redirects=False) as c:  # the dashboard's cookie
        assert c.get("/", params={"token": TOKEN}).status_code == 303
        for path in paths:
            assert c.get(path).status_code == 200, path


# ---------------------------------------------------------------------------------------------
# cancel and resume (a run that is slow enough to catch: trafilatura extraction, small shards)

SLOW_DAG = """
name: slow
inputs:
  crawl: {format: warc, paths: ["tests/data/warc/*.warc.gz"], source: web}
  math: {format: jsonl, paths: ["tests/data/jsonl/gsm8k_train_head400.jsonl.gz"], source: math, text_field: question, split_bytes: 2500}
stages:
  extract: {type: extract, input: crawl, engine: trafilatura}
  merged: {type: union, inputs: [extract, math]}
"""


def _wait_group_gone(pid: int, timeout: float = 30) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and group_members(pid):
        time.sleep(0.2)
    assert not group_members(pid), f"processes left in group {pid}: {group_members(pid)}"


def test_cancel_stops_the_process_group_and_resume_relaunches(client, service, demo):
    r = client.post("/runs", content=SLOW_DAG, headers={"Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    run_id = r.json()["id"]
    # running, with Ray up and shards in flight (phases appear once the driver has Ray)
    info = wait_state(client, run_id, ("running",) + TERMINAL, timeout=120, until=lambda i: i["phases"] or i["state"] != "running")
    assert info["state"] == "running", info
    pid = info["pid"]
    assert len(group_members(pid)) > 1  # the driver and the Ray processes it started
    r = client.post(f"/runs/{run_id}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    _wait_group_gone(pid)
    assert client.get(f"/runs/{run_id}").json()["state"] == "cancelled"
    assert client.post(f"/runs/{run_id}/cancel").status_code == 409

    r = client.post(f"/runs/{run_id}/resume")
    assert r.status_code == 200 and r.json()["attempt"] == 2, r.text
    again = wait_state(client, run_id, ("running",) + TERMINAL, timeout=60)
    assert again["state"] in ("running", "done") and again["attempt"] == 2
    meta = json.loads((service.runs_dir / run_id / "service.json").read_text())
    # the same command, a new process (the client sees it with paths relative to the base dir)
    assert meta["pid"] != pid and again["command"] == info["command"] and len(meta["command"]) == len(info["command"])
    if again["state"] == "running":
        client.post(f"/runs/{run_id}/cancel").raise_for_status()
        _wait_group_gone(meta["pid"])
    # a finished run can be neither cancelled nor resumed
    assert client.post(f"/runs/{demo['id']}/cancel").status_code == 409
    assert client.post(f"/runs/{demo['id']}/resume").status_code == 409
    assert client.post("/runs/../../etc/cancel").status_code == 404
    assert client.get("/runs/no-such-run").status_code == 404


# ---------------------------------------------------------------------------------------------
# the queue, without Ray: a stand-in for `python -m curation.cli run`

FAKE_RUN = """#!{python}
import json, sys, time
out = sys.argv[sys.argv.index("--out") + 1]
t0 = time.time()
with open(out + "/../order.log", "a") as f:
    f.write(out.rsplit("/", 1)[-1] + " start %f\\n" % t0)
time.sleep(0.6)
with open(out + "/progress.json", "w") as f:
    json.dump({{"state": "done", "started": t0, "finished": time.time(), "phases": {{}}, "stages": {{}}}}, f)
with open(out + "/../order.log", "a") as f:
    f.write(out.rsplit("/", 1)[-1] + " end %f\\n" % time.time())
"""


def test_fifo_queue_respects_the_limit_and_survives_a_manager_restart(tmp_path):
    from curation.service.auth import PathPolicy
    from curation.service.runs import RunManager

    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_RUN.format(python=sys.executable))
    fake.chmod(0o755)
    policy = PathPolicy([DATA], REPO)
    dag = _dag(["tests/data/jsonl/gsm8k_train_head400.jsonl.gz"])
    m = RunManager(tmp_path / "runs", policy, max_concurrent=1, python=str(fake), poll_s=0.05)
    ids = [m.submit(dag)["id"] for _ in range(3)]
    cancelled = m.submit(dag)["id"]
    assert [m.describe(i)["state"] for i in ids] == ["queued"] * 3
    m.cancel(cancelled)
    m.start()
    time.sleep(0.3)
    m.stop()  # a "restart" with runs queued and one running
    m2 = RunManager(tmp_path / "runs", policy, max_concurrent=1, python=str(fake), poll_s=0.05)
    m2.start()
    with pytest.raises(Exception, match="another `refinery serve`"):
        RunManager(tmp_path / "runs", policy, python=str(fake)).start()
    deadline = time.time() + 30
    while time.time() < deadline and any(m2.describe(i)["state"] != "done" for i in ids):
        time.sleep(0.1)
    m2.stop()
    assert [m2.describe(i)["state"] for i in ids] == ["done"] * 3
    assert m2.describe(cancelled)["state"] == "cancelled"
    events = [line.split() for line in (tmp_path / "runs" / "order.log").read_text().splitlines()]
    assert [e[0] for e in events if e[1] == "start"] == ids  # FIFO, each launched once
    running = 0
    for _, kind, _ in sorted(events, key=lambda e: float(e[2])):
        running += 1 if kind == "start" else -1
        assert running <= 1  # never more than max_concurrent


# ---------------------------------------------------------------------------------------------
# on a shared Ray cluster: cancelling a run stops its tasks on the cluster's workers too


def _procs() -> list[tuple[int, int, str]]:
    """(pid, ppid, command line) of every live process."""
    out = []
    for d in Path("/proc").glob("[0-9]*"):
        try:
            fields = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] not in ("Z", "X"):
            out.append((int(d.name), int(fields[1]), cmd))
    return out


@pytest.fixture()
def ray_cluster():
    """A `ray start --head` of our own: a private temp dir (so no other ray.init() on this
    machine finds it through /tmp/ray/ray_current_cluster) and its own process group, stopped
    by killing exactly its processes (never `ray stop`, which stops every Ray here)."""
    import tempfile

    temp = tempfile.mkdtemp(prefix="rsvc-", dir="/tmp")  # short: Ray's socket paths have a length limit
    port = _free_port()
    log = Path(temp + ".log")
    with open(log, "wb") as out:
        head = subprocess.Popen([str(Path(sys.executable).parent / "ray"), "start", "--head", f"--port={port}",
                                 f"--temp-dir={temp}", "--num-cpus=2", "--include-dashboard=false",
                                 "--disable-usage-stats", "--block"],
                                env={**os.environ, "RAY_ADDRESS": ""}, cwd=temp, start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT)
    deadline = time.time() + 120
    while time.time() < deadline and head.poll() is None and "Ray runtime started" not in log.read_text():
        time.sleep(0.5)
    assert "Ray runtime started" in log.read_text(), log.read_text()[-2000:]
    yield f"127.0.0.1:{port}", temp
    # a throwaway cluster: SIGKILL (a graceful `ray start --block` shutdown takes ~20 s here);
    # its workers exit with their raylet
    os.killpg(head.pid, signal.SIGKILL)
    head.wait()
    for pid, _, cmd in _procs():
        if temp in cmd:
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
def test_cancel_on_a_shared_cluster_stops_the_runs_tasks(tmp_path, ray_cluster):
    address, temp = ray_cluster
    svc = ServiceProcess(tmp_path, [DATA])
    svc.runs_dir.mkdir()
    code = ("from curation.service.app import serve; "
            f"serve({str(svc.runs_dir)!r}, {address!r}, {str(svc.token_file)!r}, '127.0.0.1', {svc.port}, "
            f"{[str(DATA)]!r}, 2, {str(REPO)!r})")
    # Ray's token auth: a driver given an explicit address presents the cluster token only
    # when asked to (the token itself is in ~/.ray/auth_token, written by `ray start`)
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    with open(svc.log, "ab") as log:
        svc.proc = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                    env=env)
    try:
        deadline = time.time() + 120
        while True:
            try:
                if httpx.get(svc.url + "/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                assert time.time() < deadline and svc.proc.poll() is None, svc.log.read_text()[-2000:]
            time.sleep(0.3)
        raylet = next(pid for pid, _, c in _procs() if "raylet" in c and temp in c)

        def run_tasks() -> list[int]:
            # task processes are the cluster's workers (children of its raylet), not the run's
            return [pid for pid, ppid, c in _procs() if ppid == raylet and "run_root_task" in c]

        with svc.client() as c:
            run_id = c.post("/runs", content=SLOW_DAG).raise_for_status().json()["id"]
            info = wait_state(c, run_id, ("running",) + TERMINAL, timeout=120,
                              until=lambda i: (i["phases"] and run_tasks()) or i["state"] != "running")
            assert info["state"] == "running" and run_tasks(), info
            assert "--address" in info["command"] and address in info["command"]
            assert not set(run_tasks()) & set(group_members(info["pid"]))
            c.post(f"/runs/{run_id}/cancel").raise_for_status()
            _wait_group_gone(info["pid"])
            deadline = time.time() + 30  # Ray kills the workers of a job whose driver died
            while time.time() < deadline and run_tasks():
                time.sleep(0.5)
            assert run_tasks() == [], "tasks of the cancelled run still running on the cluster"
            assert c.get(f"/runs/{run_id}").json()["state"] == "cancelled"
    finally:
        svc.stop()
