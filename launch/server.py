"""A vLLM server started through its launch profile (``launch/serve.sh PROFILE``), seen from Python.

``serve.sh`` starts vLLM in its own process group, waits for ``/health``, smoke-tests it and then
writes ``manifest.json``: so a manifest means "healthy and answering". This object starts
serve.sh, waits for that manifest while failing fast (with the log's last lines) if anything
dies, tells whether the server is still alive, and stops both process groups.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

from vllm_locust.core.schema import MANIFEST, SERVER_LOG

ROOT = Path(__file__).resolve().parents[1]
SERVE_SH = ROOT / "launch" / "serve.sh"


class ServerError(Exception):
    """The server could not be started, or died; the message is one line, ``log_tail`` the rest."""

    def __init__(self, message: str, log_tail: list[str] | None = None):
        super().__init__(message)
        self.log_tail = log_tail or []


def serve_sh(*args: str, env: dict | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SERVE_SH), *args], capture_output=True, text=True,
                          env=env, timeout=timeout_s)


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def tail(path: Path, n: int = 25) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def pid_alive(pid: int | None) -> bool:
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ServerProcess:
    """One start of one profile, into ``run_dir`` (server.log, serve.log, manifest.json)."""

    def __init__(self, profile: str, run_dir: Path, env: dict):
        self.profile = profile
        self.run_dir = Path(run_dir)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.manifest: dict = {}

    @property
    def url(self) -> str:
        return self.manifest.get("url", "")

    @property
    def model(self) -> str:
        return self.manifest.get("model", "")

    @property
    def server_log(self) -> Path:
        return self.run_dir / SERVER_LOG

    def log_tail(self, n: int = 25) -> list[str]:
        return tail(self.server_log, n) or tail(self.run_dir / "serve.log", n)

    def start(self, timeout_s: float) -> "ServerProcess":
        """Start and wait until healthy and smoke-tested; ``ServerError`` otherwise (nothing left running)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.run_dir / "serve.log", "w") as out:
            self.proc = subprocess.Popen(["bash", str(SERVE_SH), self.profile, "--run-dir", str(self.run_dir)],
                                         stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
        try:
            self._wait_until_up(timeout_s)
        except BaseException:
            # Ctrl-C or SIGTERM while the server starts: stop it too. An interrupted tuning on the
            # H200 left a half-started vLLM holding 132 GB, and the next start failed for lack of it.
            self.stop()
            raise
        return self

    def _wait_until_up(self, timeout_s: float) -> None:
        deadline = time.time() + timeout_s
        manifest = self.run_dir / MANIFEST
        while not manifest.exists():
            if self.proc.poll() is not None:
                reason = last_line((self.run_dir / "serve.log").read_text(errors="replace"))
                tail_lines = self.log_tail()
                self.stop()
                raise ServerError(f"{self.profile}: the server did not come up: {reason or 'serve.sh exited'}", tail_lines)
            if time.time() > deadline:
                tail_lines = self.log_tail()
                self.stop()
                raise ServerError(f"{self.profile}: not healthy after {timeout_s:g} s", tail_lines)
            time.sleep(0.5)
        self.manifest = json.loads(manifest.read_text())

    def alive(self) -> bool:
        """serve.sh and the vLLM it started are both still running."""
        return self.proc is not None and self.proc.poll() is None and pid_alive(self.manifest.get("pid"))

    def stop(self, grace_s: float = 60) -> None:
        """TERM to serve.sh's group (its trap stops vLLM's group), KILL whatever is left after ``grace_s``."""
        if self.proc is None:
            return
        groups = [self.proc.pid] + ([self.manifest["pid"]] if self.manifest.get("pid") else [])
        for group in groups[:1]:
            _signal_group(group, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.time() + 10
        while any(_group_alive(g) for g in groups) and time.time() < deadline:
            time.sleep(0.5)
        for group in groups:
            _signal_group(group, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(timeout=10)
        self.proc = None


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True
