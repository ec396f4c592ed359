"""A vLLM killed in the middle of a sweep (real vLLM CPU): a failed run that keeps its data and log."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest

from .conftest import ROOT, free_port, require_vllm

pytestmark = pytest.mark.integration


def test_vllm_killed_mid_sweep_is_a_failed_run_with_its_log_and_data_kept(tmp_path):
    """The kill case against real vLLM CPU: the run whose server died gets failed.json (reason and
    the server's last log lines) and keeps what it measured; the sweep stops and says so; the
    analysis of the sweep names the failed run."""
    require_vllm()
    out = tmp_path / "runs"
    proc = subprocess.Popen(["bash", str(ROOT / "launch" / "sweep.sh"), "--profiles", "baseline-cpu", "--concurrency", "2",
                             "--warmup", "2", "--duration", "8", "--repeats", "2", "--out", str(out), "--",
                             "--prompt-tokens", "64", "--max-tokens", "16", "--prompt-pool", "16",
                             "--stop-after-refused-s", "5"],
                            cwd=ROOT, env=dict(os.environ, PORT=str(free_port())), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    second = out / "baseline-cpu" / "c2" / "r2"
    try:
        deadline = time.time() + 600
        while sum(1 for f in glob.glob(str(second / "requests-*.csv")) for _ in open(f)) < 6:
            assert time.time() < deadline and proc.poll() is None, "the second run never recorded requests"
            time.sleep(0.5)
        (manifest,) = glob.glob(str(out / "baseline-cpu" / "server-*" / "manifest.json"))
        os.killpg(json.loads(open(manifest).read())["pid"], signal.SIGKILL)  # vLLM dies (OOM-killer style)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    assert proc.returncode not in (0, None) and "vLLM died" in stderr, stderr[-3000:]
    failure = json.loads((second / "failed.json").read_text())
    assert failure["reason"] == "vLLM died during the run" and failure["server_log_tail"], failure
    assert not (second / "run.json").exists()
    kept = pd.concat(pd.read_csv(f) for f in second.glob("requests-*.csv"))
    assert kept["error"].isna().sum() >= 5, "what the run measured before the death is kept"
    analysis = subprocess.run([sys.executable, "-m", "analysis", str(out), "--bootstrap", "100"], capture_output=True,
                              text=True, cwd=ROOT, timeout=300)
    assert analysis.returncode == 0, analysis.stderr[-2000:]
    assert "failed run (left out): baseline-cpu/c2/r2: vLLM died during the run" in analysis.stdout
    assert "Runs that failed" in (out / "report.md").read_text()
