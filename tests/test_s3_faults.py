"""Faults, survived (issue 29): the S3 server answers a share of requests with ``503 SlowDown``
or resets the connection (a proxy in front of the local moto server, deterministic: every 7th
request a 503, every 11th a reset). A run reading its inputs from and writing its run directory
to that server retries, counts its retries in progress.json, and ends with the bytes a local
run gets."""

from __future__ import annotations

import http.client
import itertools
import socket
import struct
import subprocess
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import pytest
import yaml

from conftest import REPO
from test_s3 import BUCKET, REFINERY, _committed_hashes, s3  # noqa: F401  (s3: the moto server fixture)

pytestmark = pytest.mark.slow

SLOW_DOWN = (b'<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code>'
             b"<Message>Please reduce your request rate.</Message></Error>")
HOP = ("transfer-encoding", "connection", "keep-alive")


class FlakyProxy:
    """HTTP/1.1 proxy to the S3 server: every ``every_503``-th request answered ``503 SlowDown``,
    every ``every_reset``-th connection reset after the request was read; the rest forwarded."""

    def __init__(self, target: str, every_503: int = 7, every_reset: int = 11):
        t = urlparse(target)
        self.host, self.port = t.hostname, t.port
        self.counter = itertools.count()
        self.faults: Counter = Counter()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    parts = []
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(parts)
                        parts.append(self.rfile.read(size))
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else b""

            def _handle(self) -> None:
                body = self._body()
                i = next(proxy.counter)
                if i % every_503 == 3:
                    proxy.faults["503 SlowDown"] += 1
                    self.send_response_only(503, "Slow Down")
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(SLOW_DOWN)))
                    self.end_headers()
                    if self.command != "HEAD":
                        self.wfile.write(SLOW_DOWN)
                    return
                if i % every_reset == 5:
                    proxy.faults["connection reset"] += 1
                    self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    self.close_connection = True
                    self.connection.close()  # RST, no response
                    return
                headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP + ("content-length",)}
                if body or self.command in ("PUT", "POST"):
                    headers["Content-Length"] = str(len(body))
                conn = http.client.HTTPConnection(proxy.host, proxy.port, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                finally:
                    conn.close()
                self.send_response_only(resp.status, resp.reason)
                for k, v in resp.getheaders():
                    if k.lower() not in HOP and not (k.lower() == "content-length" and self.command != "HEAD"):
                        self.send_header(k, v)
                if self.command != "HEAD":
                    self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def requests(self) -> int:
        return next(self.counter)  # (consumes one number: only for reporting)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


DAG = {
    "name": "s3-faults",
    "inputs": {"math": {"format": "jsonl", "paths": [f"s3://{BUCKET}/data/jsonl/gsm8k_train_head400.jsonl"],
                        "source": "math", "text_field": "question", "split_bytes": 20000}},
    "stages": {"gopher": {"type": "gopher_quality", "input": "math", "min_doc_words": 5},
               "exact": {"type": "exact_dedup", "input": "gopher", "partitions": 2,
                         "bloom": {"expected_items": 10000, "false_positive_rate": 1.0e-6}}},
    "output": "exact",
}


def test_a_run_through_503s_and_connection_resets_equals_a_local_run(s3, tmp_path):  # noqa: F811
    dag_file = tmp_path / "faults.yaml"
    dag_file.write_text(yaml.safe_dump(DAG))
    local = tmp_path / "local"
    # the local reference runs beside the faulty run (they share nothing): 71 s -> 60 s on 2
    # cores, before the fault rate below was halved
    local_run = subprocess.Popen(REFINERY + ["run", str(dag_file), "--out", str(local), "--workers", "2", "-q"],
                                 env=s3["env"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    # one request in 13 answered 503, one connection in 17 reset: 48 and 33 faults over the run's
    # ~620 requests (one in 7 and 11 gave 99 and 54, and the faulty run took 56 s instead of 43)
    proxy = FlakyProxy(s3["env"]["AWS_ENDPOINT_URL"], every_503=13, every_reset=17)
    try:
        url = f"s3://{BUCKET}/runs/faults"
        t0 = time.time()
        res = subprocess.run(REFINERY + ["run", str(dag_file), "--out", url, "--workers", "2", "-q"],
                             env={**s3["env"], "AWS_ENDPOINT_URL": proxy.url}, cwd=REPO, capture_output=True,
                             text=True, timeout=600)
        seconds = time.time() - t0
        assert res.returncode == 0, res.stderr[-3000:]
        n = proxy.requests
    finally:
        proxy.close()
        _, err = local_run.communicate(timeout=600)
    assert local_run.returncode == 0, err[-3000:]
    assert proxy.faults["503 SlowDown"] > 0 and proxy.faults["connection reset"] > 0, proxy.faults
    fs = s3["fs"]
    remote = {st: fs.cat(f"{BUCKET}/runs/faults/{st}/_manifest.jsonl").decode() for st in ("math", "gopher", "exact")}
    here = {st: (local / st / "_manifest.jsonl").read_text() for st in ("math", "gopher", "exact")}
    assert _committed_hashes(remote) == _committed_hashes(here)
    for f, (sha, _) in _committed_hashes(here).items():
        import hashlib

        assert hashlib.sha256(fs.cat(f"{BUCKET}/runs/faults/{f}")).hexdigest() == sha, f
    # the retries are counted in progress.json (the tasks' and the driver's, curation/io/retries.py):
    # every 503 is a retry botocore decides (bar any after progress.json's last write); a reset of a
    # reused keep-alive connection is resent by aiohttp below botocore, unseen, so it may not count
    import json

    retries = json.loads(fs.cat(f"{BUCKET}/runs/faults/progress.json"))["retries"]
    assert 0.9 * proxy.faults["503 SlowDown"] <= retries <= sum(proxy.faults.values()), (retries, dict(proxy.faults))
    print(f"{n} requests, faults injected {dict(proxy.faults)}, progress.json retries {retries}; run {seconds:.1f} s")
