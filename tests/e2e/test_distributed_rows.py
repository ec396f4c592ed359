"""A distributed run ends with one complete run directory on the master: every worker's raw rows
arrive with its stats reports (Locust's messaging), whatever disk the worker has."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd

from tests.conftest import start_fake_server
from tests.e2e.test_secrets_and_bad_input import LOAD, ROOT, free_port


def analyse(directory: Path) -> pd.DataFrame:
    proc = subprocess.run([sys.executable, "-m", "analysis", str(directory), "--bootstrap", "50"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return pd.read_csv(directory / "summary.csv")


def test_master_gets_every_workers_rows_and_they_equal_the_workers_own_copies(tmp_path):
    server = start_fake_server()
    server.configure(ttft_ms=10, itl_ms=2, tokens=8)
    master_dir, port = tmp_path / "master", free_port()
    own = [tmp_path / "worker-a", tmp_path / "worker-b"]  # as two hosts' disks would be
    base = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfile.py")]
    workers = [subprocess.Popen([*base, "--worker", "--master-host", "127.0.0.1", "--master-port", str(port),
                                 "--worker-samples-dir", str(d)], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True) for d in own]
    try:
        master = subprocess.run([*base, "--master", "--master-bind-host", "127.0.0.1", "--master-bind-port", str(port),
                                 "--expect-workers", "2", "--headless", "-u", "4", "-r", "4", "-t", "6s", "--host",
                                 server.url, "--samples-dir", str(master_dir), "--csv", str(tmp_path / "locust"), *LOAD],
                                cwd=ROOT, capture_output=True, text=True, timeout=180)
    finally:
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(w.pid, signal.SIGKILL)
        server.stop()
    assert master.returncode == 0, master.stderr[-2000:]
    for kind in ("samples", "requests", "client"):
        on_master = sorted(Path(p).name for p in glob.glob(str(master_dir / f"{kind}-*.csv")))
        on_workers = sorted(Path(p).name for d in own for p in glob.glob(str(d / f"{kind}-*.csv")))
        assert len(on_master) == 2 and on_master == on_workers, (kind, on_master, on_workers)
        for name in on_master:
            local = next(d / name for d in own if (d / name).exists())
            assert (master_dir / name).read_bytes() == local.read_bytes(), f"{name}: the master's copy is the worker's"
    requests = pd.concat(pd.read_csv(p) for p in glob.glob(str(master_dir / "requests-*.csv")))
    stats = pd.read_csv(tmp_path / "locust_stats.csv")
    e2e = int(stats.loc[stats["Name"] == "E2E", "Request Count"].sum())
    finished = requests[~requests["error"].astype("string").fillna("").str.startswith("interrupted")]
    assert len(finished) == e2e > 20, "Locust's total equals the rows the master holds"
    (record,) = [json.loads(Path(p).read_text()) for p in glob.glob(str(master_dir / "loadrun-*.json"))]
    assert len(record["workers"]) == 2 and all(w["host"] and w["pid"] and w["received_bytes"] > 0 for w in record["workers"])
    assert all(w["clock_offset_s"] is not None and abs(w["clock_offset_s"]) < 5 for w in record["workers"])
    # The analysis of the master's directory equals that of the workers' own copies put together.
    together = tmp_path / "together"
    together.mkdir()
    for d in own:
        for f in d.glob("*.csv"):
            shutil.copy(f, together / f.name)
    shutil.copy(next(master_dir.glob("loadrun-*.json")), together)
    from_master, from_workers = analyse(master_dir), analyse(together)
    columns = ["requests", "p50_ttft_ms", "p95_ttft_ms", "p50_itl_ms", "p95_itl_ms", "output_tokens_per_s"]
    pd.testing.assert_frame_equal(from_master[columns], from_workers[columns])
