"""A trace replay is open loop without an asked rate: its rows have ``intended_at_s`` (and send
lateness, client queue time) but an empty ``request_rate``. The analysis finds open loop by those
rows, so a trace run gets send lateness, queue time and latency from the intended instant, the
load-delivered check, and the report's open-loop section, as a --request-rate run does."""

import contextlib
import io

import pandas as pd
import pytest

from analysis.__main__ import main
from tests.unit.test_analysis_turns import Spec, write_recording

LATENESS_MS = (2.0, 4.0, 6.0, 8.0)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    root = tmp_path_factory.mktemp("trace") / "runs"
    write_recording(root, "trace", [Spec(at_s=i, ttft_ms=50.0 + 10 * i, lateness_ms=late, queue_ms=5.0 if i == 3 else 0.0)
                                    for i, late in enumerate(LATENESS_MS)], workload="trace")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main([str(root), "--bootstrap", "20"]) == 0
    return root, stdout.getvalue()


def test_the_rows_are_open_loop_without_a_rate(analysed):
    root, _ = analysed
    requests = pd.read_csv(next((root / "trace").glob("requests-*.csv")))
    assert requests["request_rate"].isna().all() and requests["intended_at_s"].notna().all()


def test_a_trace_run_is_summarised_with_its_send_lateness(analysed):
    row = pd.read_csv(analysed[0] / "summary.csv").iloc[0]
    assert row["request_rate"] == 0 and row["concurrency"] == 4
    assert row["p50_send_lateness_ms"] == pytest.approx(5.0, abs=1e-3)
    assert row["p99_send_lateness_ms"] == pytest.approx(6.0 + 0.97 * 2.0, abs=1e-3)
    assert row["max_send_lateness_ms"] == pytest.approx(8.0, abs=1e-3)
    assert row["queued_requests"] == 1 and row["mean_client_queue_ms"] == pytest.approx(5.0 / 4)
    # from the intended instant: TTFT 50, 60, 70, 80 plus lateness 2, 4, 6, 8
    assert row["p50_ttft_from_intended_ms"] == pytest.approx((64.0 + 76.0) / 2, abs=1e-3)
    assert bool(row["load_delivered"]) is True


def test_the_report_has_the_open_loop_section_for_a_trace(analysed):
    report = (analysed[0] / "report.md").read_text()
    assert "## Open loop: latency from the intended send, lateness, client queue" in report
    assert "Open loop: the asked rate was delivered" in report


def test_a_late_trace_replay_is_not_trusted(tmp_path):
    write_recording(tmp_path, "trace", [Spec(at_s=i, ttft_ms=50.0, lateness_ms=late) for i, late in
                                        enumerate((2.0, 4.0, 6.0, 400.0))], workload="trace")
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main([str(tmp_path), "--bootstrap", "20"]) == 0
    row = pd.read_csv(tmp_path / "summary.csv").iloc[0]
    assert bool(row["load_delivered"]) is False
    assert "load not delivered: trace c=4: send lateness p99" in stdout.getvalue()
