"""The pair-by-pair comparison: drift shared by both sides of a pair cancels in the paired
interval, not in the unpaired one, so the paired design decides with fewer requests."""

import numpy as np
import pandas as pd
import pytest

from analysis.paired import change_intervals, pairs, requests_needed


def drifting_pairs(n=400, seed=1):
    """The host's drift moves both copies of a request alike (a factor of 0.5-2); b is 5% slower."""
    rng = np.random.default_rng(seed)
    drift = rng.uniform(100.0, 400.0, n)
    a = drift * rng.normal(1.0, 0.01, n)
    b = 1.05 * drift * rng.normal(1.0, 0.01, n)
    return a, b


def test_drift_cancels_in_the_paired_interval_only():
    a, b = drifting_pairs()
    change, paired, unpaired = change_intervals(a, b, 50, 500, 0)
    assert change == pytest.approx(5.0, abs=1.5)
    assert paired[0] > 0, "paired: decided"
    assert unpaired[0] < 0 < unpaired[1], "unpaired: the drift hides a 5% change"
    assert (paired[1] - paired[0]) * 5 < unpaired[1] - unpaired[0]
    assert requests_needed(len(a), change, *paired) == len(a)
    assert requests_needed(len(a), change, *unpaired) > 2 * len(a)


def test_requests_needed_scales_with_the_square_of_the_width():
    assert requests_needed(100, 5.0, -5.0, 15.0) == 400  # half-width 10 against a change of 5: four times the pairs
    assert requests_needed(100, 5.0, 1.0, 9.0) == 100
    assert requests_needed(100, 0.0, -1.0, 1.0) == float("inf")


def test_pairs_keep_only_pairs_whose_copies_both_succeeded():
    rows = []
    for i, (ta, tb, err_b) in enumerate([(50, 100, None), (60, 110, "HTTP 500"), (55, 105, None)]):
        for target, ttft, err in (("a", ta, None), ("b", tb, err_b)):
            rows.append({"pair_id": f"w:{i}", "target": target, "phase": "measured", "ttft_ms": float(ttft),
                         "e2e_ms": ttft + 90.0, "completion_tokens": 10, "content_chunks": 10, "error": err})
    frame = pairs(pd.DataFrame(rows))
    assert frame["pair_id"].tolist() == ["w:0", "w:2"]
    assert frame["ttft_ms_b"].tolist() == [100.0, 105.0] and frame["tpot_ms_a"].tolist() == [10.0, 10.0]
