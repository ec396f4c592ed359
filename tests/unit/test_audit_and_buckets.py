"""The client's self-audit (loop lag, CPU) and Locust's sub-millisecond buckets."""

import math
import random
import time
from contextlib import contextmanager

import gevent
import locust.stats
import pytest

from vllm_locust.plugin.records import buckets
from vllm_locust.plugin.lifecycle.audit import ClientAudit, cpu_pct, overshoot_ms
from vllm_locust.core.schema import CPU_PCT, GC_MS_PER_S, GC_PAUSE_MS, LOOP_LAG_MS, MEASURED, SPAWN_TO_SEND_MS


@contextmanager
def installed_buckets():
    """The production bucketing for a block; afterwards ``locust.stats`` as it was before it."""
    was = locust.stats.bucket_response_time is buckets.fine_bucket
    buckets.install()
    try:
        yield
    finally:
        if was:
            buckets.install()
        else:
            buckets.uninstall()


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


def test_every_full_garbage_collection_is_a_row_and_each_second_says_the_collectors_share():
    import gc

    rows = []
    audit = ClientAudit(rows.append, lambda: ("r", "w", MEASURED, 4, 0), tick_s=0.005)
    audit.start()
    before = len(gc.callbacks)
    assert audit._on_gc in gc.callbacks, "timed from the start"
    for _ in range(3):
        gc.collect()  # a full collection each
    gevent.sleep(1.1)
    audit.stop()
    pauses = [r for r in rows if r.metric == GC_PAUSE_MS]
    assert len(pauses) >= 3 and all(r.value >= 0 for r in pauses), pauses
    shares = [r.value for r in rows if r.metric == GC_MS_PER_S]
    assert shares and max(shares) > 0, "a second with three full collections spent time collecting"
    assert len(gc.callbacks) == before - 1, "the callback leaves with the audit"
    gc.collect()
    assert len([r for r in rows if r.metric == GC_PAUSE_MS]) == len(pauses), "none timed after stop"


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
    assert buckets.fine_bucket(54.32) == 54.3 and buckets.fine_bucket(1234) == 1230
    with installed_buckets():
        entry = locust.stats.StatsEntry(locust.stats.RequestStats(), "ITL", "chat")
        for value in [0.2] * 60 + [5.4] * 36 + [7.7] * 4:
            entry.log(value, 1)
        assert entry.get_response_time_percentile(0.5) == 0.2, "Locust's own buckets would say 0"
        assert entry.get_response_time_percentile(0.95) == 5.4, "and 5 here"


def test_locusts_total_counts_requests_not_samples():
    """Seen ramping 8 users against vLLM CPU: the web UI's header read "RPS 647" at about 7
    requests/s, because every ITL gap was a request to Locust's total."""
    from locust.env import Environment
    from locust.event import Events

    from vllm_locust.plugin.records.buckets import requests_only_total

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


def test_buckets_keep_three_significant_digits_at_every_magnitude():
    """Seen: Locust's own buckets put TTFT above 100 ms in 10 ms steps (100.24 ms showed as 100 or
    110). Every value from 0.01 ms to 60 s keeps its bucket within 0.5 percent of itself."""
    import math

    values = [0.01 * (6e6 ** (i / 4000)) for i in range(4001)]  # 0.01 ms .. 60 s, log-spaced
    values += [0.0104999, 0.9995, 9.995, 99.95, 100.24, 104.9, 999.5, 1049.0, 10490.0, 59999.0, 60000.0]
    for value in values:
        bucket = buckets.fine_bucket(value)
        assert abs(bucket - value) <= 0.005 * value + 1e-12, (value, bucket)
    assert buckets.fine_bucket(100.24) == 100 and buckets.fine_bucket(104.9) == 105
    assert buckets.fine_bucket(12345.6) == 12300 and buckets.fine_bucket(0.012345) == 0.0123
    assert buckets.fine_bucket(0) == 0 and not math.isnan(buckets.fine_bucket(1e-9))


def test_percentiles_are_monotone_near_100_ms():
    """Seen in the web UI: median 100.24 ms beside p95 100 and p99 120. Locust clamps the median
    into [min, max] and not the other percentiles; a bucket below the minimum put p95 under p50."""
    with installed_buckets():
        entry = locust.stats.StatsEntry(locust.stats.RequestStats(), "TTFT", "chat", use_response_times_cache=True)
        for value in [100.24] * 60 + [100.3] * 35 + [100.4] * 4 + [118.0]:
            entry.log(value, 1)
        p50, p95, p99 = (entry.get_response_time_percentile(p) for p in (0.5, 0.95, 0.99))
        median = entry.median_response_time
        assert median <= p95 <= p99 and p50 <= p95, (median, p50, p95, p99)
        assert entry.min_response_time <= p50 <= p99 <= entry.max_response_time
        shown = entry.to_dict()  # what the web UI's table reads
        assert shown["median_response_time"] <= shown["response_time_percentile_0.95"] \
            <= shown["response_time_percentile_0.99"], shown


