"""``-t`` counted from the first request a headless run can send, not from Locust's start.

Locust arms its ``--run-time`` timer as it starts the runner, so the start checks (``/v1/models``)
and the workload's build (a tokenizer, ``/tokenize`` calls, a trace's layout) ran inside ``-t``:
on a busy 2-core machine 4 of a 10 s run sent nothing, against vLLM 15.8 of 20 s, and a short run
could end before any request completed. For a local headless run without a shape the suite takes
the timer over: at ``init`` (before Locust reads the option) it keeps ``-t`` and leaves Locust none;
at test start it gives the option back (records and pages show it) and arms its own timer once
the workload is built (``Workload.on_test_start`` calls ``arm``; on a master, ``BuildGate`` once
every worker has built). A shape's clock is reset instead (``LoadTestShape.reset_time``), and held
at its start while a master waits for its workers' builds (``hold``): a shape ticks on its own
greenlet, and a build longer than the first warm-up had published the measured phase (or ended
the steps) before the clock started over.
"""

from __future__ import annotations

import logging
import time

import gevent
from locust.runners import LocalRunner, MasterRunner

logger = logging.getLogger(__name__)
LOCUST_MAIN = "locust.main"
NO_LIMIT_LINE = "No run time limit set"


class _HideNoLimitLine(logging.Filter):
    """Locust says there is no run-time limit when the suite holds it: a line that would mislead."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(NO_LIMIT_LINE)


class RunClock:
    """The run's ``-t``, when the suite holds it."""

    def __init__(self, environment):
        self.environment = environment
        self.limit_s: float | None = None
        self._timer: gevent.Greenlet | None = None
        self._deadline = 0.0  # time.monotonic() when -t is up, once armed
        self.held = False  # a build is under way: a shape's clock stays at its start until ``arm``
        self.armed_s: float | None = None  # unix seconds the run's time started (``arm``); None before
        self.on_arm: list = []  # called at ``arm``, before the first request (a schedule's settings at 0)
        options = environment.parsed_options
        if (options is not None and getattr(options, "headless", False) and getattr(options, "run_time", None)
                and isinstance(environment.runner, (LocalRunner, MasterRunner)) and environment.shape_class is None):
            self.limit_s = float(options.run_time)
            options.run_time = None  # Locust arms no timer of its own
            logging.getLogger(LOCUST_MAIN).addFilter(_HideNoLimitLine())
            logger.info("Run time limit set to %g seconds, counted from the first request (after the start checks "
                        "and the workload's build)", self.limit_s)

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)
        events.test_stop.add_listener(self.on_test_stop)

    def on_test_start(self, environment, **_kwargs) -> None:
        if self.limit_s is not None:
            environment.parsed_options.run_time = int(self.limit_s)  # the option as given, for records

    def hold(self) -> None:
        """The workers build: a shape's clock stays at its start until ``arm``."""
        self.held = True

    def arm(self, built_s: float) -> None:
        """The workload is built: the run's time starts now (a shape's clock too)."""
        was_held, self.held = self.held, False
        if self.armed_s is None:
            self.armed_s = time.time()
            for listener in self.on_arm:
                listener()
        shape = self.environment.shape_class
        if shape is not None and (built_s > 0 or was_held):
            shape.reset_time()
        if self.limit_s is None or self._timer is not None:
            return
        if built_s >= 1.0:
            logger.info("workload built in %.1f s before the first request (not counted in -t)", built_s)
        self._deadline = time.monotonic() + self.limit_s
        self._timer = gevent.spawn_later(self.limit_s, self._end)

    def _end(self) -> None:
        # The event loop's timers count from its cached time, which a busy loop (a long build, a
        # loaded machine) leaves stale: seen firing 15 ms before -t was up. Whatever is left, waited.
        left = self._deadline - time.monotonic()
        if left > 0:
            self._timer = gevent.spawn_later(left, self._end)
            return
        self._timer = None
        logger.info("--run-time limit reached, shutting down")
        self.environment.runner.quit()

    def on_test_stop(self, **_kwargs) -> None:
        self.held, self.armed_s = False, None
        timer, self._timer = self._timer, None
        if timer is not None and timer is not gevent.getcurrent():
            timer.kill(block=False)
