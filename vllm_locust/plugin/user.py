"""``ChatStreamUser``: one closed-loop stream at a time, timed chunk by chunk at the socket.

A task plans its request (the workload's next prompt, the labels in force, the open-loop arrival)
and hands it to the user's ``RequestPipeline`` (``request.py``): sent through the user's client
(``apiclient``, the ``streamclient`` seam) on the user's clock, read and timed by the suite
(``sse.py``, ``stream.py``), recorded once into its sinks. Each user has its own client and
keep-alive connection; clients share the process's TLS context, so building one costs 0.1 ms and
hundreds of users start at once.
"""

from __future__ import annotations

import time
from dataclasses import replace

import gevent
from locust import User, constant, task
from locust.exception import StopUser

from ..backend.client import ServerCheckError
from ..backend.endpoints import Endpoint, endpoint
from ..backend.wire import WireClock
from ..core.record import Labels
from ..core.tracecontext import new_ids, trace_headers
from . import attach, locust_compat
from .context import LoadContext
from .images import with_images
from .options import embedding_batch_size
from .loads.pacer import Arrival
from .personas import OptionsView
from .request import PlannedRequest, RequestPipeline, request_numbers
from .loads.sessionplay import play_session
from .loads.sessions import plays_sessions
from .vllm_plugin import VllmPlugin

attach.register()  # importing the user class is all a locustfile needs: the suite attaches itself, once

MAX_BACKOFF_S = 1.0


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
        self.pipeline = RequestPipeline(self)
        self.refusals = 0  # consecutive refused connections: the backoff's exponent
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
            return play_session(self, ctx, api, client)
        # Open loop: wait for this process's next arrival (at once when it is already due).
        arrival = plugin.open_loop.claim(self.persona_name)
        gate = plugin.steering.gate  # a steered cap on requests in flight (none: no wait)
        if gate.enter() and arrival is not None:  # waited for a place: client queue time too
            arrival = replace(arrival, queue_ms=max(arrival.queue_ms,
                                                    (time.perf_counter() - arrival.intended_perf_s) * 1000.0))
        try:
            self._one_request(ctx, api, client, batch, paired, arrival)
        finally:
            gate.leave()

    def _one_request(self, ctx: LoadContext, api: Endpoint, client, batch: int, paired, arrival) -> None:
        labels = self.labels(arrival)
        prompt, rendered = ctx.next_request(labels.run_id, arrival)
        if not api.streams:  # embeddings: a batch of inputs, each its own tagged prompt
            rendered = [rendered, *(ctx.next_request(labels.run_id)[1] for _ in range(batch - 1))]
        request = self.plan(ctx, api, prompt, rendered, labels, arrival)
        if paired is None:
            refused, wait_s, _ok = self.pipeline.leg(request, client, self.wire, "")
        else:
            # Both servers get the same request at the same instant, each on its own stream; the
            # run's stop kills this greenlet, and with it target b's.
            leg_b = gevent.spawn(self.pipeline.leg, request, paired[0], paired[1], "b")
            try:
                refused, wait_s, _ok = self.pipeline.leg(request, client, self.wire, "a")
                refused_b, wait_b, _ok = leg_b.get()
            finally:
                leg_b.kill()
            refused, wait_s = refused or refused_b, max(wait_s or 0.0, wait_b or 0.0) or None
        if wait_s:
            gevent.sleep(wait_s)  # HTTP 429: the server said when to come back
        self.back_off(refused)

    def labels(self, arrival: Arrival | None) -> Labels:
        """Labels come from the state in force when the request is sent, not when it ends."""
        state = self.plugin.run.state
        return Labels(state.run_id or self.environment.parsed_options.run_id or "run", state.phase, state.concurrency,
                      state.step, state.request_rate if arrival is not None else None)

    def plan(self, ctx: LoadContext, api: Endpoint, prompt, rendered, labels: Labels,
             arrival: Arrival | None) -> PlannedRequest:
        max_tokens = getattr(prompt, "max_tokens", None) or ctx.spec.max_tokens  # a source may set its own
        body = api.body(ctx.model, max_tokens, rendered, ctx.continuous_usage, ctx.ignore_eos,
                        tools=str(getattr(self.options, "tools", "none") or "none"))
        number, images = next(self.numbers), None
        named = getattr(prompt, "images", ())
        if (ctx.images is not None or named) and isinstance(rendered, list):  # the last user message's images
            files = [ctx.image_files[name] for name in named]  # the row's own, then --images-per-request's
            urls, image_bytes = [url for url, _ in files], sum(size or 0 for _, size in files)
            if ctx.images is not None:
                made, made_bytes = ctx.images.for_request(f"{labels.run_id}:{ctx.worker_index}:{number}")
                urls, image_bytes = urls + made, image_bytes + made_bytes
            body["messages"] = with_images(rendered, urls)
            images = (len(urls), image_bytes)
        if self.extra_headers:
            body["extra_headers"] = dict(self.extra_headers)  # the SDK's per-request headers, read at send time
        trace_id, span = "", None
        spans = self.plugin.spans
        if spans.traces_requests:  # the join with vLLM's spans (``--server-spans``): its own trace context
            span, ids = spans.client.start(api.name, ctx.model, self.persona_name) if spans.client.on else (None, None)
            trace_id, span_id = ids or new_ids()
            body["extra_headers"] = {**body.get("extra_headers", {}),
                                     **trace_headers(trace_id, span_id, self.extra_headers)}
        return PlannedRequest(ctx, api, body, prompt, max_tokens, labels, arrival, number, trace_id, span, images)

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
