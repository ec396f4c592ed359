"""LeanTransport against scripted raw-socket servers: keep-alive, stale connections, broken bodies."""

import os
import socket
import threading

import httpx2
import pytest

from vllm_locust.backend.client import make_client
from vllm_locust.backend.transport import LeanTransport
from vllm_locust.backend.wire import WireClock

CHUNKED_OK = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
              b"8\r\ndata:1\r\n\r\n" b"8\r\ndata:2\r\n\r\n" b"0\r\n\r\n")


class ScriptedServer:
    """Accepts connections on 127.0.0.1; ``handler(conn, index)`` plays one connection's script."""

    def __init__(self, handler):
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.requests: list[bytes] = []
        self.handler = handler
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self):
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self.handler, args=(self, conn, self.connections), daemon=True).start()

    def read_request(self, conn) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            more = conn.recv(65536)
            if not more:
                return b""
            data += more
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(next((line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), b"0"))
        while len(body) < length:
            body += conn.recv(65536)
        self.requests.append(head + b"\r\n\r\n" + body)
        return data

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}/v1/stream"

    def close(self):
        self.listener.close()


def post(client: httpx2.Client, url: str, **kw):
    with client.stream("POST", url, json={"x": 1}, **kw) as response:
        return response.status_code, list(response.iter_raw())


def keep_alive(server, conn, index):
    while server.read_request(conn):
        conn.sendall(CHUNKED_OK)


def test_streams_a_chunked_body_and_reuses_the_connection():
    server = ScriptedServer(keep_alive)
    client = httpx2.Client(transport=LeanTransport())
    results = [post(client, server.url) for _ in range(3)]
    assert [b"".join(body) for _, body in results] == [b"data:1\r\ndata:2\r\n"] * 3
    assert results[0][0] == 200
    assert server.connections == 1, "one keep-alive connection for back-to-back requests"
    assert b'{"x":1}' in server.requests[0] and server.requests[0].startswith(b"POST /v1/stream HTTP/1.1\r\n")
    server.close()


def test_a_request_larger_than_the_sockets_buffer_is_sent_whole():
    server = ScriptedServer(keep_alive)
    client = httpx2.Client(transport=LeanTransport())
    body = b"x" * (16 << 20)  # one send takes only what the socket's buffer holds
    with client.stream("POST", server.url, content=body) as response:
        assert response.status_code == 200 and b"".join(response.iter_raw()) == b"data:1\r\ndata:2\r\n"
    assert server.requests[0].endswith(b"\r\n\r\n" + body)
    server.close()


def test_a_request_the_server_does_not_read_is_a_write_timeout():
    """A send stuck past the write timeout is httpx's ``WriteTimeout`` (as httpcore's), not a read
    timeout of response headers never waited for."""
    def never_read(server, conn, index):
        threading.Event().wait(5)
        conn.close()

    server = ScriptedServer(never_read)
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(5.0, write=0.3))
    with pytest.raises(httpx2.WriteTimeout, match="sending the request"):
        client.post(server.url, content=b"x" * (64 << 20))  # more than both sockets' buffers hold
    server.close()


def test_a_connection_the_server_closed_between_requests_is_replaced_once():
    def close_after_one(server, conn, index):
        server.read_request(conn)
        conn.sendall(CHUNKED_OK)
        if index == 1:
            server.read_request(conn)  # the second request arrives on the old connection...
            conn.close()  # ...and the server closes it without answering (keep-alive expiry race)
            return
        keep_alive(server, conn, index)

    server = ScriptedServer(close_after_one)
    client = httpx2.Client(transport=LeanTransport())
    assert post(client, server.url)[0] == 200
    assert post(client, server.url)[0] == 200, "the request is sent again on a new connection"
    assert server.connections == 2
    server.close()


def test_a_body_abandoned_midway_closes_its_connection():
    def slow_body(server, conn, index):
        while server.read_request(conn):
            conn.sendall(CHUNKED_OK[:-5])  # the body's last chunk never comes on the first connection
            if index > 1:
                conn.sendall(CHUNKED_OK[-5:])

    server = ScriptedServer(slow_body)
    client = httpx2.Client(transport=LeanTransport())
    with client.stream("POST", server.url, json={}) as response:
        next(response.iter_raw())  # read one chunk, then leave
    assert post(client, server.url)[0] == 200
    assert server.connections == 2, "bytes left on the wire: that connection is not reused"
    server.close()


