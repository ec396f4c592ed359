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


def test_a_forked_worker_starts_its_own_read_watcher(monkeypatch):
    """A process forked from one whose watcher ran (``--processes``) has no such thread: silence
    there must still time out."""
    from vllm_locust.backend import transport

    watch = transport._ReadWatch()
    watch.watch(transport._BodyStream(None, (), None, None, 1.0))  # the parent's watcher
    parents = watch.thread
    monkeypatch.setattr(watch, "pid", -1)  # as a forked child sees it
    monkeypatch.setattr(transport, "_READ_WATCH", watch)
    watch.bodies.clear()
    test_silence_after_the_headers_is_a_read_timeout()
    assert watch.thread is not parents and watch.pid == os.getpid()


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
