"""The server's prefix-cache hit rate over a window (``analysis.server.prefix_cache_hit_rate``):
hits over queries from the counters' increases (a restart counts from zero, engines add up), the
names vLLM 0.7-0.9 used, an older server's hit-rate gauge, and NaN when there is nothing to read."""

import json
import math

import pandas as pd
import pytest

from analysis.server import prefix_cache_hit_rate, run_server_stats


def scrapes(series: dict[str, list[float]], labels: dict | None = None) -> pd.DataFrame:
    text = json.dumps(labels or {"engine": "0"})
    return pd.DataFrame([{"t_s": float(t), "name": name, "labels": text, "value": v}
                         for name, values in series.items() for t, v in enumerate(values)])


def test_hits_over_queries_from_the_counters_increases():
    frame = scrapes({"vllm:prefix_cache_hits_total": [1000, 1030, 1060],
                     "vllm:prefix_cache_queries_total": [5000, 5100, 5200]})
    assert prefix_cache_hit_rate(frame) == pytest.approx(60 / 200)
    assert run_server_stats(frame)["prefix_cache_hit_rate"] == pytest.approx(0.3)


def test_a_restart_counts_from_zero_and_engines_add_up():
    restarted = scrapes({"vllm:prefix_cache_hits_total": [500, 10, 40], "vllm:prefix_cache_queries_total": [900, 20, 80]})
    other = scrapes({"vllm:prefix_cache_hits_total": [0, 0, 0], "vllm:prefix_cache_queries_total": [0, 50, 100]},
                    {"engine": "1"})
    # engine 0: hits 10 + 30, queries 20 + 60; engine 1: 0 of 100
    assert prefix_cache_hit_rate(pd.concat([restarted, other])) == pytest.approx(40 / 180)


def test_the_names_of_older_vllm():
    frame = scrapes({"vllm:gpu_prefix_cache_hits_total": [0, 25], "vllm:gpu_prefix_cache_queries_total": [0, 100]})
    assert prefix_cache_hit_rate(frame) == pytest.approx(0.25)
    gauge = pd.concat([scrapes({"vllm:gpu_prefix_cache_hit_rate": [0.2, 0.4]}),
                       scrapes({"vllm:gpu_prefix_cache_hit_rate": [0.2, 0.4]}, {"engine": "1"})])
    assert prefix_cache_hit_rate(gauge) == pytest.approx(0.3), "a share is averaged, not summed over engines"


def test_nothing_queried_or_nothing_exported_is_unknown():
    idle = scrapes({"vllm:prefix_cache_hits_total": [7, 7], "vllm:prefix_cache_queries_total": [9, 9]})
    assert math.isnan(prefix_cache_hit_rate(idle))
    assert math.isnan(prefix_cache_hit_rate(scrapes({"vllm:num_requests_running": [1, 2]})))
