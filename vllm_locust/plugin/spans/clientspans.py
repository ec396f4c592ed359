"""With Locust's ``--otel``: each request is also a client span, exported to the user's collector
by the standard ``OTEL_*`` variables (Locust sets up the tracer provider; the suite only uses
OpenTelemetry's public tracing API), and its trace context is the one the request carries, so vLLM's
span of the request is its child and Jaeger or Tempo shows both sides of one trace.

The span starts when the request is planned (its ids must be on the wire; OpenTelemetry makes them
at the start), microseconds before its first byte leaves, and ends at the request's end. It carries
the suite's attributes (endpoint, model, persona, turn, prompt and output tokens, outcome, TTFT and
E2E in ms) and two events, the first token and the last, never one per chunk.
"""

from __future__ import annotations

import logging
import time

logger = logging.getLogger(__name__)
TRACER_NAME = "vllm_locust"


class ClientSpans:
    """This process's client spans: none unless ``--otel`` and a tracer provider that records."""

    def __init__(self, environment):
        self.environment = environment
        self._tracer = None
        self._checked = False

    def tracer(self):
        if self._checked:
            return self._tracer
        options = self.environment.parsed_options
        if options is not None and getattr(options, "otel", False):
            try:
                from opentelemetry import trace
            except ImportError:  # Locust said it once already: "OpenTelemetry SDK is not installed"
                self._tracer = None
            else:
                tracer = trace.get_tracer(TRACER_NAME)
                probe = tracer.start_span("probe")  # a provider that records makes valid ids
                self._tracer = tracer if probe.get_span_context().is_valid else None
        self._checked = True
        return self._tracer

    @property
    def on(self) -> bool:
        return self.tracer() is not None

    def start(self, endpoint: str, model: str, persona: str):
        """A started client span and its (trace id, span id) in hex, or (None, None) when off."""
        tracer = self.tracer()
        if tracer is None:
            return None, None
        from opentelemetry.trace import SpanKind

        span = tracer.start_span(f"vllm_locust {endpoint}", kind=SpanKind.CLIENT, start_time=time.time_ns(),
                                 attributes={"vllm_locust.endpoint": endpoint, "gen_ai.request.model": model,
                                             "vllm_locust.persona": persona})
        context = span.get_span_context()
        return span, (format(context.trace_id, "032x"), format(context.span_id, "016x"))

    @staticmethod
    def end(span, record) -> None:
        """The request's end: its attributes, its first- and last-token events, its end time."""
        if span is None:
            return
        sent_ns = int(record.info.sent_at_s * 1e9)
        attributes = {"vllm_locust.outcome": record.outcome.value, "vllm_locust.request_id": record.info.request_id}
        for name, value in (("gen_ai.usage.prompt_tokens", record.prompt_tokens),
                            ("gen_ai.usage.completion_tokens", record.completion_tokens),
                            ("vllm_locust.turn", record.turn), ("vllm_locust.ttft_ms", record.ttft_ms),
                            ("vllm_locust.e2e_ms", record.e2e_ms)):
            if value is not None:
                attributes[name] = value
        span.set_attributes(attributes)
        if record.ttft_ms is not None:
            span.add_event("first_token", timestamp=sent_ns + int(record.ttft_ms * 1e6))
        end_ns = sent_ns + int((record.e2e_ms if record.e2e_ms is not None else record.elapsed_ms) * 1e6)
        if record.e2e_ms is not None:
            span.add_event("last_token", timestamp=end_ns)
        if record.failure is not None:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, record.failure.message[:200]))
        span.end(end_time=max(end_ns, sent_ns))
