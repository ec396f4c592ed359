"""The endpoints the suite can load, by name: each builds its request body and reads its response.

A new endpoint is one module here that defines an ``Endpoint`` and calls ``register`` at import,
plus its import line at the bottom of this file; ``--endpoint``'s choices and the user pick it up.
"""

from __future__ import annotations

from typing import Callable

import httpx2

from ...core.stream import StreamLimits, StreamResult, read_stream
from ..transport import close_response, raw_reads

try:  # orjson serialises a body in a few microseconds; json is the fallback
    from orjson import dumps as _dumps
except ImportError:  # pragma: no cover - orjson is in requirements.txt
    import json

    def _dumps(value) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

# ``create``'s keyword arguments that are not body fields (``wire_request`` takes them apart).
SDK_ONLY = ("extra_body", "extra_headers", "extra_query", "timeout")
_SDK_ONLY_SET = frozenset(SDK_ONLY)
_NO_SDK_ONLY = _SDK_ONLY_SET.isdisjoint
_EXTRA_BODY_ONLY = {"extra_body"}
# As ``create`` sends it: bearer auth (the SDK's own default would also try the admin key).
_SECURITY = {"bearer_auth": True}


def wire_request(body: dict) -> tuple[bytes, dict]:
    """``body`` (``create``'s keyword arguments) as the JSON bytes ``create`` would send (``extra_body``
    merged in) and the SDK request options (``extra_headers``, ``extra_query``, ``timeout``).

    Why: ``create`` runs the SDK's type-driven ``maybe_transform`` over every body (about a quarter
    of the client's CPU per request, issue 25); the suite's bodies are plain JSON types already."""
    if _NO_SDK_ONLY(body):  # no SDK argument among the body's keys (in C)
        return _dumps(body), {"security": _SECURITY}
    fields = dict(body)  # the body fields, in order: the SDK's arguments taken out, extra_body's merged last
    present = _SDK_ONLY_SET.intersection(body)  # usually ``extra_body`` alone (``--ignore-eos``)
    for key in present:
        del fields[key]
    fields.update(body.get("extra_body") or {})
    if present == _EXTRA_BODY_ONLY:
        return _dumps(fields), {"security": _SECURITY}
    options: dict = {"security": _SECURITY}
    if body.get("extra_headers"):
        options["headers"] = body["extra_headers"]
    if body.get("extra_query"):
        options["params"] = body["extra_query"]
    if "timeout" in body:
        options["timeout"] = body["timeout"]
    return _dumps(fields), options


class Endpoint:
    """One OpenAI-compatible endpoint, streamed. ``prompt_field``: the body's key for the rendered
    prompt; ``prompt_form``: what the workload renders for it (``"messages"`` or ``"text"``)."""

    name = ""
    path = ""  # the SDK's path for it, e.g. ``/chat/completions`` (the client's base URL ends in ``/v1``)
    prompt_field = ""
    prompt_form = "messages"
    tool_modes: tuple[str, ...] = ("none",)  # the ``--tools`` values it can send (chat: forced, auto)
    # False: one JSON body, not a stream (embeddings): the user calls ``call(client, body)``, which
    # returns the endpoint's reply (``embeddings.Reply``), and records E2E only.
    streams = True

    def resource(self, client):
        """The SDK resource whose ``create`` this endpoint calls."""
        raise NotImplementedError

    def body(self, model: str, max_tokens: int, prompt, continuous_usage: bool = False, ignore_eos: bool = False,
             tools: str = "none") -> dict:
        """Keyword arguments for the SDK's ``create``: fixed output length, usage in the stream, and
        ``--tools`` (``tool_fields``). A tool call ends when its arguments are complete: with tools,
        no ``ignore_eos`` (max_tokens stays the cap)."""
        stream_options = {"include_usage": True}
        if continuous_usage:
            stream_options["continuous_usage_stats"] = True  # vLLM: running token count on every chunk
        body = dict(model=model, max_tokens=max_tokens, stream=True, stream_options=stream_options)
        if tools != "none":
            body.update(self.tool_fields(tools))
        elif ignore_eos:
            body["extra_body"] = {"ignore_eos": True}  # vLLM's extension: exactly max_tokens out
        body[self.prompt_field] = prompt
        return body

    def tool_fields(self, tools: str) -> dict:
        """The body's ``tools`` and ``tool_choice`` for ``--tools`` (see ``tools_error``)."""
        raise ValueError(tools_error(self.name, tools) or f"--tools {tools}: not supported by --endpoint {self.name}")

    def stream(self, client, body: dict, on_content: Callable[[int, float, int | None], None], result: StreamResult,
               limits: StreamLimits) -> StreamResult:
        """Send ``body`` and read the response into ``result``, calling ``on_content`` per content
        chunk (the suite reads the raw body: ``stream.read_stream``).

        The SDK sends it through its public ``post`` (auth, default headers, its exceptions: an
        HTTP 4xx/5xx raises ``openai.APIStatusError``'s subclass with the body, as ``create`` does),
        with the body already serialised (``wire_request``) and the raw httpx response back; a user's
        later requests reuse the first one's URL and headers (``TemplatedOpenAI.post_stream``)."""
        content, options = wire_request(body)
        post_stream = getattr(client, "post_stream", None)  # ``templated.TemplatedOpenAI``'s (make_client)
        response = (post_stream(self.path, content, options) if post_stream is not None else
                    client.post(self.path, content=content, options=options, cast_to=httpx2.Response, stream=True))
        try:
            return read_stream(response, on_content, result, limits, raw_reads(response))
        finally:
            close_response(response)


ENDPOINTS: dict[str, Endpoint] = {}


def register(endpoint: Endpoint) -> Endpoint:
    if not endpoint.name or endpoint.name in ENDPOINTS:
        raise ValueError(f"endpoint {endpoint.name!r}: no name, or registered twice")
    ENDPOINTS[endpoint.name] = endpoint
    return endpoint


def endpoint(name: str) -> Endpoint:
    """The endpoint of that name; a one-line error naming the known ones."""
    try:
        return ENDPOINTS[name]
    except KeyError:
        raise ValueError(f"unknown endpoint {name!r} (--endpoint): one of {', '.join(ENDPOINTS)}") from None


def names() -> list[str]:
    return list(ENDPOINTS)


TOOL_MODES = ("none", "forced", "auto")  # --tools: no tools; one tool named in tool_choice; tool_choice "auto"


def tools_error(endpoint_name: str, tools: str) -> str | None:
    """One line when ``--tools`` cannot go with ``--endpoint`` (or is unknown), else None: checked
    before any load (completions carry no tools)."""
    if tools not in TOOL_MODES:
        return f"--tools {tools!r}: choose one of {', '.join(TOOL_MODES)}"
    api = ENDPOINTS.get(endpoint_name)
    if api is not None and tools not in api.tool_modes:
        return f"--tools {tools} with --endpoint {endpoint_name}: only {', '.join(n for n, e in ENDPOINTS.items() if tools in e.tool_modes)} sends tools"
    return None


from . import chat, completions, embeddings  # noqa: E402,F401 - each registers itself
