"""``ChatStreamUser``: one closed-loop stream at a time, timed chunk by chunk at the socket.

Each user's client (``apiclient``) sends the request through the wire-client seam
(``streamclient``), with the user's clock; the suite reads the response body itself (``sse.py``,
``stream.py``), so a chunk costs a raw read, a fast JSON parse and one Locust event. Each user has its own client and keep-alive connection; clients share the
process's TLS context, so building one costs 0.1 ms and hundreds of users start at once.
"""

from __future__ import annotations

import itertools
import logging
import time
import weakref

import gevent
from gevent import GreenletExit
from locust import User, constant, task
from locust.exception import StopUser

from ..backend.client import ServerCheckError, classify, connection_refused, is_client_error, retry_after_s
from ..backend.endpoints import Endpoint, endpoint
from ..backend.wire import WireClock
from ..core.metrics import StreamTimer, ms_between
from ..core.outcome import INTERRUPTED_FAILURE, Failure, Outcome
from ..core.record import Labels, RequestInfo, RequestRecord
from ..core.reporting import RequestReport
from ..core.sse import DEFAULT_MAX_EVENT_BYTES
from ..core.stream import StreamError, StreamLimits, StreamResult
from . import attach, locust_compat
from .buckets import listener_failed, sample_log
from .completion import FailureKinds
from .context import LoadContext
from .options import embedding_batch_size
from .pacer import Arrival
from .personas import OptionsView, persona_dealer
from .sessions import dealer, plays_sessions, session_option_errors
from .vllm_plugin import VllmPlugin

attach.register()  # importing the user class is all a locustfile needs: the suite attaches itself, once

MAX_BACKOFF_S = 1.0

logger = logging.getLogger(__name__)
# Request numbers, one sequence per plugin (per process and run environment): ids stay unique
# among a process's users, and a fresh environment (a test's) starts again at 1.
_numbers: "weakref.WeakKeyDictionary[VllmPlugin, itertools.count]" = weakref.WeakKeyDictionary()


def request_numbers(plugin: VllmPlugin) -> itertools.count:
    numbers = _numbers.get(plugin)
    if numbers is None:
        numbers = _numbers[plugin] = itertools.count(1)
    return numbers


