"""How a run fails: stopped at once with one line and exit code 2, or judged at its end.

``RunFailures`` is every concern's way to stop the run (a bad option, no server, a full disk, a
workload that cannot be built); ``Verdict`` sets the exit code at test stop from
``--max-failure-ratio`` and from whether anything completed at all.
"""

from __future__ import annotations

import logging
import time

import gevent
from locust.runners import WorkerRunner

from .completion import FailureKinds, nothing_completed

logger = logging.getLogger(__name__)


class RunFailures:
    """Stops the run: one line, exit code 2, what was measured is kept."""

    def __init__(self, environment):
        self.environment = environment
        self.first: dict[str, str] = {}  # kind of failure said once a run ("write", "workload"): its first line
        self.failed = False  # this run was stopped: the later steps of its start are skipped

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)

    def on_test_start(self, **_kwargs) -> None:
        self.first.clear()
        self.failed = False

    def fail_run(self, message: str, *, once: str | None = None, workers_quit: bool = True) -> None:
        """Stop the whole run with one line and exit code 2. ``once``: a kind of failure that many
        users or files can hit together, said only by the first of them. ``workers_quit=False``:
        a worker whose users stop by themselves leaves the quitting to its master."""
        if once is not None:
            if once in self.first:
                return
            self.first[once] = message
        self.failed = True
        logger.error("%s", message)
        self.environment.process_exit_code = 2
        runner = self.environment.runner
        if runner is not None and (workers_quit or not isinstance(runner, WorkerRunner)):
            gevent.spawn_later(0, runner.quit)

    def write_failed(self, message: str) -> None:
        """A file of the run cannot be written (a full disk): the recorder, the scraper child and the
        master's copy of its workers' rows each say so here; the first stops the run (exit 2)."""
        self.fail_run(message, once="write")


class Verdict:
    """The deciding process's exit code at test stop."""

    def __init__(self, environment, run):
        self.environment = environment
        self.run = run

    def register(self, events) -> None:
        events.test_stop.add_listener(self.on_test_stop)
        events.quitting.add_listener(self.on_quitting)
        FailureKinds.register(self.environment)  # failures by kind, over every process (``completion``)

    def on_test_stop(self, **_kwargs) -> None:
        if self.run.deciding:
            self.judge()

    def on_quitting(self, **_kwargs) -> None:
        """A master stopped while its start checks ran never fired ``test_stop`` (its runner had not
        left its initial state): it exited 0, nothing measured. Said here, once, if still unsaid."""
        if self.run.deciding and self.run.checking_since_s is not None:
            self.ended_in_checks()

    def ended_in_checks(self) -> bool:
        if self.environment.process_exit_code is not None or self.run.checking_since_s is None:
            return False
        logger.error("the run ended %.1f s into its start checks (GET /v1/models, the model's fit), before "
                     "anything was sent: the server answered more slowly than the run lasted (-t, or a stop); "
                     "nothing was measured: exit code 2", time.time() - self.run.checking_since_s)
        self.environment.process_exit_code = 2
        return True

    def judge(self) -> None:
        """``--max-failure-ratio``: the exit code says whether the run failed too often. A run that
        completed no request at all measured nothing, whatever ratio was allowed: one line, exit 2."""
        environment = self.environment
        limit = float(getattr(environment.parsed_options, "max_failure_ratio", -1.0) or 0.0)
        if self.ended_in_checks():
            return
        if environment.process_exit_code is None and self.run.started_s is not None:
            nothing = nothing_completed(environment.stats, FailureKinds.of(environment))
            if nothing:
                logger.error("%s: exit code 2", nothing)
                environment.process_exit_code = 2
                return
        if limit < 0 or environment.process_exit_code is not None:
            return
        total = environment.stats.total
        ratio = total.fail_ratio if total.num_requests else 0.0
        environment.process_exit_code = 0 if ratio <= limit else 1
        if ratio > limit:
            logger.error("%d of %d requests failed (%.1f%%), more than --max-failure-ratio %g: exit code 1",
                         total.num_failures, total.num_requests, 100 * ratio, limit)
