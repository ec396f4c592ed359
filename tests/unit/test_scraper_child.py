"""The ``/metrics`` scraper child (issue 21, items 9, 11, 12): it dies with its parent, it writes
where the user's relative ``--samples-dir`` says from any cwd, and a ``--host`` ending in ``/v1``
scrapes ``/metrics``, not ``/v1/metrics``."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from vllm_locust.backend.controls import reset_prefix_cache
from vllm_locust.core.hosts import normalize_host
from vllm_locust.plugin.webui.live_metrics import LiveMetrics, Scrapes
from vllm_locust.mock.server import start_in_thread, start_process

from .test_live_metrics import wait_for

ROOT = Path(__file__).resolve().parents[2]

PARENTS = {
    "live_metrics": """
import sys, time
from vllm_locust.plugin.webui.live_metrics import LiveMetrics
live = LiveMetrics()
live.start(sys.argv[1], 0.1, sys.argv[2])
print(live._proc.pid, flush=True)
time.sleep(600)
""",
    "scraper": """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-m", "vllm_locust.backend.scraper", sys.argv[1], "--out",
                          sys.argv[2] + "/metrics.csv", "--interval", "0.1"])
print(child.pid, flush=True)
time.sleep(600)
""",
}


def gone(pid: int) -> bool:
    """The process has exited (a zombie nobody reaped counts: it runs no more)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def rows_in(path: Path) -> int:
    try:
        with open(path) as f:
            return sum(1 for _ in csv.reader(f))
    except FileNotFoundError:
        return 0


@pytest.mark.parametrize("kind", sorted(PARENTS))
def test_the_scraper_child_exits_when_its_parent_is_killed(tmp_path, kind):
    server = start_process()
    parent = subprocess.Popen([sys.executable, "-c", PARENTS[kind], server.url, str(tmp_path)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    try:
        assert wait_for(lambda: rows_in(tmp_path / "metrics.csv"), lambda n: n > 1) > 1, "the child scrapes"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        for _ in range(300):  # a count, not a deadline: the child sees its parent go at its next check
            if gone(child):
                break
            time.sleep(0.05)
        assert gone(child), f"the {kind} child kept running after its parent was SIGKILLed"
    finally:
        if not gone(child):
            os.kill(child, signal.SIGKILL)
        server.stop()


def test_a_relative_samples_dir_is_the_users_cwd_not_the_repositorys(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = f"rel-samples-{os.getpid()}"
    server = start_in_thread()
    live = LiveMetrics()
    try:
        live.start(server.url, 0.05, name)
        wait_for(lambda: rows_in(tmp_path / name / "metrics.csv"), lambda n: n > 1)
    finally:
        live.stop()
        server.stop()
    assert rows_in(tmp_path / name / "metrics.csv") > 1, "metrics.csv lands in <cwd>/<samples-dir>"
    assert not (ROOT / name).exists()
    assert "cannot read" not in live.as_json()


@pytest.mark.parametrize("given", ["http://h:8000/v1", "http://h:8000/v1/", "http://h:8000//", "http://h:8000",
                                   " http://h:8000/v1// "])
def test_a_host_is_normalised_to_the_servers_root(given):
    assert normalize_host(given) == "http://h:8000"


def test_normalising_keeps_a_path_prefix_and_empty_stays_empty():
    assert normalize_host("https://proxy/vllm/v1") == "https://proxy/vllm"
    assert normalize_host("http://h/v10") == "http://h/v10"
    assert normalize_host("") == "" and normalize_host(None) == ""


def test_a_host_ending_in_v1_scrapes_metrics_and_resets_the_cache_at_the_root(tmp_path):
    server = start_in_thread()
    live = LiveMetrics()
    try:
        assert Scrapes(server.url + "/v1/").url == server.url
        live.start(server.url + "/v1", 0.05, str(tmp_path))
        wait_for(lambda: rows_in(tmp_path / "metrics.csv"), lambda n: n > 1)
        before = server.prefix_cache_resets()  # a count kept per process: other tests' servers add to it
        done, message = reset_prefix_cache(server.url + "/v1")
        resets = server.prefix_cache_resets() - before
    finally:
        live.stop()
        server.stop()
    assert live.url == server.url
    assert rows_in(tmp_path / "metrics.csv") > 1, "scraped /metrics, not /v1/metrics"
    assert done and resets == 1, message
