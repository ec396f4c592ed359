"""``ChatStreamUser``: one closed-loop stream at a time, timed chunk by chunk at the socket.

The ``openai`` SDK builds and sends the request (auth, body, HTTP errors); the suite reads the
response body itself (``sse.py``, ``stream.py``), so a chunk costs a raw read, a fast JSON parse
and one Locust event. Each user has its own client and keep-alive connection; clients share the
process's TLS context, so building one costs 0.1 ms and hundreds of users start at once.
"""

from __future__ import annotations

import itertools
import logging
import time

import gevent
from gevent import GreenletExit
from locust import User, constant, task
from locust.exception import StopUser

from ..backend.client import (RequestFailure, ServerCheckError, connection_refused, describe_error, is_client_error,
                     retry_after_s)
from .context import LoadContext
from ..core.metrics import E2E, TPOT, StreamTimer, ms_between
from .pacer import Arrival
from .vllm_plugin import VllmPlugin
from ..core.reporting import RequestReport, RequestInfo
from ..core.schema import INTERRUPTED, RequestRow
from ..core.sse import DEFAULT_MAX_EVENT_BYTES
from ..core.stream import StreamLimits, StreamResult, read_stream
from ..backend.wire import WireClock

MAX_BACKOFF_S = 1.0

logger = logging.getLogger(__name__)
_request_numbers = itertools.count(1)


def request_body(ctx: LoadContext, messages_or_text) -> dict:
    """Keyword arguments for the SDK's ``create``: fixed output length, usage in the stream."""
    stream_options = {"include_usage": True}
    if ctx.continuous_usage:
        stream_options["continuous_usage_stats"] = True  # vLLM: running token count on every chunk
    body = dict(model=ctx.model, max_tokens=ctx.spec.max_tokens, stream=True, stream_options=stream_options)
    if ctx.ignore_eos:
        body["extra_body"] = {"ignore_eos": True}  # vLLM's extension: exactly max_tokens out
    body["prompt" if ctx.spec.endpoint == "completions" else "messages"] = messages_or_text
    return body