def test_uninstall_puts_locusts_own_back():
    with installed_buckets():
        buckets.install()  # twice: still undone in one go
        buckets.uninstall()
        assert locust.stats.bucket_response_time is buckets.LOCUST_BUCKET
        assert locust.stats.StatsEntry.get_response_time_percentile is buckets.LOCUST_PERCENTILE
        assert locust.stats.StatsEntry.get_current_response_time_percentile is buckets.LOCUST_CURRENT_PERCENTILE
        assert locust.stats.StatsEntry.log is buckets.LOCUST_LOG


@pytest.mark.parametrize("processes, worker, advice", [
    (None, False, "add --processes"),
    (2, True, "add more --processes or workers, or give the client its own cores"),
    (None, True, "add more --processes or workers, or give the client its own cores"),
])
def test_the_loop_lag_advice_depends_on_what_is_in_use(caplog, processes, worker, advice):
    """Seen: "add --processes" with ``--processes 2`` in use (the warning comes from a worker)."""
    from argparse import Namespace
    from types import SimpleNamespace

    from locust.runners import WorkerRunner

    from vllm_locust.core.schema import LOOP_LAG_MS, MEASURED, ClientRow
    from vllm_locust.plugin.lifecycle.selfaudit import SelfAudit

    class Worker(WorkerRunner):  # a worker's runner, without a master to connect to
        def __init__(self):
            pass

        def __del__(self):
            pass

    runner = Worker() if worker else SimpleNamespace()
    environment = SimpleNamespace(runner=runner, parsed_options=Namespace(
        max_loop_lag_ms=2.0, processes=processes, worker=worker))
    audit = SelfAudit(environment, "host-1", run=None, write=lambda row: None)  # the warning alone
    for lag_ms in [0.5] * 90 + [30.0] * 10:
        audit.client_row(ClientRow("r", "host-1", 0.0, MEASURED, 1, 0, LOOP_LAG_MS, lag_ms))
    with caplog.at_level("WARNING", logger="vllm_locust.plugin.lifecycle.selfaudit"):
        audit.warn_if_late()
    [line] = [r.getMessage() for r in caplog.records]
    assert "client fell behind" in line and advice in line, line
    if worker:
        assert "add --processes" not in line


def test_fine_buckets_are_the_values_rounded_to_three_significant_digits():
    """The fast path (an integer over a power of ten) gives the float ``round(value, digits)`` gives,
    at every magnitude from nanoseconds to hours."""
    rng = random.Random(25)
    values = [rng.uniform(1, 10) * 10.0 ** rng.randint(-9, 7) for _ in range(20000)] + [5e-324, 1e-310, 0.001, 999.5]
    for value in values:
        digits = 2 - math.floor(math.log10(value))
        expected = round(value, digits)
        assert buckets.fine_bucket(value) == (int(expected) if digits <= 0 else expected), value


def entry_state(entry) -> dict:
    """Every attribute of the entry (``vars``: a field Locust adds is compared too, where a fixed
    list of fields had missed ``start_time``), each with its type, NaN made comparable, the
    histograms and the once-a-second cache as plain dicts."""
    def same(value):
        if isinstance(value, float) and math.isnan(value):
            return "nan"
        if isinstance(value, dict):
            return {same(k): (same(v), type(k)) for k, v in value.items()}
        if hasattr(value, "__dict__") and not isinstance(value, type):
            return {k: same(v) for k, v in vars(value).items()}
        return value

    return {name: (type(value), same(value)) for name, value in vars(entry).items() if name != "stats"}


@pytest.mark.parametrize("cache", [False, True])
def test_the_fused_log_leaves_an_entry_as_locusts_log_does(monkeypatch, cache):
    """``buckets.log`` (one function per ITL gap) against Locust's own ``StatsEntry.log`` with the
    same bucketing: same counts, sums, extremes and their types, histogram, per-second counts and
    once-a-second cache, over values with None, NaN, ints, ties and a clock that crosses seconds."""
    rng = random.Random(7)
    values = [5, 5.0, 300.0, 300, None, 2, 2.0, 99.99999, 100, 100.0, 1e-297, 1e-300, 9.995e-298, 0.0] + [
        rng.choice([None, float("nan"), 0, 5, 5.0, rng.uniform(0, 200), rng.uniform(0, 1), 1e6 * rng.random()])
        for _ in range(2000)]
    with installed_buckets():
        now = [1_000_000.0]
        monkeypatch.setattr(time, "time", lambda: now[0])  # before the entries: their start_time is compared too
        stats = locust.stats.RequestStats(use_response_times_cache=cache)
        ours, theirs = (locust.stats.StatsEntry(stats, "ITL", "chat", use_response_times_cache=cache) for _ in range(2))
        for i, value in enumerate(values):
            now[0] += rng.choice([0.0, 0.001, 0.3, 1.0, 2.5])
            length = i % 3
            buckets.log(ours, value, length)
            buckets.LOCUST_LOG(theirs, value, length)
            assert entry_state(ours) == entry_state(theirs), i
        assert locust.stats.StatsEntry.log is buckets.log  # what every entry of a run logs with
