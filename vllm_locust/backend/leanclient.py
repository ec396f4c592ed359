"""The lean ``StreamClient``: plain HTTP/1.1 over one keep-alive socket per user, responses parsed by
llhttp (C, through ``geventhttpclient``, which Locust already installs).

Why: with httpx's own transport (httpcore and h11, pure Python) reading one streamed chunk cost
about 40% of the client's CPU per chunk (a gevent timeout, h11's event machine and four stream
wrappers per read). Here a chunk is one ``recv``, one C parse and one yield. ``https://`` is the
``httpx`` client's (``httpxclient.py``). Response headers are capped at ``MAX_HEADER_BYTES`` (200 MB
of them had been read into memory and the request counted a success; httpx refuses past 100 KiB).
Read timeouts are kept by one watcher (``_ReadWatch``), not by a timer per read.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from typing import Iterator

from geventhttpclient.response import HTTPParseError, HTTPProtocolViolationError, HTTPResponse

from . import gevent_compat, llhttp_compat, streamclient
from .streamclient import (BadResponse, ConnectFailed, ConnectionLost, ConnectTimedOut, PreparedRequest, ReadTimedOut,
                           SendClock, StreamCut, UnsupportedURL, WriteTimedOut)

BLOCK_SIZE = 65536
MAX_HEADER_BYTES = 65536  # all of a response's header bytes; vLLM sends a few hundred

_DROP = set().discard  # a C callback that keeps nothing (and returns None: llhttp goes on)


class _ResponseParser(HTTPResponse):
    """llhttp's parser (``geventhttpclient``'s) handing over what it parses in lists, each filled by a
    ``list.append`` given to llhttp as the callback (C: no Python call per header or per piece of the
    body): the status text's pieces, the header names and values (latin-1 text of the wire's bytes),
    and the body as it is parsed, not accumulated. llhttp hands a name or a value over in two pieces
    when a read ends inside it: the lists pair up only for a head parsed in one ``feed`` (a head
    that took several reads is parsed again, in one piece). A final response after an interim 1xx
    starts the lists again; after the final response's head nothing more is kept (a chunked body's
    trailer fields, a HEAD response's stray body are not its head)."""

    # ``HTTPResponse``'s flags, False until llhttp's callbacks set them on the parser itself.
    headers_complete = message_begun = message_complete = False
    _message_ended_in_skip_body = _trailing_data_dropped = False

    def __init__(self, method: str):  # not ``HTTPResponse.__init__``: its header index is not used
        self.method = method.upper()
        self.status: list[str] = []
        self.names: list[str] = []
        self.values: list[str] = []
        self.body: list[bytearray] = []  # llhttp's copies of each piece (a new bytearray each)
        self._on_status, self._on_header_field = self.status.append, self.names.append
        self._on_header_value, self._on_body = self.values.append, self.body.append

    def _on_message_begin(self) -> None:
        if self.message_begun and not self.message_complete:
            raise HTTPProtocolViolationError(f"a new response began before the end of {self.get_code()}")
        if self.message_complete:
            self.headers_complete = self.message_complete = False
            if self._on_header_field is not _DROP:  # the final response after an interim 1xx: its own head
                del self.status[:], self.names[:], self.values[:]
        self.message_begun = True

    def _on_headers_complete(self) -> bool:
        self.headers_complete = True
        if self.get_code() >= 200:  # the final head: what llhttp parses after it is not it
            self._on_status = self._on_header_field = self._on_header_value = _DROP
        if self.method == "HEAD":  # the message ends with its headers (``HTTPResponse.feed`` reads this)
            self._message_ended_in_skip_body = True
            return True
        return False

    def __repr__(self) -> str:  # ``HTTPResponse``'s reads the header index this parser does not keep
        return f"<{type(self).__name__} status={self.get_code()} headers={len(self.names)}>"

    def head(self) -> tuple[str, streamclient.Headers]:
        """The status text and the headers as ``(lowered name, value)``; whitespace after a value is
        not the value's (RFC 9110 5.5: llhttp passes it on, h11 strips it)."""
        values = self.values
        if any(v.endswith((" ", "\t")) for v in values):
            values = [v.rstrip(" \t") for v in values]
        return "".join(self.status), streamclient.Headers(zip([n.lower() for n in self.names], values))


