"""A trace's schedule: its send times scaled by the speed and sliced over processes, the pacer's
end of a finite schedule (every arrival handed out and every request over), the options a trace
refuses, and one process's replay from start to its own stop."""

import itertools
import logging
import time
from argparse import Namespace
from types import SimpleNamespace

import gevent
import pytest
from locust.env import Environment
from locust.event import Events

from vllm_locust.core.arrivals import trace_offsets
from vllm_locust.plugin.lifecycle.failures import RunFailures
from vllm_locust.plugin.loads.openloop import OpenLoop
from vllm_locust.plugin.options import defaults
from vllm_locust.plugin.loads.pacer import Pacer
from vllm_locust.plugin.lifecycle.runstate import RunStateBroadcast
from vllm_locust.plugin.loads.shapes import wants_steps
from vllm_locust.plugin.loads.tracereplay import TraceReplay, trace_errors

TIMES = [0.0, 0.1, 0.1, 0.25, 0.4, 0.9, 1.3]


def test_trace_offsets_are_the_send_times_over_the_speed_in_order():
    assert list(trace_offsets(TIMES)) == list(enumerate(TIMES))
    assert list(trace_offsets(TIMES, 2.0)) == [(k, t / 2) for k, t in enumerate(TIMES)]
    assert list(trace_offsets(TIMES, 0.5)) == [(k, t * 2) for k, t in enumerate(TIMES)]
    assert list(trace_offsets([])) == []


@pytest.mark.parametrize("count", [1, 2, 3, 8])
def test_the_slices_of_all_processes_are_the_whole_trace_once(count):
    slices = [list(trace_offsets(TIMES, 1.5, index, count)) for index in range(count)]
    for index, part in enumerate(slices):
        assert [k for k, _ in part] == list(range(index, len(TIMES), count)), "arrival k goes to process k % count"
        assert [t for _, t in part] == sorted(t for _, t in part), "each slice in the trace's order"
    assert sorted(itertools.chain(*slices)) == [(k, t / 1.5) for k, t in enumerate(TIMES)]


@pytest.mark.parametrize("times, words", [([0.0, 0.5, 0.2], "request 2: sent at 0.2 s, before request 1"),
                                          ([0.0, None], "request 1: no send time"),
                                          ([0.0, float("nan")], "request 1: no send time"),
                                          ([-1.0], "request 0: no send time")])
def test_a_bad_trace_is_refused_whole_before_any_arrival(times, words):
    with pytest.raises(ValueError, match=words):
        trace_offsets(times)  # not lazily: nothing of it is handed out


@pytest.mark.parametrize("speed", [0, -1, float("inf"), float("nan")])
def test_a_speed_that_is_not_positive_names_its_flag(speed):
    with pytest.raises(ValueError, match="--trace-speed"):
        trace_offsets(TIMES, speed)


def test_a_slice_outside_the_processes_is_refused():
    with pytest.raises(ValueError, match="slice 2 of 2"):
        trace_offsets(TIMES, 1.0, 2, 2)


def trace_options(**overrides) -> Namespace:
    return defaults(workload="trace", dataset_path="t.jsonl", **overrides)


@pytest.mark.parametrize("overrides, words", [
    (dict(request_rate="5"), "--workload trace with --request-rate: the trace sets its own arrival times"),
    (dict(steps="4,8"), "--workload trace with --steps: the trace sets its own arrival times"),
    (dict(request_rate="5", steps="4"), "with --request-rate and --steps"),
    (dict(trace_speed=0.0), "--trace-speed 0: must be a positive number"),
    (dict(trace_speed=-2.0), "--trace-speed -2: must be a positive number"),
])
def test_a_trace_refuses_options_that_contradict_it_in_one_line(overrides, words):
    error = trace_errors(trace_options(**overrides))
    assert error is not None and words in error and "\n" not in error, error


