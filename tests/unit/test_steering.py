"""Steering a running test: the change's form, the schedule file, the knee search, the live judge,
the in-flight gate, and the deciding process's steps (``loads.steering``) on a test environment."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import gevent
import numpy as np
import pandas as pd
import pytest
from locust.env import Environment
from locust.event import Events

from analysis.goodput import within_slo
from vllm_locust.core.arrivals import cumulative_weights, persona_of
from vllm_locust.core.client_window import ClientWindow, RequestLedger
from vllm_locust.core.knee import KneeProbe, KneeSearch, clear_pass, decisive
from vllm_locust.core.schema import ITL, MEASURED, SUMMARY, TTFT, WARMUP
from vllm_locust.core.slo import judge, parse_slo, percentile, request_meets
from vllm_locust.core.steering import (Change, Schedule, ScheduleEntry, Settings, parse_change, read_schedule,
                                       schedule_toml)
from vllm_locust.plugin.loads.steering import InFlightGate, SteerError, share
from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.user import ChatStreamUser
from vllm_locust.plugin.vllm_plugin import VllmPlugin

PERSONAS = ["chat", "agent"]


# -- the change ---------------------------------------------------------------------------------
def test_a_change_reads_every_setting_and_keeps_what_it_does_not_set():
    change = parse_change({"rate": "8", "burstiness": 0.5, "weights": {"chat": 1, "agent": 3}, "think_time": 2,
                           "max_in_flight": 16, "users": 32, "spawn_rate": 8}, PERSONAS)
    assert change == Change(rate=8.0, burstiness=0.5, weights={"chat": 1.0, "agent": 3.0}, think_time={"": 2.0},
                            max_in_flight=16, users=32, spawn_rate=8.0)
    before = Settings(rate=4.0, weights={"chat": 3.0}, think_time={"agent": 1.0})
    after = before.then(Change(rate=6.0, think_time={"chat": 0.5}))
    assert after == Settings(rate=6.0, weights={"chat": 3.0}, think_time={"agent": 1.0, "chat": 0.5})
    assert before.then(Change(think_time={"": 2.0})).think_time == {"": 2.0}, "every user's think time replaces each"
    assert Settings.from_dict(after.as_dict()) == after
    assert change.label() == ("rate 8/s, burstiness 0.5, weights chat:1 agent:3, think time all:2, "
                              "max in flight 16, users 32, spawn rate 8")


@pytest.mark.parametrize("data, said", [
    ({"rte": 3}, "unknown setting 'rte'"),
    ({"rate": -1}, "rate -1: expected a number more than 0"),
    ({"rate": 0}, "rate 0: expected a number more than 0"),
    ({"rate": "fast"}, "rate 'fast': expected a number"),
    ({"rate": float("nan")}, "rate nan: expected a number"),
    ({"rate": True}, "rate True: expected a number"),
    ({"max_in_flight": 2.5}, "max_in_flight 2.5: expected a whole number"),
    ({"users": -3}, "users -3: expected a number at least 0"),
    ({"weights": {"bot": 1}}, "weights: unknown persona 'bot' (personas: chat, agent)"),
    ({"weights": {"chat": -1}}, "weights.chat -1: expected a number at least 0"),
    ({"weights": [1, 2]}, "weights: expected a table of persona = value"),
    ({"think_time": {"chat": -2}}, "think_time.chat -2: expected a number at least 0"),
    ({}, "nothing to change"),
    ([1], "a change is an object"),
])
def test_a_bad_change_is_one_line(data, said):
    with pytest.raises(ValueError) as err:
        parse_change(data, PERSONAS)
    assert said in str(err.value) and "\n" not in str(err.value)


# -- the schedule file --------------------------------------------------------------------------
def test_a_schedule_round_trips_through_its_toml():
    schedule = Schedule((ScheduleEntry(0.0, Change(rate=4.0, users=8)),
                         ScheduleEntry(30.5, Change(rate=8.0, burstiness=0.5, weights={"chat": 1.0, "agent": 3.0})),
                         ScheduleEntry(61.0, Change(max_in_flight=2, think_time={"": 1.5, "agent": 0.0}))),
                        run_time_s=90.0, warmup_s=5.0)
    text = schedule_toml(schedule, "run x")
    assert text.startswith("# vllm-locust schedule") and "[[at]]" in text and "[at.weights]" in text
    assert read_schedule(text, PERSONAS) == schedule


def test_a_hand_written_schedule_reads():
    text = "run_time_s = 40\n[[at]]\nt = 0\nrate = 2\n[[at]]\nt = 20\nrate = 6\nweights = { agent = 0 }\n"
    schedule = read_schedule(text, PERSONAS)
    assert schedule.run_time_s == 40.0 and [e.t_s for e in schedule.entries] == [0.0, 20.0]
    assert schedule.entries[1].change == Change(rate=6.0, weights={"agent": 0.0})


@pytest.mark.parametrize("text, said", [
    ("[[at]\nt=1", "--schedule s.toml: not TOML"),
    ("speed = 2\n[[at]]\nt = 1\nrate = 2", "unknown key 'speed'"),
    ("run_time_s = 5", "no [[at]] entries"),
    ("[[at]]\nrate = 2", "[[at]] 1: needs t"),
    ("[[at]]\nt = 5\nrate = 2\n[[at]]\nt = 1\nrate = 3", "in order of t"),
    ("[[at]]\nt = 0\nrate = 2\n[[at]]\nt = 3\nweights = { bot = 1 }", "[[at]] 2: weights: unknown persona 'bot'"),
])
def test_a_bad_schedule_names_its_entry(text, said):
    with pytest.raises(ValueError) as err:
        read_schedule(text, PERSONAS, "--schedule s.toml")
    assert said in str(err.value) and "\n" not in str(err.value)


# -- the knee search ----------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [0.3, 5.3, 37.0, 200.0])
def test_the_knee_search_brackets_then_bisects_like_the_boundary_search(capacity):
    search = KneeSearch(start=1.0, tolerance=0.1)
    while (rate := search.next_rate()) is not None:
        search.record(KneeProbe(rate, rate <= capacity))
    assert search.low is not None and search.high is not None
    assert search.low <= capacity < search.high and (search.high - search.low) / search.low <= 0.1
    fails = [p.rate for p in search.probes if not p.passed]
    assert all(fails.count(r) == 2 for r in fails), "every breach judged twice before it counts"


def test_a_breach_that_does_not_hold_is_not_the_knee():
    search = KneeSearch(start=2.0, tolerance=0.5)
    verdicts = iter([True, False, True, True, False, False])  # 2 ok; 4 once unlucky, then ok; 8 ok; 16 fails twice
    while (rate := search.next_rate()) is not None:
        search.record(KneeProbe(rate, next(verdicts, rate <= 8)))
        if len(search.probes) > 20:
            break
    assert search.probes[1].rate == search.probes[2].rate == 4.0, "a failed window is judged again at its rate"
    assert (search.low, search.high) == (8.0, 12.0), "(12 - 8) / 8 is the tolerance: done"
    assert [p.rate for p in search.probes[:6]] == [2.0, 4.0, 4.0, 8.0, 16.0, 16.0]


def test_a_decisive_breach_counts_at_once():
    limits = {"ttft": 500.0, "itl": 50.0}
    assert decisive({"ttft": 1000.0, "itl": 10.0}, limits, 30, 0, 0.05)
    assert not decisive({"ttft": 999.0, "itl": 99.0}, limits, 30, 0, 0.05), "under twice the threshold"
    assert not decisive({"ttft": 5000.0}, limits, 29, 0, 0.05), "too few requests to say"
    assert decisive({"ttft": 10.0}, limits, 100, 11, 0.05) and not decisive({"ttft": 10.0}, limits, 100, 10, 0.05)
    assert clear_pass({"ttft": 250.0, "itl": 25.0}, limits, 50, 0)
    assert not clear_pass({"ttft": 251.0, "itl": 25.0}, limits, 50, 0), "over half the threshold"
    assert not clear_pass({"ttft": 10.0, "itl": 1.0}, limits, 49, 0) and not clear_pass({"ttft": 10.0, "itl": 1.0},
                                                                                        limits, 100, 1)
    assert not clear_pass({"ttft": 10.0}, limits, 100, 0), "a metric not measured is not clear"
    search = KneeSearch(start=4.0, tolerance=0.3)
    search.record(KneeProbe(4.0, True))
    search.record(KneeProbe(8.0, False, decisive=True))
    assert search.high == 8.0 and search.next_rate() == 6.0, "no second window for a decisive breach"


# -- the live judge is the analysis's judge -----------------------------------------------------
def test_percentiles_are_numpys_linear_ones():
    rng = random.Random(3)
    for n in (1, 2, 7, 100, 1001):
        values = sorted(rng.expovariate(1.0) for _ in range(n))
        for q in (50, 95, 99):
            assert math.isclose(percentile(values, q), float(np.percentile(values, q)), rel_tol=1e-12)


@pytest.mark.parametrize("ttft, itl, failures, passed", [(400.0, 40.0, 0, True), (501.0, 40.0, 0, False),
                                                        (400.0, 50.5, 0, False), (400.0, 40.0, 6, False),
                                                        (float("nan"), 40.0, 0, False)])
def test_the_live_judge_and_the_analysis_give_one_verdict(ttft, itl, failures, passed):
    slo = parse_slo("ttft:500,itl:50")
    row = pd.Series({SUMMARY.request_rate: 4.0, SUMMARY.requests: 100, SUMMARY.failures: failures,
                     "p95_ttft_from_intended_ms": ttft, "p95_itl_ms": itl})
    analysed, _figures, why = within_slo(row, slo)
    live, live_why = judge({"ttft": ttft, "itl": itl}, 100, failures, slo)
    assert analysed == live == passed and bool(why) == bool(live_why) == (not passed)


def test_the_ledger_judges_a_step_on_its_own_requests_and_gaps():
    window = ClientWindow()
    for i in range(100):  # step 1: every TTFT 100 ms (intended), gaps 10 ms
        window.add(TTFT, 80.0, step=1)
        for _ in range(4):
            window.add(ITL, 10.0, step=1)
        window.add_request("chat", 1, True, 100.0, 200.0, 10.0, 10.0)
    for i in range(50):  # step 2: slow
        window.add(ITL, 90.0, step=2)
        window.add_request("agent", 2, i % 10 != 0, 900.0, 1200.0, 90.0, 90.0)
    ledger = RequestLedger()
    ledger.add(window.take(), t_s=1000.0)
    slo = parse_slo("ttft:500,itl:50")
    passed, why, p95, judged = ledger.judge(slo, 1, 0.0)
    assert passed and judged == 100 and p95["ttft"] == 100.0 and p95["itl"] == 10.0, (why, p95)
    passed, why, p95, judged = ledger.judge(slo, 2, 0.0)
    assert not passed and judged == 50 and "ttft p95 900.0 > 500" in why and "5 of 50 requests failed" in why
    goodput = ledger.goodput({"": slo, "agent": parse_slo("ttft:1000")}, window_s=10.0, now=1005.0)
    assert goodput["chat"] == {"requests": 100, "met": 100, "met_share": 1.0, "goodput_rps": 10.0}
    assert goodput["agent"]["met"] == 45 and goodput["agent"]["met_share"] == 0.9, "the persona's own SLO"
    assert ledger.goodput({"": slo}, window_s=10.0, now=2000.0) == {}, "older than the window"
    assert request_meets(slo, 100.0, None, None, None) and not request_meets(slo, None, None, None, 10.0)


# -- the in-flight gate -------------------------------------------------------------------------
def test_the_gate_holds_users_above_the_cap_and_lets_them_in_when_it_rises():
    gate = InFlightGate()
    gate.set_cap(2)
    inside, most = [0], [0]

    def user():
        gate.enter()
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        gevent.sleep(0.01)
        inside[0] -= 1
        gate.leave()

    gevent.joinall([gevent.spawn(user) for _ in range(10)], timeout=10)
    assert most[0] == 2 and gate.active == 0
    gate.set_cap(0)
    waiting = gevent.spawn(gate.enter)
    gevent.sleep(0.05)
    assert not waiting.dead, "a cap of 0 holds every user"
    gate.set_cap(None)
    waiting.join(timeout=5)
    assert waiting.dead and gate.active == 1
    assert [share(5, i, 2) for i in range(2)] == [3, 2] and [share(1, i, 3) for i in range(3)] == [1, 0, 0]


def test_a_weight_of_zero_is_never_drawn():
    table = cumulative_weights([3.0, 0.0, 1.0])
    assert {persona_of(k, 7, table) for k in range(5000)} == {0, 2}
    with pytest.raises(ValueError):
        cumulative_weights([0.0, 0.0])


# -- the deciding process's steps ---------------------------------------------------------------
class Concrete(ChatStreamUser):
    pass


def plugin(tmp_path, **opts) -> VllmPlugin:
    options = defaults(model="fake-model", prompt_tokens=20, prompt_pool=4, prompt_cache_dir="",
                       samples_dir=str(tmp_path), steer_warmup=0.2, **opts)
    env = Environment(user_classes=[Concrete], available_user_classes={"Concrete": Concrete}, events=Events(),
                      parsed_options=options)
    env.runner = SimpleNamespace(target_user_count=8, spawn_rate=8.0, user_count=8)
    return VllmPlugin(env, worker_id="w1")


def test_a_change_is_the_next_step_with_its_warm_up_marker_and_schedule_entry(tmp_path):
    p = plugin(tmp_path, request_rate="4")
    with pytest.raises(SteerError) as err:
        p.steering.steer({"rate": 8})
    assert err.value.status == 409 and "no run in progress" in str(err.value)
    p.run.publish(run_id="r1", concurrency=8)
    p.steering.on_test_start(p.environment)
    p.run.publish(request_rate=4.0, arrivals=p.open_loop.segment(4.0, 4.0))
    p.clock.armed_s = p.run.started_s
    for data, said in (({"burstiness": 2, "weights": {"x": 1}}, "unknown persona 'x'"),
                       ({"think_time": 1}, "plays no conversations"), ({"spawn_rate": 3}, "give users with it")):
        with pytest.raises(SteerError) as err:
            p.steering.steer(data)
        assert said in str(err.value) and err.value.status == 400
    done = p.steering.steer({"rate": 8, "burstiness": 2, "max_in_flight": 3})
    state = p.run.state
    assert done["step"] == 1 and state.step == 1 and state.phase == WARMUP and state.request_rate == 8.0
    assert state.arrivals["rate0"] == 8.0 and state.arrivals["burstiness"] == 2.0 and state.arrivals["key"] == 1
    assert state.concurrency == 3, "the cap below the users labels the level"
    assert p.steering.gate.cap == 3, "the single process holds the whole cap"
    gevent.sleep(0.4)
    assert state.phase == MEASURED, "measured once the warm-up after the change is over"
    assert p.view.markers[-1]["kind"] == "steer" and p.view.markers[-1]["label"].startswith("step 1: rate 8/s")
    p.steering.steer({"max_in_flight": 0})
    assert p.run.state.step == 2 and p.steering.gate.cap is None and p.run.state.concurrency == 8
    schedule = p.steering.as_schedule()
    assert [e.change for e in schedule.entries] == [Change(rate=4.0, users=8),
                                                    Change(rate=8.0, burstiness=2.0, max_in_flight=3),
                                                    Change(max_in_flight=0)]
    p.steering.on_test_stop()
    (written,) = tmp_path.glob("schedule-r1.toml")
    assert read_schedule(written.read_text(), []).entries == schedule.entries
    assert [c["step"] for c in p.steering.changes] == [1, 2]


def test_a_shaped_run_is_not_steered(tmp_path):
    p = plugin(tmp_path, steps="2,4")
    p.environment.shape_class = object()
    p.run.publish(run_id="r1", concurrency=2, step=0)
    with pytest.raises(SteerError) as err:
        p.steering.steer({"users": 4})
    assert err.value.status == 409 and "follows --steps" in str(err.value)
