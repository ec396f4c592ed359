"""``--calibrate``'s arithmetic and plumbing: the budget from the client's and the truth's numbers,
the child's command and its reading, and the analysis that shows the budget and calls out what it
could explain. Recorded numbers in, exact numbers out."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from analysis.calibration import budgets, calibration_lines, note_verdicts, with_calibration, within_budget
from vllm_locust.core.calibration import budget_ms, describe, error_budget, quantile, truth_of
from vllm_locust.core.schema import OPTIONAL_SUMMARY, SUMMARY, VERDICT
from vllm_locust.plugin.lifecycle.calibration import child_command, child_env, read_client


@pytest.mark.parametrize("q", [0, 1, 50, 95, 99, 100])
def test_quantile_is_numpys_linear_one(q):
    values = list(np.random.default_rng(1).exponential(10, 37))
    assert quantile(values, q) == pytest.approx(np.percentile(values, q))


def test_the_budget_is_the_clients_percentiles_minus_the_truths():
    # the truth: TTFT 50 ms, gaps of 10 ms; the client reads TTFT 2 ms late and one gap 4 ms long
    truth = [{"recv": 100.0 + k, "sends": [100.05 + k + 0.01 * i for i in range(11)]} for k in range(20)]
    true_ttft, true_itl = truth_of(truth)
    assert true_ttft == pytest.approx([50.0] * 20) and true_itl == pytest.approx([10.0] * 200)
    client_ttft = [52.0] * 20
    client_itl = [10.0] * 199 + [14.0]
    budget = error_budget(client_ttft, client_itl, truth)
    assert budget["ttft_p50_error_ms"] == pytest.approx(2.0) and budget["ttft_p95_error_ms"] == pytest.approx(2.0)
    assert budget["ttft_mean_error_ms"] == pytest.approx(2.0)
    assert budget["itl_p95_error_ms"] == pytest.approx(0.0, abs=1e-9)
    assert budget["itl_p99_error_ms"] == pytest.approx(round(np.percentile(client_itl, 99) - 10.0, 3))
    assert budget["itl_sd_client_ms"] == pytest.approx(round(float(np.std(client_itl)), 3))
    assert budget["itl_sd_truth_ms"] == pytest.approx(0.0, abs=1e-6) and budget["requests"] == 20
    assert budget_ms({**budget, "ttft_p95_error_ms": -3.5}, "TTFT") == 3.5
    assert budget_ms({}, "itl") is None


def test_the_line_says_the_load_and_the_errors_or_why_there_are_none():
    line = describe({"streams": 100, "processes": 2, "events_per_s": 10000, "ttft_ms": 50.0, "itl_ms": 10.0,
                     "ttft_p95_error_ms": 1.25, "ttft_p99_error_ms": 2.0, "itl_p95_error_ms": 0.3,
                     "itl_p99_error_ms": 0.9, "cpu_us_per_chunk": 30})
    assert "100 streams (2 processes, 10,000 chunks/s" in line and "TTFT p95 +1.25 ms" in line and "ITL p95 +0.30 ms" in line
    assert describe({"error": "the exact-timing mock did not start: x"}) == \
        "client calibration failed: the exact-timing mock did not start: x"
    assert describe({}) == ""


def write_rows(path, rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def test_the_childs_rows_are_read_without_each_users_first_request_nor_failures(tmp_path):
    write_rows(tmp_path / "requests-c-w1.csv", [
        {"request_id": "a", "sent_at_s": 1.0, "kind": "ok"},  # the first of the run's 1 stream: warm-up
        {"request_id": "b", "sent_at_s": 2.0, "kind": "ok"},
        {"request_id": "c", "sent_at_s": 3.0, "kind": "http_5xx"},
        {"request_id": "d", "sent_at_s": 4.0, "kind": "ok"}])
    write_rows(tmp_path / "samples-c-w1.csv", [
        {"request_id": r, "metric": m, "value_ms": v} for r, m, v in
        [("a", "TTFT", 90), ("a", "ITL", 30), ("b", "TTFT", 51), ("b", "ITL", 10.5), ("c", "TTFT", 1),
         ("d", "TTFT", 52), ("d", "ITL", 10.25), ("d", "E2E", 80)]])
    write_rows(tmp_path / "client-c-w1.csv", [
        {"phase": p, "metric": m, "value": v} for p, m, v in
        [("measured", "cpu_pct", 50), ("measured", "cpu_pct", 30), ("measured", "chunks_per_s", 4000),
         ("measured", "loop_lag_ms", 0.5), ("measured", "loop_lag_ms", 1.5), ("stopping", "loop_lag_ms", 80)]])
    read = read_client(str(tmp_path), streams=1)
    assert read["ttft"] == [51.0, 52.0] and read["itl"] == [10.5, 10.25]
    assert read["cpu_us_per_chunk"] == 200  # 0.8 CPU s over 4,000 chunks
    assert read["loop_lag_ms"] == [0.5, 1.5] and read["loop_lag_p99_ms"] == pytest.approx(1.49)


def test_the_child_runs_the_runs_transport_on_a_master_port_of_its_own(tmp_path, monkeypatch):
    options = SimpleNamespace(endpoint="embeddings", http_transport="httpx", continuous_usage="on")
    one = child_command(tmp_path / "f.py", "http://127.0.0.1:9", 40, 1, 5, str(tmp_path), options)
    assert "--processes" not in one and one[one.index("-u") + 1] == "40" and one[one.index("-t") + 1] == "5s"
    assert one[one.index("--endpoint") + 1] == "chat", "an endpoint without streams is calibrated on chat"
    assert one[one.index("--http-transport") + 1] == "httpx" and one[one.index("--continuous-usage") + 1] == "on"
    four = child_command(tmp_path / "f.py", "http://127.0.0.1:9", 400, 4, 5, str(tmp_path), options)
    port = four[four.index("--master-bind-port") + 1]
    assert four[four.index("--processes") + 1] == "4" and four[four.index("--master-port") + 1] == port != "5557"
    monkeypatch.setenv("LOCUST_STEPS", "1,2")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    env = child_env()
    assert "LOCUST_STEPS" not in env, "the run's own Locust settings are not the child's"
    assert "OPENAI_API_KEY" not in env, "the key is for the user's host, never sent to the mock"


def summary_frame() -> pd.DataFrame:
    return pd.DataFrame([
        {SUMMARY.profile: "baseline", SUMMARY.request_rate: 0.0, SUMMARY.concurrency: 8, "p95_ttft_ms": 100.0, "p95_itl_ms": 20.0},
        {SUMMARY.profile: "optimized", SUMMARY.request_rate: 0.0, SUMMARY.concurrency: 8, "p95_ttft_ms": 99.2, "p95_itl_ms": 15.0},
        {SUMMARY.profile: "optimized", SUMMARY.request_rate: 0.0, SUMMARY.concurrency: 16, "p95_ttft_ms": 90.0, "p95_itl_ms": 15.0},
    ])


def run(profile: str, concurrency: int, calibration: dict):
    return SimpleNamespace(profile=profile, request_rate=0.0, record={"concurrency": concurrency}, calibration=calibration)


def test_each_level_shows_its_runs_budget_and_a_difference_inside_it_is_called_out():
    runs = [run("baseline", 8, {"ttft_p95_error_ms": 0.5, "itl_p95_error_ms": 0.2}),
            run("optimized", 8, {"ttft_p95_error_ms": -1.0, "itl_p95_error_ms": 0.1}),
            run("optimized", 16, {"error": "did not start"})]
    assert budgets(runs) == {("baseline", 0.0, 8): {"TTFT": 0.5, "ITL": 0.2}, ("optimized", 0.0, 8): {"TTFT": 1.0, "ITL": 0.1}}
    summary = with_calibration(summary_frame(), runs)
    assert list(summary[OPTIONAL_SUMMARY.calibrated_ttft_p95_error_ms].fillna(-1)) == [0.5, 1.0, -1]
    found = within_budget(summary, "baseline")
    # TTFT: -0.8 ms against a budget of 1.0: called out; ITL: -5 ms, well outside 0.2: not
    assert found == {("optimized", 0.0, 8): ["p95 TTFT differs by -0.80 ms, within the client's calibrated error (1.00 ms)"]}
    per_level = pd.DataFrame([{VERDICT.profile: "optimized", VERDICT.request_rate: 0.0, VERDICT.concurrency: 8,
                               VERDICT.why: "p95 TTFT does not improve with an interval excluding zero"}])
    noted = note_verdicts(per_level, summary, "baseline")
    assert noted[VERDICT.why].iloc[0].endswith("; p95 TTFT differs by -0.80 ms, within the client's calibrated error (1.00 ms)")
    assert calibration_lines(runs)[-1] == "optimized: client calibration failed: did not start"


def test_without_a_calibration_nothing_changes():
    summary = summary_frame()
    assert with_calibration(summary, [run("baseline", 8, {})]) is summary
    assert within_budget(summary, "baseline") == {}


@pytest.mark.parametrize("seconds, itl_ms, flag", [(0.0, 10.0, "--calibrate-seconds"), (8.0, -1.0, "--calibrate-itl-ms")])
def test_a_bad_calibration_setting_is_one_line_before_anything_runs(seconds, itl_ms, flag):
    from vllm_locust.plugin.lifecycle.calibration import Calibration

    said = []
    failures = SimpleNamespace(failed=False, fail_run=said.append)
    options = SimpleNamespace(calibrate=True, calibrate_seconds=seconds, calibrate_itl_ms=itl_ms, num_users=2, steps="",
                              request_rate="", samples_dir="")
    environment = SimpleNamespace(parsed_options=options, runner=SimpleNamespace(target_user_count=2))
    part = Calibration(environment, SimpleNamespace(deciding=True), failures)
    part.on_test_start(environment)
    assert said == [f"{flag} must be above 0 (got {seconds if flag == '--calibrate-seconds' else itl_ms:g})"]
    assert part.result == {}
