"""One request, recorded once: ``RequestRecord`` holds everything its rows and events are made of.

The user builds it once, when the request ends, from its identity at send (``RequestInfo``: the
labels in force and the wire clock's send stamp), the stream timer's metrics, what the stream
carried (``StreamResult``), the open-loop arrival and the prompt. ``reporting`` turns it into
Locust events and the recorder into rows (``row_values()``: the ``RequestRow``'s values;
``sample_parts()``: what the ``SampleRow`` rows are made of), so the events, the rows and the
bench-JSON export read the same numbers.
Stdlib only.
"""

from __future__ import annotations

from dataclasses import dataclass

from .outcome import Failure, Outcome
from .schema import E2E, TPOT, RequestRow, SampleRow, names_of


@dataclass(frozen=True, slots=True)
class Labels:
    """The run state a request was sent under (not the state when it ended)."""

    run_id: str
    phase: str
    concurrency: int | None
    step: int | None
    request_rate: float | None = None  # open loop only: the arrival rate it was sent at


@dataclass(frozen=True, slots=True)
class RequestInfo:
    """Who a request's samples belong to: its identity, labels and send instant (both clocks)."""

    labels: Labels
    worker_id: str
    request_id: str
    request_type: str  # Locust's request type: the endpoint ("chat"; paired mode's target b: "chat-b")
    sent_at_s: float  # unix seconds
    sent_perf_s: float  # perf_counter seconds, same instant
    persona: str = ""  # --personas: the persona (Locust user class) that sent it

    @property
    def run_id(self) -> str:
        return self.labels.run_id

    @property
    def phase(self) -> str:
        return self.labels.phase


# The order sample rows are made in (``sample_parts``, the recorder); checked against the schema once, at import.
SAMPLE_ORDER = ("run_id", "worker_id", "request_id", "metric", "value_ms", "t_s", "phase", "concurrency", "step", "tokens",
                "request_rate", "persona")
if names_of(SampleRow) != SAMPLE_ORDER:  # pragma: no cover - fails loudly if the schema changes
    raise ImportError(f"record.SAMPLE_ORDER is out of date with schema.SampleRow: {names_of(SampleRow)}")


# The order ``RequestRecord.row_values`` gives a request row's values in; checked the same way.
REQUEST_ORDER = ("run_id", "worker_id", "request_id", "endpoint", "model", "workload", "prompt_index", "prompt_kind",
                 "sent_at_s", "ttft_ms", "e2e_ms", "prompt_tokens", "completion_tokens", "content_chunks",
                 "finish_reason", "error", "phase", "concurrency", "step", "intended_at_s", "lateness_ms", "queue_ms",
                 "request_rate", "target", "pair_id", "kind", "session_id", "turn", "trimmed_turns", "persona",
                 "ttfr_ms", "ttfa_ms", "reasoning_tokens", "answer_tokens", "tool_call_ms", "tool_args_ms",
                 "tool_calls", "trace_id", "images", "image_bytes")
if names_of(RequestRow) != REQUEST_ORDER:  # pragma: no cover - fails loudly if the schema changes
    raise ImportError(f"record.REQUEST_ORDER is out of date with schema.RequestRow: {names_of(RequestRow)}")


