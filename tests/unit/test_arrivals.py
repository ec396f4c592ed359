"""The arrival schedule's statistics (seeded), its slicing over processes, ramps, the persona draw,
and the pacer's queue time, intended instants and persona filter."""

import itertools
import math
import time

import gevent
import numpy as np
import pytest

from vllm_locust.core.arrivals import (Segment, cumulative_weights, offsets, parse_rates, persona_of,
                                      persona_offsets)
from vllm_locust.plugin.loads.pacer import Pacer


def gaps(rate, burstiness, n=20000, seed=3):
    times = [t for _, t in zip(range(n), (t for _, t in offsets(Segment(0.0, rate, rate), seed, burstiness)))]
    return np.diff([0.0, *times])


@pytest.mark.parametrize("rate", [10.0, 100.0, 1000.0])
@pytest.mark.parametrize("burstiness", [0.5, 1.0, 4.0])
def test_mean_rate_within_2_percent_and_dispersion_follows_burstiness(rate, burstiness):
    g = gaps(rate, burstiness)
    assert abs(1.0 / g.mean() / rate - 1) < 0.02, f"mean rate {1 / g.mean():.2f} for {rate}"
    # gamma(shape B): coefficient of variation 1/sqrt(B) (Poisson: 1)
    cv = g.std() / g.mean()
    assert abs(cv - 1 / math.sqrt(burstiness)) < 0.05 * (1 / math.sqrt(burstiness)), f"cv {cv:.3f} for B={burstiness}"


def test_infinite_burstiness_is_a_constant_rate():
    g = gaps(50.0, math.inf, n=100)
    assert np.allclose(g, 0.02)


def test_seeded_schedule_repeats_and_seeds_differ():
    a, b, c = gaps(10, 1.0, 50, seed=1), gaps(10, 1.0, 50, seed=1), gaps(10, 1.0, 50, seed=2)
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_slices_of_all_processes_make_exactly_the_whole_schedule(count):
    segment = Segment(0.0, 20.0, 20.0)
    whole = [t for _, t in zip(range(400), (t for _, t in offsets(segment, 7, 1.0)))]
    parts = []
    for index in range(count):
        parts += list(itertools.takewhile(lambda kt: kt[0] < 400, offsets(segment, 7, 1.0, index, count)))
    merged = sorted(parts)
    assert [k for k, _ in merged] == list(range(400))
    assert [t for _, t in merged] == whole


def test_linear_ramp_sends_the_integral_of_its_rate():
    # 10 -> 30 requests/s over 100 s: 2,000 arrivals expected, 750 in the first half
    segment = Segment(0.0, 10.0, 30.0, ramp_s=100.0)
    times = np.array([t for _, t in zip(range(4000), (t for _, t in offsets(segment, 0, 1.0))) if t < 100.0])
    assert abs(len(times) / 2000 - 1) < 0.05
    assert abs((times < 50).sum() / 750 - 1) < 0.07
    # after the ramp the last rate holds
    assert segment.expected_by(110.0) == pytest.approx(2000 + 300)
    assert segment.time_of(segment.expected_by(37.5)) == pytest.approx(37.5)


@pytest.mark.parametrize("text", ["0", "-1", "x", "1,,nan", "inf"])
def test_bad_rates_name_the_flag(text):
    with pytest.raises(ValueError, match="--request-rate"):
        parse_rates(text)
        Segment(0.0, *([float(text)] * 2))


def test_rates_parse():
    assert parse_rates("") == []
    assert parse_rates("1, 2,4.5") == [1.0, 2.0, 4.5]


def test_pacer_reports_the_wait_for_a_free_user_as_queue_time():
    # The schedule began 10 s ago at 10 requests/s: its first arrivals are long overdue when a
    # user finally claims them, and the wait is the time since each was due.
    pacer = Pacer()
    pacer.set_segment(Segment(time.time() - 10.0, 10.0, 10.0), seed=0, burstiness=math.inf)
    first, second = pacer.claim(), pacer.claim()
    assert (first.k, second.k) == (0, 1)
    # (bounds wide enough for a busy machine: the claims come a few ms after the schedule is set)
    assert 9900 < first.queue_ms < 15000 and first.queue_ms - second.queue_ms == pytest.approx(100, abs=50)
    assert second.intended_at_s - first.intended_at_s == pytest.approx(0.1, abs=1e-5)


