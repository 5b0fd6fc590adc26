"""A run directory and inputs on object storage: an S3-compatible server (moto's, from the
``dev`` extra) started on 127.0.0.1, reached the way a user reaches S3, MinIO or R2 (the
standard ``AWS_*`` variables, ``AWS_ENDPOINT_URL`` for the endpoint). The pipeline runs from the
CLI, is SIGKILLed mid-run, resumes, and must give the bytes a local run dir gets."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from conftest import REPO

REFINERY = [sys.executable, "-m", "curation.cli"]
BUCKET = "refinery-test"

DAG = {
    "name": "s3",
    "inputs": {
        "crawl": {"format": "warc", "paths": [f"s3://{BUCKET}/data/warc/*.warc.gz"], "source": "web"},
        "math": {"format": "jsonl", "paths": [f"s3://{BUCKET}/data/jsonl/gsm8k_train_head400.jsonl"],
                 "source": "math", "text_field": "question", "split_bytes": 8000},
    },
    "stages": {
        "extract": {"type": "extract", "input": "crawl", "engine": "trafilatura"},
        "gopher_rep": {"type": "gopher_repetition", "input": "extract"},
        "merged": {"type": "union", "inputs": ["gopher_rep", "math"]},
        "exact": {"type": "exact_dedup", "input": "merged", "partitions": 2,
                  "bloom": {"expected_items": 10000, "false_positive_rate": 1.0e-6}},
        "near": {"type": "minhash_dedup", "input": "exact", "partitions": 2, "threshold": 0.7},
    },
    "output": "near",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers_s3(port: int) -> bool:
    """True when what listens on ``port`` is an S3 endpoint (ListBuckets answers)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
            return r.status == 200 and b"ListAllMyBucketsResult" in r.read()
    except Exception:
        return False


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """The server, its environment for child processes, and an s3fs filesystem on it."""
    import moto  # noqa: F401  (in the dev extra that `make test` installs: missing is a failure, not a skip)

    log = tmp_path_factory.mktemp("moto") / "server.log"
    # A port found free can be taken before moto binds it (Ray's workers open ports all the
    # time in this session): the server must answer S3 itself, else it is restarted on another.
    for _attempt in range(3):
        port = _free_port()
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.time() + 60
        while time.time() < deadline and proc.poll() is None:
            if _answers_s3(port):
                break
            time.sleep(0.2)
        if proc.poll() is None and _answers_s3(port):
            break
        proc.kill()
    else:  # moto is a test dependency and 127.0.0.1 is always there: a failure, never a skip
        pytest.fail("the S3 test server (python -m moto.server) could not serve on 127.0.0.1 in 3 tries. "
                    f"Its log: {log.read_text()[-500:]}")
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    import s3fs

    # fsspec caches filesystems by their arguments, not by the endpoint in the environment: one
    # made for another module's server (now gone) would be handed back to the library here.
    s3fs.S3FileSystem.clear_instance_cache()
    fs = s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False)
    fs.mkdir(BUCKET)
    for f in sorted((REPO / "tests/data/warc").glob("*.warc.gz")):
        fs.put_file(str(f), f"{BUCKET}/data/warc/{f.name}")
    fs.put_file(str(REPO / "tests/data/jsonl/gsm8k_train_head400.jsonl"), f"{BUCKET}/data/jsonl/gsm8k_train_head400.jsonl")
    try:
        yield {"env": {**os.environ, **env}, "fs": fs}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        s3fs.S3FileSystem.clear_instance_cache()