def test_a_trace_is_no_step_sequence_and_other_workloads_are_not_checked():
    assert trace_errors(trace_options(trace_speed=2.5)) is None
    assert trace_errors(defaults(request_rate="5", trace_speed=0.0)) is None, "not a trace: its speed is unused"
    assert not wants_steps(trace_options(request_rate="5")), "refused at start, not run as a step"
    assert wants_steps(defaults(request_rate="5")), "one rate without -u/-t is still one step"


def past_trace(pacer: Pacer, times, done: list, index: int = 0, count: int = 1) -> None:
    """A trace whose start was long ago: every arrival is due at once."""
    pacer.set_trace("t", time.time() - 100.0, trace_offsets(times, 1.0, index, count), done.append)


def test_a_finite_schedule_ends_when_every_arrival_is_out_and_every_request_over():
    pacer, done = Pacer(), []
    past_trace(pacer, [0.0, 0.1, 0.2], done)
    gates = [gevent.event.Event() for _ in range(3)]
    claimed = []

    def user(gate):
        claimed.append(pacer.claim().k)
        gate.wait()  # the request streams until the test lets it end
        pacer.claim()  # free again: the next claim waits, the trace being over

    users = [gevent.spawn(user, gate) for gate in gates]
    gevent.sleep(0.05)
    assert sorted(claimed) == [0, 1, 2]
    for gate in gates[:2]:
        gate.set()
    gevent.sleep(0.05)
    assert done == [], "a request of the trace is still in flight"
    gates[2].set()
    gevent.sleep(0.05)
    assert done == [3], "said once, with the arrivals handed out"
    assert not any(u.ready() for u in users), "the users wait for the next schedule"
    gevent.killall(users)


def test_a_finite_schedule_counts_only_its_own_slice_and_a_killed_users_request_is_over():
    pacer, done = Pacer(), []
    past_trace(pacer, TIMES, done, index=1, count=3)  # arrivals 1 and 4
    held = []
    holder = gevent.spawn(lambda: (held.append(pacer.claim().k), gevent.sleep(60)))  # a long request
    gevent.sleep(0.01)
    other = gevent.spawn(lambda: (pacer.claim(), pacer.claim()))
    gevent.sleep(0.05)
    assert held == [1] and done == [], "the first user still holds its request"
    holder.kill()  # the user died mid-request: nothing more will come from it
    gevent.spawn(pacer.claim)  # another user frees itself: the pacer looks again
    gevent.sleep(0.05)
    assert done == [2]
    other.kill()


def test_a_new_schedule_forgets_the_old_ones_end():
    pacer, done = Pacer(), []
    past_trace(pacer, [0.0], done)
    first = pacer.claim()
    pacer.set_segment(None)  # the run stopped
    waiter = gevent.spawn(pacer.claim)
    gevent.sleep(0.02)
    assert first.k == 0 and done == [] and not waiter.ready(), "an abandoned trace is not done"
    waiter.kill()


class Built:
    """The process's workload, as ``plugin.workload`` hands it out: prompts with send times."""

    def __init__(self, times):
        self.ctx = SimpleNamespace(prompts=[SimpleNamespace(send_at_s=t) for t in times])
        self.errors = []

    def context(self):
        return self.ctx

    def failed(self, err):
        self.errors.append(str(err))


def local_replay(times, **options):
    env = Environment(events=Events(), parsed_options=trace_options(**options))
    env.parsed_options.headless = True
    env.create_local_runner()
    run, failures = RunStateBroadcast(env), RunFailures(env)
    open_loop = OpenLoop(env, run, failures)
    workload = Built(times)
    trace = TraceReplay(env, run, failures, workload, open_loop)
    quits = []
    env.runner.quit = lambda: quits.append(time.time())
    return env, trace, open_loop, workload, quits


