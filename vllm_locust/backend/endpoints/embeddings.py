"""``/v1/embeddings``: a batch of text inputs in, one JSON body out; timed from the send to its last byte.

Not a stream (``streams = False``): the user calls ``call`` instead of ``stream`` and records E2E
only (no TTFT, no ITL). The user's client sends it (``apiclient``); the suite reads the raw body
within ``bounds.MAX_BODY_BYTES``, stamps each read, and checks that ``data`` holds one embedding
per input.
``encoding_format`` is ``float``: the SDK's default, base64, would be decoded by the SDK, not read here.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ...core.outcome import Outcome
from ...core.stream import StreamError, identity_only
from ..bounds import MAX_BODY_BYTES, body_over
from . import Endpoint, register

try:  # orjson parses a body of floats several times faster than json
    from orjson import JSONDecodeError, loads
except ImportError:  # pragma: no cover - orjson is in requirements.txt
    from json import JSONDecodeError, loads


@dataclass(frozen=True, slots=True)
class Reply:
    """What one embeddings response delivered: the instant its last bytes arrived (``perf_counter`` s),
    the inputs it embedded and the prompt tokens its usage counted (None: no usage)."""

    end_perf_s: float
    inputs: int
    prompt_tokens: int | None


def bad(message: str) -> StreamError:
    return StreamError(f"bad response: {message}", Outcome.BAD_RESPONSE)


def read_reply(body: bytes, end_perf_s: float, inputs: int) -> Reply:
    """Check a response body against the ``inputs`` sent: ``data``, a list of ``inputs`` objects each
    with an ``embedding`` list. Raises ``StreamError`` (kind ``bad_response``) naming what is wrong."""
    try:
        doc = loads(body)
    except (JSONDecodeError, ValueError):
        raise bad(f"embeddings body is not JSON ({len(body)} bytes)") from None
    if not isinstance(doc, dict):
        raise bad("embeddings body is not a JSON object")
    if doc.get("error"):
        error = doc["error"]
        raise StreamError(f"server error: {error.get('message') if isinstance(error, dict) else error}"[:300],
                          Outcome.BAD_RESPONSE)
    data = doc.get("data")
    if not isinstance(data, list):
        raise bad("embeddings body has no 'data' list")
    if len(data) != inputs:
        raise bad(f"{len(data)} embeddings for {inputs} inputs")
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("embedding"), (list, str)) or not item["embedding"]:
            raise bad(f"embedding {i} is missing or empty")
    usage = doc.get("usage")
    tokens = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return Reply(end_perf_s, inputs, tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None)


class Embeddings(Endpoint):
    name = "embeddings"
    path = "/embeddings"
    prompt_field = "input"
    prompt_form = "text"
    streams = False

    def resource(self, client):
        return client.embeddings

    def body(self, model: str, max_tokens: int, prompt, continuous_usage: bool = False, ignore_eos: bool = False,
             tools: str = "none") -> dict:
        """``input``: the list of rendered texts (one request's batch; a single text is a batch of one).
        No output length, no stream options, no tools (``tool_modes`` is none only)."""
        if tools != "none":
            return super().tool_fields(tools)  # raises the one-line error
        inputs = [prompt] if isinstance(prompt, str) else list(prompt)
        return dict(model=model, input=inputs, encoding_format="float")

    def stream(self, client, body, on_content, result, limits, clock):
        raise TypeError("embeddings is not streamed: call Embeddings.call")

    def call(self, client, body: dict, clock, max_bytes: int = MAX_BODY_BYTES) -> Reply:
        """Send ``body`` on ``clock`` and read its whole response (at most ``max_bytes``): the reply,
        its end stamped at the last read."""
        response = client.open(self, body, clock)
        try:
            identity_only(response.headers)
            parts, size, end = [], 0, time.perf_counter()
            for data in response.reads():
                end = time.perf_counter()
                size += len(data)
                if size > max_bytes:
                    raise StreamError(body_over(max_bytes), Outcome.BAD_RESPONSE)
                parts.append(data)
        finally:
            response.close()
        return read_reply(b"".join(parts), end, len(body["input"]))


register(Embeddings())
