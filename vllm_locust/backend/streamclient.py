"""The wire-client seam: a prepared request in; status, headers and timed reads out.

A user's request crosses one ``StreamClient``: ``send(request, clock)`` takes a ``PreparedRequest``
(a ``Route``: method and URL; header lines, body bytes, timeouts), calls ``clock.sending()`` just before the
request's first byte is written (after a new connection's connect: set-up is the client's, not the
server's), and returns a ``StreamResponse`` (status, headers, ``reads()`` as they arrive, ``close()``).
Everything that goes wrong on the wire is one of the ``WireError`` subclasses below, which
``client.classify`` maps onto an ``Outcome``. The clock and the request travel as arguments: no
greenlet-local, no hook the client must find.

Two implementations register themselves and are held to one contract suite
(``tests/unit/test_stream_clients.py``): ``lean`` (``leanclient.py``: one keep-alive socket, llhttp)
and ``httpx`` (``httpxclient.py``: ``httpx2.Client``'s public ``send(stream=True)``; https, proxies).
"""

from __future__ import annotations

from typing import Callable, Iterator, Protocol
from urllib.parse import urlsplit


class Timeouts:
    """Seconds (None: wait for ever): to connect, between two reads, to write the request."""

    __slots__ = ("connect_s", "read_s", "write_s")

    def __init__(self, connect_s: float | None, read_s: float | None, write_s: float | None = None):
        self.connect_s, self.read_s = connect_s, read_s
        self.write_s = read_s if write_s is None else write_s


class Route:
    """Where a request goes, parsed once per URL (a user's requests share theirs)."""

    __slots__ = ("method", "url", "scheme", "host", "port", "target")

    def __init__(self, method: str, url: str):
        parts = urlsplit(url)
        self.method, self.url, self.scheme, self.host = method, url, parts.scheme, parts.hostname or ""
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")


class PreparedRequest:
    """One request as it goes on the wire: ``headers`` are ``(name, value)`` byte pairs in order
    (``Host`` and ``Content-Length`` are the client's to add)."""

    __slots__ = ("route", "headers", "body", "timeouts")

    def __init__(self, route: Route, headers: tuple, body: bytes, timeouts: Timeouts):
        self.route, self.headers, self.body, self.timeouts = route, headers, body, timeouts


class Headers(list):
    """A response's ``(lowered name, value)`` pairs in order; ``get`` as a mapping's (the first value)."""

    def get(self, name: str, default=None):
        for key, value in self:
            if key == name:
                return value
        return default


class SendClock(Protocol):
    """What a client tells about its send (``wire.WireClock``)."""

    def sending(self) -> None:
        """The request's first byte is about to be written."""


class StreamResponse(Protocol):
    status: int
    reason: str
    headers: Headers

    def reads(self) -> Iterator[bytes]:
        """The body's bytes (chunked framing removed, never decoded) as each read returns them."""

    def close(self) -> None:
        """Done with it: a body not read to its end closes its connection."""


class StreamClient(Protocol):
    def send(self, request: PreparedRequest, clock: SendClock) -> StreamResponse: ...

    def close(self) -> None: ...


# -- what goes wrong on the wire -------------------------------------------------------------------
class WireError(Exception):
    """A request that failed on the wire; the subclass says how (``client.classify``)."""


class ConnectFailed(WireError):
    """No connection: refused, unreachable, a name that does not resolve (nothing was sent)."""


class ConnectTimedOut(WireError):
    pass


class WriteTimedOut(WireError):
    pass


class ReadTimedOut(WireError):
    pass


class ConnectionLost(WireError):
    """The connection ended before the response's head did."""


class StreamCut(WireError):
    """The connection ended, or failed, in the middle of the body."""


class BadResponse(WireError):
    """Bytes that are not an HTTP response within the suite's bounds."""


class UnsupportedURL(WireError):
    pass


class ErrorStatus(WireError):
    """The server answered with a status that is not 2xx: its code, its body (JSON when it parsed,
    else text), its ``Retry-After``."""

    def __init__(self, status: int, reason: str, body, retry_after: str | None = None):
        super().__init__(f"HTTP {status} {reason}".strip())
        self.status, self.reason, self.body, self.retry_after = status, reason, body, retry_after


CLIENTS: dict[str, Callable[..., StreamClient]] = {}


def register(name: str, make: Callable[..., StreamClient]) -> None:
    """``make(tls)``: a new client of this kind (one per user: its own connection)."""
    CLIENTS[name] = make