_PEEK_NOW = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)  # an int: the flags' ``|`` makes an enum member per call


def _closed_while_idle(sock: socket.socket) -> bool:
    """An idle keep-alive socket that is readable has been closed by the server (or holds junk).
    A non-blocking peek of the C socket, not ``select``: gevent's ``select`` with a zero timeout
    switches to the hub, and a request's one yield before its send is the clock's
    (``wire.WireClock``). Without the C socket (``gevent_compat`` not verified), ``select``: a
    gevent socket's own ``recv`` would wait for the bytes the peek asks not to wait for."""
    raw = gevent_compat.raw_socket(sock)
    try:
        if raw is None:
            return bool(select.select([sock], [], [], 0)[0])
        raw.recv(1, _PEEK_NOW)
        return True  # bytes (junk) or b"" (closed): not reusable either way
    except BlockingIOError:
        return False  # nothing to read: the connection is open and clean
    except (OSError, ValueError):
        return True


class _ReadWatch:
    """Read timeouts for response bodies without a timer per read: a socket read with a timeout
    arms and cancels one (gevent's ``Timeout``, about 4 us of a chunk's 40, issue 25). A body being
    read notes the instant of its last bytes; one daemon thread (a greenlet under Locust's
    monkey-patching) looks every ``period`` and shuts down a socket silent for its read timeout,
    which ends that read (the read then raises ``ReadTimedOut``). A timeout fires up to ``period``
    (at most a quarter of the shortest timeout watched, at most ``MAX_PERIOD_S``) late."""

    MAX_PERIOD_S = 0.25

    def __init__(self):
        self.bodies: set[LeanResponse] = set()
        self.thread: threading.Thread | None = None
        # A forked process (``--processes``) has no such thread, nor the parent's bodies to watch.
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.thread = None
        self.bodies = set()

    def watch(self, body: "LeanResponse") -> None:
        self.bodies.add(body)
        # Not ``thread.is_alive()`` each time: under gevent it takes a lock (2% of a short request's CPU).
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="read-timeouts", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        try:
            self._watch_forever()
        finally:  # killed (a test's hub, a greenlet kill): the next body starts another
            if self.thread is threading.current_thread():
                self.thread = None

    def _watch_forever(self) -> None:
        while True:
            bodies = list(self.bodies)
            period = min([self.MAX_PERIOD_S, *(b.read_timeout_s / 4 for b in bodies)])
            time.sleep(max(period, 0.001))
            now = time.monotonic()
            for body in bodies:
                if body in self.bodies and now - body.last_read_s >= body.read_timeout_s:
                    body.expire()


_READ_WATCH = _ReadWatch()


def _read_error(err: Exception, expired: bool, part: str, lost: streamclient.WireError) -> streamclient.WireError:
    """The seam's error for a socket or parser failure while reading ``part`` of a response: a
    timeout, a malformed response, or else ``lost``."""
    if expired or isinstance(err, socket.timeout):
        return ReadTimedOut(f"timed out waiting for {part}")
    if isinstance(err, HTTPParseError):
        return BadResponse(f"malformed HTTP response ({part}): {err}")
    return lost


class _StaleConnection(Exception):
    """A reused connection that the server had closed: nothing of this request reached it."""


