"""A distributed run's workers build before its clock starts (``workerbuild.BuildGate``), against
Locust's runner classes with their sockets left out: what each side says, when, and to whom."""

from __future__ import annotations

from types import SimpleNamespace

import gevent
import locust.runners
import pytest
from locust.rpc import Message
from locust.runners import MasterRunner, WorkerRunner

from vllm_locust.plugin.distributed import workerbuild
from vllm_locust.plugin.distributed.workerbuild import BUILT_MESSAGE, GO_MESSAGE, BuildGate
from vllm_locust.plugin.lifecycle.runstate import STATE_MESSAGE, RunStateBroadcast

RUN = "20261206-210000"


class FakeMaster(MasterRunner):
    """A master's workers and the messages it sends; no port bound."""

    def __init__(self, clients):  # noqa: super().__init__ would bind the master's port
        self.clients, self.sent, self.handlers, self.greenlet = SimpleNamespace(all=clients), [], {}, None
        self.quits = 0

    def quit(self):
        self.quits += 1

    def register_message(self, name, handler, concurrent=False):
        self.handlers[name] = handler

    def send_message(self, msg_type, data=None, client_id=None):
        self.sent.append((msg_type, data, client_id))


class FakeWorker(WorkerRunner):
    def __init__(self):  # noqa: super().__init__ would connect to a master
        self.sent, self.handlers, self.greenlet = [], {}, None

    def register_message(self, name, handler, concurrent=False):
        self.handlers[name] = handler

    def send_message(self, msg_type, data=None, client_id=None):
        self.sent.append((msg_type, data))


class Failures:
    def __init__(self):
        self.failed, self.lines = False, []

    def fail_run(self, message, **_kwargs):
        self.failed = True
        self.lines.append(message)


def gate_for(runner, build=lambda: None):
    calls = []
    failures = Failures()
    run = SimpleNamespace(deciding=isinstance(runner, MasterRunner), records_samples=not isinstance(runner, MasterRunner),
                          state=SimpleNamespace(run_id=RUN), restart=lambda: calls.append("restart"),
                          follow=lambda callback: None, send_to=lambda node: calls.append(f"state to {node}"))
    workload = SimpleNamespace(gate=None, build_all=build, failed=lambda err: failures.fail_run(f"cannot build: {err}"))
    env = SimpleNamespace(runner=runner, stats=SimpleNamespace(reset_all=lambda: calls.append("reset stats")))
    gate = BuildGate(env, run, failures, workload, SimpleNamespace(arm=lambda s: calls.append("arm"), hold=lambda: calls.append("hold")),
                     SimpleNamespace(restart_schedule=lambda: calls.append("restart schedule")))
    gate.register(SimpleNamespace(test_start=SimpleNamespace(add_listener=lambda f: None),
                                  test_stop=SimpleNamespace(add_listener=lambda f: None)))
    return gate, calls, failures, workload


def node(name, state="running"):
    return SimpleNamespace(id=name, state=state, heartbeat=locust.runners.HEARTBEAT_LIVENESS)


def built(gate, name, run_id=RUN, **extra):
    gate.on_built_message(Message(BUILT_MESSAGE, {"run_id": run_id, "failed": False, **extra}, name))


def test_the_master_says_go_once_every_worker_has_built():
    master = FakeMaster([node("w1"), node("w2")])
    gate, calls, failures, _ = gate_for(master)
    gate.on_test_start()
    assert calls == ["hold"], "a steps shape's clock holds at its start while the workers build"
    calls.clear()
    built(gate, "w1")
    assert master.sent == [] and calls == [], "w2 is still building: no go, no clock"
    built(gate, "w2", run_id="an-earlier-run")
    assert master.sent == [], "another run's message counts for nothing"
    assert calls == ["state to w2"], "but its sender is told this run's state"
    built(gate, "w2")
    assert master.sent == [(GO_MESSAGE, {"run_id": RUN}, None)], "one go, to every worker"
    assert calls[1:] == ["restart", "restart schedule", "reset stats", "arm"], "the run's time starts at go"
    gate.on_test_stop()


def test_a_worker_that_builds_after_go_is_told_go_alone():
    master = FakeMaster([node("w1")])
    gate, calls, _, _ = gate_for(master)
    gate.on_test_start()
    built(gate, "w1")
    master.clients.all.append(node("late"))
    built(gate, "late")
    assert master.sent[-1] == (GO_MESSAGE, {"run_id": RUN}, "late")
    assert calls.count("arm") == 1, "the clock is armed once"
    assert calls.count("restart schedule") == 2, "the schedule again, with the late worker's slice"
    gate.on_test_stop()


