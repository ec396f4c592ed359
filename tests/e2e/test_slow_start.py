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
