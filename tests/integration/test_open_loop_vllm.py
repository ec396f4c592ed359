"""An open-loop run over two processes against real vLLM: its schedule read to the millisecond.

Beside two other shards (CI at 882f3af and f9348b0) the workers' build outlasted the 2 s warm-up and
the phase labels went warm-up, measured, warm-up, measured: the master's shape ticked on while the
workers built, then its clock started over. The shape now holds its clock until every worker has
built (``runclock.RunClock.hold``; tests/e2e/test_slow_start.py reproduces it on the mock).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

import pytest

from tests.conftest import processes

from .conftest import run_locust
from .test_locust_vllm import LOAD, read_all

pytestmark = pytest.mark.integration


def test_open_loop_against_real_vllm_with_two_processes(vllm_server, tmp_path):
    """A request rate over two processes against vLLM: one schedule, each arrival sent once, on
    time, and the analysis reads latency from the intended send beside the actual one."""
    import subprocess
    import sys

    out = tmp_path / "rate"
    proc = run_locust(vllm_server.url, out, *processes(2), "--request-rate", "4", "--burstiness", "inf",
                      "--max-concurrency", "8", "--step-warmup", "2", "--step-duration", "10", *LOAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    requests = read_all(str(out / "requests-*.csv"), proc)
    assert requests["worker_id"].nunique() == 2 and requests["intended_at_s"].is_unique
    measured = requests[requests["phase"] == "measured"].sort_values("intended_at_s")
    gaps = measured["intended_at_s"].diff().dropna()
    assert gaps.between(0.2495, 0.2505).all(), "4 requests/s evenly spaced, whichever process sent them"
    assert len(measured) >= 36, len(measured)
    analysis = subprocess.run([sys.executable, "-m", "analysis", str(out), "--bootstrap", "100", "--slo", "ttft:5000"],
                              capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert analysis.returncode == 0, analysis.stderr
    row = pd.read_csv(out / "summary.csv").iloc[0]
    assert row["request_rate"] == 4.0 and row["p95_ttft_from_intended_ms"] >= row["p95_ttft_ms"]
    assert row["slo_met_share"] > 0.9
