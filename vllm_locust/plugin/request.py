"""One request's way through a user, in stages: send it on the user's clock (``StreamClient`` seam),
decode and time its stream, then record it once, however it ended, into its sinks (``reporting``:
Locust's stats, the live charts, the raw rows; the self-audit's chunk count).

``PlannedRequest`` is what a task's request is (built once, shared by paired mode's two legs);
``RequestPipeline`` (one per user) sends one leg and records it.
"""

from __future__ import annotations

import itertools
import logging
import time
import weakref

from gevent import GreenletExit

from ..backend.client import classify, connection_refused, is_client_error, retry_after_s
from ..backend.endpoints import Endpoint
from ..backend.wire import WireClock
from ..core.metrics import StreamTimer, ms_between
from ..core.outcome import INTERRUPTED_FAILURE, Failure, Outcome
from ..core.record import Labels, RequestInfo, RequestRecord
from ..core.sse import DEFAULT_MAX_EVENT_BYTES
from ..core.stream import StreamError, StreamLimits, StreamResult
from .records.buckets import listener_failed, sample_log
from .lifecycle.completion import FailureKinds
from .context import LoadContext
from .loads.pacer import Arrival
from .records.reporting import RequestReport

logger = logging.getLogger(__name__)
# Request numbers, one sequence per plugin (per process and run environment): ids stay unique
# among a process's users, and a fresh environment (a test's) starts again at 1.
_numbers: "weakref.WeakKeyDictionary[object, itertools.count]" = weakref.WeakKeyDictionary()


def request_numbers(plugin) -> itertools.count:
    numbers = _numbers.get(plugin)
    if numbers is None:
        numbers = _numbers[plugin] = itertools.count(1)
    return numbers


class PlannedRequest:
    """What one task's request is, whichever server(s) it goes to: built once, shared by the legs."""

    __slots__ = ("ctx", "api", "body", "prompt", "max_tokens", "labels", "arrival", "number", "trace_id", "span",
                 "images")

    def __init__(self, ctx: LoadContext, api: Endpoint, body: dict, prompt, max_tokens: int, labels: Labels,
                 arrival: Arrival | None, number: int, trace_id: str = "", span=None, images: tuple | None = None):
        self.ctx, self.api, self.body, self.prompt, self.max_tokens = ctx, api, body, prompt, max_tokens
        self.labels, self.arrival, self.number, self.trace_id = labels, arrival, number, trace_id
        self.span = span  # --otel: the request's client span (``spans.clientspans``), ended with its record
        self.images = images  # (image_url parts, their encoded bytes) with --images-per-request

    def record(self, report: RequestReport, timer: StreamTimer, result: StreamResult, failure: Failure | None,
               end_perf_s: float, target: str) -> RequestRecord:
        """The one record of this request on one server, from the timer, the stream and the arrival."""
        tokens = result.completion_tokens if result.completion_tokens is not None else result.content_chunks
        measured = timer.finish(tokens)
        ok, prompt = failure is None, self.prompt
        record = self._record(
            report, failure, end_perf_s, target, last_perf_s=timer.last_s, ttft_ms=measured.ttft_ms,
            e2e_ms=measured.e2e_ms if ok else None, tpot_ms=measured.tpot_ms if ok else None, output_tokens=tokens,
            prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
            content_chunks=result.content_chunks, finish_reason=result.finish_reason, samples=report.samples(),
            session_id=prompt.session_id or "", turn=prompt.turn, trimmed_turns=prompt.trimmed_turns)
        if result.parts is not None:  # reasoning or tool calls: the stream events' fields (a plain stream has none)
            for name, value in result.events(report.info.sent_perf_s).items():
                setattr(record, name, value)
        return record

    def reply_record(self, report: RequestReport, reply, failure: Failure | None, end_perf_s: float,
                     target: str) -> RequestRecord:
        """The record of a request answered in one body (``embeddings.Reply``; None when it failed):
        E2E to the body's last bytes, no TTFT; ``content_chunks`` holds the inputs it embedded,
        ``completion_tokens`` 0 (nothing generated), ``prompt_tokens`` the batch's by usage."""
        ok = failure is None and reply is not None
        return self._record(
            report, failure, end_perf_s, target, last_perf_s=reply.end_perf_s if ok else None, ttft_ms=None,
            e2e_ms=ms_between(report.info.sent_perf_s, reply.end_perf_s) if ok else None, tpot_ms=None,
            output_tokens=0, prompt_tokens=reply.prompt_tokens if ok else None, completion_tokens=0 if ok else None,
            content_chunks=reply.inputs if ok else 0, finish_reason="stop" if ok else None)

    def _record(self, report: RequestReport, failure: Failure | None, end_perf_s: float, target: str,
                **measured) -> RequestRecord:
        """What every record of this request shares (who, which prompt, the arrival, the pair), and
        what was ``measured``."""
        info, arrival = report.info, self.arrival
        return RequestRecord(
            info=info, endpoint=self.api.name, model=self.ctx.model, workload=self.ctx.spec.name,
            prompt_index=self.prompt.index, prompt_kind=self.prompt.kind, end_perf_s=end_perf_s, failure=failure,
            intended_at_s=None if arrival is None else arrival.intended_at_s,
            intended_perf_s=None if arrival is None else arrival.intended_perf_s,
            queue_ms=None if arrival is None else arrival.queue_ms,
            target=target, pair_id=f"{info.worker_id}:{self.number}" if target else "", trace_id=self.trace_id,
            images=self.images[0] if self.images else None, image_bytes=self.images[1] if self.images else None,
            **measured)


