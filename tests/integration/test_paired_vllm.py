"""launch.paired on real vLLM CPU: two servers started side by side (each with its own "GPUs"
and port), one Locust run sending every request to both, then the pair-by-pair analysis. On a
machine of several GPUs the same command puts each server on its own devices."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pandas as pd

from .conftest import ROOT, free_port, require_vllm


def test_paired_run_of_two_cpu_servers(tmp_path):
    python = require_vllm()
    out = tmp_path / "paired"
    ports = f"{free_port()},{free_port()}"
    proc = subprocess.run([sys.executable, "-m", "launch.paired", "--base", "baseline-cpu", "--candidate", "optimized-cpu",
                           "--gpus-base", "0", "--gpus-candidate", "1", "--ports", ports, "--concurrency", "2",
                           "--warmup", "3", "--duration", "12", "--out", str(out), "--bootstrap", "200",
                           "--", "--max-tokens", "16", "--prompt-tokens", "64", "--prompt-pool", "8",
                           "--prompt-cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT,
                          env=dict(os.environ, VLLM_PYTHON=python))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    for name, port in zip(("base", "candidate"), ports.split(",")):
        manifest = json.loads((out / f"server-{name}" / "manifest.json").read_text())
        assert f"--port {port}" in " ".join(manifest["command"])
        assert manifest["env"]["CUDA_VISIBLE_DEVICES"] == ("0" if name == "base" else "1")
    requests = pd.concat([pd.read_csv(f) for f in glob.glob(str(out / "requests-*.csv"))])
    measured = requests[(requests["phase"] == "measured") & requests["error"].isna()]
    assert set(measured["target"]) == {"a", "b"}
    assert (requests.groupby("pair_id").size() == 2).all()
    table = pd.read_csv(out / "paired.csv")
    assert set(table["metric"]) >= {"p50_ttft_ms", "p95_ttft_ms", "p95_tpot_ms"}
    assert (table["pairs"] >= 5).all() and (table["concurrency"] == 2).all()
    assert "optimized-cpu (b) against baseline-cpu (a)" in (out / "paired.md").read_text()
