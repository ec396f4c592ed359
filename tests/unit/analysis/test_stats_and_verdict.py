"""Known answers on small synthetic frames."""

import json

import numpy as np
import pandas as pd
import pytest

from analysis.server import histogram_quantile, run_server_stats
from analysis.stats import bootstrap_ci, counter_increase, pct_change, percentiles
from analysis.verdict import Rule, compare, overall, verdicts


def test_percentiles_are_from_raw_samples():
    p = percentiles(np.arange(1, 101), (50, 95, 99))
    assert p == {50: 50.5, 95: 95.05, 99: 99.01}, "linear interpolation on the raw values"
    assert np.isnan(percentiles([], (95,))[95])


def test_bootstrap_interval_brackets_a_known_shift_and_excludes_zero():
    rng = np.random.default_rng(1)
    base = [[rng.normal(100, 5, 10) for _ in range(60)] for _ in range(3)]
    cand = [[a * 0.8 for a in rep] for rep in base]  # exactly 20% faster, request by request
    point, low, high = bootstrap_ci(base, cand, lambda v: np.percentile(v, 95), 300, np.random.default_rng(0))
    assert point == pytest.approx(-20.0, abs=1e-9), "the point estimate is the plain percent change"
    assert low < -20 + 1e-9 and high < 0, f"interval [{low:.1f}, {high:.1f}] excludes zero"


def test_bootstrap_interval_spans_zero_for_identical_distributions():
    rng = np.random.default_rng(2)
    base = [[rng.exponential(50, 8) for _ in range(40)] for _ in range(2)]
    cand = [[rng.exponential(50, 8) for _ in range(40)] for _ in range(2)]
    _, low, high = bootstrap_ci(base, cand, lambda v: np.percentile(v, 95), 300, np.random.default_rng(0))
    assert low < 0 < high, f"no real difference, so the interval [{low:.1f}, {high:.1f}] holds zero"


def test_counter_increase_survives_a_restart():
    assert counter_increase([10, 12, 15]) == 5
    assert counter_increase([10, 12, 3, 4]) == 2 + 3 + 1, "a drop means the counter restarted from zero"
    assert counter_increase([7]) == 0


def _hist_rows(t, buckets, name="vllm:time_to_first_token_seconds"):
    return [{"t_s": t, "name": f"{name}_bucket", "labels": json.dumps({"le": str(le)}), "value": v}
            for le, v in buckets]


def test_histogram_quantile_uses_the_increase_in_the_window():
    before = _hist_rows(0, [(0.1, 100), (0.2, 100), ("+Inf", 100)])  # old requests, all under 100 ms
    after = _hist_rows(1, [(0.1, 100), (0.2, 200), ("+Inf", 200)])  # 100 new ones, all in (0.1, 0.2]
    frame = pd.DataFrame(before + after)
    assert histogram_quantile(frame, "vllm:time_to_first_token_seconds", 0.5) == pytest.approx(150.0)


def test_server_stats_from_tidy_rows():
    rows = []
    for t, running, waiting, kv, pre, qsum, qcount in ((0, 2, 0, 0.1, 5, 1.0, 10), (1, 8, 3, 0.5, 7, 3.0, 20),
                                                        (2, 4, 1, 0.3, 1, 0.5, 5)):
        rows += [{"t_s": t, "name": "vllm:num_requests_running", "labels": "{}", "value": running},
                 {"t_s": t, "name": "vllm:num_requests_waiting", "labels": "{}", "value": waiting},
                 {"t_s": t, "name": "vllm:kv_cache_usage_perc", "labels": "{}", "value": kv},
                 {"t_s": t, "name": "vllm:num_preemptions_total", "labels": "{}", "value": pre},
                 {"t_s": t, "name": "vllm:request_queue_time_seconds_sum", "labels": "{}", "value": qsum},
                 {"t_s": t, "name": "vllm:request_queue_time_seconds_count", "labels": "{}", "value": qcount}]
    s = run_server_stats(pd.DataFrame(rows))
    assert (s["max_num_requests_running"], s["max_num_requests_waiting"]) == (8, 3)
    assert s["mean_kv_cache_usage"] == pytest.approx(0.3)
    assert s["preemptions"] == 2 + 1, "7-5, then a restart to 1"
    assert s["server_queue_ms"] == pytest.approx((2.0 + 0.5) / (10 + 5) * 1000), "mean over the window's increase"


def _samples(profile, scale, repeats=2, requests=30, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for r in range(1, repeats + 1):
        for i in range(requests):
            rid = f"{profile}-{r}-{i}"
            rows.append((profile, 0.0, 4, r, rid, "TTFT", scale * rng.uniform(90, 110)))
            rows += [(profile, 0.0, 4, r, rid, "ITL", scale * rng.uniform(9, 11)) for _ in range(5)]
            rows += [(profile, 0.0, 4, r, rid, m, scale * 50) for m in ("TPOT", "E2E")]
    return pd.DataFrame(rows, columns=["profile", "request_rate", "concurrency", "repeat", "request_id", "metric", "value_ms"])


def _runs(profile, tok_s):
    return pd.DataFrame({"profile": profile, "request_rate": 0.0, "concurrency": 4, "repeat": [1, 2],
                         "output_tokens_per_s": tok_s})


@pytest.mark.parametrize("scale,tput,beats,why", [
    (0.7, [100, 100], True, "improve"),
    (1.0, [100, 100], False, "p95 TTFT does not improve"),
    (0.7, [70, 70], False, "throughput falls more than 20%"),
    (0.7, [81, 81], True, "improve"),
])
def test_verdict_edges(scale, tput, beats, why):
    samples = pd.concat([_samples("base", 1.0, seed=1), _samples("cand", scale, seed=1 if scale == 1.0 else 2)])
    runs = pd.concat([_runs("base", [100, 100]), _runs("cand", tput)])
    rule = Rule(bootstrap=200)
    per_level = verdicts(compare(samples, runs, "base", rule), rule)
    row = per_level.iloc[0]
    assert bool(row["beats"]) is beats and why in row["why"], row.to_dict()
    assert overall(per_level) == {"cand": "beats" if beats else "does not beat"}


def test_pct_change():
    assert pct_change(200, 150) == -25
    assert np.isnan(pct_change(0, 1))