def _refinery(s3, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    t0 = time.time()
    res = subprocess.run(REFINERY + list(args), env=s3["env"], cwd=REPO, capture_output=True, text=True, timeout=300)
    if check and res.returncode:
        raise AssertionError(f"refinery {' '.join(args)} failed:\n{res.stderr[-3000:]}")
    print(f"refinery {args[0]} {args[-1] if args[0] != 'run' else args[3]}: {time.time() - t0:.1f} s")
    return res


def _committed_hashes(manifests: dict[str, str]) -> dict[str, tuple]:
    """file -> (sha256, rows) of every committed file, from manifest texts."""
    out = {}
    for text in manifests.values():
        for line in text.splitlines():
            e = json.loads(line)
            if e.get("file"):
                out[e["file"]] = (e["sha256"], e["rows"])
            if e.get("rejected_file"):
                out[e["rejected_file"]] = (e["rejected_sha256"], e["rejected_rows"])
    return out


def test_files_on_object_storage(s3):
    """The storage primitives on the server: whole-object writes, logs without append, listings."""
    from curation.formats.manifest import SEGMENTS
    from curation.io import files, location

    base = f"s3://{BUCKET}/prim"
    files.write_json(location.join(base, "a", "x.json"), {"k": 1})
    assert json.loads(location.read_text(f"{base}/a/x.json")) == {"k": 1}
    with files.atomic_path(f"{base}/a/y.bin") as tmp:
        tmp.write_bytes(b"abc")
        assert not location.exists(f"{base}/a/y.bin")  # nothing visible before the upload
    assert location.read_bytes(f"{base}/a/y.bin") == b"abc"
    assert location.listdir(f"{base}/a", "*.json") == [f"{base}/a/x.json"]
    assert set(location.files_under(base)) == {f"{base}/a/x.json", f"{base}/a/y.bin"}

    log = f"{base}/_manifest.jsonl"
    files.append_lines(log, '{"shard": "a"}\n')
    files.append_lines(log, '{"shard": "b"}\n{"shard": "c"}\n')
    assert files.log_segments(log) == 2 and files.read_lines(log) == ['{"shard": "a"}', '{"shard": "b"}', '{"shard": "c"}']
    files.rewrite_lines(log, '{"shard": "z"}\n')
    assert files.read_lines(log) == ['{"shard": "z"}'] and not s3["fs"].exists(f"{BUCKET}/prim/_manifest.jsonl{SEGMENTS}")

    appender = files.ParquetAppender(f"{base}/p.parquet", row_group_size=4)
    import pyarrow as pa

    for i in range(3):
        appender.append(pa.table({"id": [f"{i}-{j}" for j in range(3)]}))
    info = appender.close()
    data = location.read_bytes(f"{base}/p.parquet")
    assert info["sha256"] == hashlib.sha256(data).hexdigest() and info["rows"] == 9
    assert location.parquet_file(f"{base}/p.parquet").metadata.num_row_groups == 3
    location.remove(base, recursive=True)
    assert not location.files_under(base)


def test_manifest_commits_are_batched_and_compacted(s3):
    from curation.io import files
    from curation.pipeline.rundir import RunDir

    rd = RunDir(f"s3://{BUCKET}/commits/")
    assert rd.root == f"s3://{BUCKET}/commits" and rd.remote
    path = rd.manifest_path("st")
    for i in range(RunDir.COMPACT_SEGMENTS - 1):
        rd.commit([{"shard": f"k{i:03d}", "stage": "st", "params_hash": "h"},
                   {"shard": f"k{i:03d}-b", "stage": "st", "params_hash": "h"}])
    assert files.log_segments(path) == RunDir.COMPACT_SEGMENTS - 1  # one object per commit, not per line
    rd.commit([{"shard": "last", "stage": "st", "params_hash": "h"}])
    assert files.log_segments(path) == 0  # folded into _manifest.jsonl
    assert len(rd.entries("st")) == 2 * (RunDir.COMPACT_SEGMENTS - 1) + 1
    assert rd.committed("st", "h").keys() == rd.entries("st").keys()  # entries without files


def test_manifest_read_while_the_driver_commits_and_compacts(s3, monkeypatch):
    """A reader (a monitor, `refinery stats`, a test polling a live run) reads a manifest the
    driver is appending to and compacting: every read succeeds and holds every line an earlier
    read held (a first segment landing mid-listing once made s3fs list the folder `.d` itself)."""
    import threading

    from curation.io import files
    from curation.pipeline.rundir import RunDir

    monkeypatch.setattr(RunDir, "COMPACT_SEGMENTS", 4)  # many compactions in a short run
    rd = RunDir(f"s3://{BUCKET}/live")
    path = rd.manifest_path("st")
    n_commits = 48
    done = threading.Event()

    def drive():
        try:
            for i in range(n_commits):
                rd.commit([{"shard": f"k{i:03d}", "stage": "st", "params_hash": "h"}])
        finally:
            done.set()

    writer = threading.Thread(target=drive)
    writer.start()
    seen: set[str] = set()
    reads = 0
    try:
        while not done.is_set():
            now = set(files.read_lines(path))
            assert seen <= now, f"a read lost lines an earlier read had: {sorted(seen - now)[:3]}"
            seen, reads = now, reads + 1
    finally:
        writer.join()
    assert len({json.loads(ln)["shard"] for ln in files.read_lines(path)}) == n_commits
    assert reads > 5  # the reads overlapped the commits


@pytest.mark.slow
def test_run_on_s3_killed_and_resumed_equals_a_local_run(s3, tmp_path):
    dag_file = tmp_path / "s3.yaml"
    dag_file.write_text(yaml.safe_dump(DAG))
    local = tmp_path / "local"
    # the local reference runs beside the run that is killed (they share nothing): 78 s -> 56 s
    # on 2 cores; the kill point is read from the S3 run's own manifest
    pool = ThreadPoolExecutor(2)
    local_run = pool.submit(_refinery, s3, "run", str(dag_file), "--out", str(local), "--workers", "2", "-q")

    url = f"s3://{BUCKET}/runs/s3"
    proc = subprocess.Popen(REFINERY + ["run", str(dag_file), "--out", url, "--workers", "1", "-q"], env=s3["env"],
                            cwd=REPO, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    from curation.io import files

    math_manifest = f"{url}/math/_manifest.jsonl"
    deadline = time.time() + 180
    while time.time() < deadline and proc.poll() is None:
        if len(files.read_lines(math_manifest)) >= 3:
            break
        time.sleep(0.2)
    assert proc.poll() is None, f"run ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray it started
    proc.wait()
    n_math = len(files.read_lines(math_manifest))
    assert not s3["fs"].exists(f"{BUCKET}/runs/s3/near/_manifest.jsonl")
    # the resumed run starts at once, beside whatever is left of the local reference
    resumed = pool.submit(_refinery, s3, "run", str(dag_file), "--out", url, "--workers", "2", "-q")
    local_run.result()
    n_local = len((local / "math" / "_manifest.jsonl").read_text().splitlines())
    assert 3 <= n_math < n_local
    resumed.result()

    fs = s3["fs"]
    keys = {k.removeprefix(f"{BUCKET}/runs/s3/") for k in fs.find(f"{BUCKET}/runs/s3")}
    manifests = {k: fs.cat_file(f"{BUCKET}/runs/s3/{k}").decode() for k in keys if k.endswith("_manifest.jsonl")}
    local_manifests = {str(p.relative_to(local)): p.read_text() for p in local.rglob("_manifest.jsonl")}
    # every stage compacted: the same manifest bytes as the local run, no segment objects left
    assert manifests == local_manifests
    assert not [k for k in keys if "_manifest.jsonl.d/" in k]
    # every committed file: present, and the bytes its manifest line names (= the local run's)
    committed = _committed_hashes(manifests)
    assert committed == _committed_hashes(local_manifests) and len(committed) > 20
    for rel, (sha, _) in committed.items():
        assert hashlib.sha256(fs.cat_file(f"{BUCKET}/runs/s3/{rel}")).hexdigest() == sha, rel
    # global stages' work folders removed; nothing half written
    assert not [k for k in keys if "/_work/" in k or ".tmp" in k]
    assert json.loads(fs.cat_file(f"{BUCKET}/runs/s3/progress.json"))["state"] == "done"

    # stats and SQL read the run where it is
    def table(run: str) -> list[str]:  # the title (the run's name) is centred: compare the rows
        return [ln.strip() for ln in _refinery(s3, "stats", run).stdout.replace(run, "RUN").splitlines()]

    remote_table, local_table = pool.map(table, [url, str(local)])  # two processes at once
    assert remote_table == local_table
    q = "select count(*), count(distinct id), sum(length(text)) from kept"
    remote_sql, local_sql = pool.map(lambda run: _refinery(s3, "sql", run, q).stdout, [url, str(local)])
    assert remote_sql == local_sql
    pool.shutdown()

    from curation.pipeline.rundir import RunDir

    con = RunDir(url).connect()
    n, distinct = con.execute("select count(*), count(distinct id) from kept").fetchone()
    assert n == distinct > 0
    assert con.execute("select count(*) from rejected where stage = 'near'").fetchone()[0] == \
        RunDir(local).connect().execute("select count(*) from rejected where stage = 'near'").fetchone()[0]
