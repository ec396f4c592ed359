"""A request's sinks: each sample to Locust's stats (and the live charts) as it happens, its record to
the recorder at its end. The core builds the record and touches no Locust object; this is the
Locust wing's side of a request (it was ``core/reporting.py``, Locust's work in the core: issue 40).

One ``events.request.fire`` per sample (``name`` is the metric, so TTFT/ITL/TPOT/E2E are rows of
Locust's stats and ``--csv`` files; ``response_length`` is the tokens the sample covers). The
keyword arguments that do not change within a request are built once. While the runner's own
listener is the event's only one, a sample goes straight to what that listener calls (``log``).
Warm-up samples are recorded, labelled ``warmup``, but never reach Locust's stats: that is what
discarding them means.
Raw samples are kept as plain tuples and leave with the request's ``RequestRecord``, so a chunk
costs a tuple and the recorder one checked write per request.
"""

from __future__ import annotations

from ...core.outcome import Outcome, RequestFailure
from ...core.record import RequestInfo, RequestRecord
from ...core.schema import E2E, ITL, MEASURED, TOOL_ARGS, TOOL_CALL, TPOT, TTFA, TTFR
from ...core.slo import percentile

# Stream events past the first token, fired once per request at its end: (metric, the record's
# field, its field of tokens for ``response_length``). TOOL_ARGS only for a success: a stream
# that broke off had no complete arguments.
STREAM_EVENTS = ((TTFR, "ttfr_ms", "reasoning_tokens"), (TTFA, "ttfa_ms", "answer_tokens"),
                 (TOOL_CALL, "tool_call_ms", "tool_calls"), (TOOL_ARGS, "tool_args_ms", "tool_calls"))

__all__ = ["RequestInfo", "RequestReport"]


def _reraise() -> None:
    raise  # noqa: PLE0704 - called in an ``except`` block: that exception goes on


