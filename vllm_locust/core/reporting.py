"""Hand one request's samples on: each to Locust's stats as it happens, all to the recorder at its end.

One ``events.request.fire`` per sample (``name`` is the metric, so TTFT/ITL/TPOT/E2E are rows of
Locust's stats and ``--csv`` files; ``response_length`` is the tokens the sample covers). The
keyword arguments that do not change within a request are built once. Warm-up samples are
recorded, labelled ``warmup``, but never reach Locust's stats: that is what discarding them means.
Raw rows are kept as plain tuples and written with the request row, so a chunk costs a tuple
and the recorder one write per request.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import E2E, MEASURED, RequestRow, SampleRow, names_of


@dataclass(frozen=True)
class RequestInfo:
    """Who a sample belongs to and the run state when its request was sent."""

    run_id: str
    worker_id: str
    request_id: str
    request_type: str
    phase: str
    concurrency: int | None
    step: int | None
    sent_at_s: float  # unix seconds
    sent_perf_s: float  # perf_counter seconds, same instant
    request_rate: float | None = None  # open loop: the arrival rate it was sent at


# The order ``close`` builds sample rows in; checked against the schema once, at import.
SAMPLE_ORDER = ("run_id", "worker_id", "request_id", "metric", "value_ms", "t_s", "phase", "concurrency", "step", "tokens",
                "request_rate")
if names_of(SampleRow) != SAMPLE_ORDER:  # pragma: no cover - fails loudly if the schema changes
    raise ImportError(f"reporting.SAMPLE_ORDER is out of date with schema.SampleRow: {names_of(SampleRow)}")


class RequestReport:
    """The samples of one request: fired to Locust as they come, rows kept for the recorder."""

    __slots__ = ("info", "recorder", "rows", "_fire", "_event", "_measured", "_window")

    def __init__(self, environment, recorder, info: RequestInfo, window=None):
        self.info = info
        self.recorder = recorder
        self.rows: list[tuple] = []  # (metric, value_ms, end_perf_s, tokens)
        self._fire = environment.events.request.fire
        self._measured = info.phase == MEASURED
        # The live charts' raw values (``client_window``): measured samples only, as Locust's stats.
        self._window = window.add if window is not None and self._measured else None
        self._event = dict(request_type=info.request_type, exception=None,
                           context={"request_id": info.request_id, "worker_id": info.worker_id, "run_id": info.run_id})

    def sample(self, metric: str, value_ms: float, end_perf_s: float, tokens: int | None = None) -> None:
        if self.recorder is not None:
            self.rows.append((metric, value_ms, end_perf_s, tokens))
        if self._measured:
            self._fire(name=metric, response_time=value_ms, response_length=1 if tokens is None else tokens, **self._event)
            if self._window is not None:
                self._window(metric, value_ms)

    def failure(self, elapsed_ms: float, exception: Exception) -> None:
        """A failed request: an ``E2E`` failure in Locust; its earlier samples stand as reported.
        Its time stays out of Locust's E2E percentiles (``response_time=None``: counted, not
        timed): a dead server's instant refusals had pulled them to 0 ms. The row keeps it."""
        if self._measured:
            self._fire(**{**self._event, "name": E2E, "response_time": None, "response_length": 0,
                          "exception": exception})

    def close(self, row: RequestRow) -> None:
        """Write the request's sample rows and its request row."""
        if self.recorder is not None:
            self.recorder.sample_values(row.run_id, self.sample_values())
            self.recorder.request(row)
            self.rows = []

    def sample_values(self) -> list[tuple]:
        """The kept samples as ``SampleRow`` field tuples (``SAMPLE_ORDER``), rounded as written."""
        i = self.info
        offset = i.sent_at_s - i.sent_perf_s  # perf_counter -> unix seconds
        return [(i.run_id, i.worker_id, i.request_id, metric, round(value, 4), round(end + offset, 6),
                 i.phase, i.concurrency, i.step, tokens, i.request_rate) for metric, value, end, tokens in self.rows]
