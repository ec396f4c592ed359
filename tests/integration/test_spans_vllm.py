"""vLLM's own spans joined to the suite's rows (issue 42), on vLLM's CPU build with tracing on.

One server (``profiles/tracing-cpu.conf`` and one request at a time, ``max-num-seqs=1``, so that
a load of six streams makes it queue: five wait for each one served), one run with
``--server-spans``: at least 99% of answered requests joined; per request server queue + prefill
<= server TTFT <= client TTFT and server E2E <= client E2E; inside the engine the queue carries
the tail; the analysis writes the report's section and its tables.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from .conftest import ROOT, free_port, run_locust, served

pytestmark = pytest.mark.integration
LOAD = ["--prompt-tokens", "64", "--max-tokens", "160", "--prompt-pool", "16"]
EPS_MS = 0.01  # the receiver keeps 4 decimals of each millisecond value


@pytest.fixture(scope="module")
def traced_server(tmp_path_factory):
    """``serve.sh`` with spans on to a port of our own, on a profile that serves one request at a time."""
    profiles = tmp_path_factory.mktemp("profiles")
    for conf in (ROOT / "profiles").glob("*.conf"):
        shutil.copy(conf, profiles / conf.name)
    (profiles / "tracing-queue.conf").write_text("include=tracing-cpu\nmax-num-seqs=1\n")
    port = free_port()
    env = {"PROFILES_DIR": str(profiles), "SPANS_ENDPOINT": f"http://127.0.0.1:{port}/v1/traces"}
    with served("tracing-queue", tmp_path_factory.mktemp("vllm"), env) as server:
        server.spans_port = port
        yield server


def test_every_answered_request_joins_its_vllm_span_and_the_queue_carries_the_tail(traced_server, tmp_path):
    out = tmp_path / "run"
    proc = run_locust(traced_server.url, out, "-u", "6", "-r", "6", "-t", "12s", "--server-spans",
                      str(traced_server.spans_port), *LOAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "request spans from vLLM" in proc.stderr, proc.stderr[-3000:]
    analysis = subprocess.run([sys.executable, "-m", "analysis", str(out), "--bootstrap", "50"], capture_output=True,
                              text=True, cwd=ROOT, timeout=300)
    assert analysis.returncode == 0, analysis.stderr[-3000:]
    rows = pd.read_csv(out / "request_spans.csv")
    assert len(rows) >= 12, len(rows)
    joined = rows[rows["server_span"]]
    assert len(joined) >= 0.99 * len(rows), (len(joined), len(rows))
    bad = joined[~((joined["server_queue_ms"] + joined["server_prefill_ms"] <= joined["server_ttft_ms"] + EPS_MS)
                   & (joined["server_ttft_ms"] <= joined["ttft_ms"] + EPS_MS)
                   & (joined["server_e2e_ms"] <= joined["e2e_ms"] + EPS_MS))]
    assert bad.empty, bad.to_string()
    level = pd.read_csv(out / "server_spans.csv").iloc[0]
    shares = {name: level[f"tail_{name}_share"] for name in ("queue", "prefill", "admission", "outside")}
    assert abs(sum(shares.values()) - 1.0) < 0.01, ("the tail's TTFT attributed whole", shares)
    # Inside vLLM the queue carries the tail: one request served at a time, five wait (seconds each),
    # a 64-token prefill and the admission take milliseconds. Judged on the engine's own slowest
    # TTFTs: the client's slowest are the machine's luck (CI at bf05b3d, three shards beside vLLM:
    # its API server started them late, and 99.5% of their time was outside the engine).
    engine_tail = joined[joined["server_ttft_ms"] >= joined["server_ttft_ms"].quantile(0.95)]
    assert engine_tail["server_queue_ms"].sum() > 5 * (engine_tail["server_prefill_ms"].sum()
                                                       + engine_tail["server_admission_ms"].sum()), engine_tail
    assert joined["server_queue_ms"].mean() > 5 * joined["server_prefill_ms"].mean(), joined.describe()
    assert "Where each request's time went (vLLM's spans)" in (out / "report.md").read_text()
    assert Path(out / "report-figures" / "slowest-requests.png").stat().st_size > 0
