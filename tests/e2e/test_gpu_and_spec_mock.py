"""Issue 44 on the mock: GPU telemetry from a DCGM exporter's /metrics and vLLM's speculative-decoding
counters flow from a sweep into ``gpu.csv``, ``metrics.csv``, the summary and the comparison.

Each mock serves ``/dcgm/metrics`` for two GPUs that draw a set power steadily (the energy counter is
exactly power x time) and streams three tokens a chunk with k = 4 draft tokens a step: every step
after the first accepts two of four, so the acceptance rate is 0.5 and the mean accepted length 3.
"""

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from tests.conftest import fake_servers

ROOT = Path(__file__).resolve().parents[2]
SPEED = dict(ttft_ms=20, itl_ms=10, tokens=9, tokens_per_chunk=3, spec_tokens=4)


def sweep(url: str, label: str, out: Path) -> None:
    proc = subprocess.run(["bash", str(ROOT / "launch" / "sweep.sh"), "--external-url", url, "--label", label, "--dcgm-url", f"{url}/dcgm",
                           "--concurrency", "2", "--warmup", "1", "--duration", "4", "--repeats", "2", "--out", str(out),
                           "--", "--max-tokens", "9", "--prompt-tokens", "16", "--prompt-pool", "4", "--continuous-usage", "on",
                           ], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.fixture(scope="module")
def two_powers(tmp_path_factory):
    out = tmp_path_factory.mktemp("powers")
    with fake_servers(dict(SPEED, gpu_power_w=300.0), dict(SPEED, gpu_power_w=150.0)) as (hungry, frugal):
        sweep(hungry.url, "baseline", out)
        sweep(frugal.url, "frugal", out)
    proc = subprocess.run([sys.executable, "-m", "analysis", str(out), "--bootstrap", "200"], capture_output=True,
                          text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_gpu_rows_land_beside_metrics_with_the_suites_names(two_powers):
    files = sorted(two_powers.rglob("gpu.csv"))
    assert len(files) == 4, "one per run: two profiles, two repeats"
    rows = pd.read_csv(files[0])
    assert set(rows["name"]) == {"gpu:power_w", "gpu:energy_j_total", "gpu:utilization_pct", "gpu:memory_used_mib",
                                 "gpu:sm_clock_mhz", "gpu:temperature_c"}
    assert {json.loads(labels)["gpu"] for labels in rows["labels"]} == {"0", "1"}
    power = rows[rows["name"] == "gpu:power_w"]["value"].unique()
    assert set(power) <= {300.0, 150.0} and len(power) == 1


def test_the_summary_has_energy_per_token_and_the_spec_counters(two_powers):
    summary = pd.read_csv(two_powers / "summary.csv").set_index("profile")
    for profile, watts in (("baseline", 300.0), ("frugal", 150.0)):
        row = summary.loc[profile]
        assert row["gpus"] == 2
        assert row["gpu_mean_power_w"] == pytest.approx(2 * watts), "two GPUs' power, summed"
        assert row["gpu_utilization_pct"] == pytest.approx(90.5)
        # the window's energy over what completed in it: power x window / tokens = power / tokens per s
        assert row["gpu_j_per_output_token"] == pytest.approx(2 * watts / row["output_tokens_per_s"], rel=0.05)
        assert row["gpu_j_per_request"] == pytest.approx(9 * row["gpu_j_per_output_token"], rel=0.05)
        assert row["spec_acceptance_rate"] == pytest.approx(0.5)
        assert row["spec_mean_accepted_length"] == pytest.approx(3.0)
        assert row["spec_draft_tokens_per_draft"] == pytest.approx(4.0)
        assert row["spec_acceptance_by_position"] == "1.000 1.000 0.000 0.000"
        assert row["chunks_per_token"] == pytest.approx(1 / 3), "three tokens a chunk"
        assert row["p50_itl_per_token_ms"] == pytest.approx(row["p50_itl_ms"] / 3, rel=0.01)


def test_the_comparison_gives_energy_per_token_an_interval(two_powers):
    comparison = pd.read_csv(two_powers / "comparison.csv")
    energy = comparison[comparison["metric"] == "gpu_j_per_output_token"]
    assert len(energy) == 1
    row = energy.iloc[0]
    # half the power: J/token halves for the same tokens/s; the two sweeps' tokens/s are the client's
    # on this machine (beside other shards they differed), so the change is judged against them
    tokens_per_s = pd.read_csv(two_powers / "summary.csv").set_index("profile")["output_tokens_per_s"]
    # (CI at 2909bad: 432 against 387 tokens/s, -43.3% where -44.1% was expected; each J/token within
    # 5% of power over tokens/s, as the summary test holds it, so the ratio of the two within 8%)
    expected = 150.0 / 300.0 * tokens_per_s["baseline"] / tokens_per_s["frugal"]
    assert 1 + row["change_pct"] / 100 == pytest.approx(expected, rel=0.08), (row["change_pct"], expected,
                                                                              dict(tokens_per_s))
    assert row["ci_low_pct"] <= row["change_pct"] <= row["ci_high_pct"]