def _rounded(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(slots=True, unsafe_hash=True)
class RequestRecord:
    """One finished request. ``samples``: the stream's ``(metric, value_ms, end_perf_s, tokens)``
    (TTFT, ITL) as measured; E2E and TPOT are its own fields;
    ``failure``: None when it succeeded, else its kind and message (interrupted included).

    Not frozen, though nothing changes it once built: a frozen dataclass sets each of its 35 fields
    through ``object.__setattr__`` (2.7 us per request against 0.6, issue 25). Hashed by its fields
    as the frozen one was (a listener may keep records in a set)."""

    info: RequestInfo
    endpoint: str
    model: str
    workload: str
    prompt_index: int
    prompt_kind: str
    end_perf_s: float
    last_perf_s: float | None  # the last content chunk's arrival (perf_counter s): where E2E ends
    ttft_ms: float | None
    e2e_ms: float | None  # None unless it succeeded
    tpot_ms: float | None
    output_tokens: int | None  # usage's completion tokens, else the content chunks
    prompt_tokens: int | None
    completion_tokens: int | None
    content_chunks: int
    finish_reason: str | None
    failure: Failure | None
    samples: tuple[tuple, ...] = ()
    intended_at_s: float | None = None  # open loop: when the schedule meant it to leave (unix s)
    intended_perf_s: float | None = None  # the same instant on perf_counter
    queue_ms: float | None = None  # open loop: the part of its lateness spent waiting for a free user
    target: str = ""  # paired mode: "a" or "b"
    pair_id: str = ""
    session_id: str = ""  # conversations: its session and turn (from 1), and earlier turns trimmed away
    turn: int | None = None
    trimmed_turns: int | None = None
    ttfr_ms: float | None = None  # stream events past the first token (``schema.RequestRow``)
    ttfa_ms: float | None = None
    reasoning_tokens: int | None = None
    answer_tokens: int | None = None
    tool_call_ms: float | None = None
    tool_args_ms: float | None = None
    tool_calls: int | None = None
    trace_id: str = ""  # the W3C trace id it carried (``tracecontext``)
    images: int | None = None  # image_url parts it sent, and their encoded bytes (--images-per-request)
    image_bytes: int | None = None
    part_samples: tuple[tuple, ...] = ()  # ITL per stream part, as ``samples`` (``StreamResult.events``)

    @property
    def outcome(self) -> Outcome:
        return Outcome.OK if self.failure is None else self.failure.kind

    @property
    def error(self) -> str:
        return "" if self.failure is None else self.failure.message

    @property
    def elapsed_ms(self) -> float:
        """From the send to the request's end (a failure's time; not a metric)."""
        return (self.end_perf_s - self.info.sent_perf_s) * 1000.0

    @property
    def lateness_ms(self) -> float | None:
        """Open loop: from the instant it was due to the instant it left."""
        if self.intended_perf_s is None:
            return None
        return (self.info.sent_perf_s - self.intended_perf_s) * 1000.0

    def row_values(self) -> tuple:
        """The request row's values in its columns' order (``REQUEST_ORDER``), rounded as written: what
        the recorder formats, without a ``RequestRow`` built for each request (``_rounded`` in line)."""
        info, labels = self.info, self.info.labels
        if self.intended_at_s is None:
            open_loop = (None, None, None, None)
        else:
            open_loop = (round(self.intended_at_s, 6), _rounded(self.lateness_ms), _rounded(self.queue_ms),
                         labels.request_rate)
        failure, ttft, e2e = self.failure, self.ttft_ms, self.e2e_ms
        if self.ttfr_ms is None and self.ttfa_ms is None and self.tool_call_ms is None and self.tool_args_ms is None:
            events = (None, None, self.reasoning_tokens, self.answer_tokens, None, None)  # a plain stream's
        else:
            events = (_rounded(self.ttfr_ms), _rounded(self.ttfa_ms), self.reasoning_tokens, self.answer_tokens,
                      _rounded(self.tool_call_ms), _rounded(self.tool_args_ms))
        return (labels.run_id, info.worker_id, info.request_id, self.endpoint, self.model, self.workload,
                self.prompt_index, self.prompt_kind, round(info.sent_at_s, 6), None if ttft is None else round(ttft, 4),
                None if e2e is None else round(e2e, 4), self.prompt_tokens, self.completion_tokens, self.content_chunks,
                self.finish_reason, "" if failure is None else failure.message, labels.phase, labels.concurrency,
                labels.step, *open_loop, self.target, self.pair_id,
                Outcome.OK._value_ if failure is None else failure.kind._value_, self.session_id, self.turn,
                self.trimmed_turns, info.persona, *events, self.tool_calls, self.trace_id, self.images, self.image_bytes)

    def sample_parts(self) -> tuple[tuple, tuple, tuple, float, tuple[tuple, ...]]:
        """What the sample rows are made of (``SAMPLE_ORDER``): the fields every row of this request
        shares, before ``metric`` (run_id, worker_id, request_id), between ``t_s`` and ``tokens``
        (phase, concurrency, step) and after them (request_rate, persona); the offset from
        perf_counter to unix seconds; and the samples ``(metric, value_ms, end_perf_s, tokens)``
        unrounded, a success's E2E and TPOT last. The recorder formats them once per request."""
        info, labels = self.info, self.info.labels
        samples = (self.samples + self.part_samples) if self.part_samples else self.samples
        if self.failure is None and self.e2e_ms is not None:  # a success's own samples end with it
            samples += ((E2E, self.e2e_ms, self.last_perf_s, self.output_tokens),)
            if self.tpot_ms is not None:
                samples += ((TPOT, self.tpot_ms, self.last_perf_s, self.output_tokens),)
        return ((labels.run_id, info.worker_id, info.request_id), (labels.phase, labels.concurrency, labels.step),
                (labels.request_rate, info.persona), info.sent_at_s - info.sent_perf_s, samples)