def test_pacer_holds_a_claim_until_its_instant_and_drops_it_when_the_schedule_changes():
    pacer = Pacer()
    pacer.set_segment(Segment(time.time() + 30.0, 1.0, 1.0), seed=0, burstiness=math.inf)  # first due in 31 s
    claimed = []
    waiter = gevent.spawn(lambda: claimed.append(pacer.claim()))
    gevent.sleep(0.05)
    assert not claimed, "an arrival left before its instant"
    pacer.set_segment(Segment(time.time() - 5.0, 2.0, 2.0, key=1), seed=0, burstiness=math.inf)
    waiter.join(timeout=5)
    assert claimed and claimed[0].k == 0 and claimed[0].queue_ms > 4000, "the old schedule's arrival was kept"


def test_pacer_without_schedule_waits():
    pacer = Pacer()
    waiter = gevent.spawn(pacer.claim)
    gevent.sleep(0.05)
    assert not waiter.ready()
    pacer.set_segment(Segment(time.time() - 1.0, 5.0, 5.0), burstiness=math.inf)
    assert waiter.get(timeout=5).k == 0


def test_the_most_recently_freed_user_takes_the_next_arrival():
    # Round-robin over idle users opened a new connection for every request; the turn goes LIFO.
    pacer = Pacer()
    pacer.set_segment(Segment(time.time() + 0.05, 100.0, 100.0), seed=0, burstiness=math.inf)
    got = {}

    def user(name):
        got[name] = pacer.claim().k

    users = [gevent.spawn(user, name) for name in ("first", "second", "third")]
    gevent.joinall(users, timeout=10)
    assert got == {"first": 0, "third": 1, "second": 2}


def test_the_persona_draw_splits_by_weight_and_repeats_per_seed():
    table = cumulative_weights([3, 1])
    assert table == [3, 4]
    draws = [persona_of(k, 11, table) for k in range(20000)]
    assert set(draws) == {0, 1}
    assert abs(draws.count(1) / 20000 - 0.25) < 0.02, f"{draws.count(1)} of 20000 to the weight-1 persona"
    assert draws == [persona_of(k, 11, table) for k in range(20000)], "a pure function of (seed, k)"
    assert draws != [persona_of(k, 12, table) for k in range(20000)], "another seed, another draw"
    assert draws != [persona_of(k, 11, table, key=1) for k in range(20000)], "another segment, another draw"
    assert {persona_of(k, 11, [5]) for k in range(1000)} == {0}, "a single persona takes all"


def test_the_persona_draw_of_three_follows_their_weights_and_refuses_bad_weights():
    table = cumulative_weights([1, 2, 5])
    counts = np.bincount([persona_of(k, -3, table) for k in range(40000)], minlength=3) / 40000
    assert np.allclose(counts, [1 / 8, 2 / 8, 5 / 8], atol=0.02), counts
    for bad in ([], [0, 0], [2, -1], [1, float("inf")]):  # a 0 is allowed (steered out), not all of them
        with pytest.raises(ValueError, match="persona weights"):
            cumulative_weights(bad)


@pytest.mark.parametrize("count", [1, 3])
def test_persona_shares_over_their_senders_make_exactly_the_whole_schedule(count):
    segment = Segment(0.0, 20.0, 20.0, key=2)
    table = cumulative_weights([3, 1])
    whole = list(itertools.islice(offsets(segment, 7, 1.0), 400))
    parts = {}
    for persona in (0, 1):
        for index in range(count):
            share = list(itertools.takewhile(lambda kt: kt[0] < 400,
                                             persona_offsets(segment, 7, 1.0, persona, table, index, count)))
            assert all(persona_of(k, 7, table, key=2) == persona for k, _ in share)
            parts[persona, index] = share
    assert sorted(sum(parts.values(), [])) == whole, "each arrival once, at its own instant"
    if count == 3:  # a persona's own arrivals go round its senders
        ones = sorted(k for (persona, _), share in parts.items() if persona == 1 for k, _ in share)
        assert [k for k, _ in parts[1, 1]] == ones[1::3]


def test_a_persona_pacer_hands_out_only_its_share():
    segment = Segment(time.time() - 100.0, 10.0, 10.0)  # 1,000 arrivals already due
    table = cumulative_weights([3, 1])
    pacer = Pacer()
    pacer.set_segment(segment, arrivals=persona_offsets(segment, 5, 1.0, 1, table))
    got = [pacer.claim().k for _ in range(50)]
    assert got == [k for k in range(1000) if persona_of(k, 5, table) == 1][:50]
    whole = Pacer()
    whole.set_segment(segment, 5, 1.0)
    assert [whole.claim().k for _ in range(5)] == [0, 1, 2, 3, 4], "without a share: every arrival, as before"
