"""The client's audit of itself (``audit.ClientAudit``) during a run, and its one-line warning.

Each sending process audits its own event loop while its users run; at test stop it says once
when the measured phase's loop lag p99 exceeded ``--max-loop-lag-ms``: its TTFT/ITL are late too.
"""

from __future__ import annotations

import logging
from typing import Callable

from ...core.schema import LOOP_LAG_MS, MEASURED, ClientRow
from .audit import TICK_S, ClientAudit, in_processes, lag_advice

logger = logging.getLogger(__name__)


def implied_lateness_ms(lags_ms: list[float], q: float, tick_ms: float = TICK_S * 1000) -> float:
    """The ``q`` quantile (0-1) of how late a stamp taken at a random instant is, from the audit's lag.

    Each audit tick asks to sleep ``tick_ms`` and wakes ``lag`` ms late: the tick spans
    ``tick_ms + lag`` ms of wall time, of which the last ``lag`` ms the loop was stalled. A chunk
    that arrives ``s`` ms into a stall of ``lag`` ms is stamped ``lag - s`` late (uniform: L/2 on
    average, up to L); one that arrives outside a stall is on time. Over all ticks, with arrivals
    spread evenly in time, P(late > e) = sum(max(0, lag - e)) / sum(tick_ms + lag); the quantile is
    the e where that equals 1 - q. So only the share of time spent stalled moves a percentile: a few
    30 ms stalls make lag p99 30 ms but leave most stamps on time. It is an estimate for stamps spread
    evenly in time: a closed-loop wave's first chunks come together just after its setup's stall,
    so TTFT can be later than it says (``benchmarks/measurement_error.py`` prints both).
    """
    total = sum(tick_ms + lag for lag in lags_ms)
    if total <= 0 or not lags_ms:
        return 0.0
    want = (1.0 - q) * total  # the wall time (ms) in which a stamp is later than the answer
    lags = sorted(lags_ms, reverse=True)
    # sum(max(0, lag - e)) is piecewise linear in e, falling; walk its pieces from the largest lag.
    above = 0.0  # sum of the lags above the current piece
    for k, lag in enumerate(lags, start=1):
        above += lag
        nxt = lags[k] if k < len(lags) else 0.0
        if above - k * nxt >= want:  # the answer lies in [nxt, lag]: above - k * e = want
            return max(0.0, (above - want) / k)
    return 0.0


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
            logger.warning("client fell behind: event-loop lag p99 %.2f ms > %g ms (--max-loop-lag-ms) in %s; by "
                           "the time it spent stalled its stamps are late by about %.2f ms at p95 and %.2f ms at p99 "
                           "(TTFT/ITL percentiles read that much high; a wave of requests starting together, more): %s",
                           p99, limit, self.worker_id, implied_lateness_ms(lags, 0.95), implied_lateness_ms(lags, 0.99),
                           advice)
