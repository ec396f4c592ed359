"""vLLM's request spans from an OTLP/HTTP body (``ExportTraceServiceRequest``), through
``opentelemetry-proto``'s public messages (the mock builds such bodies: ``mock/spans.py``).

vLLM (``v1/engine/output_processor.py``, ``do_tracing``) ends one span per finished request,
``llm_request`` of kind SERVER, started at the request's arrival, with its latencies in seconds as
attributes: ``gen_ai.latency.time_in_queue`` (scheduled - queued), ``time_to_first_token``,
``e2e``, ``time_in_model_prefill`` (first token - scheduled), ``time_in_model_decode`` (last token
- first token), ``time_in_model_inference``, and ``gen_ai.request.id``, ``gen_ai.usage.*``. Spans
without them (another service's, a detailed trace's children) are counted, not kept.
"""

from __future__ import annotations

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from ..core.schema import ServerSpanRow

QUEUE, TTFT, E2E = "gen_ai.latency.time_in_queue", "gen_ai.latency.time_to_first_token", "gen_ai.latency.e2e"
PREFILL, DECODE = "gen_ai.latency.time_in_model_prefill", "gen_ai.latency.time_in_model_decode"
INFERENCE = "gen_ai.latency.time_in_model_inference"
REQUEST_ID = "gen_ai.request.id"
PROMPT_TOKENS, COMPLETION_TOKENS = "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens"
SECONDS = {QUEUE: "queue_ms", PREFILL: "prefill_ms", DECODE: "decode_ms", INFERENCE: "inference_ms", TTFT: "ttft_ms",
           E2E: "e2e_ms"}
TOKENS = {PROMPT_TOKENS: "prompt_tokens", COMPLETION_TOKENS: "completion_tokens"}
MAX_SPANS = 100_000  # a batch with more is refused whole (vLLM's exporter sends at most 512 a batch)


class BadSpans(ValueError):
    """A body that is not an OTLP trace export this receiver accepts."""


def _value(any_value: AnyValue):
    kind = any_value.WhichOneof("value")
    return None if kind is None else getattr(any_value, kind)


def _number(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if value == value and abs(value) < 1e9 else None  # no nan, no absurd seconds


def decode(body: bytes, run_id: str, received_s: float) -> tuple[list[ServerSpanRow], int]:
    """The vLLM request spans in ``body`` and the count of other spans in it; ``BadSpans`` when the
    body does not parse or holds more than ``MAX_SPANS``."""
    request = ExportTraceServiceRequest()
    try:
        request.ParseFromString(body)
    except (DecodeError, RecursionError, ValueError) as err:
        raise BadSpans(f"not an OTLP ExportTraceServiceRequest ({type(err).__name__})") from None
    rows, others, seen = [], 0, 0
    for resource in request.resource_spans:
        for scope in resource.scope_spans:
            seen += len(scope.spans)
            if seen > MAX_SPANS:
                raise BadSpans(f"more than {MAX_SPANS} spans in one batch")
            for span in scope.spans:
                row = _row(span, run_id, received_s)
                if row is None:
                    others += 1
                else:
                    rows.append(row)
    return rows, others


def _row(span: Span, run_id: str, received_s: float) -> ServerSpanRow | None:
    values = {}
    for attribute in span.attributes:
        key = attribute.key
        if key in SECONDS or key in TOKENS or key == REQUEST_ID:
            values[key] = _value(attribute.value)
    if TTFT not in values and QUEUE not in values:
        return None  # not vLLM's request span
    fields = {name: None if _number(values.get(key)) is None else round(_number(values[key]) * 1000.0, 4)
              for key, name in SECONDS.items()}
    for key, name in TOKENS.items():
        number = _number(values.get(key))
        fields[name] = None if number is None else int(number)
    request_id = values.get(REQUEST_ID)
    return ServerSpanRow(run_id=run_id, trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                         request_id=str(request_id)[:200] if request_id is not None else "",
                         parent_span_id=span.parent_span_id.hex(), name=span.name[:100],
                         start_s=round(span.start_time_unix_nano / 1e9, 6), end_s=round(span.end_time_unix_nano / 1e9, 6),
                         received_s=round(received_s, 6), **fields)


def response_body() -> bytes:
    """What an OTLP/HTTP receiver answers a whole success with (no partial success)."""
    return ExportTraceServiceResponse().SerializeToString()