class ChatStreamUser(User):
    """Streams chat (or completions) requests back to back; users = concurrent streams."""

    wait_time = constant(0)

    def on_start(self):
        self.client = None
        self.client_settings: tuple | None = None
        self.wire = WireClock()
        self.plugin = VllmPlugin.awaited(self.environment)
        self.spawned_perf_s = time.perf_counter()
        self.first_sent = False  # spawn-to-first-send is recorded once per user
        self.refusals = 0  # consecutive refused connections: the backoff's exponent
        self.paired: tuple | None = None  # paired mode: (client settings, client, its own WireClock)

    def _client_for(self, ctx: LoadContext):
        """This user's client, rebuilt when the host, key or timeouts change (web UI runs)."""
        settings = self.plugin.client_settings(ctx)
        if self.client is None or settings != self.client_settings:
            self.client, self.client_settings = self.plugin.new_client(ctx), settings
        return self.client

    def _paired_for(self, ctx: LoadContext, host: str) -> tuple:
        """Paired mode's target b: this user's second client (to ``--paired-host``) and clock."""
        settings = (host, *self.plugin.client_settings(ctx)[1:])
        if self.paired is None or self.paired[0] != settings:
            self.paired = (settings, self.plugin.new_client(ctx, host), WireClock())
        return self.paired[1], self.paired[2]

    def _request_info(self, ctx: LoadContext, labels: tuple, wire: WireClock, number: int, target: str) -> RequestInfo:
        """Identity and labels of the request now on the wire (the send hook has stamped it)."""
        run_id, phase, concurrency, step, request_rate = labels
        worker_id = self.plugin.worker_id
        # paired mode: target b's copy gets its own id and its own Locust name ("chat-b")
        return RequestInfo(run_id=run_id, worker_id=worker_id, request_id=f"{worker_id}:{number}{'b' if target == 'b' else ''}",
                           request_type=ctx.spec.endpoint + ("-b" if target == "b" else ""), phase=phase,
                           concurrency=concurrency, step=step, sent_at_s=wire.sent_at_s, sent_perf_s=wire.sent_perf_s,
                           request_rate=request_rate)

    @task
    def stream_completion(self):
        plugin = self.plugin
        try:
            ctx = plugin.load_context()
            client = self._client_for(ctx)
            paired_host = getattr(self.environment.parsed_options, "paired_host", "") or ""
            paired = self._paired_for(ctx, paired_host) if paired_host else None
        except (ServerCheckError, ValueError, OSError) as err:
            plugin.workload_failed(err)
            raise StopUser() from None
        # Open loop: wait for this process's next arrival (at once when it is already due).
        arrival = plugin.pacer.claim() if plugin.open_loop else None
        state = plugin.state
        # Labels come from the state in force when the request is sent, not when it ends.
        labels = (state.run_id or self.environment.parsed_options.run_id or "run", state.phase, state.concurrency,
                  state.step, state.request_rate if arrival is not None else None)
        prompt, rendered = ctx.next_request(labels[0])
        body = request_body(ctx, rendered)
        number = next(_request_numbers)
        if paired is None:
            refused, wait_s = self._leg(ctx, client, self.wire, body, prompt, labels, arrival, number, "")
        else:
            # Both servers get the same request at the same instant, each on its own stream; the
            # run's stop kills this greenlet, and with it target b's.
            leg_b = gevent.spawn(self._leg, ctx, paired[0], paired[1], body, prompt, labels, arrival, number, "b")
            try:
                refused, wait_s = self._leg(ctx, client, self.wire, body, prompt, labels, arrival, number, "a")
                refused_b, wait_b = leg_b.get()
            finally:
                leg_b.kill()
            refused, wait_s = refused or refused_b, max(wait_s or 0.0, wait_b or 0.0) or None
        if wait_s:
            gevent.sleep(wait_s)  # HTTP 429: the server said when to come back
        self.back_off(refused)

    def _leg(self, ctx: LoadContext, client, wire: WireClock, body: dict, prompt, labels: tuple,
             arrival: Arrival | None, number: int, target: str) -> tuple[bool, float | None]:
        """One request to one server, streamed, timed and recorded: (refused, seconds to wait)."""
        plugin = self.plugin
        resource = client.completions if ctx.spec.endpoint == "completions" else client.chat.completions
        audit = plugin.audit
        wire.on_request_started()  # the wire hook stamps it again when the bytes go out
        report: RequestReport | None = None
        timer: StreamTimer | None = None

        def on_content(_index: int, t: float, tokens: int | None) -> None:
            nonlocal report, timer
            if report is None:
                report = RequestReport(self.environment, plugin.recorder,
                                       self._request_info(ctx, labels, wire, number, target), plugin.window)
                timer = StreamTimer(report.info.sent_perf_s)
            metric, value = timer.content(t)
            report.sample(metric, value, t, tokens)
            if audit is not None:
                audit.chunks += 1

        result, error = StreamResult(), None
        finish = (lambda err: self._finish(report, timer, ctx, prompt, labels, result, err, time.perf_counter(), arrival,
                                           wire, number, target))
        try:
            with wire.active(), resource.with_streaming_response.create(**body) as response:
                limits = StreamLimits(ctx.spec.max_tokens, int(getattr(self.environment.parsed_options, "max_event_bytes",
                                                                       DEFAULT_MAX_EVENT_BYTES)))
                read_stream(response.http_response, on_content, result, limits)
            if not result.content_times_s:
                raise RequestFailure(f"stream finished ({result.finish_reason}) without any content")
        except GreenletExit:
            # The run stopped mid-stream: keep the row (its TTFT was counted), marked as interrupted.
            # Nothing raised while recording it may replace the kill: a user that raised a disk
            # error here outlived its run (the recorder itself never raises OSError).
            try:
                finish(RequestFailure(INTERRUPTED))
            except Exception:  # noqa: BLE001 - a bug in recording; the kill still goes through
                logger.exception("cannot record the interrupted request")
            raise
        except Exception as err:  # every failure becomes a Locust failure with its own message
            error = RequestFailure(describe_error(err, float(self.environment.parsed_options.read_timeout)))
            if is_client_error(err):
                logger.exception("%s", error)
            finish(error)
            return connection_refused(err), retry_after_s(err)
        finish(None)
        return False, None

    def back_off(self, refused: bool) -> None:
        """After a refused connection, wait (doubling, up to ``MAX_BACKOFF_S``) before the next
        request: a dead server's port answered about 470 refusals a second to zero-wait users."""
        if not refused:
            self.refusals = 0
            self.plugin.server_answered()
            return
        self.refusals += 1
        self.plugin.server_refused()
        gevent.sleep(min(MAX_BACKOFF_S, 0.01 * 2 ** min(self.refusals, 10)))

    def _finish(self, report: RequestReport | None, timer: StreamTimer | None, ctx: LoadContext, prompt,
                labels: tuple, result: StreamResult, error: Exception | None, end_perf: float,
                arrival: Arrival | None, wire: WireClock, number: int, target: str) -> None:
        """Report the per-request metrics (or the failure) and write the request's rows."""
        if report is None:  # no content arrived: the request still has a row
            report = RequestReport(self.environment, self.plugin.recorder,
                                   self._request_info(ctx, labels, wire, number, target), self.plugin.window)
            timer = StreamTimer(report.info.sent_perf_s)
        info = report.info
        # spawn-to-send measures a closed-loop user's start; an open-loop user waits for its arrival
        if not self.first_sent and self.plugin.audit is not None and arrival is None:
            self.plugin.audit.spawn_to_send(ms_between(self.spawned_perf_s, info.sent_perf_s))
        self.first_sent = True
        tokens = result.completion_tokens if result.completion_tokens is not None else result.content_chunks
        measured = timer.finish(tokens)
        interrupted = error is not None and str(error) == INTERRUPTED
        if error is None:
            report.sample(E2E, measured.e2e_ms, timer.last_s, tokens)
            if measured.tpot_ms is not None:
                report.sample(TPOT, measured.tpot_ms, timer.last_s, tokens)
        elif not interrupted:
            report.failure(ms_between(info.sent_perf_s, end_perf), error)
        report.close(RequestRow(
            run_id=info.run_id, worker_id=info.worker_id, request_id=info.request_id,
            endpoint=ctx.spec.endpoint, model=ctx.model, workload=ctx.spec.name,
            prompt_index=prompt.index, prompt_kind=prompt.kind, sent_at_s=round(info.sent_at_s, 6),
            ttft_ms=rounded(measured.ttft_ms), e2e_ms=rounded(measured.e2e_ms if error is None else None),
            prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
            content_chunks=result.content_chunks, finish_reason=result.finish_reason,
            error="" if error is None else str(error),
            phase=info.phase, concurrency=info.concurrency, step=info.step,
            **open_loop_columns(arrival, info),
            **({"target": target, "pair_id": f"{info.worker_id}:{number}"} if target else {}),
        ))


def open_loop_columns(arrival: Arrival | None, info: RequestInfo) -> dict:
    """``RequestRow``'s open-loop columns: when the request was due, how late it left, how long of
    that it waited for a free user."""
    if arrival is None:
        return {}
    return dict(intended_at_s=round(arrival.intended_at_s, 6),
                lateness_ms=round((info.sent_perf_s - arrival.intended_perf_s) * 1000.0, 4),
                queue_ms=round(arrival.queue_ms, 4), request_rate=info.request_rate)


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
