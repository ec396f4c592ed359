"""Bounds on what a server can make the client read: identity encoding only, capped bodies.

The suite reads raw bytes and asks for ``Accept-Encoding: identity`` on every request: a body in
another encoding is refused by name, never decoded (a 1 MB gzip bomb on ``/v1/models`` had taken
the process to 1.87 GB), and a body that is not an event stream is read up to ``MAX_BODY_BYTES``.
Three ways in: a user's ``apiclient.ApiClient`` (identity asked for, an error body bounded; the
stream's events bounded by the SSE decoder), ``guard_response``, an httpx response hook for the
``openai`` SDK's client (``--http-transport sdk``), and ``get``/``post`` for the plain ``requests`` calls (``/v1/models``, ``/version``,
``/tokenize``, ``/metrics``).
"""

from __future__ import annotations

from operator import itemgetter

import httpx2
import requests

from .httpx_compat import header_triples

IDENTITY = {"Accept-Encoding": "identity"}
MAX_BODY_BYTES = 16 << 20  # a model list, a /metrics page or an error body is kilobytes
READ_BLOCK = 65536


class ResponseRefused(requests.RequestException):
    """A response the suite will not read (its encoding, its size): one line starting ``bad response``."""


def refused_encoding(headers) -> str | None:
    """The one-line reason to refuse a response's ``Content-Encoding``, or None for identity."""
    encoding = (headers.get("content-encoding") or "identity").strip().lower()
    if encoding in ("", "identity"):
        return None
    return f"bad response: Content-Encoding {encoding[:40]} (the suite asks for identity)"


def body_over(limit: int) -> str:
    return f"bad response: body over {limit} bytes"


# -- the openai client (httpx) ------------------------------------------------------------------------
class CappedStream(httpx2.SyncByteStream):
    """A response body that fails once it passes ``limit`` bytes, instead of filling the memory."""

    def __init__(self, stream: httpx2.SyncByteStream, limit: int):
        self._stream, self._limit = stream, limit

    def __iter__(self):
        seen = 0
        for data in self._stream:
            seen += len(data)
            if seen > self._limit:
                raise httpx2.RemoteProtocolError(body_over(self._limit).removeprefix("bad response: "))
            yield data

    def close(self) -> None:
        self._stream.close()


lowered_name = itemgetter(1)  # of httpx's (name, lowered name, value) header triples
_lowered_and_value = itemgetter(1, 2)


def guard_response(response: httpx2.Response, max_body_bytes: int = MAX_BODY_BYTES) -> None:
    """httpx response hook (headers in, body not yet read): refuse an encoding that is not identity;
    cap a body that is not an event stream (an event stream is bounded by the SSE decoder)."""
    headers = response.headers
    # httpx's (name, lowered name, value) triples as {lowered name: its first value}, made in C: the
    # first value is where httpx's ``headers["content-type"]`` (values joined by ", ") starts, and
    # its decoding is ASCII's for the prefix tested (one httpx lookup, ~150 bytecodes, less: issue 25)
    first = dict(map(_lowered_and_value, reversed(header_triples(headers))))
    reason = refused_encoding(headers) if b"content-encoding" in first else None
    if reason is not None:
        raise httpx2.RemoteProtocolError(reason.removeprefix("bad response: "), request=response.request)
    content_type = first.get(b"content-type")
    if content_type is None or not content_type.startswith(b"text/event-stream"):
        response.stream = CappedStream(response.stream, max_body_bytes)


# -- plain requests ---------------------------------------------------------------------------------
def read_bounded(response: requests.Response, max_bytes: int = MAX_BODY_BYTES) -> requests.Response:
    """Read a ``stream=True`` response's raw body (never decoded) up to ``max_bytes``; its ``.json()``,
    ``.text`` and ``.content`` then work as usual. Raises ``ResponseRefused``."""
    reason = refused_encoding(response.headers)
    if reason is not None:
        raise ResponseRefused(reason)
    try:
        if int(response.headers.get("content-length") or 0) > max_bytes:
            raise ResponseRefused(body_over(max_bytes))
    except ValueError:
        raise ResponseRefused("bad response: Content-Length is not a number") from None
    parts, size = [], 0
    while True:
        data = response.raw.read(READ_BLOCK, decode_content=False)
        if not data:
            break
        size += len(data)
        if size > max_bytes:
            raise ResponseRefused(body_over(max_bytes))
        parts.append(data)
    response._content = b"".join(parts)  # what requests' own .content would have held
    response._content_consumed = True
    return response


def json_of(response: requests.Response):
    """``response.json()``, with a body nested too deeply for Python's parser (a hostile server's
    ``[[[[...``: 1,443 tracebacks were seen) a ``ValueError`` like any other body that is not JSON."""
    try:
        return response.json()
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


def request(method: str, url: str, headers: dict | None = None, timeout_s: float = 10.0,
            max_bytes: int = MAX_BODY_BYTES, session=None, **kwargs) -> requests.Response:
    """``requests`` with identity encoding and a bounded body; raises ``requests.RequestException``
    (``ResponseRefused`` for a refused response)."""
    response = (session or requests).request(method, url, headers={**(headers or {}), **IDENTITY},
                                             timeout=timeout_s, stream=True, **kwargs)
    try:
        return read_bounded(response, max_bytes)
    finally:
        response.close()


def get(url: str, headers: dict | None = None, timeout_s: float = 10.0, **kwargs) -> requests.Response:
    return request("GET", url, headers, timeout_s, **kwargs)


def post(url: str, headers: dict | None = None, timeout_s: float = 10.0, **kwargs) -> requests.Response:
    return request("POST", url, headers, timeout_s, **kwargs)