@pytest.mark.parametrize("script,error,text", [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8\r\ndata:1\r\n\r\n", httpx2.RemoteProtocolError, "peer closed"),
    (b"NOT HTTP AT ALL\r\n\r\n", httpx2.RemoteProtocolError, "malformed HTTP response"),
    (b"HTTP/1.1 200 OK\r\nContent-Len", httpx2.RemoteProtocolError, "before the response headers ended"),
])
def test_broken_responses_are_httpx_errors(script, error, text):
    def once(server, conn, index):
        server.read_request(conn)
        conn.sendall(script)
        conn.close()

    server = ScriptedServer(once)
    client = httpx2.Client(transport=LeanTransport())
    with pytest.raises(error, match=text):
        post(client, server.url)
    server.close()


def stall_after_headers(server, conn, index):
    """The response's headers and part of its first chunk, then silence."""
    server.read_request(conn)
    conn.sendall(CHUNKED_OK[:90])
    threading.Event().wait(5)


def test_silence_after_the_headers_is_a_read_timeout():
    server = ScriptedServer(stall_after_headers)
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(0.3))
    with pytest.raises(httpx2.ReadTimeout):
        post(client, server.url)
    server.close()


def test_a_forked_worker_starts_its_own_read_watcher():
    """A process forked from one whose watcher ran (``--processes``) has no such thread, nor the
    parent's bodies to watch (it would shut down the parent's sockets): silence there must still
    time out. A real fork; the child's exit code is the verdict."""
    import time

    from vllm_locust.backend import transport

    transport._READ_WATCH.watch(transport._BodyStream(None, (), None, None, 60.0))  # the parent's watcher, a body
    assert transport._READ_WATCH.thread is not None and transport._READ_WATCH.bodies
    server = ScriptedServer(stall_after_headers)
    pid = os.fork()
    if pid == 0:  # the child: 0 = a fresh watcher timed the silence out
        code = 1
        try:
            if transport._READ_WATCH.thread is not None or transport._READ_WATCH.bodies:
                code = 3  # the parent's (dead) thread or bodies
            else:
                try:
                    post(httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(0.3)), server.url)
                except httpx2.ReadTimeout:
                    code = 0 if transport._READ_WATCH.thread is not None else 4
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    transport._READ_WATCH.bodies.clear()
    server.close()
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, done


def test_refused_connection_is_a_connect_error():
    with pytest.raises(httpx2.ConnectError):
        post(httpx2.Client(transport=LeanTransport()), "http://127.0.0.1:9/v1")


def test_the_send_stamp_is_taken_before_the_request_bytes_go_out():
    seen = []

    def handler(server, conn, index):
        server.read_request(conn)
        seen.append("server read")
        conn.sendall(CHUNKED_OK)

    server = ScriptedServer(handler)
    client = httpx2.Client(transport=LeanTransport())
    post(client, server.url, extensions={"trace": lambda name, info: seen.append(name)})
    assert seen == [WireClock.SEND_EVENT, "server read"]
    server.close()


def test_lean_transport_only_for_plain_http_hosts():
    lean = make_client("http://127.0.0.1:8000", "", 1, 1)
    assert isinstance(lean._client._transport, LeanTransport)
    assert not isinstance(make_client("https://example.invalid", "", 1, 1)._client._transport, LeanTransport)
    assert not isinstance(make_client("http://127.0.0.1:8000", "", 1, 1, transport="httpx")._client._transport, LeanTransport)


def test_response_headers_past_the_cap_are_refused_not_read_on():
    """Seen: the lean transport read 200 MB of headers (RSS 489 MB) and counted a success."""

    def huge_headers(server, conn, index):
        server.read_request(conn)
        try:
            conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n")
            for i in range(256):  # 1 MB of headers, then a valid body
                conn.sendall(b"X-Junk-%d: " % i + b"x" * 4000 + b"\r\n")
            conn.sendall(b"\r\n" + CHUNKED_OK.split(b"\r\n\r\n", 1)[1])
        except OSError:
            pass  # the client hung up

    server = ScriptedServer(huge_headers)
    client = httpx2.Client(transport=LeanTransport())
    with pytest.raises(httpx2.RemoteProtocolError, match="response headers over 65536 bytes"):
        post(client, server.url)
    server.close()


