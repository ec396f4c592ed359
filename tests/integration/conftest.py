"""Real vLLM (CPU build) on 127.0.0.1 and real Locust, for the integration tests.

The server's Python comes from ``VLLM_PYTHON`` or ``.venv-vllm`` (``launch/setup.sh`` makes it);
without either the integration tests are skipped, which ``.ci/run`` refuses (it sets
``REQUIRE_INTEGRATION=1``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import free_port  # noqa: F401  (the integration tests import it from here)

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "models" / "tiny"


def vllm_python() -> str | None:
    candidate = os.environ.get("VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    return candidate if Path(candidate).exists() else None


def require_vllm():
    python = vllm_python()
    if python is None:
        if os.environ.get("REQUIRE_INTEGRATION"):
            pytest.fail("no vLLM server python (VLLM_PYTHON or .venv-vllm): run launch/setup.sh")
        pytest.skip("no vLLM CPU install: run launch/setup.sh")
    if not (MODEL_DIR / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "launch" / "make_tiny_model.py"), str(MODEL_DIR)], check=True)
    return python


class VllmServer:
    def __init__(self, url: str, proc: subprocess.Popen, log: Path):
        self.url, self.proc, self.log = url, proc, log


@contextmanager
def served(profile: str, run_dir: Path, env: dict | None = None):
    """``launch/serve.sh PROFILE``, as a user starts it: healthy and smoke-tested once its manifest
    exists; SIGTERM on leaving makes serve.sh stop vLLM's process group. ``env``: added to ours."""
    python = require_vllm()
    port = free_port()
    env = dict(os.environ, PORT=str(port), VLLM_PYTHON=python, **(env or {}))
    with open(run_dir / "serve.log", "w") as out:
        proc = subprocess.Popen(["bash", str(ROOT / "launch" / "serve.sh"), profile, "--run-dir", str(run_dir)],
                                stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    deadline = time.time() + 300
    while not (run_dir / "manifest.json").exists():
        if proc.poll() is not None or time.time() > deadline:
            os.killpg(proc.pid, signal.SIGTERM)
            pytest.fail(f"serve.sh {profile} did not come up:\n" + (run_dir / "serve.log").read_text()[-3000:])
        time.sleep(1)
    try:
        yield VllmServer(f"http://127.0.0.1:{port}", proc, run_dir / "server.log")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """``serve.sh baseline-cpu``: the embedded default."""
    with served("baseline-cpu", tmp_path_factory.mktemp("vllm")) as server:
        yield server


def run_locust(host: str, out: Path, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """Real ``locust --headless`` on the project's locustfile; samples and --csv under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", host, "--headless",
           "--csv", str(out / "locust"), "--samples-dir", str(out), "--prompt-cache-dir", str(out / "cache"),
           "--only-summary", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def launch(script: str, *args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    """``bash launch/SCRIPT ARGS`` from the repository, as a user runs it; ``env`` added to ours."""
    full = dict(os.environ, **(env or {}))
    return subprocess.run(["bash", str(ROOT / "launch" / script), *args], capture_output=True, text=True,
                          env=full, timeout=timeout, cwd=ROOT)
