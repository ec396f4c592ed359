"""``--processes 4 --csv``: no write to a closed CSV file at shutdown, and the files hold the final stats.

Locust's master closes the CSV files at ``quit`` and then, in its exit handler ``kill_workers``,
sleeps 0.1 s cooperatively; a ``--csv`` writer greenlet due in that window wrote to the closed
files (``CRITICAL ... ValueError: I/O operation on closed file``, exit code 0), about one run in
four to twelve. Here the window is made certain rather than waited for: the locustfile adds an
exit handler to the master that yields 1.5 s after the files close, longer than the writer's
one-second interval, so a writer still alive always wakes in it.
"""

from __future__ import annotations

import csv
import glob
import subprocess
import sys
from pathlib import Path

import pandas as pd

from tests.conftest import processes, start_fake_server
from tests.e2e.test_secrets_and_bad_input import LOAD, ROOT

LOCUSTFILE = '''
import atexit

import gevent
from locust import events
from locust.runners import WorkerRunner

from vllm_locust.plugin import user


class ChatStreamUser(user.ChatStreamUser):
    pass


@events.init.add_listener
def yield_after_the_files_close(environment, **_kwargs):
    if not isinstance(environment.runner, WorkerRunner):  # the master: the one with --csv
        atexit.register(gevent.sleep, 1.5)  # runs after shutdown() closed the CSV files
'''


def table(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_processes_csv_writer_never_writes_to_closed_files_and_keeps_the_final_counts(tmp_path):
    locustfile = tmp_path / "yielding_locustfile.py"
    locustfile.write_text(LOCUSTFILE)
    samples = tmp_path / "samples"
    server = start_fake_server()
    try:
        server.configure(ttft_ms=10, itl_ms=2, tokens=8)
        proc = subprocess.run(
            [sys.executable, "-m", "locust", "-f", str(locustfile), "--headless", *processes(4), "-u", "8", "-r", "8",
             "-t", "3s", "--host", server.url, "--samples-dir", str(samples), "--csv", str(tmp_path / "x"), *LOAD],
            cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        server.stop()
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert "Unhandled exception in greenlet" not in log and "closed file" not in log, log[-3000:]
    # Complete: every request the master holds a row for is counted in the CSV, and every metric row
    # and file is there.
    requests = pd.concat(pd.read_csv(p) for p in glob.glob(str(samples / "requests-*.csv")))
    finished = requests[~requests["error"].astype("string").fillna("").str.startswith("interrupted")]
    stats = {row["Name"]: row for row in table(tmp_path / "x_stats.csv")}
    assert list(stats) == ["E2E", "ITL", "TPOT", "TTFT", "Aggregated"]
    assert int(stats["E2E"]["Request Count"]) == len(finished) > 8
    assert int(stats["ITL"]["Request Count"]) > int(stats["E2E"]["Request Count"])
    assert stats["Aggregated"]["Request Count"] == stats["E2E"]["Request Count"]
    assert requests["worker_id"].nunique() == 4
    history = table(tmp_path / "x_stats_history.csv")
    assert len(history) >= 3 and history[-1]["Name"] == "Aggregated"
    assert table(tmp_path / "x_failures.csv") == [] and table(tmp_path / "x_exceptions.csv") == []


def test_processes_auto_runs_one_process_for_a_few_streams_and_says_so(tmp_path):
    """``--processes auto`` through real Locust: parsed, resolved before Locust would fork, said once.
    (A count above one needs more cores than CI's two: the unit tests cover the rule.)"""
    from tests.conftest import headless, request_rows

    server = start_fake_server()
    try:
        server.configure(ttft_ms=5, itl_ms=1, tokens=4)
        proc = headless(server.url, tmp_path, "--processes", "auto", "-u", "3", "-r", "3", "-t", "2s", *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "--processes auto:" in line]
    assert len(said) == 1 and "one process for 3 streams" in said[0], proc.stderr[-3000:]
    rows = request_rows(tmp_path)
    assert len(rows) > 0 and rows["worker_id"].nunique() == 1