def test_protocol_errors_are_bad_responses_not_refusals():
    """Seen: a malformed response counted as "connection refused" and --stop-after-refused-s ended a
    run with "no server ... (did it die?)" while the server answered every request."""
    from vllm_locust.backend.client import connection_refused, describe_error, failure_kind

    def bad_chunk(server, conn, index):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\ndata\r\n")
        conn.close()

    server = ScriptedServer(bad_chunk)
    for transport in ("lean", "httpx"):
        client = make_client(f"http://127.0.0.1:{server.port}", "", 5, 5, transport=transport)
        with pytest.raises(Exception) as caught:
            with client.chat.completions.with_streaming_response.create(model="m", messages=[], stream=True) as r:
                list(r.http_response.iter_raw())
        message = describe_error(caught.value, 5)
        assert message.startswith("bad response: "), (transport, message)
        assert failure_kind(message) == "bad_response"
        assert not connection_refused(caught.value), transport
    server.close()
    with pytest.raises(Exception) as refused:
        make_client("http://127.0.0.1:9", "", 5, 5).models.list()
    assert connection_refused(refused.value) and describe_error(refused.value).startswith("connection failed")


def test_every_request_asks_for_identity_encoding():
    server = ScriptedServer(keep_alive)
    for transport in ("lean", "httpx"):
        client = make_client(f"http://127.0.0.1:{server.port}", "", 5, 5, transport=transport)
        with client.chat.completions.with_streaming_response.create(model="m", messages=[], stream=True) as r:
            list(r.http_response.iter_raw())
    assert len(server.requests) == 2
    for request in server.requests:
        head = request.split(b"\r\n\r\n")[0].lower()
        assert b"\r\naccept-encoding: identity" in head and b"gzip" not in head, head
    server.close()


# -- read timeouts without a timer per read (issue 25) ---------------------------------------------

def _dribble(chunks: int, every_s: float):
    def handler(server, conn, index):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(chunks):
            threading.Event().wait(every_s)
            conn.sendall(b"8\r\ndata:1\r\n\r\n")
        conn.sendall(b"0\r\n\r\n")
    return handler


def test_a_bodys_reads_arm_no_timer_each(monkeypatch):
    import gevent.timeout

    armed = []
    start = gevent.timeout.Timeout._start_new_or_dummy  # what a gevent socket read with a timeout calls

    def counting(timeout, exception=None, ref=True):
        if timeout == 30.0:  # the client's (the scripted server's own waits are shorter)
            armed.append(timeout)
        return start(timeout, exception, ref)

    monkeypatch.setattr(gevent.timeout.Timeout, "_start_new_or_dummy", staticmethod(counting))
    server = ScriptedServer(_dribble(40, 0.005))
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(30.0))
    with client.stream("POST", server.url, json={"x": 1}) as response:
        reads = list(response.iter_raw())
    assert b"".join(reads).count(b"data:1") == 40 and len(reads) > 5, "the body did not arrive in pieces"
    assert len(armed) <= 4, f"{len(armed)} timers armed for one request of {len(reads)} reads (connect, headers: 3)"
    server.close()


def test_a_body_that_keeps_coming_outlives_its_read_timeout():
    """Silence is what times out, not the body's length: 2 s of chunks, 50 ms apart, 0.8 s read timeout."""
    server = ScriptedServer(_dribble(40, 0.05))
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(0.8))
    with client.stream("POST", server.url, json={"x": 1}) as response:
        assert b"".join(response.iter_raw()).count(b"data:1") == 40
    server.close()


class _CountingSocket:
    """A socket's C object with its failed non-blocking reads counted (everything else passed on)."""

    def __init__(self, real):
        self._real = real
        self.would_block = 0

    def recv(self, *args):
        try:
            return self._real.recv(*args)
        except BlockingIOError:
            self.would_block += 1
            raise

    def __getattr__(self, name):
        return getattr(self._real, name)