class Clock:
    """``time.monotonic`` for the gate, moved by hand."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


def test_a_worker_missing_while_building_is_waited_for_then_the_others_go(monkeypatch):
    """Locust calls a worker missing after three seconds without a heartbeat: on a busy machine a
    building worker's heartbeats can be that late. Going without it had left it no slice of the
    schedule (it sent nothing all run); now it is waited for up to MISSING_GRACE_S."""
    clock = Clock()
    monkeypatch.setattr(workerbuild, "time", clock)
    monkeypatch.setattr(workerbuild, "CHECK_EVERY_S", 0.01)
    lost = node("lost")
    master = FakeMaster([node("w1"), lost])
    gate, _, _, _ = gate_for(master)
    gate.on_test_start()
    built(gate, "w1")
    lost.state = "missing"
    assert gate.waiting_for() == ["lost"], "missing for a moment: still waited for"
    clock.now += workerbuild.MISSING_GRACE_S - 1
    gevent.sleep(0.05)  # the master's watch looks several times
    assert gate.waiting_for() == ["lost"] and master.sent == [], "no go inside the grace"
    clock.now += 2
    with gevent.Timeout(10, AssertionError("no go after the grace")):
        while not master.sent:
            gevent.sleep(0.01)
    assert master.sent == [(GO_MESSAGE, {"run_id": RUN}, None)]
    gate.on_test_stop()


def test_a_worker_whose_heartbeats_came_back_is_waited_for_again(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(workerbuild, "time", clock)
    late = node("late")
    master = FakeMaster([node("w1"), late])
    gate, _, _, _ = gate_for(master)
    gate.on_test_start()
    built(gate, "w1")
    late.state = "missing"
    assert gate.waiting_for() == ["late"]
    clock.now += workerbuild.MISSING_GRACE_S - 1
    late.state = "running"  # its heartbeats arrived
    assert gate.waiting_for() == ["late"]
    late.state = "missing"
    clock.now += 2
    assert gate.waiting_for() == ["late"], "its grace starts again"
    built(gate, "late")
    assert master.sent == [(GO_MESSAGE, {"run_id": RUN}, None)]
    gate.on_test_stop()


def test_a_build_that_failed_on_a_worker_stops_the_run_with_its_reason():
    master = FakeMaster([node("w1"), node("w2")])
    gate, calls, failures, _ = gate_for(master)
    gate.on_test_start()
    built(gate, "w1", failed=True, why="--dataset-path x.jsonl: no such file")
    assert failures.lines == ["cannot build the workload on worker w1: --dataset-path x.jsonl: no such file"]
    built(gate, "w2")
    assert master.sent == [] and "arm" not in calls, "a failed run is never told go"
    gate.on_test_stop()


def test_a_workers_users_wait_at_the_gate_until_go():
    worker = FakeWorker()
    gate, _, _, workload = gate_for(worker)
    assert workload.gate is gate, "the worker's workload waits on the gate"
    gate.on_test_start()
    user = gevent.spawn(gate.wait)
    gevent.sleep(0.05)
    assert worker.sent == [(BUILT_MESSAGE, {"run_id": RUN, "failed": False})], "built, with the run's id"
    assert not user.ready(), "built is not go: the user still waits"
    worker.handlers[GO_MESSAGE](Message(GO_MESSAGE, {"run_id": RUN}, "master"))
    user.join(timeout=5)
    assert user.ready()


@pytest.mark.parametrize("error, why", [(ValueError("--prompt-tokens 0"), "--prompt-tokens 0"),
                                        (KeyError("surprise"), "KeyError: 'surprise'")])
def test_a_build_that_breaks_tells_the_master_and_lets_the_users_meet_it(error, why):
    def build():
        raise error

    worker = FakeWorker()
    gate, _, _, _ = gate_for(worker, build)
    gate.on_test_start()
    gevent.sleep(0.05)
    assert worker.sent == [(BUILT_MESSAGE, {"run_id": RUN, "failed": True, "why": why})]
    with gevent.Timeout(1, AssertionError("the gate stayed shut after a failed build")):
        gate.wait()


def test_a_worker_that_built_before_hearing_the_run_id_says_built_again_when_it_hears_it():
    # Seen on a busy machine (--processes 2 beside vLLM starting): the workers' plugins attached
    # after their master's spawn, built before the answer to their hello brought the run id, said
    # built under "" and waited for a go that never came: nothing sent, exit 2.
    worker = FakeWorker()
    env = SimpleNamespace(runner=worker, stats=None)
    run = RunStateBroadcast(env)
    run.register(SimpleNamespace(spawning_complete=SimpleNamespace(add_listener=lambda f: None)))
    workload = SimpleNamespace(gate=None, build_all=lambda: None, failed=None)
    gate = BuildGate(env, run, Failures(), workload, None, None)
    gate.register(SimpleNamespace(test_start=SimpleNamespace(add_listener=lambda f: None),
                                  test_stop=SimpleNamespace(add_listener=lambda f: None)))
    gate.on_test_start()  # the late start: no state heard yet
    user = gevent.spawn(gate.wait)
    gevent.sleep(0.05)
    assert worker.sent == [(BUILT_MESSAGE, {"run_id": "", "failed": False})]
    worker.handlers[STATE_MESSAGE](Message(STATE_MESSAGE, {"run_id": RUN, "phase": "measured"}, "master"))
    assert worker.sent[-1] == (BUILT_MESSAGE, {"run_id": RUN, "failed": False}), "said again, under the run's id"
    worker.handlers[STATE_MESSAGE](Message(STATE_MESSAGE, {"run_id": RUN, "phase": "warmup"}, "master"))
    assert len(worker.sent) == 2, "the same run id: not said a third time"
    assert not user.ready()
    worker.handlers[GO_MESSAGE](Message(GO_MESSAGE, {"run_id": RUN}, "master"))
    user.join(timeout=5)
    assert user.ready()
    worker.handlers[STATE_MESSAGE](Message(STATE_MESSAGE, {"run_id": RUN + "-2"}, "master"))
    assert len(worker.sent) == 2, "after go, a new run id is the next run's business"


def test_the_master_answers_built_for_another_run_id_with_the_state_and_does_not_count_it():
    master = FakeMaster([node("w1"), node("w2")])
    gate, calls, _, _ = gate_for(master)
    gate.on_test_start()
    built(gate, "w1", run_id="")
    built(gate, "stranger", run_id="")
    assert calls == ["hold", "state to w1"], "the registered worker is sent the state; a stranger nothing"
    built(gate, "w2")
    assert master.sent == [] and gate.built == {"w2"}, "w1 is still waited for"
    built(gate, "w1")
    assert master.sent == [(GO_MESSAGE, {"run_id": RUN}, None)]
    gate.on_test_stop()


def test_workers_starved_while_building_are_not_called_missing_and_the_run_goes(monkeypatch):
    """CI at ee326b1: both workers of a ``--processes 2`` run, starved of CPU while building, sent no
    heartbeat for four seconds; Locust called the last one missing and stopped the test, and the
    headless run never ended. Workers heard from within MISSING_GRACE_S keep Locust's count."""
    clock = Clock()
    monkeypatch.setattr(workerbuild, "time", clock)
    monkeypatch.setattr(workerbuild, "CHECK_EVERY_S", 0.01)
    workers = [node("w1"), node("w2")]
    master = FakeMaster(workers)
    gate, _, _, _ = gate_for(master)
    heard = {"w1": clock.now, "w2": clock.now}
    gate.heard_at = heard.get
    gate.on_test_start()
    for _second in range(6):  # six seconds of silence, as Locust's heartbeat loop counts them
        clock.now += 1
        for worker in workers:
            worker.heartbeat -= 1
        gevent.sleep(0.05)  # the master's watch looks
        assert all(w.heartbeat >= 0 for w in workers), "Locust would call a starved worker missing"
    built(gate, "w1")
    built(gate, "w2")
    assert master.sent == [(GO_MESSAGE, {"run_id": RUN}, None)]
    clock.now += workerbuild.MISSING_GRACE_S
    workers[0].heartbeat = 0
    gate._keep_alive()
    assert workers[0].heartbeat == 0, "after go Locust's own count stands"
    gate.on_test_stop()