def test_one_process_replays_from_its_built_workload_and_stops_itself(caplog):
    env, trace, open_loop, workload, quits = local_replay([0.0, 0.02, 0.04, 0.06], trace_speed=2.0)
    trace.on_test_start(environment=env)
    gevent.sleep(0.05)  # the workload is built (a greenlet): ready, but users are still spawning
    assert env.runner.state != "stopped" and open_loop.run.state.arrivals["epoch_s"] is None
    assert open_loop.active, "users wait for the trace's arrivals instead of sending back to back"
    trace.on_spawning_complete()
    start = open_loop.run.state.arrivals["epoch_s"]
    assert start is not None and start > time.time(), "the start leaves the woken users time to reach the pacer"
    got = []

    def user():
        while True:
            arrival = open_loop.claim()
            got.append((arrival.k, arrival.intended_at_s))

    with caplog.at_level(logging.INFO, logger="vllm_locust.plugin.loads.tracereplay"):
        users = [gevent.spawn(user) for _ in range(2)]
        gevent.sleep(1.5)
    gevent.killall(users)
    assert [k for k, _ in got] == [0, 1, 2, 3]
    assert [round(t - start, 6) for _, t in got] == [0.0, 0.01, 0.02, 0.03], "the trace's times over --trace-speed"
    assert len(quits) == 1, "the run stops itself once, when the trace is over"
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("trace replayed")]
    assert len(said) == 1, said
    assert said[0].startswith("trace replayed: 4 requests in ") and said[0].endswith("(speed 2)"), said
    assert not workload.errors


def test_one_process_with_a_bad_trace_stops_before_any_arrival():
    env, trace, open_loop, workload, quits = local_replay([0.0, 0.5, 0.2])
    trace.on_test_start(environment=env)
    gevent.sleep(0.05)
    trace.on_spawning_complete()
    assert workload.errors and "before request 1" in workload.errors[0]
    assert open_loop.run.state.arrivals["epoch_s"] is None, "no start: nothing is sent"


def test_one_process_refuses_a_rate_with_a_trace_before_publishing_a_schedule():
    env, trace, open_loop, workload, quits = local_replay([0.0], request_rate="5")
    trace.on_test_start(environment=env)
    gevent.sleep(0.01)
    assert env.process_exit_code == 2 and open_loop.run.state.arrivals is None
    assert quits, "the run stops at once"


def test_headless_without_u_holds_max_concurrency_users_spawned_at_once():
    env, trace, *_ = local_replay([0.0], max_concurrency=32)
    env.parsed_options.num_users, env.parsed_options.spawn_rate = None, None
    trace.headless_users()
    assert (env.parsed_options.num_users, env.parsed_options.spawn_rate) == (32, 32.0)
    env.parsed_options.num_users, env.parsed_options.spawn_rate = 5, None
    trace.headless_users()
    assert (env.parsed_options.num_users, env.parsed_options.spawn_rate) == (5, 5.0), "-u is the cap when given"


def test_arrivals_due_together_are_handed_out_together():
    """A burst (issue 25): every user gets its arrival before any of them goes on to send; passing
    the turn from one user to the next had each send wait behind the next user's claim and setup."""
    import time

    pacer, log, done = Pacer(), [], []
    users = 6
    pacer.set_trace("burst", time.time() + 0.05, iter([(k, 0.0) for k in range(users)]), done.append)

    def user() -> None:
        arrival = pacer.claim()
        log.append(("claimed", arrival.k, arrival.queue_ms))
        gevent.sleep(0)  # the request's one yield before its send (``wire.WireClock``)
        log.append(("sent", arrival.k, None))
        pacer.claim()  # the request is over; the trace has nothing more: waits for a next schedule

    greenlets = [gevent.spawn(user) for _ in range(users)]
    gevent.sleep(0.3)
    gevent.killall(greenlets)
    assert [kind for kind, _, _ in log] == ["claimed"] * users + ["sent"] * users
    assert sorted(k for kind, k, _ in log if kind == "claimed") == list(range(users)), "each arrival once"
    assert all(queue == 0.0 for kind, _, queue in log if kind == "claimed"), "free users never queued"
    assert done == [users], "the burst's requests were not all counted as handed out and over"
