"""sweep.sh --external-url against the exact-timing fake server: real shell, real Locust, no vLLM."""

import json
import subprocess
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]


def sweep(*args, timeout=240):
    return subprocess.run(["bash", str(ROOT / "launch" / "sweep.sh"), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def test_external_sweep_as_the_issue_writes_it(fake_server, tmp_path):
    fake_server.configure(ttft_ms=30, itl_ms=3, tokens=16)
    out = tmp_path / "runs"
    args = ["--external-url", fake_server.url, "--label", "slow", "--concurrency", "4", "--warmup", "2",
            "--duration", "10", "--out", str(out), "--", "--max-tokens", "16", "--prompt-tokens", "32",
            "--prompt-pool", "8"]
    proc = sweep(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = out / "slow" / "c4" / "r1"
    record = json.loads((run / "run.json").read_text())
    assert (record["profile"], record["concurrency"], record["repeat"], record["external"]) == ("slow", 4, 1, True)
    assert record["versions"]["locust"] == "2.47.0"
    assert "run 1 of 1" in proc.stderr, "progress is shown"
    samples = pd.concat(pd.read_csv(f) for f in run.glob("samples-*.csv"))
    measured = samples[samples["phase"] == "measured"]
    assert set(measured["concurrency"]) == {4} and (samples["phase"] == "warmup").any()
    assert len(measured[measured["metric"] == "TTFT"]) > 10
    assert (run / "locust_stats.csv").exists() and (run / "metrics-before.prom").exists()
    metrics = pd.read_csv(run / "metrics.csv")
    assert set(metrics.columns) == {"t_s", "name", "labels", "value"} and len(metrics) >= 5, "scraped about once a second"
    manifest = json.loads(next((out / "slow").glob("external-*/manifest.json")).read_text())
    assert manifest["external"] and manifest["models"]["data"][0]["id"] == "fake-model"

    files_before = sorted(p.name for p in run.iterdir())
    again = sweep(*args)
    assert again.returncode == 0 and "all runs done, skipped" in again.stderr, "a finished run is never rerun"
    assert sorted(p.name for p in run.iterdir()) == files_before

    other = sweep("--external-url", fake_server.url, "--label", "fast", "--concurrency", "4", "--warmup", "1",
                  "--duration", "3", "--out", str(out), "--", "--max-tokens", "8", "--prompt-tokens", "32",
                  "--prompt-pool", "8")
    assert other.returncode == 0, other.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["fast", "slow"], "labels accumulate side by side"


def test_interrupted_run_is_set_aside_not_overwritten(fake_server, tmp_path):
    fake_server.configure(ttft_ms=5, itl_ms=1, tokens=4)
    partial = tmp_path / "x" / "c1" / "r1"
    partial.mkdir(parents=True)
    (partial / "samples-old.csv").write_text("kept\n")
    proc = sweep("--external-url", fake_server.url, "--label", "x", "--concurrency", "1", "--warmup", "0",
                 "--duration", "2", "--out", str(tmp_path), "--", "--max-tokens", "4", "--prompt-tokens", "16",
                 "--prompt-pool", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    aside = list((tmp_path / "x" / "c1").glob("r1.incomplete-*"))
    assert len(aside) == 1 and (aside[0] / "samples-old.csv").read_text() == "kept\n"
    assert (partial / "run.json").exists()


def test_client_cpus_pin_locust_apart_from_the_server(fake_server, tmp_path):
    """On a small machine vLLM's CPU build starved a client sharing its cores (chunks stamped up to
    500 ms late); --client-cpus (compare.sh sets it with SERVER_CPUS) runs Locust under taskset."""
    fake_server.configure(ttft_ms=5, itl_ms=1, tokens=4)
    proc = sweep("--external-url", fake_server.url, "--label", "pinned", "--concurrency", "1", "--warmup", "0",
                 "--duration", "2", "--client-cpus", "0", "--out", str(tmp_path), "--", "--max-tokens", "4",
                 "--prompt-tokens", "16", "--prompt-pool", "2")
    assert proc.returncode == 0, proc.stderr[-2000:]
    run = tmp_path / "pinned" / "c1" / "r1"
    loadrun = json.loads(next(run.glob("loadrun-*.json")).read_text())
    assert loadrun["cpus"] == [0], "Locust ran on the CPUs it was given"
    assert json.loads((run / "run.json").read_text())["params"]["client_cpus"] == "0"


def test_sweep_refuses_bad_arguments(tmp_path):
    assert "needs --label" in sweep("--external-url", "http://127.0.0.1:9", "--out", str(tmp_path)).stderr
    proc = sweep("--external-url", "http://127.0.0.1:9", "--label", "down", "--out", str(tmp_path))
    assert proc.returncode != 0 and "cannot reach http://127.0.0.1:9/v1/models" in proc.stderr
    proc = sweep("--profiles", "baseline-cpu,nope", "--out", str(tmp_path))
    assert proc.returncode != 0 and "unknown profile 'nope'" in proc.stderr


def test_a_personas_sweep_with_workers_gives_each_worker_the_personas(fake_server, tmp_path):
    """Seen on the H200: with --workers 2 the sweep started its workers without --personas; they had no
    persona classes and died on the master's first spawn (KeyError), the run measured nothing."""
    fake_server.configure(ttft_ms=5, itl_ms=1, tokens=4)
    personas = tmp_path / "p.toml"
    personas.write_text('[[persona]]\nname = "tenant_a"\nweight = 3\n\n[[persona]]\nname = "tenant_b"\nweight = 1\n'
                        'max_tokens = 2\n')
    out = tmp_path / "runs"
    proc = sweep("--external-url", fake_server.url, "--label", "mix", "--concurrency", "4", "--warmup", "1",
                 "--duration", "3", "--workers", "2", "--out", str(out), "--", "--max-tokens", "4",
                 "--prompt-tokens", "32", "--prompt-pool", "8", "--personas", str(personas))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = pd.concat(pd.read_csv(f) for f in (out / "mix" / "c4" / "r1").glob("requests-*.csv"))
    assert set(rows["persona"]) == {"tenant_a", "tenant_b"} and rows["worker_id"].nunique() == 2
