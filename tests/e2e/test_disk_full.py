"""A full disk under a real headless run (issue 21, item 3). Seen: with ``--samples-dir`` on a 1 MB
tmpfs, 3 of 4 runs never exited, hundreds of ``[Errno 28]`` tracebacks, Locust counted 0 failures
and the CSVs ended mid-row. A write failure must stop the run by itself with one line and exit 2,
keeping whole lines of what was written."""

from __future__ import annotations

import csv
import io
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import start_fake_server

ROOT = Path(__file__).resolve().parents[2]
DISK_ERROR = "No space left on device"


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB tmpfs (needs root and mount rights: skipped, with the reason, elsewhere)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip() or made.returncode}")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def run_group(cmd: list[str], timeout_s: float) -> tuple[int | None, str, str]:
    """``cmd`` in its own process group; past ``timeout_s`` (a safety net, not a measurement) the
    whole group is killed and the exit code is None."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err


def test_a_full_disk_stops_the_run_with_one_line_exit_2_and_whole_csv_lines(small_disk):
    server = start_fake_server()
    server.configure(ttft_ms=1, itl_ms=1, tokens=64)  # about 6 KB of sample rows a request: full in a second
    try:
        code, out, err = run_group([sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py"), "--headless",
                                    "--host", server.url, "-u", "4", "-r", "4", "-t", "5s", "--samples-dir",
                                    str(small_disk), "--max-tokens", "64", "--prompt-tokens", "32", "--prompt-pool", "8",
                                    "--metrics-interval", "0.2"], timeout_s=90)
    finally:
        server.stop()
    lines = err.splitlines()
    assert code is not None, f"the run never exited by itself (-t 5s): {err[-3000:]}"
    assert code == 2, f"exit {code}: {err[-3000:]}"
    stopping = [line for line in lines if DISK_ERROR in line and "stopping the run" in line]
    assert len(stopping) == 1, f"one line says why the run stopped, got {len(stopping)}: {err[-3000:]}"
    assert sum("Traceback" in line for line in lines) == 0, f"no traceback flood: {err[-3000:]}"
    assert sum(DISK_ERROR in line for line in lines) <= 2, "the stop line, and at most the load record's line"
    files = sorted(small_disk.glob("*.csv"))
    assert any(p.name.startswith("samples-") for p in files), "what was written before the disk filled is kept"
    for path in files:
        text = path.read_text()
        if not text:
            continue  # made, but not even its header fitted
        assert text.endswith("\n"), f"{path.name} ends mid-row"
        rows = list(csv.reader(io.StringIO(text)))
        widths = {len(row) for row in rows}
        assert widths == {len(rows[0])}, f"{path.name}: rows of {widths} columns, header {len(rows[0])}"