class ChatStreamUser(User):
    """Streams chat (or completions) requests back to back; users = concurrent streams. Abstract,
    as Locust's own base users are: a locustfile imports it to subclass it, and only the subclass
    is spawned (the suite's ``locustfile.py`` defines one of the same name)."""

    abstract = True
    wait_time = constant(0)
    extra_headers: dict[str, str] = {}  # HTTP headers on each of this user's requests (a subclass sets them)
    persona = None  # --personas: the ``core.personas.Persona`` of this class (``personas.install`` makes them)
    _view: OptionsView | None = None

    @property
    def options(self):
        """The options this user's requests follow: its persona's view of the run's, else the run's."""
        return self.environment.parsed_options if self._view is None else self._view

    @property
    def persona_name(self) -> str:
        return "" if self.persona is None else self.persona.name

    def on_start(self):
        self.client = None
        self.client_settings: tuple | None = None
        self.wire = WireClock()
        self.plugin = VllmPlugin.awaited(self.environment)
        self.numbers = request_numbers(self.plugin)
        self.failure_kinds = FailureKinds.of(self.environment)
        self.spawned_perf_s = time.perf_counter()
        self.first_sent = False  # spawn-to-first-send is recorded once per user
        self.refusals = 0  # consecutive refused connections: the backoff's exponent
        self.limits: StreamLimits | None = None  # the last request's (``_limits_for``)
        self.paired: tuple | None = None  # paired mode: (client settings, client, its own WireClock)
        self.sessions_of: LoadContext | None = None  # the context whose source was last asked ...
        self.sessions = False  # ... whether it plays conversations (checked once per context)
        self._view = None if self.persona is None else OptionsView(self.environment, self.persona.overrides)
        locust_compat.replace_taskset_sleep(self, self._sleep_between_tasks)

    def _sleep_between_tasks(self, seconds: float) -> None:
        """Locust's sleep between two tasks (``TaskSet.wait``; its stop checks around it stay),
        without its yield when there is nothing to wait (``constant(0)``) and the task has just
        given the others their turn: its request yielded before its send (``WireClock``). One trip
        through the event loop less per request (issue 25); a task that sent nothing still yields."""
        wire = self.wire
        if seconds <= 0 and wire.yielded:
            wire.yielded = False
            return
        wire.yielded = False
        gevent.sleep(seconds)

    def _client_for(self, ctx: LoadContext):
        """This user's client, rebuilt when the host, key or timeouts change (web UI runs)."""
        settings = self.plugin.clients.settings(ctx)
        if self.client is None or settings != self.client_settings:
            self.client, self.client_settings = self.plugin.clients.new_client(ctx), settings
        return self.client

    def _paired_for(self, ctx: LoadContext, host: str) -> tuple:
        """Paired mode's target b: this user's second client (to ``--paired-host``) and clock."""
        settings = (host, *self.plugin.clients.settings(ctx)[1:])
        if self.paired is None or self.paired[0] != settings:
            self.paired = (settings, self.plugin.clients.new_client(ctx, host), WireClock())
        return self.paired[1], self.paired[2]

    @task
    def stream_completion(self):
        plugin = self.plugin
        try:
            ctx = plugin.workload.context(self._view, self.persona_name)
            api = endpoint(ctx.spec.endpoint)
            client = self._client_for(ctx)
            if ctx is not self.sessions_of:  # once per context, not per request
                self.sessions_of, self.sessions = ctx, plays_sessions(ctx.spec.name)
                if self.sessions and not api.streams:
                    raise ValueError(f"--endpoint {api.name} with --workload {ctx.spec.name}: a conversation "
                                     "needs replies (chat or completions)")
            batch = 1 if api.streams else embedding_batch_size(self.options)
            paired_host = getattr(self.environment.parsed_options, "paired_host", "") or ""
            paired = self._paired_for(ctx, paired_host) if paired_host and not self.sessions else None
        except (ServerCheckError, ValueError, OSError) as err:
            plugin.workload.failed(err)
            raise StopUser() from None
        if self.sessions:
            return self.play_session(ctx, api, client)
        # Open loop: wait for this process's next arrival (at once when it is already due).
        arrival = plugin.open_loop.claim(self.persona_name)
        labels = self._labels(arrival)
        prompt, rendered = ctx.next_request(labels.run_id, arrival)
        if not api.streams:  # embeddings: a batch of inputs, each its own tagged prompt
            rendered = [rendered, *(ctx.next_request(labels.run_id)[1] for _ in range(batch - 1))]
        request = self._request(ctx, api, prompt, rendered, labels, arrival)
        if paired is None:
            refused, wait_s, _ok = self._leg(request, client, self.wire, "")
        else:
            # Both servers get the same request at the same instant, each on its own stream; the
            # run's stop kills this greenlet, and with it target b's.
            leg_b = gevent.spawn(self._leg, request, paired[0], paired[1], "b")
            try:
                refused, wait_s, _ok = self._leg(request, client, self.wire, "a")
                refused_b, wait_b, _ok = leg_b.get()
            finally:
                leg_b.kill()
            refused, wait_s = refused or refused_b, max(wait_s or 0.0, wait_b or 0.0) or None
        if wait_s:
            gevent.sleep(wait_s)  # HTTP 429: the server said when to come back
        self.back_off(refused)

    def _labels(self, arrival: Arrival | None) -> Labels:
        """Labels come from the state in force when the request is sent, not when it ends."""
        state = self.plugin.run.state
        return Labels(state.run_id or self.environment.parsed_options.run_id or "run", state.phase, state.concurrency,
                      state.step, state.request_rate if arrival is not None else None)

    def _request(self, ctx: LoadContext, api: Endpoint, prompt, rendered, labels: Labels,
                 arrival: Arrival | None) -> "_Request":
        max_tokens = getattr(prompt, "max_tokens", None) or ctx.spec.max_tokens  # a source may set its own
        body = api.body(ctx.model, max_tokens, rendered, ctx.continuous_usage, ctx.ignore_eos,
                        tools=str(getattr(self.options, "tools", "none") or "none"))
        if self.extra_headers:
            body["extra_headers"] = dict(self.extra_headers)  # the SDK's per-request headers, read at send time
        return _Request(ctx, api, body, prompt, max_tokens, labels, arrival, next(self.numbers))

    def play_session(self, ctx: LoadContext, api: Endpoint, client) -> None:
        """One conversation, turn by turn: each turn's history holds the server's own replies; the
        think time separates a reply from the next turn (the run's stop interrupts it). A failed
        turn ends the session; the next task starts the next conversation."""
        plugin = self.plugin
        problem = session_option_errors(self.options)
        if problem:
            plugin.failures.fail_run(problem, once="sessions", workers_quit=False)
            raise StopUser()
        deal = dealer(plugin) if self.persona is None else persona_dealer(plugin, self.persona_name)
        session = deal.next(ctx, self._labels(None).run_id, self.options)
        while True:
            prompt = session.next_turn()
            if prompt is None:
                break
            request = self._request(ctx, api, prompt, prompt.render(""), self._labels(None), None)
            result = StreamResult(text=[])
            refused, wait_s, ok = self._leg(request, client, self.wire, "", result)
            if ok:
                session.replied("".join(result.text), result.prompt_tokens, result.completion_tokens)
            else:
                logger.debug("session %s: turn %d failed: the session ends", session.session_id, prompt.turn)
            if wait_s:
                gevent.sleep(wait_s)
            self.back_off(refused)
            if not ok or session.done:
                break
            think_s = session.think_s()
            if think_s > 0:
                gevent.sleep(think_s)
        problem = deal.ended(session)
        if problem:
            plugin.failures.fail_run(problem, once="sessions", workers_quit=False)
            raise StopUser()

    def _info(self, request: "_Request", wire: WireClock, target: str) -> RequestInfo:
        """Identity and labels of the request now on the wire (the send hook has stamped it)."""
        worker_id = self.plugin.worker_id
        # paired mode: target b's copy gets its own id and its own Locust name ("chat-b")
        b = "b" if target == "b" else ""
        # A persona's requests have their own Locust stats rows: request type "chat:<persona>".
        persona = self.persona_name
        return RequestInfo(labels=request.labels, worker_id=worker_id, request_id=f"{worker_id}:{request.number}{b}",
                           request_type=request.api.name + ("-b" if b else "") + (f":{persona}" if persona else ""),
                           sent_at_s=wire.sent_at_s, sent_perf_s=wire.sent_perf_s, persona=persona)

    def _report(self, request: "_Request", wire: WireClock, target: str) -> RequestReport:
        plugin = self.plugin
        environment = self.environment
        log, listeners = sample_log(environment)  # (None, None): every sample fired as a request event
        return RequestReport(environment, plugin.recording.recorder, self._info(request, wire, target),
                             plugin.view.window, self.failure_kinds, log, listeners, listener_failed)

    def _leg(self, request: "_Request", client, wire: WireClock, target: str,
             result: StreamResult | None = None) -> tuple[bool, float | None, bool]:
        """One request to one server, streamed (or, for an endpoint that answers in one body, called),
        timed and recorded into ``result`` (a fresh one unless given): (refused, seconds to wait,
        whether it succeeded)."""
        if not request.api.streams:
            reply = None

            def call() -> None:
                nonlocal reply
                reply = request.api.call(client, request.body, wire)

            def recorded(failure: Failure | None) -> None:
                end_perf_s = time.perf_counter()
                report = self._report(request, wire, target)
                self._note_first_send(request.arrival, report.info)
                report.finish(request.reply_record(report, reply, failure, end_perf_s, target))

            return self._attempt(wire, call, recorded)
        audit = self.plugin.self_audit
        report: RequestReport | None = None
        timer: StreamTimer | None = None

        def on_content(_index: int, t: float, tokens: int | None) -> None:
            nonlocal report, timer
            if report is None:
                report = self._report(request, wire, target)
                timer = StreamTimer(report.info.sent_perf_s)
            metric, value = timer.content(t)
            report.sample(metric, value, t, tokens)
            audit.chunk()

        result = StreamResult() if result is None else result

        def stream() -> None:
            request.api.stream(client, request.body, on_content, result, self._limits_for(request.max_tokens), wire)
            if not result.content_times_s:
                raise StreamError(f"stream finished ({result.finish_reason}) without any content",
                                  Outcome.STREAM_INCOMPLETE)

        def recorded(failure: Failure | None) -> None:
            nonlocal report, timer
            end_perf_s = time.perf_counter()
            if report is None:  # no content arrived: the request still has a row
                report = self._report(request, wire, target)
                timer = StreamTimer(report.info.sent_perf_s)
            self._note_first_send(request.arrival, report.info)
            report.finish(request.record(report, timer, result, failure, end_perf_s, target))

        return self._attempt(wire, stream, recorded)

    def _attempt(self, wire: WireClock, send, recorded) -> tuple[bool, float | None, bool]:
        """``send()`` the request on ``wire``'s clock, then ``recorded(failure)`` it once however it
        ended: (refused, seconds to wait, whether it succeeded). A request killed by the run's stop
        mid-stream keeps its row, marked interrupted; one killed before its first byte has none."""
        wire.on_request_started()  # the wire hook stamps it again when the bytes go out
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

    def _limits_for(self, max_tokens: int | None) -> StreamLimits:
        """This request's ``StreamLimits``, kept while ``max_tokens`` and ``--max-event-bytes`` (a web
        UI run may change it) stay the same: not a frozen dataclass built per request (issue 25)."""
        max_event_bytes = int(getattr(self.options, "max_event_bytes", DEFAULT_MAX_EVENT_BYTES))
        limits = self.limits
        if limits is None or limits.max_tokens != max_tokens or limits.max_event_bytes != max_event_bytes:
            limits = self.limits = StreamLimits(max_tokens, max_event_bytes)
        return limits

    def _note_first_send(self, arrival: Arrival | None, info: RequestInfo) -> None:
        """spawn-to-send measures a closed-loop user's start; an open-loop user waits for its arrival."""
        if not self.first_sent and arrival is None:
            self.plugin.self_audit.first_send(ms_between(self.spawned_perf_s, info.sent_perf_s))
        self.first_sent = True

    def back_off(self, refused: bool) -> None:
        """After a refused connection, wait (doubling, up to ``MAX_BACKOFF_S``) before the next
        request: a dead server's port answered about 470 refusals a second to zero-wait users."""
        if not refused:
            self.refusals = 0
            self.plugin.refusals.answered()
            return
        self.refusals += 1
        self.plugin.refusals.refused()
        gevent.sleep(min(MAX_BACKOFF_S, 0.01 * 2 ** min(self.refusals, 10)))


class _Request:
    """What one task's request is, whichever server(s) it goes to: built once, shared by the legs."""

    __slots__ = ("ctx", "api", "body", "prompt", "max_tokens", "labels", "arrival", "number")

    def __init__(self, ctx: LoadContext, api: Endpoint, body: dict, prompt, max_tokens: int, labels: Labels,
                 arrival: Arrival | None, number: int):
        self.ctx, self.api, self.body, self.prompt, self.max_tokens = ctx, api, body, prompt, max_tokens
        self.labels, self.arrival, self.number = labels, arrival, number

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
            target=target, pair_id=f"{info.worker_id}:{self.number}" if target else "", **measured)
