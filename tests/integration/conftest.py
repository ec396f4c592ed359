"""Real vLLM (CPU build) on 127.0.0.1 and real Locust, for the integration tests.

The server's Python comes from ``VLLM_PYTHON`` or ``.venv-vllm`` (``launch/setup.sh`` makes it);
without either the integration tests are skipped, which ``.ci/run`` refuses (it sets
``REQUIRE_INTEGRATION=1``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODEL_DIR = ROOT / "models" / "tiny"


def vllm_python() -> str | None:
    candidate = os.environ.get("VLLM_PYTHON") or str(ROOT / ".venv-vllm" / "bin" / "python")
    return candidate if Path(candidate).exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    python = require_vllm()
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_CPU_OMP_THREADS_BIND="auto", VLLM_SERVER_DEV_MODE="1")
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(MODEL_DIR),
           "--served-model-name", "tiny", "--load-format", "dummy", "--dtype", "float32",
           "--max-model-len", "4096", "--host", "127.0.0.1", "--port", str(port)]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 300
    while time.time() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"vLLM exited with {proc.returncode}:\n" + "".join(log.read_text().splitlines(True)[-30:]))
        try:
            with urllib.request.urlopen(url + "/health", timeout=2):
                break
        except OSError:
            time.sleep(1)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("vLLM did not become healthy in 300 s")
    yield VllmServer(url, proc, log)
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def run_locust(host: str, out: Path, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    """Real ``locust --headless`` on the project's locustfile; samples and --csv under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", host, "--headless",
           "--csv", str(out / "locust"), "--samples-dir", str(out), "--prompt-cache-dir", str(out / "cache"),
           "--only-summary", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
