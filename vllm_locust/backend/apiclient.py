"""A user's client of one server's OpenAI-compatible API: a request body in, a ``StreamResponse`` out.

``ApiClient`` makes the request the way the ``openai`` SDK's ``create`` sends it (the body as JSON,
bearer auth, the SDK's extra headers and query), asks for identity encoding, sends it through a
``StreamClient`` (``--http-transport lean`` or ``httpx``) and turns a status that is not 2xx into
``ErrorStatus`` with the server's body. The body is serialised once (orjson), not run through the
SDK's type-driven transform (about a quarter of the client's CPU per request, issue 25).

``SdkClient`` (``--http-transport sdk``) is the end-to-end reference: the SDK's own public
``with_streaming_response.create(...)`` builds, sends and checks the request; the suite still reads
the raw body. Its send stamp comes from httpcore's ``trace`` extension, set by the client's own
request hook on the clock ``open`` was given.
"""

from __future__ import annotations

from urllib.parse import urlencode

import openai
import openai.resources.chat  # noqa: F401 - the SDK imports its resources on first use: the first request
import openai.resources.completions  # noqa: F401   of every process paid about 28 ms of it, late
import openai.resources.embeddings  # noqa: F401

from . import bounds, leanclient, streamclient  # noqa: F401 - leanclient registers itself
from .httpxclient import SEND_EVENTS  # the module registers the httpx client
from .streamclient import ErrorStatus, PreparedRequest, Route, StreamClient, Timeouts
from ..core.hosts import normalize_host

try:  # orjson serialises a body in a few microseconds; json is the fallback
    from orjson import dumps as _dumps, loads as _loads
except ImportError:  # pragma: no cover - orjson is in requirements.txt
    import json

    def _dumps(value) -> bytes:
        return json.dumps(value, separators=(",", ":")).encode()

    _loads = json.loads

USER_AGENT = f"vllm-locust (OpenAI/Python {openai.__version__})".encode()
MAX_ERROR_BODY_BYTES = 1 << 20  # an error's body is a line of JSON
# ``create``'s keyword arguments that are not body fields.
SDK_ONLY = frozenset({"extra_body", "extra_headers", "extra_query", "timeout"})
_NO_SDK_ONLY = SDK_ONLY.isdisjoint


def api_base(host: str) -> str:
    """``http://h:p`` or ``http://h:p/v1`` -> ``http://h:p/v1`` (``hosts.normalize_host``)."""
    return normalize_host(host) + "/v1"


def request_parts(body: dict) -> tuple[bytes, dict | None, dict | None, object]:
    """``body`` (``create``'s keyword arguments) as the JSON bytes ``create`` sends (``extra_body``
    merged in last), and its ``extra_headers``, ``extra_query`` and ``timeout`` (None when absent)."""
    if _NO_SDK_ONLY(body):  # no SDK argument among the body's keys (in C)
        return _dumps(body), None, None, None
    fields = {key: value for key, value in body.items() if key not in SDK_ONLY}
    fields.update(body.get("extra_body") or {})
    return _dumps(fields), body.get("extra_headers") or None, body.get("extra_query") or None, body.get("timeout")


def error_body(response) -> object:
    """An error response's body, bounded: its JSON when it parses, else its text."""
    parts, size = [], 0
    try:
        for data in response.reads():
            size += len(data)
            if size > MAX_ERROR_BODY_BYTES:
                break
            parts.append(data)
    except streamclient.WireError:
        pass  # the status says enough
    raw = b"".join(parts)
    try:
        return _loads(raw)
    except (ValueError, RecursionError):
        return raw.decode("utf-8", "replace")


