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