def test_a_body_is_waited_for_not_read_until_it_would_block(monkeypatch):
    """Between two chunks of a stream the body's reader waits for the socket, then reads: gevent's
    own ``recv`` read first, failed (EAGAIN) and raised once per chunk (issue 25)."""
    counted = []
    connect = LeanTransport._connect

    def counting_connect(self, key, timeout_s):
        sock = connect(self, key, timeout_s)
        sock._sock = _CountingSocket(sock._sock)
        counted.append(sock._sock)
        return sock

    monkeypatch.setattr(LeanTransport, "_connect", counting_connect)
    server = ScriptedServer(_dribble(40, 0.005))
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(30.0))
    with client.stream("POST", server.url, json={"x": 1}) as response:
        reads = list(response.iter_raw())
    assert b"".join(reads).count(b"data:1") == 40 and len(reads) > 5, "the body did not arrive in pieces"
    assert len(counted) == 1 and counted[0].would_block <= 2, f"{counted[0].would_block} failed reads for {len(reads)} reads"
    server.close()


def test_raw_reads_are_iter_raws_reads_straight_from_the_body():
    """``raw_reads``: the same bytes as ``iter_raw`` for this transport's body, the response marked
    consumed, an error naming its request; a capped body (not an event stream) keeps its cap."""
    from vllm_locust.backend.bounds import guard_response
    from vllm_locust.backend.transport import _BodyStream, raw_reads

    server = ScriptedServer(_dribble(10, 0.001))
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(5.0))
    with client.stream("POST", server.url, json={"x": 1}) as response:
        expected = list(response.iter_raw())
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(5.0))
    with client.stream("POST", server.url, json={"x": 1}) as response:
        reads = raw_reads(response)
        assert response.is_stream_consumed and type(response.stream._stream) is _BodyStream
        assert b"".join(reads) == b"".join(expected) and expected
        with pytest.raises(httpx2.StreamConsumed):
            next(response.iter_raw())
    server.close()

    server = ScriptedServer(stall_after_headers)
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(0.3))
    with client.stream("POST", server.url, json={"x": 1}) as response:
        with pytest.raises(httpx2.ReadTimeout) as raised:
            list(raw_reads(response))
        assert raised.value.request is response.request
    server.close()

    def plain(server, conn, index):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 64\r\n\r\n" + b"x" * 64)

    server = ScriptedServer(plain)
    client = httpx2.Client(transport=LeanTransport(), event_hooks={"response": [lambda r: guard_response(r, 16)]})
    with client.stream("POST", server.url, json={"x": 1}) as response:
        with pytest.raises(httpx2.RemoteProtocolError, match="over 16 bytes"):
            list(raw_reads(response))
    server.close()


def test_silence_before_the_headers_is_a_read_timeout_without_a_timer(monkeypatch):
    """A server that reads the request and says nothing: ``ReadTimeout`` from the read watcher, and a
    request on a kept-alive connection arms no gevent timer (one per request before, issue 25)."""
    import gevent.timeout

    armed = []
    start = gevent.timeout.Timeout._start_new_or_dummy

    def counting(timeout, exception=None, ref=True):
        if timeout in (0.4, 30.0):  # the clients' (the scripted servers' own waits differ)
            armed.append(timeout)
        return start(timeout, exception, ref)

    monkeypatch.setattr(gevent.timeout.Timeout, "_start_new_or_dummy", staticmethod(counting))

    def mute(server, conn, index):
        server.read_request(conn)
        threading.Event().wait(5)

    server = ScriptedServer(mute)
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(0.4))
    with pytest.raises(httpx2.ReadTimeout, match="response headers"):
        post(client, server.url)
    server.close()

    server = ScriptedServer(keep_alive)
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(30.0))
    assert post(client, server.url)[0] == 200  # opens the connection (its connect may arm one)
    armed.clear()
    for _ in range(3):
        status, reads = post(client, server.url)
        assert status == 200 and b"".join(reads).count(b"data:") == 2
    assert server.connections == 1 and armed == [], f"{len(armed)} timers armed for 3 requests on a kept-alive connection"
    server.close()


def _first_chunk_then_wait(split: bool):
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"

    def handler(server, conn, index):
        server.read_request(conn)
        if split:  # the first chunk in a read of its own (the body's loop), not with the headers
            conn.sendall(head)
            threading.Event().wait(0.2)
            conn.sendall(b"8\r\ndata:1\r\n\r\n")
        else:
            conn.sendall(head + b"8\r\ndata:1\r\n\r\n")
        threading.Event().wait(3)  # the rest does not come in time: the reader waits on the socket
    return handler