class ApiClient:
    """One user's client of one server: its ``StreamClient`` (own keep-alive connection), its base
    URL, its headers and timeouts, made once and reused by every request."""

    def __init__(self, host: str, api_key: str, connect_s: float, read_s: float, wire: StreamClient):
        self.base_url, self.wire = api_base(host), wire
        self.timeouts = Timeouts(connect_s, read_s)
        self.headers = ((b"Accept", b"application/json"), (b"Content-Type", b"application/json"),
                        (b"User-Agent", USER_AGENT), (b"Authorization", b"Bearer " + (api_key or "EMPTY").encode()),
                        (b"Accept-Encoding", b"identity"))
        self._routes: dict[str, Route] = {}
        self._extra: tuple = ({}, self.headers)  # (the last extra headers, the headers with them)

    def route(self, path: str, query: dict | None = None) -> Route:
        if query:
            return Route("POST", f"{self.base_url}{path}?{urlencode(query)}")
        route = self._routes.get(path)
        if route is None:
            route = self._routes[path] = Route("POST", self.base_url + path)
        return route

    def headers_with(self, extra: dict | None) -> tuple:
        """The client's headers, each of ``extra`` replacing its name's (``extra_headers``)."""
        if not extra:
            return self.headers
        if self._extra[0] != extra:
            names = {name.lower().encode() for name in extra}
            kept = tuple(h for h in self.headers if h[0].lower() not in names)
            self._extra = (dict(extra), kept + tuple((str(k).encode("latin-1"), str(v).encode("latin-1"))
                                                     for k, v in extra.items()))
        return self._extra[1]

    def open(self, endpoint, body: dict, clock):
        """Send ``body`` to ``endpoint`` on ``clock``: the response, its head read; a status that is
        not 2xx raises ``ErrorStatus`` (its body read and the response closed)."""
        content, extra_headers, query, timeout = request_parts(body)
        timeouts = self.timeouts if timeout is None else Timeouts(self.timeouts.connect_s, float(timeout))
        request = PreparedRequest(self.route(endpoint.path, query), self.headers_with(extra_headers), content,
                                  timeouts)
        response = self.wire.send(request, clock)
        if not 200 <= response.status < 300:
            try:
                raise ErrorStatus(response.status, response.reason, error_body(response),
                                  response.headers.get("retry-after"))
            finally:
                response.close()
        return response

    def close(self) -> None:
        self.wire.close()


class SdkResponse:
    """``with_streaming_response.create(...)``'s response as a ``StreamResponse``."""

    def __init__(self, manager, response):
        self.manager, http = manager, response.http_response
        self.http, self.status, self.reason, self.headers = http, http.status_code, http.reason_phrase, http.headers

    def reads(self):
        return self.http.iter_raw()

    def close(self) -> None:
        self.manager.__exit__(None, None, None)


class SdkClient:
    """``--http-transport sdk``: the ``openai`` SDK sends each request through its public API."""

    def __init__(self, host: str, api_key: str, connect_s: float, read_s: float, tls=None):
        import httpx2

        timeout = httpx2.Timeout(read_s, connect=connect_s)
        self.clock = None  # the clock of the request being sent (``open``)
        hooks = {"request": [self._on_request], "response": [bounds.guard_response]}
        self.sdk = openai.OpenAI(base_url=api_base(host), api_key=api_key or "EMPTY", max_retries=0, timeout=timeout,
                                 default_headers=bounds.IDENTITY,
                                 http_client=openai.DefaultHttpxClient(timeout=timeout, event_hooks=hooks,
                                                                       verify=tls if tls is not None else True))

    def _on_request(self, request) -> None:
        if self.clock is not None:
            request.extensions["trace"] = self._trace

    def _trace(self, name: str, _info: dict) -> None:
        if name in SEND_EVENTS and self.clock is not None:
            self.clock.sending()

    def open(self, endpoint, body: dict, clock):
        self.clock = clock
        manager = endpoint.resource(self.sdk).with_streaming_response.create(**body)
        return SdkResponse(manager, manager.__enter__())

    def close(self) -> None:
        self.sdk.close()


def make_client(host: str, api_key: str, connect_timeout_s: float, read_timeout_s: float, tls=None,
                transport: str = "lean"):
    """A user's own client (no retries: a retry would hide a failure). ``lean`` reads plain-HTTP
    responses with ``leanclient.LeanClient`` (C parser, a fraction of the CPU per chunk); ``httpx``
    and every ``https://`` host use ``httpxclient.HttpxClient``; ``sdk`` the ``openai`` SDK itself.
    ``tls``, built once per process and shared, makes a client cost 0.1 ms instead of the 20 ms of
    loading the certificate store."""
    if transport == "sdk":
        return SdkClient(host, api_key, connect_timeout_s, read_timeout_s, tls)
    kind = transport if transport == "lean" and api_base(host).startswith("http://") else "httpx"
    return ApiClient(host, api_key, connect_timeout_s, read_timeout_s, streamclient.CLIENTS[kind](tls))
