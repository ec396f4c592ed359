"""The endpoints the suite can load, by name: each builds its request body and reads its response.

A new endpoint is one module here that defines an ``Endpoint`` and calls ``register`` at import,
plus its import line at the bottom of this file; ``--endpoint``'s choices and the user pick it up.
"""

from __future__ import annotations

from typing import Callable

from ...core.stream import StreamLimits, StreamResult, read_stream


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
               limits: StreamLimits, clock) -> StreamResult:
        """Send ``body`` on ``clock`` and read the response into ``result``, calling ``on_content`` per
        content chunk (the suite reads the raw body: ``stream.read_stream``). ``client`` is the
        user's (``apiclient.make_client``): a status that is not 2xx raises its error with the body."""
        response = client.open(self, body, clock)
        try:
            return read_stream(response, on_content, result, limits, response.reads())
        finally:
            response.close()


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
