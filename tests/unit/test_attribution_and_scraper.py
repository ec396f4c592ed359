"""Attribution sentences agree with the numbers they are given; the scraper's tidy rows."""

import json
import math

import pandas as pd

from analysis.attribution import attribute
from vllm_locust.core.schema import SERVER
from vllm_locust.backend.scraper import tidy_rows


def row(**kw):
    base = dict(server_queue_ms=5.0, server_prefill_ms=50.0, server_decode_ms=400.0, max_num_requests_waiting=0.0,
                mean_ttft_ms=80.0, server_ttft_mean_ms=60.0, preemptions=0.0, mean_kv_cache_usage=0.1,
                prefix_cache_hit_rate=float("nan"))
    return pd.Series({**base, **kw})


def test_the_largest_measured_part_of_ttft_is_named():
    assert "mostly from queueing" in attribute(row(server_queue_ms=300.0, max_num_requests_waiting=12.0,
                                                   mean_ttft_ms=380.0, server_ttft_mean_ms=360.0))
    assert "mostly from prefill" in attribute(row())
    text = attribute(row(preemptions=3.0))
    assert "3 preemptions" in text and "20.0 ms (25%) outside the engine" in text


def test_queueing_is_read_from_the_queue_histogram_when_the_gauge_reads_0():
    """From a newcomer's report: the rule required the waiting gauge, which reads 0 under load on
    vLLM's CPU build, so it could never say "queueing"."""
    text = attribute(row(server_queue_ms=300.0, max_num_requests_waiting=0.0, mean_ttft_ms=380.0, server_ttft_mean_ms=360.0))
    assert "mostly from queueing" in text and "waiting gauge read 0" in text


def test_time_outside_the_engine_is_named_when_it_dominates():
    """From a newcomer's report: "TTFT came mostly from execution" while its own numbers put 83% of
    the client's TTFT outside the engine."""
    text = attribute(row(mean_ttft_ms=120.0, server_ttft_mean_ms=20.0, server_queue_ms=2.0, server_prefill_ms=15.0))
    assert "mostly from outside the engine" in text and "(83%)" in text


def test_no_histograms_cannot_attribute():
    assert "cannot attribute" in attribute(row(server_queue_ms=math.nan))


PROM = """# HELP vllm:num_requests_running Number of requests running.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
# HELP vllm:time_to_first_token_seconds TTFT.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="tiny"} 2.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="tiny"} 5.0
vllm:time_to_first_token_seconds_count{model_name="tiny"} 5.0
vllm:time_to_first_token_seconds_sum{model_name="tiny"} 0.9
# HELP process_cpu_seconds_total CPU.
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.0
"""


def test_scraper_keeps_vllm_series_as_tidy_rows():
    rows = tidy_rows(PROM, 100.0)
    names = [r[SERVER.name] for r in rows]
    assert "process_cpu_seconds_total" not in names, "only vllm: series"
    assert names.count("vllm:time_to_first_token_seconds_bucket") == 2
    running = next(r for r in rows if r[SERVER.name] == "vllm:num_requests_running")
    assert running[SERVER.value] == 3.0 and json.loads(running[SERVER.labels]) == {"engine": "0", "model_name": "tiny"}
    assert set(rows[0]) == set(SERVER) and all(r[SERVER.t_s] == 100.0 for r in rows)


def test_a_hostile_metrics_page_adds_at_most_the_caps_to_metrics_csv(capsys):
    """Seen (issue 39, L2): 150,000 series, or one 15 MB label, grew metrics.csv by ~3 MB/s."""
    from vllm_locust.backend import scraper

    scraper._capped.clear()  # said once a process: this test counts its own
    many = "".join(f'vllm:x{{i="{i}"}} 1\n' for i in range(scraper.MAX_SERIES + 500))
    huge = 'vllm:y{l="' + "a" * 2 * scraper.MAX_LABELS_CHARS + '"} 1\nvllm:num_requests_running 2\n'
    assert len(tidy_rows(many, 1.0)) == scraper.MAX_SERIES
    kept = tidy_rows(huge, 1.0)
    assert [r[SERVER.name] for r in kept] == ["vllm:num_requests_running"]
    err = capsys.readouterr().err
    assert err.count("left out of metrics.csv") == 2, err
    assert scraper.MAX_SCRAPE_BYTES < 16 << 20


def test_failed_requests_leave_latency_percentiles_and_are_counted_by_kind():
    from analysis.tidy import failure_table, successful_samples

    samples = pd.DataFrame({"run_key": ["a/c1/r1"] * 3, "request_id": ["q1", "q2", "q2"], "metric": ["TTFT"] * 3,
                            "value_ms": [10.0, 900.0, 1.0], "profile": ["a"] * 3, "concurrency": [1] * 3})
    requests = pd.DataFrame({"run_key": ["a/c1/r1"] * 2, "request_id": ["q1", "q2"], "profile": ["a"] * 2,
                             "request_rate": [0.0, 0.0], "concurrency": [1, 1], "error": [None, "connection failed: X"]})
    kept = successful_samples(samples, requests)
    assert kept["request_id"].tolist() == ["q1"], "a failed request's partial samples are left out"
    table = failure_table(requests)
    assert table.to_dict("records") == [{"profile": "a", "request_rate": 0.0, "concurrency": 1, "kind": "connection",
                                         "error": "connection failed: X", "count": 1}]
    from analysis.tidy import failure_kinds

    more = pd.DataFrame({"error": [None, "HTTP 500: oom", "connection failed: A", "connection failed: B", "timeout: x"]})
    assert failure_kinds(more) == "connection:2, http_5xx:1, timeout:1"
