"""An httpx transport for streamed completions over plain HTTP/1.1: a keep-alive socket per user,
responses parsed by llhttp (C, through ``geventhttpclient``, which Locust already installs).

Why: with httpx's own transport (httpcore and h11, pure Python) reading one streamed chunk cost
about 40% of the client's CPU per chunk (a gevent timeout, h11's event machine and four stream
wrappers per read). Here a chunk is one ``recv``, one C parse and one yield. The ``openai`` SDK
still builds the request, authenticates and turns statuses into its errors; only the bytes on
the wire are handled here. ``https://`` hosts keep httpx's transport (``client.make_client``).

The send stamp: httpx's request hook sets the ``trace`` extension (``wire.py``); it is called
with httpcore's event name just before the request's bytes are written, as httpcore does.
Errors are httpx's, so the SDK and ``client.describe_error`` read them as before. The response
headers are capped at ``MAX_HEADER_BYTES`` (200 MB of them had been read into memory and the
request counted a success; httpx's own transport refuses past 100 KiB).
"""

from __future__ import annotations

import errno
import os
import socket
import threading
import time
from typing import Iterator

import httpx2
from geventhttpclient._parser import HTTPResponseParser
from geventhttpclient.response import HTTPParseError, HTTPProtocolViolationError, HTTPResponse
from httpx2._client import BoundSyncStream

from .wire import WireClock

BLOCK_SIZE = 65536
MAX_HEADER_BYTES = 65536  # all of a response's header bytes; vLLM sends a few hundred


_DROP = set().discard  # a C callback that keeps nothing (and returns None: llhttp goes on)


class _ResponseParser(HTTPResponse):
    """llhttp's parser (``geventhttpclient``'s) handing over what it parses in lists, each filled by a
    ``list.append`` given to llhttp as the callback (C: no Python call per header or per piece of the
    body; geventhttpclient's callbacks were 4 Python calls per header): the status text's pieces, the
    header names and values (latin-1 text of the wire's bytes), and the body as it is parsed, not
    accumulated. llhttp hands a name or a value over in two pieces when a read ends inside it: the
    lists pair up only for a head parsed in one ``feed`` (``LeanTransport._exchange`` parses a head
    that took several reads again, in one piece). A final response after an interim 1xx starts the
    lists again; after the final response's head nothing more is kept (a chunked body's trailer
    fields, a HEAD response's stray body are not its head, as in httpx's own transport). What
    ``HTTPResponse``'s own ``feed`` and ``should_close`` read is kept as it keeps it."""

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
            # (else bytes after a final response, a HEAD's stray body: not this response's head)
        self.message_begun = True

    def _on_headers_complete(self) -> bool:
        self.headers_complete = True
        if self.get_code() >= 200:  # the final head: what llhttp parses after it (trailers, stray bytes) is not it
            self._on_status = self._on_header_field = self._on_header_value = _DROP
        if self.method == "HEAD":  # the message ends with its headers (``HTTPResponse.feed`` reads this)
            self._message_ended_in_skip_body = True
            return True
        return False

    def __repr__(self) -> str:  # ``HTTPResponse``'s reads the header index this parser does not keep
        return f"<{type(self).__name__} status={self.get_code()} headers={len(self.names)}>"

    def head(self) -> tuple[str, httpx2.Headers]:
        """The status text and the headers, as httpx's ``Headers`` (its ``(name, lowered name, value)``
        triples set as ``httpx2.Headers(pairs)`` makes them, without a call per header). Headers all
        ASCII have the encoding ``Headers.encoding`` would find, without its decoding of each name and
        value at the first lookup (any other is left to it)."""
        names, values = self.names, self.values
        value_text = "\0".join(values)
        if " \0" in value_text or "\t\0" in value_text or value_text.endswith((" ", "\t")):
            # Whitespace after a value is not the value's (RFC 9110 5.5; llhttp passes it on, h11 and
            # so httpx's own transport strip it)
            values = [value.rstrip(" \t") for value in values]
            value_text = "\0".join(values)
        # Each list as one piece of text, encoded and split again (NUL is in no name or value llhttp
        # passes; the lengths are checked all the same): the wire's bytes, in C.
        name_bytes = "\0".join(names).encode("latin-1")
        value_bytes = value_text.encode("latin-1")
        raw_names, raw_values = name_bytes.split(b"\0"), value_bytes.split(b"\0")
        if names and len(raw_names) == len(names) and len(raw_values) == len(values):
            fields = list(zip(raw_names, name_bytes.lower().split(b"\0"), raw_values))
        else:
            fields = [(n.encode("latin-1"), n.encode("latin-1").lower(), v.encode("latin-1"))
                      for n, v in zip(names, values)]
        ascii_only = name_bytes.isascii() and value_bytes.isascii()
        return "".join(self.status), headers_of(fields, "ascii" if ascii_only else None)


