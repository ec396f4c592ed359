"""The deciding process's /metrics scraper: counters to per-second, histograms to means, missing
metrics, a server without /metrics, and the web UI's /server-metrics routes."""

import csv
import json

import pytest
from locust.env import Environment
from locust.event import Events

from vllm_locust.plugin.webui.live_metrics import LiveMetrics, derive, totals
from vllm_locust.mock.server import start_in_thread
from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.vllm_plugin import VllmPlugin
from vllm_locust.backend.scraper import tidy_rows

SCRAPE_1 = """
vllm:num_requests_running{model_name="m",engine="0"} 3
vllm:num_requests_running{model_name="m",engine="1"} 2
vllm:num_requests_waiting{model_name="m"} 7
vllm:generation_tokens_total{model_name="m"} 1000
vllm:prefix_cache_hits_total{model_name="m"} 10
vllm:prefix_cache_queries_total{model_name="m"} 100
vllm:time_to_first_token_seconds_sum{model_name="m"} 2.0
vllm:time_to_first_token_seconds_count{model_name="m"} 10
"""
SCRAPE_2 = SCRAPE_1.replace(" 1000", " 1500").replace("hits_total{model_name=\"m\"} 10", "hits_total{model_name=\"m\"} 40") \
    .replace("queries_total{model_name=\"m\"} 100", "queries_total{model_name=\"m\"} 200") \
    .replace("sum{model_name=\"m\"} 2.0", "sum{model_name=\"m\"} 5.0").replace("count{model_name=\"m\"} 10", "count{model_name=\"m\"} 20")


def test_gauges_sum_over_label_sets_counters_become_rates_and_histograms_means():
    before, now = totals(tidy_rows(SCRAPE_1, 0.0)), totals(tidy_rows(SCRAPE_2, 2.0))
    row = derive(now, before, 2.0, 2.0)
    assert row["num_requests_running"] == 5 and row["num_requests_waiting"] == 7
    assert row["generation_tokens_per_s"] == 250.0
    assert row["prefix_cache_hit_rate"] == pytest.approx(0.3)
    assert row["ttft_mean_ms"] == pytest.approx(300.0), "(5.0 - 2.0) s over 10 observations"
    assert row["kv_cache_usage_perc"] is None and row["preemptions_per_s"] is None, "absent: None, not 0"
    assert row["itl_mean_ms"] is None


def test_first_scrape_has_no_rates_and_a_restart_counts_from_zero():
    now = totals(tidy_rows(SCRAPE_1, 0.0))
    assert derive(now, None, 0.0, 0.0)["generation_tokens_per_s"] is None
    restarted = totals(tidy_rows(SCRAPE_1.replace(" 1000", " 30"), 1.0))
    assert derive(restarted, now, 1.0, 1.0)["generation_tokens_per_s"] == 30.0


def test_web_ui_serves_latest_values_history_and_csv(tmp_path, monkeypatch):
    monkeypatch.setattr("sys.argv", ["locust"])  # Locust's web UI parses the command line for its form
    server = start_in_thread()
    try:
        import warnings

        from locust.argument_parser import parse_options

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            options = parse_options(args=[])  # Locust's own options, which its web UI reads
        vars(options).update(vars(defaults(samples_dir=str(tmp_path))))
        env = Environment(events=Events(), host=server.url, parsed_options=options)
        env.create_local_runner()
        env.create_web_ui("127.0.0.1", 0)
        plugin = VllmPlugin.on_init(env)
        client = env.web_ui.app.test_client()
        assert json.loads(client.get("/server-metrics").data)["history"] == [], "before a run: empty, not an error"
        plugin.view.live.start(server.url, 0.1, str(tmp_path))  # what test start does, at 10 scrapes/s
        data = wait_for(lambda: json.loads(client.get("/server-metrics").data), lambda d: len(d["history"]) >= 2)
        plugin.view.live.stop()
        assert data["latest"]["num_requests_running"] == 0.0 and data["notice"] == ""
        rows = list(csv.DictReader(client.get("/server-metrics.csv").data.decode().splitlines()))
        assert len(rows) >= 2 and "kv_cache_usage_perc" in rows[0]
        with open(tmp_path / "metrics.csv") as f:
            names = {r["name"] for r in csv.DictReader(f)}
        assert {"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:generation_tokens_total", "vllm:time_to_first_token_seconds_sum"} <= names, names
    finally:
        server.stop()
        env.runner.quit()


def wait_for(read, done, timeout_s=20.0):
    """Poll ``read()`` until ``done(value)``: the scraper is a child process (counts, not timing)."""
    import time

    deadline = time.time() + timeout_s
    while True:
        value = read()
        if done(value) or time.time() > deadline:
            return value
        time.sleep(0.05)


def test_a_server_without_metrics_gets_a_notice_not_a_crash(tmp_path):
    live = LiveMetrics()
    live.start("http://127.0.0.1:9", 0.05, str(tmp_path))  # nothing listens on port 9
    data = wait_for(lambda: json.loads(live.as_json()), lambda d: d["notice"].startswith("cannot read"))
    live.stop()
    assert "cannot read http://127.0.0.1:9/metrics" in data["notice"] and not data["history"]
    off = LiveMetrics()
    off.start("http://127.0.0.1:9", 0, None)
    assert "off" in off.notice


def test_the_mock_servers_metrics_move_with_its_streams():
    """The tab's tests need a server side that moves: the mock's /metrics counts what it served."""
    import urllib.request

    import openai

    from vllm_locust.mock.server import start_process

    # Its own process: an in-thread mock's counters are shared by every mock of this process
    # (other tests' requests made this read 150 tokens instead of 10).
    server = start_process("--ttft-ms", "1", "--itl-ms", "1", "--tokens", "5")
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="k")
        for _ in range(2):
            list(client.chat.completions.create(model="fake-model", messages=[{"role": "user", "content": "a b c"}],
                                                stream=True, max_tokens=5))
        now = totals(tidy_rows(urllib.request.urlopen(server.url + "/metrics").read().decode(), 0.0))
    finally:
        server.stop()
    assert now["vllm:generation_tokens_total"] == 10 and now["vllm:time_to_first_token_seconds_count"] == 2
    assert now["vllm:inter_token_latency_seconds_count"] == 8 and now["vllm:num_requests_running"] == 0
    assert now["vllm:prefix_cache_hits_total"] * 2 == now["vllm:prefix_cache_queries_total"], "the second prompt hit"


def test_gauges_that_read_zero_while_tokens_flow_are_called_unmeasured(monkeypatch):
    """vLLM's CPU build: running/waiting/KV cache read 0 under load; the tab must not draw that as true."""
    from vllm_locust.plugin.webui import live_metrics

    texts = iter(f'vllm:num_requests_running{{model_name="m"}} 0\nvllm:generation_tokens_total{{model_name="m"}} {100 * i}\n'
                 for i in range(20))
    monkeypatch.setattr(live_metrics.scraper, "fetch", lambda url, api_key="": next(texts))
    clock = iter(range(1000, 2000))
    monkeypatch.setattr(live_metrics.time, "time", lambda: float(next(clock)))  # one scrape a second
    scrapes = live_metrics.Scrapes("http://x")
    for _ in range(5):
        scrapes.scrape_once()
    assert not scrapes.status()["gauges_unmeasured"], "too early to say"
    for _ in range(3):
        scrapes.scrape_once()
    status = scrapes.status()
    assert status["gauges_unmeasured"] and "not measured here, not zero" in status["notice"]