class RequestPipeline:
    """A user's requests, one leg at a time: sent, timed, recorded once into the sinks."""

    def __init__(self, user):
        self.user = user  # its ``options`` (a persona's view) and ``persona_name``, read per request
        self.environment, self.plugin = user.environment, user.plugin
        self.failure_kinds = FailureKinds.of(user.environment)
        self.spawned_perf_s = time.perf_counter()
        self.first_sent = False  # spawn-to-first-send is recorded once per user
        self.limits: StreamLimits | None = None  # the last request's (``limits_for``)

    def info(self, request: PlannedRequest, wire: WireClock, target: str) -> RequestInfo:
        """Identity and labels of the request now on the wire (its clock stamped the send)."""
        worker_id = self.plugin.worker_id
        # paired mode: target b's copy gets its own id and its own Locust name ("chat-b")
        b = "b" if target == "b" else ""
        # A persona's requests have their own Locust stats rows: request type "chat:<persona>".
        persona = self.user.persona_name
        return RequestInfo(labels=request.labels, worker_id=worker_id, request_id=f"{worker_id}:{request.number}{b}",
                           request_type=request.api.name + ("-b" if b else "") + (f":{persona}" if persona else ""),
                           sent_at_s=wire.sent_at_s, sent_perf_s=wire.sent_perf_s, persona=persona)

    def report(self, request: PlannedRequest, wire: WireClock, target: str) -> RequestReport:
        plugin = self.plugin
        log, listeners = sample_log(self.environment)  # (None, None): every sample fired as a request event
        return RequestReport(self.environment, plugin.recording.recorder, self.info(request, wire, target),
                             plugin.view.window, self.failure_kinds, log, listeners, listener_failed)

    def leg(self, request: PlannedRequest, client, wire: WireClock, target: str,
            result: StreamResult | None = None) -> tuple[bool, float | None, bool]:
        """One request to one server, streamed (or, for an endpoint that answers in one body, called),
        timed and recorded into ``result`` (a fresh one unless given): (refused, seconds to wait,
        whether it succeeded)."""
        if not request.api.streams:
            reply = None

            def call() -> None:
                nonlocal reply
                reply = request.api.call(client, request.body, wire)

            def recorded_reply(failure: Failure | None) -> None:
                end_perf_s = time.perf_counter()
                report = self.report(request, wire, target)
                self.note_first_send(request.arrival, report.info)
                record = request.reply_record(report, reply, failure, end_perf_s, target)
                report.finish(record)
                if request.span is not None and target != "b":
                    self.plugin.spans.client.end(request.span, record)

            return self.attempt(wire, call, recorded_reply)
        audit = self.plugin.self_audit
        report: RequestReport | None = None
        timer: StreamTimer | None = None

        def on_content(_index: int, t: float, tokens: int | None) -> None:
            nonlocal report, timer
            if report is None:
                report = self.report(request, wire, target)
                timer = StreamTimer(report.info.sent_perf_s)
            metric, value = timer.content(t)
            report.sample(metric, value, t, tokens)
            audit.chunk()

        result = StreamResult() if result is None else result

        def stream() -> None:
            request.api.stream(client, request.body, on_content, result, self.limits_for(request.max_tokens), wire)
            if not result.content_times_s:
                raise StreamError(f"stream finished ({result.finish_reason}) without any content",
                                  Outcome.STREAM_INCOMPLETE)

        def recorded(failure: Failure | None) -> None:
            nonlocal report, timer
            end_perf_s = time.perf_counter()
            if report is None:  # no content arrived: the request still has a row
                report = self.report(request, wire, target)
                timer = StreamTimer(report.info.sent_perf_s)
            self.note_first_send(request.arrival, report.info)
            record = request.record(report, timer, result, failure, end_perf_s, target)
            report.finish(record)
            audit.request_done(record)
            if request.span is not None and target != "b":  # paired: one client span, the first leg's
                self.plugin.spans.client.end(request.span, record)

        return self.attempt(wire, stream, recorded)

    def attempt(self, wire: WireClock, send, recorded) -> tuple[bool, float | None, bool]:
        """``send()`` the request on ``wire``'s clock, then ``recorded(failure)`` it once however it
        ended: (refused, seconds to wait, whether it succeeded). A request killed by the run's stop
        mid-stream keeps its row, marked interrupted; one killed before its first byte has none."""
        wire.on_request_started()  # the client stamps it again when the bytes go out
        try:
            send()
        except GreenletExit:
            if wire.waiting_to_send:  # killed in its turn's wait, before its first byte: no request, no row
                raise
            # The run stopped mid-stream: keep the row (its TTFT was counted), marked as interrupted.
            # Nothing raised while recording it may replace the kill: a user that raised a disk
            # error here outlived its run (the recorder itself never raises OSError).
            try:
                recorded(INTERRUPTED_FAILURE)
            except Exception:  # noqa: BLE001 - a bug in recording; the kill still goes through
                logger.exception("cannot record the interrupted request")
            raise
        except Exception as err:  # every failure becomes a Locust failure with its own message
            failure = classify(err, float(self.environment.parsed_options.read_timeout))
            if is_client_error(err):
                logger.exception("%s", failure.message)
            recorded(failure)
            return connection_refused(err), retry_after_s(err), False
        recorded(None)
        return False, None, True

    def limits_for(self, max_tokens: int | None) -> StreamLimits:
        """This request's ``StreamLimits``, kept while ``max_tokens`` and ``--max-event-bytes`` (a web
        UI run may change it) stay the same: not a frozen dataclass built per request (issue 25)."""
        max_event_bytes = int(getattr(self.user.options, "max_event_bytes", DEFAULT_MAX_EVENT_BYTES))
        limits = self.limits
        if limits is None or limits.max_tokens != max_tokens or limits.max_event_bytes != max_event_bytes:
            limits = self.limits = StreamLimits(max_tokens, max_event_bytes)
        return limits

    def note_first_send(self, arrival: Arrival | None, info: RequestInfo) -> None:
        """spawn-to-send measures a closed-loop user's start; an open-loop user waits for its arrival."""
        if not self.first_sent and arrival is None:
            self.plugin.self_audit.first_send(ms_between(self.spawned_perf_s, info.sent_perf_s))
        self.first_sent = True
