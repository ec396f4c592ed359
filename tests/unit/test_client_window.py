"""The live charts' client percentiles: raw values per report, a sliding window, exact counts."""

import numpy as np
import pytest

from vllm_locust.core.client_window import CAP, ClientSeries, ClientWindow, percentile
from vllm_locust.core.schema import E2E, ITL, TTFT


def test_percentile_matches_numpy():
    values = sorted(np.random.default_rng(1).exponential(5.0, 999).tolist())
    for q in (0, 50, 95, 99, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    assert percentile([], 50) is None


def test_take_hands_over_the_values_once_and_caps_them():
    window = ClientWindow()
    for v in range(CAP + 500):
        window.add(ITL, float(v))
    window.add(TTFT, 3.5)
    window.add(E2E, 99.0)  # not charted: not kept
    batch = window.take()
    assert batch["counts"] == {TTFT: 1, ITL: CAP + 500}
    assert len(batch[ITL]) == CAP and len(set(batch[ITL])) == CAP and batch[TTFT] == [3.5]
    assert window.take()["counts"] == {TTFT: 0, ITL: 0}, "each value goes out once"


def test_series_keeps_the_last_window_of_reports():
    series = ClientSeries(window_s=10.0)
    series.add({TTFT: [100.0] * 10, ITL: [5.0], "counts": {TTFT: 10, ITL: 1}}, t_s=0.0)
    series.add({TTFT: [200.0] * 10, ITL: [], "counts": {TTFT: 10, ITL: 0}}, t_s=8.0)
    row = series.tick(users=4, t_s=9.0)
    assert row["users"] == 4 and row["ttft_p50_ms"] == pytest.approx(150.0) and row["ttft_count"] == 20
    row = series.tick(users=4, t_s=12.0)  # the first report is older than 10 s now
    assert row["ttft_p50_ms"] == 200.0 and row["itl_p50_ms"] is None and row["ttft_count"] == 10
    assert len(series.history) == 2
