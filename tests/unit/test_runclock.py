"""A local run's workload is built at test start and its ``-t`` armed after it (``runclock``): the
clock is armed even when the build breaks in a way no check foresaw, or the run would never end."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_locust.plugin.workload import Workload


class Clock:
    def __init__(self):
        self.armed: list[float] = []

    def arm(self, built_s: float) -> None:
        self.armed.append(built_s)


def workload(raises: BaseException | None):
    run = SimpleNamespace(deciding=True, records_samples=True, restarted=0)
    run.restart = lambda: setattr(run, "restarted", run.restarted + 1)
    failures = SimpleNamespace(failed=False, said=[])
    clock = Clock()
    w = Workload(SimpleNamespace(), failures, run, (), clock)
    w.failed = failures.said.append

    def context(*_args, **_kwargs):
        if raises is not None:
            raise raises
    w.context = context
    return w, run, failures, clock


def test_a_built_workload_restarts_the_run_and_arms_the_clock():
    w, run, failures, clock = workload(None)
    w.on_test_start()
    assert run.restarted == 1 and len(clock.armed) == 1 and not failures.said


def test_a_workload_that_cannot_be_built_is_one_line_and_no_clock():
    w, run, failures, clock = workload(ValueError("bad file"))
    w.on_test_start()
    assert [str(e) for e in failures.said] == ["bad file"] and clock.armed == [] and run.restarted == 0


def test_an_unforeseen_failure_still_arms_the_clock():
    w, run, failures, clock = workload(RuntimeError("boom"))
    with pytest.raises(RuntimeError):
        w.on_test_start()
    assert len(clock.armed) == 1, "-t still ends the run"


def test_a_timer_that_fires_early_waits_out_what_is_left_of_t():
    """The loop's timers count from its cached time: on a loaded machine -t's timer fired 15 ms
    before -t was up (a window of 2.985 s for -t 3s). An early call waits out the rest."""
    import time

    import gevent

    from vllm_locust.plugin.loads.runclock import RunClock

    quits: list[float] = []
    env = SimpleNamespace(parsed_options=None, shape_class=None, runner=SimpleNamespace(quit=lambda: quits.append(time.monotonic())))
    clock = RunClock(env)
    clock.limit_s = 0.3
    clock.arm(0.0)
    deadline = clock._deadline  # -t's end as armed (a later monotonic() + 0.3 fell ms after it on a busy machine)
    clock._timer.kill()
    clock._end()  # the armed timer, firing before its time
    assert quits == [], "not yet: -t is not up"
    with gevent.Timeout(5, AssertionError("-t never ended the run")):
        while not quits:
            gevent.sleep(0.01)
    assert quits[0] >= deadline and len(quits) == 1