class RequestReport:
    """The samples of one request: fired to Locust as they come, kept for its record."""

    __slots__ = ("info", "recorder", "rows", "_fire", "_log", "_listeners", "_log_failed", "_event", "_measured",
                 "_window", "_failures")

    def __init__(self, environment, recorder, info: RequestInfo, window=None, failures=None, log=None,
                 listeners=None, log_failed=None):
        """``window``: the live charts' values (``add(metric, ms)``); ``failures``: the run's
        failures by kind (``add(Outcome)``, ``plugin.completion.FailureKinds``); ``log``: the
        stats' ``log_request(request_type, name, ms, length)`` when the request event's only
        listener, in the live list ``listeners``, is the runner's own, which does just that for a
        sample (``buckets.sample_log``): a sample then skips the event's dispatch while that list
        holds one listener; ``log_failed()`` is called in the ``except`` block if ``log`` raises
        (``buckets.listener_failed``: what the event does with a raising listener; here: re-raised).
        Failures are always fired."""
        self.info = info
        self._failures = failures
        self.recorder = recorder
        self.rows: list[tuple] = []  # (metric, value_ms, end_perf_s, tokens)
        self._fire = environment.events.request.fire
        self._log = log
        self._listeners = listeners if log is not None else None
        self._log_failed = log_failed or _reraise
        self._measured = info.labels.phase == MEASURED
        # The live charts' raw values and the live SLO judgement's figures (``client_window``):
        # measured samples only, as Locust's stats.
        self._window = window if window is not None and self._measured else None
        self._event: dict | None = None if log is not None else self._event_fields()

    def _event_fields(self) -> dict:
        """The request event's keyword arguments that are the same for every sample of the request
        (made once a sample is fired: a report on the direct path may never need them)."""
        info = self.info
        self._event = dict(request_type=info.request_type, exception=None,
                           context={"request_id": info.request_id, "worker_id": info.worker_id,
                                    "run_id": info.labels.run_id})
        return self._event

    def sample(self, metric: str, value_ms: float, end_perf_s: float, tokens: int | None = None) -> None:
        if self.recorder is not None:
            self.rows.append((metric, value_ms, end_perf_s, tokens))
        if self._measured:
            self._measured_sample(metric, value_ms, tokens)

    def failure(self, exception: Exception) -> None:
        """A failed request: an ``E2E`` failure in Locust; its earlier samples stand as reported.
        Its time stays out of Locust's E2E percentiles (``response_time=None``: counted, not
        timed): a dead server's instant refusals had pulled them to 0 ms. The row keeps it."""
        if self._measured:
            self._fire(**{**(self._event or self._event_fields()), "name": E2E, "response_time": None,
                          "response_length": 0, "exception": exception})
            if self._failures is not None:
                self._failures.add(getattr(exception, "kind", Outcome.OTHER))

    def samples(self) -> tuple[tuple, ...]:
        """The kept samples (for the record), emptied here."""
        rows, self.rows = tuple(self.rows), []
        return rows

    def finish(self, record: RequestRecord) -> None:
        """The request's end: E2E and TPOT (success) or one failure (not for an interrupted
        request: the run's end is not the server's failure) to Locust, then the record to the
        recorder. The record's own rows carry E2E and TPOT (``RequestRecord.sample_parts``).
        A request answered in one body (embeddings) has no samples and no TPOT: E2E alone."""
        outcome = record.outcome
        if self._measured:
            if record.answer_tokens is not None or record.tool_calls is not None:  # not for a plain stream
                self._stream_events(record, outcome is Outcome.OK)
                for metric, value, _end, tokens in record.part_samples:  # ITL per part: as ITL, whatever the outcome
                    self._measured_sample(metric, value, tokens)
            if outcome is Outcome.OK:
                tokens = record.output_tokens
                self._measured_sample(E2E, record.e2e_ms, tokens)
                if record.tpot_ms is not None:
                    self._measured_sample(TPOT, record.tpot_ms, tokens)
            elif outcome is not Outcome.INTERRUPTED:
                self.failure(RequestFailure(record.failure))
            if self._window is not None and outcome is not Outcome.INTERRUPTED:
                self._window_request(record, outcome is Outcome.OK)
        self.close(record)

    def _window_request(self, record: RequestRecord, ok: bool) -> None:
        """The request's figures for a live SLO judgement (``ClientWindow.add_request``): TTFT and
        E2E from the instant it was due (open loop), TPOT and its own p95 gap."""
        late = record.lateness_ms or 0.0
        gaps = sorted(value for metric, value, _end, _tokens in record.samples if metric == ITL)
        self._window.add_request(self.info.persona, self.info.labels.step, ok,
                                 None if record.ttft_ms is None else record.ttft_ms + late,
                                 None if record.e2e_ms is None else record.e2e_ms + late, record.tpot_ms,
                                 percentile(gaps, 95))

    def _stream_events(self, record: RequestRecord, ok: bool) -> None:
        """TTFR, TTFA, TOOL_CALL (whenever they happened, as TTFT) and TOOL_ARGS (a success's) to Locust."""
        for metric, name, tokens in STREAM_EVENTS:
            value = getattr(record, name)
            if value is not None and (ok or metric != TOOL_ARGS):
                self._measured_sample(metric, value, getattr(record, tokens))

    def _measured_sample(self, metric: str, value_ms: float, tokens: int | None) -> None:
        """One measured sample to Locust's stats (the direct path or the event) and the live charts."""
        if self._log is not None and len(self._listeners) == 1:
            try:
                self._log(self.info.request_type, metric, value_ms, 1 if tokens is None else tokens)
            except Exception:  # noqa: BLE001 - handled as the event handles a raising listener
                self._log_failed()
        else:
            self._fire(name=metric, response_time=value_ms, response_length=1 if tokens is None else tokens,
                       **(self._event or self._event_fields()))
        if self._window is not None:
            self._window.add(metric, value_ms, self.info.labels.step)

    def close(self, record: RequestRecord) -> None:
        """Write the request's sample rows and its request row."""
        if self.recorder is not None:
            self.recorder.record(record)