def test_a_worker_silent_past_the_grace_is_given_up_and_left_to_locust(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(workerbuild, "time", clock)
    dead, alive = node("dead"), node("alive")
    master = FakeMaster([alive, dead])
    gate, _, _, _ = gate_for(master)
    heard = {"alive": clock.now, "dead": clock.now}
    gate.heard_at = heard.get
    gate.on_test_start()
    built(gate, "alive")
    clock.now += workerbuild.MISSING_GRACE_S - 1
    assert gate.waiting_for() == ["dead"]
    clock.now += 2
    dead.heartbeat = 0
    gate._keep_alive()
    assert dead.heartbeat == 0, "not kept alive once silent for the grace"
    assert gate.waiting_for() == [], "given up: its silence counts from the last time it was heard"
    gate.on_test_stop()


@pytest.mark.parametrize("headless", [True, False])
def test_a_run_stopped_before_go_ends_when_headless(headless):
    """Its ``-t`` starts at go: a headless run Locust stopped before then (its last worker missing)
    had nothing to end it. A web UI run stays for its next start."""
    master = FakeMaster([node("w1")])
    gate, _, _, _ = gate_for(master)
    gate.environment.parsed_options = SimpleNamespace(headless=headless)
    gate.on_test_start()
    gate.on_test_stop()
    gevent.sleep(0.01)
    assert master.quits == (1 if headless else 0)
    gate.on_test_start()
    built(gate, "w1")
    gate.on_test_stop()
    gevent.sleep(0.01)
    assert master.quits == (1 if headless else 0), "a run that went ends by its own -t"
