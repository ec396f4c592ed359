"""The client's audit of itself (``audit.ClientAudit``) during a run, and its one-line warning.

Each sending process audits its own event loop while its users run; at test stop it says once
when the measured phase's loop lag p99 exceeded ``--max-loop-lag-ms``: its TTFT/ITL are late too.
"""

from __future__ import annotations

import logging
from typing import Callable

from ..core.schema import LOOP_LAG_MS, MEASURED, ClientRow
from .audit import ClientAudit, in_processes, lag_advice

logger = logging.getLogger(__name__)


class SelfAudit:
    """This process's ``ClientAudit`` (None on a master and between runs) and its lag verdict."""

    def __init__(self, environment, worker_id: str, run, write: Callable[[ClientRow], None], failures=None):
        self.environment = environment
        self.worker_id = worker_id
        self.run = run
        self.write = write  # where the audit's rows go (the recorder's client file)
        self.failures = failures
        self.audit: ClientAudit | None = None
        self.measured_lag_ms: list[float] = []

    def register(self, events) -> None:
        events.test_start.add_listener(self.on_test_start)
        events.test_stopping.add_listener(self.stop)  # the teardown's loop lag is not the measured run's
        events.test_stop.add_listener(self.on_test_stop)
        events.quitting.add_listener(self.stop)

    def on_test_start(self, **_kwargs) -> None:
        if not self.run.records_samples or (self.failures is not None and self.failures.failed):
            return
        self.measured_lag_ms = []
        self.audit = ClientAudit(self.client_row, self.labels)
        self.audit.start()

    def on_test_stop(self, **_kwargs) -> None:
        if self.audit is not None:
            self.audit.stop()
            self.warn_if_late()

    def stop(self, **_kwargs) -> None:
        if self.audit is not None:
            self.audit.stop()

    def labels(self) -> tuple:
        s = self.run.state
        return s.run_id, self.worker_id, s.phase, s.concurrency, s.step

    def client_row(self, row: ClientRow) -> None:
        if row.metric == LOOP_LAG_MS and row.phase == MEASURED:
            self.measured_lag_ms.append(row.value)
        self.write(row)

    def chunk(self) -> None:
        """A content chunk arrived (``chunks_per_s``)."""
        if self.audit is not None:
            self.audit.chunks += 1

    def first_send(self, ms: float) -> None:
        """A user's spawn to its first request on the wire, in ms (once per user)."""
        if self.audit is not None:
            self.audit.spawn_to_send(ms)

    def warn_if_late(self) -> None:
        """One line when this process's loop ran late in the measured phase: its numbers are too."""
        lags = sorted(self.measured_lag_ms)
        if not lags:
            return
        p99 = lags[min(len(lags) - 1, int(0.99 * len(lags)))]
        limit = float(getattr(self.environment.parsed_options, "max_loop_lag_ms", 2.0) or 2.0)
        if p99 > limit:
            advice = lag_advice(in_processes(self.environment.runner, self.environment.parsed_options))
            logger.warning("client fell behind: event-loop lag p99 %.2f ms > %g ms (--max-loop-lag-ms) in %s; its "
                           "TTFT/ITL are late by about that much: %s", p99, limit, self.worker_id, advice)