def headers_of(fields: list, encoding: str | None) -> httpx2.Headers:
    """``httpx2.Headers`` holding httpx's ``(name, lowered name, value)`` triples ``fields`` as they are,
    with ``encoding`` (None: httpx finds it at the first lookup), without the constructor's
    ``isinstance`` tests (one against an abstract class) and its call per header."""
    headers = _new_headers(httpx2.Headers)
    headers._list, headers._encoding = fields, encoding
    return headers


_new_headers = object.__new__


_PEEK_NOW = int(socket.MSG_PEEK | socket.MSG_DONTWAIT)  # an int: the flags' ``|`` makes an enum member per call


def _closed_while_idle(sock: socket.socket) -> bool:
    """An idle keep-alive socket that is readable has been closed by the server (or holds junk).

    A non-blocking peek, not ``select``: gevent's ``select`` with a zero timeout switches to the
    hub, and a request's one yield before its send belongs to ``wire.WireClock`` (a wave's setups
    first, then its sends)."""
    try:
        # The socket's own C object, not gevent's ``recv`` (which catches the EAGAIN and raises it again).
        getattr(sock, "_sock", sock).recv(1, _PEEK_NOW)
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
    which ends that read (the body then raises ``ReadTimeout``). A timeout fires up to ``period``
    (at most a quarter of the shortest timeout watched, at most ``MAX_PERIOD_S``) late."""

    MAX_PERIOD_S = 0.25

    def __init__(self):
        self.bodies: set[_BodyStream] = set()
        self.thread: threading.Thread | None = None
        # A forked process (``--processes``) has no such thread, nor the parent's bodies to watch: told
        # by the fork itself, not by ``os.getpid()`` per body (a system call, twice per request).
        os.register_at_fork(after_in_child=self._forked)

    def _forked(self) -> None:
        self.thread = None
        self.bodies = set()

    def watch(self, body: "_BodyStream") -> None:
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


class LeanTransport(httpx2.BaseTransport):
    """HTTP/1.1 over one keep-alive connection at a time (a Locust user sends one request at a time;
    a second concurrent request opens a second connection)."""

    def __init__(self, block_size: int = BLOCK_SIZE, max_header_bytes: int = MAX_HEADER_BYTES):
        self.block_size = block_size
        self.max_header_bytes = max_header_bytes
        self._idle: list[tuple[tuple, socket.socket]] = []
        self._route: tuple | None = None  # (url, connection key) of the last request
        self._head: tuple | None = None  # (url, method, header fields but the last, their bytes): ``_request_head``

    # -- connections --------------------------------------------------------------------------------
    def _take_idle(self, key: tuple) -> socket.socket | None:
        while self._idle:
            idle_key, sock = self._idle.pop()
            if idle_key == key and not _closed_while_idle(sock):
                return sock
            sock.close()
        return None

    def _connect(self, key: tuple, timeout_s: float | None) -> socket.socket:
        _, host, port = key
        try:
            sock = socket.create_connection((host, port), timeout=timeout_s)
        except socket.timeout as err:
            raise httpx2.ConnectTimeout(f"connect to {host}:{port} timed out") from err
        except OSError as err:
            raise httpx2.ConnectError(f"{err.strerror or err} ({host}:{port})") from err
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _release(self, key: tuple, sock: socket.socket, reusable: bool) -> None:
        if reusable:
            self._idle.append((key, sock))
        else:
            sock.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop()[1].close()

    def _request_head(self, request: httpx2.Request) -> bytes:
        """``_request_bytes``'s head, blank line included. A user's requests repeat their method, URL
        and headers but for the last (a templated post's ``Content-Length``): those lines are kept as
        bytes and reused while they are the same (17 header lines joined again per request before)."""
        fields = request.headers._list  # httpx's (name, lowered name, value)
        if not fields:
            return _head_bytes(request.method, request.url, ()) + b"\r\n\r\n"
        head, kept = self._head, fields[:-1]
        if head is None or head[0] is not request.url or head[1] != request.method or head[2] != kept:
            head = self._head = (request.url, request.method, kept,
                                 _head_bytes(request.method, request.url, [(f[0], f[2]) for f in kept]))
        name, _, value = fields[-1]
        return head[3] + b"\r\n" + name + b": " + value + b"\r\n\r\n"

    # -- one exchange -------------------------------------------------------------------------------
    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        url = request.url
        route = self._route
        if route is None or route[0] is not url:  # a user's requests share their template's URL (immutable)
            if url.scheme != "http":
                raise httpx2.UnsupportedProtocol(f"LeanTransport speaks plain http, not {url.scheme}")
            route = self._route = (url, (url.scheme, url.host, url.port or 80))
        key = route[1]
        timeouts = request.extensions.get("timeout", {})
        payload = self._request_head(request) + request.read()
        trace = request.extensions.get("trace")
        sock = self._take_idle(key)
        if sock is not None:
            try:
                return self._exchange(key, sock, request, payload, trace, timeouts)
            except _StaleConnection:
                sock.close()  # the server closed it between requests: once more on a new one
        sock = self._connect(key, timeouts.get("connect"))
        try:
            return self._exchange(key, sock, request, payload, trace, timeouts)
        except _StaleConnection as err:
            sock.close()
            raise httpx2.RemoteProtocolError("server closed the connection without sending a response") from err

    def _exchange(self, key, sock, request, payload: bytes, trace, timeouts: dict) -> httpx2.Response:
        parser = _ResponseParser(request.method)
        body = _BodyStream(self, key, sock, parser, timeouts.get("read"))
        received = 0
        reads: list[bytes] = []  # the head's (``_ResponseParser``: a head parsed in pieces is parsed again whole)
        watched = False
        try:
            if trace is not None:
                trace(WireClock.SEND_EVENT, {"request": request})
            # One syscall for a request that fits the socket's buffer: a gevent socket's own C socket
            # (non-blocking) sends what fits now, no timeout needed; the rest, or a plain socket's
            # request, is sent with the write timeout (gevent's ``sendall`` asks for the buffer's size first).
            raw_send = getattr(getattr(sock, "_sock", None), "send", None)
            sent = 0
            if raw_send is not None:
                try:
                    sent = raw_send(payload)
                except BlockingIOError:
                    pass
            if sent < len(payload):
                sock.settimeout(timeouts.get("write"))
                try:
                    sock.sendall(memoryview(payload)[sent:])
                except socket.timeout as err:  # httpcore's name for it; no response was waited for
                    sock.close()
                    raise httpx2.WriteTimeout("timed out sending the request") from err
            # The headers are waited for as the body is: the read watcher keeps the read timeout
            # (a gevent timer armed and cancelled per request before), the socket is waited on, then read.
            watched = body.watch(sock)
            wait, raw_recv = body.reader = _waiting_reader(sock)
            while not parser.headers_complete or parser.get_code() < 200:
                data = _read_when_ready(sock, wait, raw_recv, self.block_size)
                if data is None:
                    continue
                if body.expired:
                    raise httpx2.ReadTimeout("timed out waiting for the response headers")
                if watched:
                    body.last_read_s = time.monotonic()
                if not data:
                    if not received:
                        raise _StaleConnection()
                    raise httpx2.RemoteProtocolError("server closed the connection before the response headers ended")
                received += len(data)
                reads.append(data)
                parser.feed(data)
                if received > self.max_header_bytes and not (parser.headers_complete and parser.get_code() >= 200):
                    sock.close()
                    raise httpx2.RemoteProtocolError(f"response headers over {self.max_header_bytes} bytes")
        except (BrokenPipeError, ConnectionResetError) as err:
            if not received:
                raise _StaleConnection() from err
            sock.close()
            raise httpx_error(err, "the response headers") from err
        except (OSError, HTTPParseError) as err:
            sock.close()
            if body.expired:
                raise httpx2.ReadTimeout("timed out waiting for the response headers") from err
            raise httpx_error(err, "the response headers") from err
        except httpx2.ReadTimeout:
            sock.close()
            raise
        finally:
            if watched:
                _READ_WATCH.bodies.discard(body)  # the body's reads watch it again (a body never read is not watched)
        status, headers = (parser if len(reads) == 1 else _parsed_whole(request.method, reads)).head()
        version = parser.get_http_version()
        return response_of(parser.get_code(), headers, body,
                           {"http_version": _VERSIONS.get(version) or version.encode("ascii"),
                            "reason_phrase": status.encode("latin-1")})


_VERSIONS = {"HTTP/1.1": b"HTTP/1.1", "HTTP/1.0": b"HTTP/1.0"}  # llhttp's text -> httpcore's extension bytes


def response_of(status_code: int, headers: httpx2.Headers, stream: httpx2.SyncByteStream,
                extensions: dict) -> httpx2.Response:
    """What ``httpx2.Response(status_code, headers=headers, stream=stream, extensions=extensions)``
    makes, its headers ``headers`` themselves (the constructor copies them and forgets their
    encoding), made without the constructor's steps for what a transport's response does not have
    (content to encode, a request, a history). ``tests/unit/test_transport.py`` holds it to the constructor's."""
    response = _new_response(httpx2.Response)
    response.status_code, response.headers = status_code, headers
    response.extensions, response.stream = extensions, stream
    response._request = response.next_request = None
    response.history = []
    response.is_closed = response.is_stream_consumed = False
    response.default_encoding, response._num_bytes_downloaded = "utf-8", 0
    return response


_new_response = object.__new__


def _parsed_whole(method: str, reads: list[bytes]) -> _ResponseParser:
    """A head that came in several reads, parsed again in one piece (its names and values whole:
    ``_ResponseParser``); the bytes after it, parsed here too, are the body's parser's to hand over."""
    parser = _ResponseParser(method)
    parser.feed(b"".join(reads))
    return parser


def httpx_error(err: Exception, part: str) -> httpx2.TransportError:
    """The httpx error a socket or parser failure while reading ``part`` of a response is."""
    if isinstance(err, socket.timeout):
        return httpx2.ReadTimeout(f"timed out waiting for {part}")
    if isinstance(err, HTTPParseError):
        return httpx2.RemoteProtocolError(f"malformed HTTP response ({part}): {err}")
    return httpx2.ReadError(str(err))


class _StaleConnection(Exception):
    """A reused connection that the server had closed: nothing of this request reached it."""


def _request_bytes(request: httpx2.Request) -> bytes:
    """The request on the wire: its head and its body."""
    return _head_bytes(request.method, request.url, request.headers.raw) + b"\r\n\r\n" + request.read()


def _head_bytes(method: str, url: httpx2.URL, fields) -> bytes:
    """The request line and the header lines ``(name, value)``, without the blank line that ends them."""
    lines = [f"{method} ".encode("ascii") + (url.raw_path or b"/") + b" HTTP/1.1"]
    lines.extend(name + b": " + value for name, value in fields)
    return b"\r\n".join(lines)


def _waiting_reader(sock) -> tuple:
    """``(wait, recv)`` for a gevent socket without a timeout: its wait for readability
    (``_wait(_read_event)``, what its own ``recv`` does after a failed read) and the non-blocking
    socket's ``recv``; ``(None, None)`` for any other socket (plain sockets read with ``recv``)."""
    wait, raw = getattr(sock, "_wait", None), getattr(sock, "_sock", None)
    if wait is None or raw is None or getattr(sock, "_read_event", None) is None or sock.gettimeout() is not None:
        return None, None
    return wait, raw.recv


def _read_when_ready(sock, wait, raw_recv, size: int) -> bytes | None:
    """One read of ``sock`` with ``_waiting_reader``'s pair: wait until it is readable, then read
    (None: woken with nothing to read); without the pair, the socket's own blocking ``recv``."""
    if wait is None:
        return sock.recv(size)
    event = sock._read_event  # ``_read_event(sock)``, in line: once per chunk
    if event is None:
        _read_event(sock)
    wait(event)
    try:
        return raw_recv(size)
    except BlockingIOError:
        return None


def _read_event(sock):
    """The gevent socket's read watcher; a socket closed since (``response.close()`` between two reads)
    has none, and reading it is the EBADF that gevent's own ``recv`` raised (httpx's ``ReadError``)."""
    event = sock._read_event
    if event is None:
        raise OSError(errno.EBADF, "Bad file descriptor")
    return event


def _parser_feed(parser: _ResponseParser):
    """llhttp's ``feed`` itself: ``HTTPResponse.feed``'s Python wrapper only mends a HEAD response's
    trailing bytes, and a body is never a HEAD's."""
    return HTTPResponseParser.feed.__get__(parser)


def raw_reads(response: httpx2.Response) -> Iterator[bytes]:
    """``response.iter_raw()``: the body's reads as they return. For this transport's own body,
    straight from it (httpx's ``iter_raw`` and the client's ``BoundSyncStream`` are two generators
    and a list per read); any other stream (``bounds.CappedStream``, httpx's transport) through
    ``iter_raw``. What ``iter_raw`` keeps besides is not kept: ``num_bytes_downloaded`` stays 0, and
    the response is closed by its caller (``Endpoint.stream``), not at the body's end (``elapsed``
    is set then)."""
    stream = response.stream
    body = getattr(stream, "_stream", None)
    if (type(stream) is not BoundSyncStream or type(body) is not _BodyStream or response.is_stream_consumed
            or response.is_closed):
        return response.iter_raw()
    response.is_stream_consumed = True
    return body.reads(response.request)


def close_response(response: httpx2.Response) -> None:
    """``response.close()``. This transport's own body (``raw_reads``'s) is closed without httpx's
    context manager around its close (a generator-based one, there to name the request on an httpx
    error, and closing this body raises none): ``is_closed`` and ``elapsed`` set as httpx sets them."""
    stream = response.stream
    if type(stream) is BoundSyncStream and type(stream._stream) is _BodyStream:
        if not response.is_closed:
            response.is_closed = True
            stream.close()
        return
    response.close()


class _BodyStream(httpx2.SyncByteStream):
    """The response body as it arrives: each read's parsed bytes (chunked framing removed). Its
    reads have no socket timeout: ``_ReadWatch`` keeps the read timeout."""

    def __init__(self, transport: LeanTransport, key: tuple, sock: socket.socket, parser: _ResponseParser,
                 read_timeout_s: float | None = None):
        self._transport, self._key, self._sock, self._parser = transport, key, sock, parser
        self.read_timeout_s = read_timeout_s
        self.reader: tuple = (None, None)  # ``_waiting_reader``'s pair, found once for the head and the body
        self.last_read_s = time.monotonic()
        self.expired = False

    def watch(self, sock: socket.socket) -> bool:
        """Reads of ``sock`` (this body's) from now on have no socket timeout; with a read timeout,
        ``_READ_WATCH`` keeps it (the caller discards this body from it when its reads end). Whether
        it is watched."""
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

    def __iter__(self) -> Iterator[bytes]:
        return self.reads()

    def reads(self, request: httpx2.Request | None = None) -> Iterator[bytes]:
        """The body's reads, as ``__iter__``; an httpx error raised here names ``request`` (what
        httpx's ``iter_raw`` does for the reads it passes on: ``raw_reads``)."""
        parser, body, sock = self._parser, self._parser.body, self._sock
        if sock is None:
            return
        if body:
            yield b"".join(body)
            body.clear()
        monotonic = time.monotonic
        size = self._transport.block_size
        feed = _parser_feed(parser)
        # A gevent socket (Locust's monkey-patching) is waited on before it is read: gevent's own
        # ``recv`` reads first, and between two chunks of a stream that read fails (EAGAIN) and raises,
        # a syscall and an exception per chunk (issue 25). A plain socket (tests) blocks in ``recv``.
        watched = False
        try:
            watched = self.watch(sock)
            wait, raw_recv = self.reader if self.reader[0] is not None else _waiting_reader(sock)
            while not parser.message_complete:
                data = _read_when_ready(sock, wait, raw_recv, size)
                if data is None:
                    continue
                if self.expired:
                    raise httpx2.ReadTimeout("timed out waiting for the body")
                if not data:
                    raise httpx2.RemoteProtocolError("peer closed connection without sending complete message body")
                if watched:
                    self.last_read_s = monotonic()
                feed(data)
                if body:
                    chunk = b"".join(body)  # bytes, from llhttp's bytearrays
                    body.clear()
                    yield chunk
        except (OSError, HTTPParseError) as err:
            self.close()
            if self.expired:
                error = httpx2.ReadTimeout("timed out waiting for the body")
            else:
                error = httpx_error(err, "the body")
            if request is not None:
                error.request = request
            raise error from err
        except httpx2.TransportError as err:
            self.close()
            if request is not None:
                err.request = request
            raise
        finally:
            if watched:
                _READ_WATCH.bodies.discard(self)
        self._sock = None
        self._transport._release(self._key, sock, not parser.should_close())

    def close(self) -> None:
        """A body abandoned before its end leaves bytes on the wire: that connection is closed."""
        if self._sock is not None:
            sock, self._sock = self._sock, None
            sock.close()
