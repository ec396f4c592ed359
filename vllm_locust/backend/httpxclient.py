"""The reference ``StreamClient``: ``httpx2.Client`` through its public API (``build_request``,
``send(stream=True)``, ``iter_raw``), for ``https://`` hosts, proxies (the standard ``*_PROXY``
variables) and ``--http-transport httpx``.

The send instant comes from httpcore's ``trace`` request extension (public, documented): its
``http11.send_request_headers.started`` event (``http2.`` on HTTP/2) is the instant the first byte
is written, after a new connection's connect. httpx's exceptions become the seam's ``WireError``s,
so both clients fail alike (``tests/unit/test_stream_clients.py``).
"""

from __future__ import annotations

from typing import Iterator

import httpx2

from . import streamclient
from .streamclient import (BadResponse, ConnectFailed, ConnectionLost, ConnectTimedOut, PreparedRequest, ReadTimedOut,
                           SendClock, StreamCut, UnsupportedURL, WireError, WriteTimedOut)

SEND_EVENTS = frozenset({"http11.send_request_headers.started", "http2.send_request_headers.started"})


def wire_error(err: httpx2.HTTPError, in_body: bool) -> WireError:
    """The seam's error for httpx's ``err``, raised before the response's head or (``in_body``) after."""
    text = str(err) or type(err).__name__
    if isinstance(err, httpx2.ConnectTimeout | httpx2.PoolTimeout):
        return ConnectTimedOut(text)
    if isinstance(err, httpx2.WriteTimeout):
        return WriteTimedOut(text)
    if isinstance(err, httpx2.TimeoutException):
        return ReadTimedOut(text)
    if isinstance(err, httpx2.ConnectError):
        return ConnectFailed(text)
    if isinstance(err, httpx2.UnsupportedProtocol | httpx2.InvalidURL):
        return UnsupportedURL(text)
    if isinstance(err, httpx2.ProtocolError) and not ("closed" in text.lower() or "disconnected" in text.lower()):
        return BadResponse(text)
    return StreamCut(text) if in_body else ConnectionLost(text)


class HttpxClient:
    """One ``httpx2.Client`` (its own connection pool) per user."""

    def __init__(self, tls=None):
        self.client = httpx2.Client(verify=tls if tls is not None else True, follow_redirects=False)

    def send(self, request: PreparedRequest, clock: SendClock) -> "HttpxResponse":
        def trace(name: str, _info: dict) -> None:
            if name in SEND_EVENTS:
                clock.sending()

        t = request.timeouts
        try:
            built = self.client.build_request(
                request.route.method, request.route.url, headers=list(request.headers), content=request.body,
                timeout=httpx2.Timeout(t.read_s, connect=t.connect_s, write=t.write_s, pool=t.connect_s),
                extensions={"trace": trace})
            return HttpxResponse(self.client.send(built, stream=True))
        except httpx2.HTTPError as err:
            raise wire_error(err, in_body=False) from err

    def close(self) -> None:
        self.client.close()


class HttpxResponse:
    def __init__(self, response: httpx2.Response):
        self.response = response
        self.status, self.reason = response.status_code, response.reason_phrase
        self.headers = streamclient.Headers((name.decode("latin-1").lower(), value.decode("latin-1"))
                                            for name, value in response.headers.raw)

    def reads(self) -> Iterator[bytes]:
        try:
            yield from self.response.iter_raw()
        except httpx2.HTTPError as err:
            raise wire_error(err, in_body=True) from err

    def close(self) -> None:
        self.response.close()


streamclient.register("httpx", HttpxClient)
