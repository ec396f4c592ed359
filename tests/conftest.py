"""Shared fixtures: the exact-timing fake server, in its own process."""

from __future__ import annotations

# Locust patches the standard library for gevent when imported; do it before anything imports
# ssl (httpx, openai, requests), as Locust itself does, or ssl recurses.
from gevent import monkey

monkey.patch_all()

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class FakeServer:
    """Handle on a running ``tests/fakeserver.py``."""

    def __init__(self, port: int, proc: subprocess.Popen):
        self.port = port
        self.proc = proc
        self.url = f"http://127.0.0.1:{port}"

    def _call(self, path: str, payload: dict | None = None) -> dict:
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def configure(self, **config) -> dict:
        """Set the script (and clear the log)."""
        base = {"ttft_ms": 150.0, "itl_ms": 15.0, "tokens": 16, "mode": "ok", "model": "fake-model"}
        return self._call("/_config", {**base, **config})

    def log(self) -> list[dict]:
        return self._call("/_log")["requests"]


def start_fake_server(*args: str) -> FakeServer:
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests" / "fakeserver.py"), "--port", "0", *args],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"fake server did not start: {line!r}")
    return FakeServer(int(line.split()[1]), proc)


@pytest.fixture(scope="session")
def fake_server_session():
    server = start_fake_server()
    yield server
    server.proc.terminate()
    server.proc.wait(timeout=10)


@pytest.fixture
def fake_server(fake_server_session):
    fake_server_session.configure()
    return fake_server_session
