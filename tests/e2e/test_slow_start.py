"""A server too slow to start a run against (issue 39, M4): its ``GET /v1/models`` answers one byte a
second. The run exited 0 with nothing measured and said nothing when ``-t`` ended it first; now it
says so and exits 2, and ``--start-timeout`` bounds the checks whatever ``-t`` is."""

from __future__ import annotations

from tests.conftest import headless, start_fake_server
from tests.e2e.test_secrets_and_bad_input import LOAD


def test_a_run_that_ends_during_its_start_checks_says_so_and_exits_2(tmp_path):
    server = start_fake_server()
    server.configure(hostile="drip-models", drip_ms=1000)
    try:
        proc = headless(server.url, tmp_path, "-u", "1", "-r", "1", "-t", "3s", *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "into its start checks" in line]
    assert len(lines) == 1 and "nothing was measured" in lines[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr


def test_start_checks_past_their_deadline_stop_the_run_with_one_line(tmp_path):
    server = start_fake_server()
    server.configure(hostile="drip-models", drip_ms=1000)
    try:
        proc = headless(server.url, tmp_path, "-u", "1", "-r", "1", "-t", "120s", "--start-timeout", "2", *LOAD)
    finally:
        server.stop()
    assert proc.returncode == 2, proc.stderr[-3000:]
    said = [line for line in proc.stderr.splitlines() if "--start-timeout 2 s" in line]
    assert len(said) == 1 and "nothing was sent" in said[0], proc.stderr[-3000:]
    assert "into its start checks" not in proc.stderr, "said once, by the check that stopped it"


def test_a_run_leaves_no_temporary_directory_behind(tmp_path):
    """Seen: one ``vllm-locust-metrics-*`` directory left in the temp folder per run (L10)."""
    import os
    import subprocess
    import sys

    from tests.e2e.test_secrets_and_bad_input import ROOT

    server = start_fake_server()
    server.configure(ttft_ms=5, itl_ms=1, tokens=4)
    temp = tmp_path / "tmp"
    temp.mkdir()
    try:
        proc = subprocess.run([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--host", server.url,
                               "--headless", "--only-summary", "-u", "1", "-r", "1", "-t", "3s", "--samples-dir",
                               str(tmp_path / "out"), *LOAD], capture_output=True, text=True, cwd=ROOT, timeout=120,
                              env={**os.environ, "TMPDIR": str(temp)})
    finally:
        server.stop()
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "out" / "metrics.csv").exists(), "the scraper ran (its directory was made)"
    assert not list(temp.glob("vllm-locust-metrics-*")), list(temp.iterdir())