class LeanClient:
    """HTTP/1.1 over one keep-alive connection at a time (a Locust user sends one request at a time;
    a second concurrent request opens a second connection)."""

    def __init__(self, tls=None, block_size: int = BLOCK_SIZE, max_header_bytes: int = MAX_HEADER_BYTES):
        self.block_size = block_size
        self.max_header_bytes = max_header_bytes
        self._idle: list[tuple[tuple, socket.socket]] = []
        self._head: tuple | None = None  # (headers, route, their bytes): ``_request_head``

    # -- connections --------------------------------------------------------------------------------
    def _take_idle(self, key: tuple) -> socket.socket | None:
        while self._idle:
            idle_key, sock = self._idle.pop()
            if idle_key == key and not _closed_while_idle(sock):
                return sock
            sock.close()
        return None

    def _connect(self, key: tuple, timeout_s: float | None) -> socket.socket:
        host, port = key
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except socket.timeout as err:
            raise ConnectTimedOut(f"connect to {host}:{port} timed out") from err
        except OSError as err:
            raise ConnectFailed(f"{err.strerror or err} ({host}:{port})") from err
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def release(self, key: tuple, sock: socket.socket, reusable: bool) -> None:
        if reusable:
            self._idle.append((key, sock))
        else:
            sock.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    def _request_head(self, request: PreparedRequest) -> bytes:
        """The request line and header lines, ``Host`` first, ``Content-Length`` last, blank line
        included. A user's requests repeat all but the body's length: the rest is kept as bytes and
        reused while the request's header tuple is the same object."""
        head, route = self._head, request.route
        if head is None or head[0] is not request.headers or head[1] is not route:
            host = route.host if route.port == 80 else f"{route.host}:{route.port}"
            lines = [f"{route.method} {route.target} HTTP/1.1\r\nHost: {host}".encode("ascii"),
                     *(name + b": " + value for name, value in request.headers)]
            head = self._head = (request.headers, route, b"\r\n".join(lines) + b"\r\nContent-Length: ")
        return head[2] + b"%d\r\n\r\n" % len(request.body)

    # -- one exchange -------------------------------------------------------------------------------
    def send(self, request: PreparedRequest, clock: SendClock) -> "LeanResponse":
        route = request.route
        if route.scheme != "http":
            raise UnsupportedURL(f"the lean client speaks plain http, not {route.scheme} (--http-transport httpx)")
        key = (route.host, route.port)
        payload = self._request_head(request) + request.body
        sock = self._take_idle(key)
        if sock is not None:
            try:
                return self._exchange(key, sock, request, payload, clock)
            except _StaleConnection:
                sock.close()  # the server closed it between requests: once more on a new one
        sock = self._connect(key, request.timeouts.connect_s)
        try:
            return self._exchange(key, sock, request, payload, clock)
        except _StaleConnection as err:
            sock.close()
            raise ConnectionLost("server closed the connection without sending a response") from err

    def _exchange(self, key, sock, request: PreparedRequest, payload: bytes, clock: SendClock) -> "LeanResponse":
        parser = _ResponseParser(request.route.method)
        body = LeanResponse(self, key, sock, parser, request.timeouts.read_s)
        received = 0
        reads: list[bytes] = []  # the head's (a head parsed in pieces is parsed again whole)
        watched = False
        try:
            clock.sending()
            # One syscall for a request that fits the socket's buffer: a gevent socket's own C socket
            # (non-blocking) sends what fits now; the rest, or a plain socket's request, is sent
            # with the write timeout.
            raw = gevent_compat.raw_socket(sock)
            sent = 0
            if raw is not None:
                try:
                    sent = raw.send(payload)
                except BlockingIOError:
                    pass
            if sent < len(payload):
                sock.settimeout(request.timeouts.write_s)
                try:
                    sock.sendall(memoryview(payload)[sent:])
                except socket.timeout as err:  # no response was waited for
                    sock.close()
                    raise WriteTimedOut("timed out sending the request") from err
            # The head is waited for as the body is: the read watcher keeps the read timeout.
            watched = body.watch(sock)
            wait, raw_recv = body.reader = gevent_compat.waiting_reader(sock)
            while not parser.headers_complete or parser.get_code() < 200:
                data = gevent_compat.read_when_ready(sock, wait, raw_recv, self.block_size)
                if data is None:
                    continue
                if body.expired:
                    raise ReadTimedOut("timed out waiting for the response headers")
                if watched:
                    body.last_read_s = time.monotonic()
                if not data:
                    if not received:
                        raise _StaleConnection()
                    raise ConnectionLost("server closed the connection before the response headers ended")
                received += len(data)
                reads.append(data)
                parser.feed(data)
                if received > self.max_header_bytes and not (parser.headers_complete and parser.get_code() >= 200):
                    sock.close()
                    raise BadResponse(f"response headers over {self.max_header_bytes} bytes")
        except (BrokenPipeError, ConnectionResetError) as err:
            if not received:
                raise _StaleConnection() from err
            sock.close()
            raise ConnectionLost(f"{type(err).__name__} reading the response headers") from err
        except (OSError, HTTPParseError) as err:
            sock.close()
            raise _read_error(err, body.expired, "the response headers", ConnectionLost(
                f"{type(err).__name__} reading the response headers: {err}")) from err
        except ReadTimedOut:
            sock.close()
            raise
        finally:
            if watched:
                _READ_WATCH.bodies.discard(body)  # the body's reads watch it again
        if len(reads) > 1:  # a head that came in several reads: parsed again in one piece
            whole = _ResponseParser(request.route.method)
            whole.feed(b"".join(reads))
            body.reason, body.headers = whole.head()
        else:
            body.reason, body.headers = parser.head()
        body.status = parser.get_code()
        return body


