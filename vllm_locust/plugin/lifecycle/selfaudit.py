"""The client's audit of itself (``audit.ClientAudit``) during a run, and its one-line warning.

Each sending process audits its own event loop while its users run; at test stop it says once
when the errors the measured phase's loop lag implies pass the trust rule's limits (``core.trust``),
or the lag's p99 a ``--max-loop-lag-ms`` the user set: its TTFT/ITL are late too.
"""

from __future__ import annotations

import logging
from typing import Callable

from ...core.schema import LOOP_LAG_MS, MEASURED, ClientRow
from ...core.trust import implied_errors, implied_lateness_ms, quantile
from .audit import TICK_S, ClientAudit, in_processes, lag_advice

logger = logging.getLogger(__name__)


class SelfAudit:
    """This process's ``ClientAudit`` (None on a master and between runs) and its lag verdict."""

    def __init__(self, environment, worker_id: str, run, write: Callable[[ClientRow], None], failures=None,
                 gauges=None):
        self.environment = environment
        self.worker_id = worker_id
        self.run = run
        self.write = write  # where the audit's rows go (the recorder's client file)
        self.failures = failures
        self.gauges = gauges  # ``prometheus.LiveGauges``: the latest lag and CPU, the largest lateness (live)
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
        if self.gauges is not None:
            self.gauges.client_row(row.metric, row.value)
        self.write(row)

    def request_done(self, record) -> None:
        """A request's record: its send lateness and client queue time for the live gauges."""
        if self.gauges is not None and record.intended_perf_s is not None:
            self.gauges.request(record.lateness_ms, record.queue_ms)

    def chunk(self) -> None:
        """A content chunk arrived (``chunks_per_s``)."""
        if self.audit is not None:
            self.audit.chunks += 1

    def first_send(self, ms: float) -> None:
        """A user's spawn to its first request on the wire, in ms (once per user)."""
        if self.audit is not None:
            self.audit.spawn_to_send(ms)

    def warn_if_late(self) -> None:
        """One line when this process's loop ran so late in the measured phase that the errors it implies
        pass the trust rule's limits (``core.trust``), or its lag p99 a ceiling the user set."""
        implied = implied_errors(self.measured_lag_ms)
        if implied is None:
            return
        lags = self.measured_lag_ms
        p99 = quantile(lags, 99)
        limit = float(getattr(self.environment.parsed_options, "max_loop_lag_ms", 0.0) or 0.0)
        over_limit = limit > 0 and p99 > limit
        if implied.trusted and not over_limit:
            return
        advice = lag_advice(in_processes(self.environment.runner, self.environment.parsed_options))
        tick_ms = TICK_S * 1000
        logger.warning("client fell behind in %s: event-loop lag p95 %.2f ms, p99 %.2f ms%s: %s; %.1f%% of its time "
                       "in stalls (stamps at p99 late by %.2f ms from those alone): %s", self.worker_id,
                       quantile(lags, 95), p99, f" (over --max-loop-lag-ms {limit:g})" if over_limit else "",
                       implied.text(), 100.0 * sum(lags) / (len(lags) * tick_ms + sum(lags)),
                       implied_lateness_ms(lags, 0.99, tick_ms), advice)
