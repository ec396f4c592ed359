"""The mock's OpenTelemetry side: one vLLM-shaped ``llm_request`` span per finished stream, with
the queue, prefill and decode times the mock itself played, posted over OTLP/HTTP protobuf to
``spans_url`` (``POST /_config``) every ``spans_every_s``, as vLLM's batch exporter does.

The request id is ``chatcmpl-<X-Request-Id>`` (``cmpl-`` for completions), the trace id and parent
the request's ``traceparent`` (a fresh trace when it carried none), as vLLM names them.
"""

from __future__ import annotations

import os
import struct
import threading
import time
import urllib.request

from ..core.tracecontext import REQUEST_ID_HEADER, parse_traceparent

_PENDING: list[dict] = []
_LOCK = threading.Lock()
_THREAD: list[threading.Thread] = []
STATS = {"posted": 0, "failed": 0}


def span_of(headers, chat: bool, arrived: float, scheduled: float, first: float, last: float,
            prompt_tokens: int, completion_tokens: int) -> dict:
    """The span of one request (``perf_counter`` instants: arrival, scheduled, first and last token),
    in ``otlpspans.encode``'s form, with the values in ms beside it (``ms``) for the mock's log."""
    context = parse_traceparent(headers.get("traceparent", ""))
    trace_id, parent = context if context else (os.urandom(16).hex(), "")
    request_id = ("chatcmpl-" if chat else "cmpl-") + (headers.get(REQUEST_ID_HEADER) or os.urandom(8).hex())
    seconds = {"gen_ai.latency.time_in_queue": scheduled - arrived,
               "gen_ai.latency.time_to_first_token": first - arrived,
               "gen_ai.latency.e2e": last - arrived,
               "gen_ai.latency.time_in_model_prefill": first - scheduled,
               "gen_ai.latency.time_in_model_decode": last - first,
               "gen_ai.latency.time_in_model_inference": last - scheduled}
    unix_offset = time.time() - time.perf_counter()
    attributes = {**seconds, "gen_ai.request.id": request_id, "gen_ai.usage.prompt_tokens": int(prompt_tokens),
                  "gen_ai.usage.completion_tokens": int(completion_tokens)}
    return {"trace_id": trace_id, "span_id": os.urandom(8).hex(), "parent_span_id": parent,
            "start_ns": int((arrived + unix_offset) * 1e9), "end_ns": int((last + unix_offset) * 1e9),
            "attributes": attributes,
            "ms": {"trace_id": trace_id, "request_id": request_id, "queue_ms": seconds["gen_ai.latency.time_in_queue"] * 1e3,
                   "prefill_ms": seconds["gen_ai.latency.time_in_model_prefill"] * 1e3,
                   "decode_ms": seconds["gen_ai.latency.time_in_model_decode"] * 1e3,
                   "ttft_ms": seconds["gen_ai.latency.time_to_first_token"] * 1e3,
                   "e2e_ms": seconds["gen_ai.latency.e2e"] * 1e3}}


def export(span: dict, config: dict) -> None:
    """Queue ``span`` for the next batch to ``config["spans_url"]`` (the exporter starts once)."""
    with _LOCK:
        _PENDING.append(span)
        if not _THREAD:
            thread = threading.Thread(target=_post_loop, args=(config,), name="mock-spans", daemon=True)
            _THREAD.append(thread)
            thread.start()


def _post_loop(config: dict) -> None:
    while True:
        time.sleep(float(config.get("spans_every_s") or 0.1))
        with _LOCK:
            batch, _PENDING[:] = list(_PENDING), []
        url = str(config.get("spans_url") or "")
        if not batch or not url:
            continue
        for start in range(0, len(batch), 512):  # vLLM's exporter: at most 512 spans a request
            body = encode(batch[start:start + 512])
            request = urllib.request.Request(url, data=body, method="POST",
                                             headers={"Content-Type": "application/x-protobuf"})
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    response.read()
                STATS["posted"] += len(batch[start:start + 512])
            except (OSError, ValueError):
                STATS["failed"] += len(batch[start:start + 512])  # as vLLM: a collector that is down loses them


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1  # int64 as protobuf writes a negative one: ten bytes
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, wire_type: int, payload: bytes) -> bytes:
    return _varint(number << 3 | wire_type) + payload


def _bytes(number: int, data: bytes) -> bytes:  # wire type 2: length-delimited
    return _field(number, 2, _varint(len(data)) + data)


def _any_value(value) -> bytes:
    """``AnyValue``: string 1, bool 2, int64 3, double 4."""
    if isinstance(value, bool):
        return _field(2, 0, _varint(int(value)))
    if isinstance(value, int):
        return _field(3, 0, _varint(value))
    if isinstance(value, float):
        return _field(4, 1, struct.pack("<d", value))
    return _bytes(1, str(value).encode())


def encode(spans: list[dict]) -> bytes:
    """An OTLP ``ExportTraceServiceRequest`` of vLLM-shaped request spans, one dict each:
    ``trace_id``, ``span_id``, ``parent_span_id`` (hex), ``start_ns``, ``end_ns``, ``attributes``
    (name -> float, int, bool or str), written in protobuf's wire format with the standard library
    (the mock imports no third-party package): ``ResourceSpans`` 1 > ``ScopeSpans`` 2 > ``Span`` 2,
    a span's fields by their numbers in ``opentelemetry/proto/trace/v1/trace.proto`` (trace id 1,
    span id 2, parent 4, name 5, kind 6 = SERVER 2, start 7 and end 8 as fixed64, attributes 9 as
    ``KeyValue``: key 1, ``AnyValue`` 2). The suite reads it with ``opentelemetry-proto``."""
    out = b""
    for spec in spans:
        span = (_bytes(1, bytes.fromhex(spec["trace_id"])) + _bytes(2, bytes.fromhex(spec["span_id"]))
                + (_bytes(4, bytes.fromhex(spec["parent_span_id"])) if spec.get("parent_span_id") else b"")
                + _bytes(5, str(spec.get("name", "llm_request")).encode()) + _field(6, 0, _varint(2))
                + _field(7, 1, struct.pack("<Q", int(spec["start_ns"])))
                + _field(8, 1, struct.pack("<Q", int(spec["end_ns"]))))
        for key, value in spec.get("attributes", {}).items():
            span += _bytes(9, _bytes(1, str(key).encode()) + _bytes(2, _any_value(value)))
        out += _bytes(2, span)
    return _bytes(1, _bytes(2, out)) if spans else b""
