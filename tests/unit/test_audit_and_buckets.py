"""The client's self-audit (loop lag, CPU) and Locust's sub-millisecond buckets."""

import time

import gevent
import locust.stats

from vllm_locust import buckets
from vllm_locust.audit import ClientAudit, cpu_pct, overshoot_ms
from vllm_locust.schema import CPU_PCT, LOOP_LAG_MS, MEASURED, SPAWN_TO_SEND_MS


def test_overshoot_and_cpu_share_arithmetic():
    assert abs(overshoot_ms(0.01, 1.0, 1.015) - 5.0) < 1e-9 and overshoot_ms(0.01, 1.0, 1.009) == 0.0
    assert cpu_pct(1.0, 1.5, 10.0, 11.0) == 50.0 and cpu_pct(0, 1, 5, 5) == 0.0


def test_a_blocked_event_loop_shows_as_loop_lag():
    rows = []
    audit = ClientAudit(rows.append, lambda: ("r", "w", MEASURED, 4, 0), tick_s=0.005)
    audit.start()
    gevent.sleep(0.05)
    end = time.perf_counter() + 0.06
    while time.perf_counter() < end:  # a greenlet that never yields: what a saturated client does
        pass
    gevent.sleep(1.1)
    audit.stop()
    lags = [r.value for r in rows if r.metric == LOOP_LAG_MS]
    assert max(lags) >= 50, f"a 60 ms block is seen as at least 50 ms of lag: {max(lags)}"
    assert sorted(lags)[len(lags) // 2] < 50, "the other ticks are not late by the block"
    assert [r for r in rows if r.metric == CPU_PCT], "CPU share once a second"
    assert {(r.run_id, r.worker_id, r.phase, r.concurrency, r.step) for r in rows} == {("r", "w", MEASURED, 4, 0)}


def test_no_rows_before_the_run_has_an_id():
    rows = []
    audit = ClientAudit(rows.append, lambda: ("", "w", MEASURED, None, None))
    audit.spawn_to_send(3.0)
    assert rows == []
    audit.labels = lambda: ("r", "w", MEASURED, None, None)
    audit.spawn_to_send(3.0)
    assert [(r.metric, r.value) for r in rows] == [(SPAWN_TO_SEND_MS, 3.0)]


def test_fine_buckets_keep_sub_millisecond_itl_in_locust_stats():
    assert buckets.fine_bucket(0.3456) == 0.346 and buckets.fine_bucket(5.432) == 5.43
    assert buckets.fine_bucket(54.32) == 54.3 and buckets.fine_bucket(1234) == 1200
    before = locust.stats.bucket_response_time
    try:
        buckets.install()
        entry = locust.stats.StatsEntry(locust.stats.RequestStats(), "ITL", "chat")
        for value in [0.2] * 60 + [5.4] * 36 + [7.7] * 4:
            entry.log(value, 1)
        assert entry.get_response_time_percentile(0.5) == 0.2, "Locust's own buckets would say 0"
        assert entry.get_response_time_percentile(0.95) == 5.4, "and 5 here"
    finally:
        locust.stats.bucket_response_time = before


def test_locusts_total_counts_requests_not_samples():
    """Seen ramping 8 users against vLLM CPU: the web UI's header read "RPS 647" at about 7
    requests/s, because every ITL gap was a request to Locust's total."""
    from locust.env import Environment
    from locust.event import Events

    from vllm_locust.buckets import requests_only_total

    env = Environment(events=Events())
    runner = env.create_local_runner()
    requests_only_total(env.stats)
    for _ in range(2):  # two requests of 4 tokens: TTFT, 3 ITL gaps, TPOT, E2E each
        for name, ms in [("TTFT", 100), ("ITL", 5), ("ITL", 5), ("ITL", 5), ("TPOT", 5), ("E2E", 115)]:
            env.events.request.fire(request_type="chat", name=name, response_time=ms, response_length=1,
                                    exception=None, context={})
    env.stats.clear_all()  # a new run on a worker rebuilds the total and the entries
    for name in ("TTFT", "ITL", "E2E"):
        env.events.request.fire(request_type="chat", name=name, response_time=10, response_length=1, exception=None, context={})
    assert env.stats.total.num_requests == 1, "the total counts requests (E2E), not samples"
    assert env.stats.get("ITL", "chat").num_requests == 1 and env.stats.get("TTFT", "chat").num_requests == 1
    runner.quit()