@pytest.mark.parametrize("split", [False, True], ids=["chunk-with-headers", "chunk-read-alone"])
def test_reading_on_after_the_response_was_closed_is_a_read_error(split):
    """``response.close()`` between two reads, then the reads go on: httpx's ``ReadError`` (EBADF), as
    gevent's own ``recv`` gave; an ``AttributeError`` or gevent's ``ConcurrentObjectUseError`` before
    the fix (no request failure a user can read)."""
    server = ScriptedServer(_first_chunk_then_wait(split))
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(5.0))
    with client.stream("POST", server.url, content=b"{}") as response:
        reads = iter(response.stream)
        assert next(reads) == b"data:1\r\n"
        response.close()
        with pytest.raises(httpx2.ReadError, match="Bad file descriptor"):
            next(reads)
    server.close()


# -- the head of a response and of a request, each made once (issue 25, sixth part) ------------------

ODD_HEAD = (b"HTTP/1.1 200 Fine Thanks\r\nX-A: 1\r\nX-B:  two \t \r\nx-a: 3\r\nX-Empty:\r\nX-Latin: caf\xe9\r\n"
            b"X-Utf: caf\xc3\xa9\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
PLAIN_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
BODY = b"8\r\ndata:1\r\n\r\n" b"8\r\ndata:2\r\n\r\n" b"0\r\n\r\n"


def answering(response: bytes):
    def script(server, conn, index):
        try:
            while server.read_request(conn):
                conn.sendall(response)
        except OSError:
            pass  # the client closed a connection it cannot reuse
    return script


def seen_through(transport, url: str, method: str = "POST") -> tuple:
    """What a client reads of one response: status, reason, HTTP version, raw headers and their
    encoding, body."""
    client = httpx2.Client(transport=transport)
    with client.stream(method, url, content=b"{}" if method == "POST" else None) as response:
        return (response.status_code, response.reason_phrase, response.http_version, response.headers.raw,
                response.headers.encoding, b"".join(response.iter_raw()))


@pytest.mark.parametrize("response", [
    PLAIN_HEAD + BODY,
    ODD_HEAD + BODY,  # repeated names apart, an empty value, whitespace after a value, latin-1 and UTF-8 bytes
    b"HTTP/1.1 100 Continue\r\nX-Interim: yes\r\n\r\n" + ODD_HEAD + BODY,  # an interim response first
    b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"e\":\"no\"}\n",
    PLAIN_HEAD + BODY[:-2] + b"X-Trailer: t\r\n\r\n",  # a chunked body's trailer field: not a header
    b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\nok",  # an HTTP/1.0 server
], ids=["plain", "odd", "interim", "404", "trailer", "http-1.0"])
@pytest.mark.parametrize("block", [65536, 5], ids=["one-read", "5-byte-reads"])
def test_a_response_reads_as_httpxs_own_transport_reads_it(response, block, monkeypatch):
    """The lean transport's headers come from llhttp's lists in C (``_ResponseParser.head``); a
    head read in pieces is parsed again whole (5-byte reads: every name and value split). Compared
    with httpx's own transport (h11) on the same bytes: the same status, reason, headers in wire
    order (geventhttpclient's grouped a repeated name), encoding and body."""
    from vllm_locust.backend import transport

    parsed_whole = []
    real = transport._parsed_whole
    monkeypatch.setattr(transport, "_parsed_whole", lambda *a: parsed_whole.append(1) or real(*a))
    server = ScriptedServer(answering(response))
    lean = seen_through(LeanTransport(block_size=block), server.url)
    assert lean == seen_through(httpx2.HTTPTransport(), server.url)
    assert len(parsed_whole) == (block == 5)
    server.close()


@pytest.mark.parametrize("block", [65536, 5], ids=["one-read", "5-byte-reads"])
def test_a_head_response_with_a_stray_body_keeps_its_own_head(block):
    """Found by a review: bytes after a HEAD response (a server that sends a body anyway) began
    a new message on the parser and emptied the response's reason and headers; httpx's own
    transport keeps both (and the connection is not reused)."""
    stray = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello"
    server = ScriptedServer(answering(stray))
    lean = seen_through(LeanTransport(block_size=block), server.url, "HEAD")
    assert lean[:4] == (200, "OK", "HTTP/1.1", [(b"Content-Length", b"5"), (b"X-A", b"1")])
    assert lean == seen_through(httpx2.HTTPTransport(), server.url, "HEAD")
    server.close()


def test_a_head_fed_in_pieces_is_split_and_parsed_again_whole():
    """llhttp hands a name or value cut by the end of a read over in two pieces: the lists no longer
    pair up, so a head that took several reads is parsed again in one piece."""
    from vllm_locust.backend.transport import _parsed_whole, _ResponseParser

    pieces = [ODD_HEAD[i:i + 3] for i in range(0, len(ODD_HEAD), 3)]
    split = _ResponseParser("POST")
    for piece in pieces:
        split.feed(piece)
    whole = _ResponseParser("POST")
    whole.feed(ODD_HEAD)
    assert len(split.names) > len(whole.names) == 8
    status, headers = _parsed_whole("POST", pieces).head()
    assert (status, headers.raw) == (whole.head()[0], whole.head()[1].raw)
    assert headers.raw[1] == (b"X-B", b"two") and headers.raw[4] == (b"X-Latin", b"caf\xe9")
    assert headers.encoding == "iso-8859-1" and _ResponseParser("POST").head()[1].raw == []


def test_a_request_head_is_made_again_only_when_it_changes():
    """``LeanTransport._request_head`` keeps a request's lines but the last; any change (a header a
    hook set, another URL or method, the last header's value) is on the wire as
    ``_request_bytes`` makes it."""
    from vllm_locust.backend.transport import _request_bytes

    transport = LeanTransport()
    url = httpx2.URL("http://127.0.0.1:9/v1/chat/completions")
    headers = httpx2.Headers({"Host": "127.0.0.1:9", "Authorization": "Bearer k", "Content-Length": "2"})

    def wire(request):
        return transport._request_head(request) + request.read()

    first = httpx2.Request("POST", url, headers=headers, content=b"{}")
    first.url = url  # a template's requests share one URL object
    assert wire(first) == _request_bytes(first)
    kept = transport._head
    again = httpx2.Request("POST", url, headers=headers, content=b"{}")
    again.url = url
    assert wire(again) == _request_bytes(again) and transport._head is kept
    longer_headers = httpx2.Headers(headers)
    longer_headers["Content-Length"] = "3"
    longer = httpx2.Request("POST", url, headers=longer_headers, content=b"{1}")
    longer.url = url
    assert wire(longer) == _request_bytes(longer) and transport._head is kept
    hooked = httpx2.Request("POST", url, headers=headers, content=b"{}")
    hooked.url = url
    hooked.headers["Authorization"] = "Bearer other"  # a request hook's change
    changed = [hooked, httpx2.Request("PUT", url, headers=headers, content=b"{}"),
               httpx2.Request("POST", "http://127.0.0.1:9/v1/completions", headers=headers, content=b"{}"),
               httpx2.Request("GET", url), httpx2.Request("GET", url, headers={"Accept": "*/*"})]
    changed[-1].headers._list.clear()
    for request in changed:
        assert wire(request) == _request_bytes(request)
    assert b"Bearer other" in wire(hooked) and wire(changed[-1]).endswith(b" HTTP/1.1\r\n\r\n")


def test_closing_a_lean_response_is_httpxs_close():
    """``close_response``: this transport's body closed without httpx's context manager, as httpx's
    ``close`` leaves it (closed, ``elapsed`` set, an abandoned body's connection closed); any other
    response through httpx's own ``close``."""
    from vllm_locust.backend.transport import close_response

    server = ScriptedServer(keep_alive)
    transport = LeanTransport()
    client = httpx2.Client(transport=transport)
    for read, idle in ((True, 1), (False, 0)):
        response = client.send(client.build_request("POST", server.url, content=b"{}"), stream=True)
        if read:
            list(response.iter_raw())
        close_response(response)
        close_response(response)  # a second close does nothing
        assert response.is_closed and response.elapsed.total_seconds() > 0
        assert len(transport._idle) == idle, "a read body's connection is kept, an abandoned one's closed"
    assert post(client, server.url)[0] == 200 and server.connections == 2
    other = httpx2.Response(200, stream=httpx2.ByteStream(b"x"))
    close_response(other)
    assert other.is_closed
    server.close()


def test_a_lean_response_is_what_httpxs_constructor_makes():
    """``response_of`` and ``headers_of`` set a response's attributes without httpx's constructors:
    the same attributes and values as ``httpx2.Response(..., headers=..., stream=..., extensions=...)``,
    the headers' encoding kept (the constructor's copy forgets it)."""
    from vllm_locust.backend.transport import headers_of, response_of

    fields = [(b"Content-Type", b"content-type", b"text/event-stream"), (b"X-A", b"x-a", b"1")]
    stream, extensions = httpx2.ByteStream(b"data"), {"http_version": b"HTTP/1.1", "reason_phrase": b"OK"}
    made = response_of(200, headers_of(list(fields), "ascii"), stream, dict(extensions))
    stock = httpx2.Response(200, headers=[(n, v) for n, _, v in fields], stream=stream, extensions=dict(extensions))
    assert sorted(vars(made)) == sorted(vars(stock))
    for name in vars(stock):
        if name != "headers":
            assert getattr(made, name) == getattr(stock, name), name
    assert made.headers.raw == stock.headers.raw and made.headers._list == stock.headers._list
    assert made.headers.encoding == "ascii" and headers_of([], None).encoding == "ascii"
    assert (made.status_code, made.reason_phrase, made.http_version, made.read()) == (200, "OK", "HTTP/1.1", b"data")


def test_a_kept_alive_request_sets_no_socket_timeout(monkeypatch):
    """A request on a kept-alive connection is sent by the C socket (non-blocking: what fits the
    buffer needs no write timeout) and its head and body are read without a socket timeout (the
    read watcher keeps it): no ``settimeout`` per request (three before)."""
    import gevent.socket

    calls = []
    real = gevent.socket.socket.settimeout
    monkeypatch.setattr(gevent.socket.socket, "settimeout", lambda self, t: calls.append(t) or real(self, t))
    server = ScriptedServer(keep_alive)
    client = httpx2.Client(transport=LeanTransport(), timeout=httpx2.Timeout(30.0))
    for _ in range(4):
        assert post(client, server.url)[0] == 200
    assert server.connections == 1
    assert calls == [30.0, None], "the connect timeout, then none for the first head: nothing per request"
    server.close()


@pytest.mark.parametrize("fields", [
    [],
    [("Content-Type", "text/event-stream; charset=utf-8")],
    [("content-type", "application/json"), ("Content-Length", "12")],
    [("Content-Type", "application/json"), ("Content-Type", "text/event-stream")],
    [("Content-Type", "text/event-stream"), ("Content-Type", "application/json")],
    [("Content-Type", "Text/Event-Stream")],
    [("Content-Type", "")],
    [("Content-Encoding", ""), ("Content-Type", "text/event-stream")],
    [("Content-Encoding", "identity"), ("Content-Type", "application/json")],
    [("Content-Encoding", " Identity ")],
    [("Content-Type", "text/event-stream"), ("Content-Encoding", "gzip")],
    [("X-A", "1"), ("content-encoding", "br"), ("Content-Type", "text/plain")],
])
def test_the_response_guard_decides_as_httpxs_own_header_lookups(fields):
    """``guard_response`` reads httpx's header triples in C: the same refusal and the same cap as
    httpx's own ``headers.get("content-encoding")`` and ``headers["content-type"]`` (repeated names
    joined by ", "), for every mix of the two."""
    from vllm_locust.backend.bounds import CappedStream, guard_response, refused_encoding

    response = httpx2.Response(200, headers=fields, stream=httpx2.ByteStream(b"{}"),
                               request=httpx2.Request("POST", "http://127.0.0.1/v1/chat/completions"))
    headers = httpx2.Headers(fields)
    reason = refused_encoding(headers) if "content-encoding" in headers else None
    capped = "content-type" not in headers or not headers["content-type"].startswith("text/event-stream")
    if reason is not None:
        with pytest.raises(httpx2.RemoteProtocolError, match="Content-Encoding"):
            guard_response(response)
        return
    guard_response(response)
    assert (type(response.stream) is CappedStream) == capped, (fields, capped)
