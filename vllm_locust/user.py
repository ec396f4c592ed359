"""``ChatStreamUser``: one closed-loop stream at a time, timed chunk by chunk."""

from __future__ import annotations

import itertools
import logging
import time

from locust import User, constant, task
from locust.exception import StopUser

from .client import RequestFailure, ServerCheckError, describe_error, is_client_error, make_client
from .context import LoadContext
from .metrics import E2E, TPOT, StreamTimer, ms_between
from .plugin import VllmPlugin
from .reporting import Reporter, RequestInfo
from .schema import RequestRow
from .stream import StreamResult, consume
from .wire import WireClock

logger = logging.getLogger(__name__)
_request_numbers = itertools.count(1)


def request_body(ctx: LoadContext, prompt) -> dict:
    """Keyword arguments for the SDK's ``create``: fixed output length, usage in the stream."""
    body = dict(
        model=ctx.model,
        max_tokens=ctx.spec.max_tokens,
        stream=True,
        stream_options={"include_usage": True},
    )
    if ctx.ignore_eos:
        body["extra_body"] = {"ignore_eos": True}  # vLLM's extension: exactly max_tokens out
    if ctx.spec.endpoint == "completions":
        body["prompt"] = prompt.text
    else:
        body["messages"] = prompt.chat_messages()
    return body


class ChatStreamUser(User):
    """Streams chat (or completions) requests back to back; users = concurrent streams."""

    wait_time = constant(0)

    def on_start(self):
        self.client = None
        self.client_key = None
        self.wire = WireClock()
        self.plugin = VllmPlugin.of(self.environment)

    def _client_for(self, ctx: LoadContext):
        o = self.environment.parsed_options
        key = (ctx.host, o.api_key, o.connect_timeout, o.read_timeout)
        if self.client is None or key != self.client_key:
            self.client = make_client(ctx.host, o.api_key, float(o.connect_timeout), float(o.read_timeout),
                                      wire=self.wire)
            self.client_key = key
        return self.client

    def _request_info(self, ctx: LoadContext, labels: tuple) -> RequestInfo:
        """Identity and labels of the request now on the wire (the send hook has stamped it)."""
        run_id, phase, concurrency, step = labels
        worker_id = self.plugin.worker_id
        return RequestInfo(run_id=run_id, worker_id=worker_id, request_id=f"{worker_id}:{next(_request_numbers)}",
                           request_type=ctx.spec.endpoint, phase=phase, concurrency=concurrency, step=step,
                           sent_at_s=self.wire.sent_at_s, sent_perf_s=self.wire.sent_perf_s)

    @task
    def stream_completion(self):
        try:
            ctx = self.plugin.load_context()
        except (ServerCheckError, ValueError, OSError) as err:
            self.plugin.workload_failed(err)
            raise StopUser() from None
        client = self._client_for(ctx)
        create = client.completions.create if ctx.spec.endpoint == "completions" else client.chat.completions.create
        prompt = ctx.next_prompt()
        body = request_body(ctx, prompt)
        state = self.plugin.state
        # Labels come from the state in force when the request is sent, not when it ends.
        labels = (state.run_id or self.environment.parsed_options.run_id or "run", state.phase, state.concurrency, state.step)
        reporter = Reporter(self.environment, self.plugin.recorder)
        self.wire.on_request_started()  # the wire hooks stamp it again when the bytes go out
        request: list = []  # [RequestInfo, StreamTimer] once the first content chunk is in

        def on_content(_index: int, t: float) -> None:
            if not request:
                info = self._request_info(ctx, labels)
                request[:] = [info, StreamTimer(info.sent_perf_s)]
            metric, value = request[1].content(t)
            reporter.sample(request[0], metric, value, t)

        result, error = StreamResult(), None
        try:
            consume(create(**body), clock=self.wire.now, on_content=on_content, result=result)
            if not result.content_times_s:
                raise RequestFailure(f"stream finished ({result.finish_reason}) without any content")
        except Exception as err:  # every failure becomes a Locust failure with its own message
            error = RequestFailure(describe_error(err, float(self.environment.parsed_options.read_timeout)))
            if is_client_error(err):
                logger.exception("%s", error)
        end_perf = time.perf_counter()
        if not request:
            info = self._request_info(ctx, labels)
            request[:] = [info, StreamTimer(info.sent_perf_s)]
        self._finish(reporter, request[0], request[1], ctx, prompt, result, error, end_perf)

    @staticmethod
    def _finish(reporter: Reporter, info: RequestInfo, timer: StreamTimer, ctx: LoadContext, prompt,
                result: StreamResult, error: Exception | None, end_perf: float) -> None:
        """Report the per-request metrics (or the failure) and write the request row."""
        tokens = result.completion_tokens if result.completion_tokens is not None else result.content_chunks
        measured = timer.finish(tokens)
        if error is None:
            last = timer.last_s
            reporter.sample(info, E2E, measured.e2e_ms, last, length=tokens)
            if measured.tpot_ms is not None:
                reporter.sample(info, TPOT, measured.tpot_ms, last, length=tokens)
        else:
            reporter.failure(info, ms_between(info.sent_perf_s, end_perf), error)
        reporter.request(RequestRow(
            run_id=info.run_id, worker_id=info.worker_id, request_id=info.request_id,
            endpoint=ctx.spec.endpoint, model=ctx.model, workload=ctx.spec.name,
            prompt_index=prompt.index, prompt_kind=prompt.kind, sent_at_s=round(info.sent_at_s, 6),
            ttft_ms=rounded(measured.ttft_ms), e2e_ms=rounded(measured.e2e_ms if error is None else None),
            prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
            content_chunks=result.content_chunks, finish_reason=result.finish_reason,
            error="" if error is None else str(error),
            phase=info.phase, concurrency=info.concurrency, step=info.step,
        ))


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
