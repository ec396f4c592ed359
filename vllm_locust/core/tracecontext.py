"""W3C trace context for each request, so vLLM's span of a request joins the client's row of it.

Every request of a run with the join on (``--server-spans``, or ``--otel``) carries a
``traceparent`` (version 00, its own 16-byte trace id and 8-byte span id, sampled) and, unless the
user set one, ``X-Request-Id`` = the trace id: vLLM names the request ``chatcmpl-<X-Request-Id>``
(``cmpl-`` for completions) and puts that in its span's ``gen_ai.request.id``, so a span whose
trace context was lost (a proxy that drops the header) still joins. Stdlib only.
"""

from __future__ import annotations

import os
import re

TRACEPARENT = "traceparent"
REQUEST_ID_HEADER = "X-Request-Id"
TRACE_ID_HEX = 32
SPAN_ID_HEX = 16
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}$")
# vLLM's OpenAI server prefixes the request id it was given (``_base_request_id``): chat, completions, embeddings.
VLLM_ID_PREFIXES = ("chatcmpl-", "cmpl-", "embd-")


def new_ids() -> tuple[str, str]:
    """A fresh (trace id, span id), lower-case hex; never all zeros (invalid in W3C)."""
    raw = os.urandom(24).hex()
    trace_id, span_id = raw[:TRACE_ID_HEX], raw[TRACE_ID_HEX:]
    if trace_id == "0" * TRACE_ID_HEX or span_id == "0" * SPAN_ID_HEX:
        return new_ids()
    return trace_id, span_id


def traceparent(trace_id: str, span_id: str) -> str:
    return f"00-{trace_id}-{span_id}-01"


def parse_traceparent(value: str) -> tuple[str, str] | None:
    """(trace id, span id) of a ``traceparent`` header, None when it is not one."""
    match = _TRACEPARENT.match(str(value or "").strip().lower())
    return (match.group(1), match.group(2)) if match else None


def trace_headers(trace_id: str, span_id: str, user_headers: dict | None = None) -> dict:
    """The headers a request carries for the join; a header the user set (``--header``) wins."""
    names = {str(name).lower() for name in (user_headers or {})}
    headers = {}
    if TRACEPARENT not in names:
        headers[TRACEPARENT] = traceparent(trace_id, span_id)
    if REQUEST_ID_HEADER.lower() not in names:
        headers[REQUEST_ID_HEADER] = trace_id
    return headers


def base_request_id(vllm_request_id: str) -> str:
    """vLLM's request id without its endpoint's prefix: the ``X-Request-Id`` it was sent."""
    text = str(vllm_request_id or "")
    for prefix in VLLM_ID_PREFIXES:
        if text.startswith(prefix):
            return text[len(prefix):]
    return text
