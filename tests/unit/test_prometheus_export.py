"""``--prometheus-port``'s series from Locust's live statistics, and the Grafana dashboard that
draws them beside vLLM's: every series it names is one the suite or vLLM exports."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

from locust.stats import RequestStats

from vllm_locust.plugin.records import prometheus as prom

ROOT = Path(__file__).resolve().parents[2]
# vLLM's names the dashboard may use (``vllm/v1/metrics/loggers.py`` of the pinned release)
VLLM_SERIES = {"vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds", "vllm:e2e_request_latency_seconds",
               "vllm:request_success", "vllm:num_requests_running", "vllm:num_requests_waiting",
               "vllm:kv_cache_usage_perc"}


def entry(times: dict, total_ms: float):
    return SimpleNamespace(response_times=times, num_requests=sum(times.values()), total_response_time=total_ms,
                           num_none_requests=0, num_failures=0)


def test_a_locust_histogram_becomes_cumulative_buckets_in_seconds():
    buckets, total = prom.histogram_of(entry({0.3: 2, 1.0: 1, 150: 1, 200000: 1}, 200152.0))
    got = dict(buckets)
    assert got["0.00025"] == 0 and got["0.0005"] == 2 and got["0.001"] == 3 and got["0.1"] == 3
    assert got["0.25"] == 4 and got["120.0"] == 4 and got["+Inf"] == 5
    assert total == 200.152
    counts = [c for _, c in buckets]
    assert counts == sorted(counts)


def collected(environment, gauges=None):
    collector = prom.ClientCollector(environment, lambda: gauges or {})
    return {f.name: f for f in collector.collect()}


def test_the_collector_labels_endpoint_and_persona_and_counts_requests_by_outcome():
    stats = SimpleNamespace(entries={("TTFT", "chat:alice"): entry({20.0: 3}, 60.0), ("E2E", "chat:alice"): entry({50.0: 3}, 150.0),
                                     ("TPOT", "chat"): entry({1.0: 1}, 1.0)})
    environment = SimpleNamespace(stats=stats, runner=SimpleNamespace(user_count=7))
    environment.vllm_locust_failure_kinds = SimpleNamespace(counts={"http_5xx": 2})
    families = collected(environment, {"w1": {"client_loop_lag_ms": 1.5}})
    ttft = families["vllm_locust_time_to_first_token_seconds"].samples
    assert {s.labels["persona"] for s in ttft} == {"alice"} and {s.labels["endpoint"] for s in ttft} == {"chat"}
    requests = {(s.labels["outcome"], s.labels["persona"]): s.value for s in families["vllm_locust_requests"].samples
                if s.name.endswith("_total")}
    assert requests == {("ok", "alice"): 3.0, ("http_5xx", ""): 2.0}
    assert families["vllm_locust_users"].samples[0].value == 7.0
    assert families["vllm_locust_client_loop_lag_ms"].samples[0].labels == {"process": "w1"}


def test_a_failed_request_is_counted_once_by_its_kind_and_is_no_latency():
    """The suite reports a failure as an ``E2E`` with no time and Locust's error (``reporting.py``):
    Locust's own statistics, as a run fills them."""
    stats = RequestStats()
    for ms in (40, 50, 60):
        stats.log_request("chat:alice", "E2E", ms, 0)
    for _ in range(2):
        stats.log_request("chat:alice", "E2E", None, 0)
        stats.log_error("chat:alice", "E2E", "HTTP 503")
    environment = SimpleNamespace(stats=stats, runner=None,
                                  vllm_locust_failure_kinds=SimpleNamespace(counts={"http_5xx": 2}))
    families = collected(environment)
    requests = {s.labels["outcome"]: s.value for s in families["vllm_locust_requests"].samples
                if s.name.endswith("_total")}
    assert requests == {"ok": 3.0, "http_5xx": 2.0}
    e2e = {s.name: s.value for s in families["vllm_locust_e2e_request_latency_seconds"].samples
           if s.labels.get("le") in (None, "+Inf")}
    assert e2e == {"vllm_locust_e2e_request_latency_seconds_bucket": 3.0,
                   "vllm_locust_e2e_request_latency_seconds_count": 3.0,
                   "vllm_locust_e2e_request_latency_seconds_sum": 0.15}


def test_live_gauges_keep_the_largest_lateness_until_taken():
    gauges = prom.LiveGauges()
    gauges.request(3.0, None)
    gauges.request(1.0, 0.5)
    gauges.client_row("loop_lag_ms", 0.7)
    assert gauges.take() == {"send_lateness_ms_max": 3.0, "client_queue_ms_max": 0.5, "client_loop_lag_ms": 0.7}
    assert gauges.take() == {"client_loop_lag_ms": 0.7}


def test_the_dashboard_names_only_series_the_suite_or_vllm_exports():
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "vllm-locust.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    ours = {name for e in exprs for name in re.findall(r"\b(vllm_locust_[a-z0-9_]+)", e)}
    theirs = {name for e in exprs for name in re.findall(r"(vllm:[a-z0-9_]+)", e)}
    exported = {*(name for name, _ in prom.HISTOGRAMS.values()), "vllm_locust_requests", "vllm_locust_users",
                "vllm_locust_client_loop_lag_ms", "vllm_locust_client_cpu_percent", "vllm_locust_send_lateness_ms_max",
                "vllm_locust_client_queue_ms_max"}
    strip = re.compile(r"_(bucket|count|sum|total)$")
    assert {strip.sub("", n) for n in ours} <= exported, ours
    assert {strip.sub("", n) for n in theirs} <= VLLM_SERIES, theirs
    assert any("vllm_locust_" in e for e in exprs) and any("vllm:" in e for e in exprs)


def test_on_loopback_the_exporter_answers_only_a_request_that_names_loopback():
    """A DNS-rebinding page (evil.example resolving to 127.0.0.1) reaches a loopback listener as its
    own origin: its ``Host`` says so, and it is refused; Prometheus names the address it scrapes."""
    from tests.conftest import free_port

    options = SimpleNamespace(prometheus_port=free_port(), prometheus_bind="127.0.0.1", prometheus_linger=0)
    environment = SimpleNamespace(parsed_options=options, stats=RequestStats(), runner=None)
    exporter = prom.PrometheusExporter(environment, SimpleNamespace(deciding=True), SimpleNamespace(failed=False), "w1")
    exporter.on_test_start()
    try:
        def get(host):
            said = []
            body = b"".join(exporter.server.application(
                {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "", "HTTP_HOST": host,
                 "wsgi.input": None, "SERVER_NAME": "127.0.0.1", "SERVER_PORT": str(options.prometheus_port)},
                lambda status, headers, exc_info=None: said.append(status)))
            return said[0], body
        status, body = get("evil.example:%d" % options.prometheus_port)
        assert status.startswith("403") and b"vllm_locust" not in body
        for host in ("127.0.0.1:%d" % options.prometheus_port, "localhost:%d" % options.prometheus_port):
            status, body = get(host)
            assert status.startswith("200") and b"vllm_locust_users" in body, host
        assert exporter.scrapes == 2
    finally:
        exporter.on_quitting()
