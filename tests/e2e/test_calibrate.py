"""``--calibrate`` in the three uses (headless, ``--processes 2``, the web UI): real Locust, the
exact-timing mock started by the run itself, the budget in the calibration file, the load record,
the summary and the report."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest
import requests as http

from tests.conftest import locust_web_ui, processes, start_fake_server, until
from tests.e2e.test_secrets_and_bad_input import LOAD, ROOT

# A calibration reads the client's timing against the exact-timing mock, and its runs start six
# Python processes at once (the run's and the calibration's masters and workers): alone, in the
# full run's second phase (tests/parallel.py), not beside the vLLM servers of the first.
pytestmark = pytest.mark.timing

BUDGET = ("ttft_p50_error_ms", "ttft_p95_error_ms", "ttft_p99_error_ms", "itl_p50_error_ms", "itl_p95_error_ms",
          "itl_p99_error_ms", "cpu_us_per_chunk")
CALIBRATE = ["--calibrate", "--calibrate-seconds", "2", "--calibrate-itl-ms", "5"]


def check_budget(calibration: dict, streams: int, workers: int) -> None:
    assert not calibration.get("error"), calibration
    assert (calibration["streams"], calibration["processes"]) == (streams, workers)
    assert calibration["events_per_s"] == streams * 200  # a chunk every 5 ms a stream
    assert all(isinstance(calibration[k], (int, float)) for k in BUDGET), calibration
    # 64-chunk requests of 0.37 s for 2 s, each stream's first left out: whole requests, counted
    assert calibration["requests"] >= streams


def headless(tmp_path, server, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--headless", "-u", "4",
                           "-r", "4", "-t", "2s", "--host", server.url, "--samples-dir", str(tmp_path / "base"),
                           "--prompt-cache-dir", "", *LOAD, *CALIBRATE, *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)


def test_a_headless_run_calibrates_first_and_the_analysis_shows_the_budget(tmp_path):
    server = start_fake_server()
    try:
        server.configure(ttft_ms=10, itl_ms=2, tokens=8)
        proc = headless(tmp_path, server)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert len(server.log()) >= 4, "the run's own load went to --host after the calibration"
    finally:
        server.stop()
    assert "client calibration: at 4 streams (1 process, 800 chunks/s asked" in proc.stderr
    [path] = (tmp_path / "base").glob("calibration-*.json")
    calibration = json.loads(path.read_text())
    check_budget(calibration, streams=4, workers=1)
    assert len(calibration["loop_lag_ms"]) > 10, "the child's own loop-lag series, for the trust rule"
    [record] = (tmp_path / "base").glob("loadrun-*.json")
    in_record = json.loads(record.read_text())["calibration"]
    assert in_record == {k: v for k, v in calibration.items() if k != "loop_lag_ms"}

    report = subprocess.run([sys.executable, "-m", "analysis", str(tmp_path)], cwd=ROOT, capture_output=True,
                            text=True, timeout=240)
    assert report.returncode == 0, report.stderr[-3000:]
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert summary["calibrated_ttft_p95_error_ms"].tolist() == [abs(calibration["ttft_p95_error_ms"])]
    assert summary["calibrated_itl_p95_error_ms"].tolist() == [abs(calibration["itl_p95_error_ms"])]
    assert "base: client calibration: at 4 streams" in (tmp_path / "report.md").read_text()


def test_a_distributed_run_calibrates_with_its_own_process_count(tmp_path):
    server = start_fake_server()
    try:
        server.configure(ttft_ms=10, itl_ms=2, tokens=8)
        proc = headless(tmp_path, server, *processes(2))
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    [record] = (tmp_path / "base").glob("loadrun-*.json")
    check_budget(json.loads(record.read_text())["calibration"], streams=4, workers=2)


def test_a_web_ui_run_calibrates_at_the_forms_user_count(tmp_path):
    """With ``--processes auto`` too: the form's users (-u 3) are its streams at start, one process."""
    server = start_fake_server()
    server.configure(ttft_ms=10, itl_ms=2, tokens=8)
    try:
        with locust_web_ui(server.url, tmp_path / "locust.log", "--samples-dir", str(tmp_path / "s"),
                           "--prompt-cache-dir", "", "--processes", "auto", "-u", "3", *LOAD,
                           *CALIBRATE) as (base, _ui):
            started = http.post(base + "/swarm", headers={"Origin": base}, timeout=120,
                                data={"user_count": "3", "spawn_rate": "3", "host": server.url})
            assert started.status_code == 200 and started.json()["success"], started.text
            until(lambda: len(server.log()) >= 3, "the run's requests after its calibration", 120)
            assert http.post(base + "/stop", headers={"Origin": base}, timeout=10).ok
            until(lambda: list((tmp_path / "s").glob("loadrun-*.json")), "the load record")
    finally:
        server.stop()
    [record] = (tmp_path / "s").glob("loadrun-*.json")
    check_budget(json.loads(record.read_text())["calibration"], streams=3, workers=1)
    log = (tmp_path / "locust.log").read_text()
    assert "--processes auto: one process for 3 streams" in log, log[-3000:]
