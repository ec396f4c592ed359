"""Hand samples on: every sample to the raw-sample recorder, measured ones to Locust's stats.

One ``events.request.fire`` per sample (``name`` is the metric, so TTFT/ITL/TPOT/E2E are rows of
Locust's stats and ``--csv`` files). Warm-up samples are recorded, labelled ``warmup``, but never
reach Locust's stats: that is what discarding them means.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import E2E, MEASURED, RequestRow, SampleRow


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

    def wall(self, perf_s: float) -> float:
        return self.sent_at_s + (perf_s - self.sent_perf_s)


class Reporter:
    """Records and fires the samples of one process's requests."""

    def __init__(self, environment, recorder):
        self.environment = environment
        self.recorder = recorder

    def sample(self, info: RequestInfo, metric: str, value_ms: float, end_perf_s: float, length: int = 1) -> None:
        if self.recorder is not None:
            self.recorder.sample(SampleRow(
                run_id=info.run_id, worker_id=info.worker_id, request_id=info.request_id, metric=metric,
                value_ms=round(value_ms, 4), t_s=round(info.wall(end_perf_s), 6), phase=info.phase,
                concurrency=info.concurrency, step=info.step))
        if info.phase == MEASURED:
            self.fire(info, metric, value_ms, length, None)

    def failure(self, info: RequestInfo, elapsed_ms: float, exception: Exception) -> None:
        """A failed request: an ``E2E`` failure in Locust; its earlier samples stand as reported."""
        if info.phase == MEASURED:
            self.fire(info, E2E, elapsed_ms, 0, exception)

    def request(self, row: RequestRow) -> None:
        if self.recorder is not None:
            self.recorder.request(row)

    def fire(self, info: RequestInfo, name: str, value_ms: float, length: int, exception) -> None:
        self.environment.events.request.fire(
            request_type=info.request_type,
            name=name,
            response_time=value_ms,
            response_length=length,
            exception=exception,
            context={"request_id": info.request_id, "worker_id": info.worker_id, "run_id": info.run_id},
        )
