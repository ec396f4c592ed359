"""Shared fixtures: the package's exact-timing mock server (``vllm_locust.mock.server``)."""

from __future__ import annotations

# Locust patches the standard library for gevent when imported; do it before anything imports
# ssl (httpx, openai, requests), as Locust itself does, or ssl recurses.
from gevent import monkey

monkey.patch_all()

import itertools
import os
import socket
import sys
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vllm_locust.mock.server import start_process  # noqa: E402


TIERS = ("unit", "e2e", "integration")  # tests/<tier>/: each test carries its folder's marker


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        parts = Path(str(item.fspath)).relative_to(ROOT).parts
        if len(parts) > 1 and parts[0] == "tests" and parts[1] in TIERS:
            item.add_marker(parts[1])


# Ports for the servers tests start: each shard of a parallel run (tests/run.sh sets TEST_SHARD)
# draws from a block of its own, below the kernel's ephemeral range (32768 up), and never hands out
# one port twice. A port the kernel picked (bind to 0) and released may be handed to the next bind(0)
# of any process, so two shards' tests could both have been told it was free.
_PORT_BLOCK = 1500
_port_counter = itertools.count()


def free_port() -> int:
    """A loopback port nothing listens on, from this shard's block (20000 + 1500 * shard)."""
    shard = os.environ.get("TEST_SHARD", "0")
    start = 20000 + _PORT_BLOCK * (int(shard) % 8 if shard.isdigit() else 0)
    for _ in range(_PORT_BLOCK):
        port = start + next(_port_counter) % _PORT_BLOCK
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free port in {start}-{start + _PORT_BLOCK - 1}")


def processes(n: int) -> list[str]:
    """``--processes N`` on a port of its own: Locust's master binds 5557 and its forked workers
    connect to 5557 unless told otherwise, so two such runs on one host (or another test's Locust)
    would share one master."""
    port = str(free_port())
    return ["--processes", str(n), "--master-bind-port", port, "--master-port", port]


def start_fake_server(*args: str):
    """The mock server in its own process: e2e tests, where its clock must not share our CPU."""
    return start_process(*args)


@contextmanager
def fake_servers(*speeds: dict):
    """Mock servers in their own processes, one per ``speeds`` entry (``configure``'s keywords),
    stopped on leaving the block."""
    servers = [start_fake_server() for _ in speeds]
    try:
        for server, speed in zip(servers, speeds):
            server.configure(**speed)
        yield servers
    finally:
        for server in servers:
            server.proc.terminate()


@pytest.fixture(scope="session")
def fake_server_session():
    server = start_process()
    yield server
    server.stop()


@pytest.fixture
def fake_server(fake_server_session):
    fake_server_session.configure()
    return fake_server_session


class _Recording(BaseHTTPRequestHandler):
    """An attacker's server: answers as an OpenAI server would and records what reached it."""

    def log_message(self, *args):
        pass

    def do_GET(self):
        self.server.seen.append((self.command, self.path, self.headers.get("Authorization")))
        body = b'{"object": "list", "data": [{"id": "m", "object": "model"}]}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_POST = do_GET


@contextmanager
def recording_server():
    """``(url, seen)``: a server on 127.0.0.1 whose ``seen`` lists (method, path, Authorization)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recording)
    server.seen = []
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server.seen
    finally:
        server.shutdown()
        server.server_close()


def until(check, what: str, timeout_s: float = 90.0):
    """Poll ``check`` until it returns something true; fail naming ``what`` after ``timeout_s``."""
    import time

    deadline = time.time() + timeout_s
    while not (value := check()):
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)
    return value


@contextmanager
def locust_web_ui(host: str, log: Path, *args: str, env: dict | None = None):
    """Real Locust with its web UI on a free loopback port, started on the project's locustfile and
    ready to answer; yields ``(base_url, process)``, stops it on leaving."""
    import os
    import subprocess

    import requests as http

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with open(log, "w") as out:
        ui = subprocess.Popen([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", host,
                               "--web-host", "127.0.0.1", "--web-port", str(port), *args],
                              cwd=ROOT, env=dict(os.environ) if env is None else env, stdout=out,
                              stderr=subprocess.STDOUT)

    def up():
        try:
            return http.get(base + "/stats/requests", timeout=2).ok
        except http.ConnectionError:
            return False

    try:
        until(lambda: up() or ui.poll() is not None, "the web UI")
        assert ui.poll() is None, log.read_text()[-3000:]
        yield base, ui
    finally:
        ui.terminate()
        ui.wait(timeout=60)


def run_locust(*args: str, timeout: int = 180, locustfile: Path | None = None):
    """Real ``locust`` on the project's locustfile (or ``locustfile``) with ``args``, from the
    repository root: the completed process (its summary and log on stderr). The one way the e2e
    tests start Locust in its own process."""
    import signal
    import subprocess

    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile or ROOT / "locustfile.py"), *args]
    # Its own process group: a run that outlives ``timeout`` is stopped with every process it
    # forked (--processes), and the error carries what it had written by then.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as late:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        late.add_note(f"locust's last output before it was stopped:\n{stderr[-4000:]}")
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


def headless(host: str, out: Path | None, *args: str, timeout: int = 180):
    """``locust --headless --only-summary`` against ``host``: raw rows under ``out`` (None: Locust's
    own defaults), no prompt cache."""
    samples = ["--samples-dir", str(out), "--prompt-cache-dir", ""] if out is not None else []
    return run_locust("--host", host, "--headless", "--only-summary", *samples, *args, timeout=timeout)


def request_rows(out: Path, kind: str = "requests"):
    """Every ``<kind>-*.csv`` under ``out`` (every process's), as one frame; empty when none."""
    import pandas as pd

    files = sorted(out.glob(f"{kind}-*.csv"))
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True) if files else pd.DataFrame()
