"""Paired mode (--paired-host): one arrival process, every request to two servers at once, then the
pair-by-pair analysis. Two mock servers of known first-token times (50 and 100 ms)."""

import glob
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import fake_servers, start_fake_server, run_locust

# Run alone (tests/parallel.py): the client's timing against an exact-timing mock, to the millisecond.
pytestmark = pytest.mark.timing

ROOT = Path(__file__).resolve().parents[2]


def locust(host, paired, samples, *extra, seconds=8):
    return run_locust("--host", host, "--paired-host", paired, "--headless", "--only-summary", "-u", "4", "-r", "4",
                      "-t", f"{seconds}s", "--samples-dir", str(samples), "--max-tokens", "10", "--prompt-tokens", "32",
                      "--prompt-pool", "8", *extra)


@pytest.fixture(scope="module")
def paired_run(tmp_path_factory):
    samples = tmp_path_factory.mktemp("paired")
    with fake_servers(dict(ttft_ms=50, itl_ms=5, tokens=10), dict(ttft_ms=100, itl_ms=5, tokens=10)) as (a, b):
        proc = locust(a.url, b.url, samples)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return samples


def test_every_request_went_to_both_servers_with_the_same_prompt(paired_run):
    requests = pd.concat([pd.read_csv(f) for f in glob.glob(str(paired_run / "requests-*.csv"))])
    assert set(requests["target"]) == {"a", "b"}
    by_pair = requests.groupby("pair_id")
    assert (by_pair.size() == 2).all(), "each pair id has one copy per server"
    assert (by_pair["target"].nunique() == 2).all()
    assert (by_pair["prompt_index"].nunique() == 1).all(), "both copies carry the same prompt"
    done = requests[requests["error"].isna()]
    assert len(done) >= 40
    # each copy is timed against its own server: b's first tokens are the 100 ms server's
    ttft = done.groupby("target")["ttft_ms"].median()
    assert ttft["a"] < 80 < ttft["b"]


def test_the_paired_analysis_decides_the_change_and_the_plain_one_refers_to_it(paired_run):
    proc = subprocess.run([sys.executable, "-m", "analysis.paired", str(paired_run), "--labels", "fast,slow",
                           "--bootstrap", "300"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    table = pd.read_csv(paired_run / "paired.csv").set_index("metric")
    row = table.loc["p50_ttft_ms"]
    assert row["change_pct"] > 50 and bool(row["decided_paired"]) and row["paired_low_pct"] > 0
    assert "slow (b) against fast (a)" in (paired_run / "paired.md").read_text()
    plain = subprocess.run([sys.executable, "-m", "analysis", str(paired_run)], capture_output=True, text=True,
                           timeout=300, cwd=ROOT)
    assert plain.returncode == 2 and "python -m analysis.paired" in plain.stderr


def test_an_unreachable_paired_host_stops_the_run_with_one_line(tmp_path):
    a = start_fake_server()
    try:
        proc = locust(a.url, "http://127.0.0.1:9", tmp_path, seconds=5)
    finally:
        a.proc.terminate()
    assert proc.returncode == 2
    assert "cannot reach http://127.0.0.1:9/v1/models" in proc.stderr
    assert not glob.glob(str(tmp_path / "requests-*.csv")) or all(
        pd.read_csv(f).empty for f in glob.glob(str(tmp_path / "requests-*.csv")))