class LeanResponse:
    """A response as it arrives: its head, then each read's parsed body bytes (chunked framing
    removed). Its reads have no socket timeout: ``_ReadWatch`` keeps the read timeout."""

    def __init__(self, client: LeanClient, key: tuple, sock: socket.socket, parser: _ResponseParser,
                 read_timeout_s: float | None = None):
        self._client, self._key, self._sock, self._parser = client, key, sock, parser
        self.status, self.reason, self.headers = 0, "", streamclient.Headers()
        self.read_timeout_s = read_timeout_s
        self.reader: tuple = (None, None)  # ``gevent_compat.waiting_reader``'s pair, found once
        self.last_read_s = time.monotonic()
        self.expired = False

    def watch(self, sock: socket.socket) -> bool:
        """Reads of ``sock`` from now on have no socket timeout; with a read timeout, ``_READ_WATCH``
        keeps it (the caller discards this body from it when its reads end). Whether it is watched."""
        if sock.timeout is not None:  # a kept-alive socket's is None since its first body
            sock.settimeout(None)
        if self.read_timeout_s is None:
            return False
        self.last_read_s = time.monotonic()
        _READ_WATCH.watch(self)
        return True

    def expire(self) -> None:
        """No bytes for the read timeout (``_ReadWatch``): end the read that waits on the socket."""
        self.expired = True
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def reads(self) -> Iterator[bytes]:
        parser, body, sock = self._parser, self._parser.body, self._sock
        if sock is None:
            return
        if body:
            yield b"".join(body)
            body.clear()
        monotonic = time.monotonic
        size = self._client.block_size
        feed = llhttp_compat.body_feed(parser)
        # A gevent socket is waited on before it is read (``gevent_compat``); a plain socket blocks in ``recv``.
        watched = False
        try:
            watched = self.watch(sock)
            wait, raw_recv = self.reader if self.reader[0] is not None else gevent_compat.waiting_reader(sock)
            while not parser.message_complete:
                data = gevent_compat.read_when_ready(sock, wait, raw_recv, size)
                if data is None:
                    continue
                if self.expired:
                    raise ReadTimedOut("timed out waiting for the body")
                if not data:
                    raise StreamCut("peer closed connection without sending complete message body")
                if watched:
                    self.last_read_s = monotonic()
                feed(data)
                if body:
                    chunk = b"".join(body)  # bytes, from llhttp's bytearrays
                    body.clear()
                    yield chunk
        except (OSError, HTTPParseError) as err:
            self.close()
            raise _read_error(err, self.expired, "the body", StreamCut(f"{type(err).__name__}: {err}")) from err
        except streamclient.WireError:
            self.close()
            raise
        finally:
            if watched:
                _READ_WATCH.bodies.discard(self)
        self._sock = None
        self._client.release(self._key, sock, not parser.should_close())

    def close(self) -> None:
        """A body abandoned before its end leaves bytes on the wire: that connection is closed."""
        if self._sock is not None:
            sock, self._sock = self._sock, None
            sock.close()


streamclient.register("lean", LeanClient)
