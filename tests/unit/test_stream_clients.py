"""The wire-client seam's contract (``backend/streamclient.py``): both ``StreamClient``s, the lean one
(llhttp) and the reference one (httpx's public client), against scripted raw-socket servers:
keep-alive, broken responses, timeouts, the send stamp, the bounds. Then the lean client's own
speed-path promises (no timer per read, the request head kept), each against what it replaced."""

from __future__ import annotations

import os
import socket
import threading
import time

import httpx2
import pytest

from vllm_locust.backend import gevent_compat, leanclient, llhttp_compat, streamclient
from vllm_locust.backend.apiclient import ApiClient, SdkClient, make_client
from vllm_locust.backend.httpxclient import HttpxClient
from vllm_locust.backend.leanclient import LeanClient, _ResponseParser
from vllm_locust.backend.streamclient import (BadResponse, ConnectFailed, ConnectionLost, PreparedRequest,
                                              ReadTimedOut, Route, StreamCut, Timeouts, WriteTimedOut)

KINDS = ["lean", "lean-public", "httpx"]  # lean-public: the lean client on gevent's and llhttp's public paths
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


class Clock:
    """A ``SendClock`` that notes when it was told."""

    def __init__(self, seen: list | None = None):
        self.seen = [] if seen is None else seen

    def sending(self) -> None:
        self.seen.append("sending")


@pytest.fixture(autouse=True)
def public_paths(request, monkeypatch):
    """``lean-public``: the lean client as on a gevent or geventhttpclient it was not verified
    against (``gevent_compat``, ``llhttp_compat``): every read, send and feed through their public
    API. The contract holds there too."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("kind") == "lean-public":
        monkeypatch.setattr(gevent_compat, "VERIFIED", False)
        monkeypatch.setattr(llhttp_compat, "_C_FEED", None)


def client_of(kind: str, **kw):
    return HttpxClient() if kind == "httpx" else LeanClient(**kw)


def prepared(url: str, body: bytes = b'{"x":1}', method: str = "POST", headers: tuple = (), connect_s=5.0,
             read_s=5.0, write_s=None) -> PreparedRequest:
    return PreparedRequest(Route(method, url), headers, body, Timeouts(connect_s, read_s, write_s))


def post(client, url: str, clock=None, **kw) -> tuple[int, list[bytes]]:
    response = client.send(prepared(url, **kw), clock or Clock())
    try:
        return response.status, list(response.reads())
    finally:
        response.close()


def keep_alive(server, conn, index):
    while server.read_request(conn):
        conn.sendall(CHUNKED_OK)


# -- the contract: both clients ------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_streams_a_chunked_body_and_reuses_the_connection(kind):
    server = ScriptedServer(keep_alive)
    client = client_of(kind)
    results = [post(client, server.url) for _ in range(3)]
    assert [b"".join(body) for _, body in results] == [b"data:1\r\ndata:2\r\n"] * 3
    assert results[0][0] == 200
    assert server.connections == 1, "one keep-alive connection for back-to-back requests"
    assert b'{"x":1}' in server.requests[0] and server.requests[0].startswith(b"POST /v1/stream HTTP/1.1\r\n")
    server.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_larger_than_the_sockets_buffer_is_sent_whole(kind):
    server = ScriptedServer(keep_alive)
    body = b"x" * (16 << 20)  # one send takes only what the socket's buffer holds
    status, reads = post(client_of(kind), server.url, body=body)
    assert status == 200 and b"".join(reads) == b"data:1\r\ndata:2\r\n"
    assert server.requests[0].endswith(b"\r\n\r\n" + body)
    server.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_request_the_server_does_not_read_is_a_write_timeout(kind):
    """A send stuck past the write timeout is a write timeout, not a read timeout of response
    headers never waited for."""
    def never_read(server, conn, index):
        threading.Event().wait(5)
        conn.close()

    server = ScriptedServer(never_read)
    with pytest.raises(WriteTimedOut):
        post(client_of(kind), server.url, body=b"x" * (64 << 20), write_s=0.3)  # more than both buffers hold
    server.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_body_abandoned_midway_closes_its_connection(kind):
    def slow_body(server, conn, index):
        while server.read_request(conn):
            conn.sendall(CHUNKED_OK[:-5])  # the body's last chunk never comes on the first connection
            if index > 1:
                conn.sendall(CHUNKED_OK[-5:])

    server = ScriptedServer(slow_body)
    client = client_of(kind)
    response = client.send(prepared(server.url), Clock())
    next(response.reads())  # read one chunk, then leave
    response.close()
    assert post(client, server.url)[0] == 200
    assert server.connections == 2, "bytes left on the wire: that connection is not reused"
    server.close()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("script,error", [
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n8\r\ndata:1\r\n\r\n", StreamCut),
    (b"NOT HTTP AT ALL\r\n\r\n", BadResponse),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\ndata\r\n", BadResponse),
    (b"HTTP/1.1 200 OK\r\nContent-Len", ConnectionLost),
], ids=["cut-body", "not-http", "bad-chunk", "cut-head"])
def test_broken_responses_are_the_seams_errors(kind, script, error):
    def once(server, conn, index):
        server.read_request(conn)
        conn.sendall(script)
        conn.close()

    server = ScriptedServer(once)
    with pytest.raises(error):
        post(client_of(kind), server.url)
    server.close()


def stall_after_headers(server, conn, index):
    """The response's headers and part of its first chunk, then silence."""
    server.read_request(conn)
    conn.sendall(CHUNKED_OK[:90])
    threading.Event().wait(5)


@pytest.mark.parametrize("kind", KINDS)
def test_silence_after_the_headers_is_a_read_timeout(kind):
    server = ScriptedServer(stall_after_headers)
    with pytest.raises(ReadTimedOut):
        post(client_of(kind), server.url, read_s=0.3)
    server.close()


@pytest.mark.parametrize("kind", KINDS)
def test_silence_before_the_headers_is_a_read_timeout(kind):
    def mute(server, conn, index):
        server.read_request(conn)
        threading.Event().wait(5)

    server = ScriptedServer(mute)
    with pytest.raises(ReadTimedOut):
        post(client_of(kind), server.url, read_s=0.4)
    server.close()


def _dribble(chunks: int, every_s: float):
    def handler(server, conn, index):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(chunks):
            threading.Event().wait(every_s)
            conn.sendall(b"8\r\ndata:1\r\n\r\n")
        conn.sendall(b"0\r\n\r\n")
    return handler


@pytest.mark.parametrize("kind", KINDS)
def test_a_body_that_keeps_coming_outlives_its_read_timeout(kind):
    """Silence is what times out, not the body's length: 3 s of chunks, 50 ms apart, 1.5 s read
    timeout (0.8 s timed out once on CI beside the vLLM shards: a starved thread's silence)."""
    server = ScriptedServer(_dribble(60, 0.05))
    status, reads = post(client_of(kind), server.url, read_s=1.5)
    assert b"".join(reads).count(b"data:1") == 60
    server.close()


@pytest.mark.parametrize("kind", KINDS)
def test_a_refused_connection_is_connect_failed_and_counts_as_refused(kind):
    from vllm_locust.backend.client import connection_refused, describe_error

    with pytest.raises(ConnectFailed) as caught:
        post(client_of(kind), "http://127.0.0.1:9/v1")
    assert connection_refused(caught.value) and describe_error(caught.value).startswith("connection failed: ")


@pytest.mark.parametrize("kind", KINDS)
def test_the_send_stamp_is_taken_before_the_request_bytes_go_out(kind):
    seen = []

    def handler(server, conn, index):
        while server.read_request(conn):
            seen.append("server read")
            conn.sendall(CHUNKED_OK)

    server = ScriptedServer(handler)
    client = client_of(kind)
    post(client, server.url, clock=Clock(seen))
    post(client, server.url, clock=Clock(seen))  # on the kept-alive connection too
    assert seen == ["sending", "server read"] * 2
    server.close()


@pytest.mark.parametrize("kind", KINDS)
def test_response_headers_past_a_cap_are_refused_not_read_on(kind):
    """Seen: the lean client read 200 MB of headers (RSS 489 MB) and counted a success. The lean
    client's cap is 64 KiB, httpx's (h11's) 100 KiB; 1 MB is past both."""

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
    with pytest.raises(BadResponse):
        post(client_of(kind), server.url)
    server.close()


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


def seen_through(client, url: str, method: str = "POST") -> tuple:
    """What a client reads of one response: status, reason, headers, body."""
    response = client.send(prepared(url, b"{}" if method == "POST" else b"", method), Clock())
    try:
        return response.status, response.reason, list(response.headers), b"".join(response.reads())
    finally:
        response.close()


@pytest.mark.parametrize("response", [
    PLAIN_HEAD + BODY,
    ODD_HEAD + BODY,  # repeated names apart, an empty value, whitespace after a value, latin-1 and UTF-8 bytes
    b"HTTP/1.1 100 Continue\r\nX-Interim: yes\r\n\r\n" + ODD_HEAD + BODY,  # an interim response first
    b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"e\":\"no\"}\n",
    PLAIN_HEAD + BODY[:-2] + b"X-Trailer: t\r\n\r\n",  # a chunked body's trailer field: not a header
    b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\nok",  # an HTTP/1.0 server
], ids=["plain", "odd", "interim", "404", "trailer", "http-1.0"])
@pytest.mark.parametrize("block", [65536, 5], ids=["one-read", "5-byte-reads"])
def test_the_lean_client_reads_a_response_as_httpx_reads_it(response, block):
    """The lean client's headers come from llhttp's lists in C; a head read in pieces is parsed
    again whole (5-byte reads: every name and value split). Against the reference client (h11) on
    the same bytes: the same status, reason, headers in wire order, and body."""
    server = ScriptedServer(answering(response))
    assert seen_through(LeanClient(block_size=block), server.url) == seen_through(HttpxClient(), server.url)
    server.close()


@pytest.mark.parametrize("block", [65536, 5], ids=["one-read", "5-byte-reads"])
def test_a_head_response_with_a_stray_body_keeps_its_own_head(block):
    """Found by a review: bytes after a HEAD response (a server that sends a body anyway) began a
    new message on the parser and emptied the response's reason and headers."""
    stray = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello"
    server = ScriptedServer(answering(stray))
    lean = seen_through(LeanClient(block_size=block), server.url, "HEAD")
    assert lean[:3] == (200, "OK", [("content-length", "5"), ("x-a", "1")])
    assert lean == seen_through(HttpxClient(), server.url, "HEAD")
    server.close()


# -- the user's client over the seam ---------------------------------------------------------------
def test_the_lean_client_only_for_plain_http_hosts():
    assert isinstance(make_client("http://127.0.0.1:8000", "", 1, 1).wire, LeanClient)
    assert isinstance(make_client("https://example.invalid", "", 1, 1).wire, HttpxClient)
    assert isinstance(make_client("http://127.0.0.1:8000", "", 1, 1, transport="httpx").wire, HttpxClient)
    assert isinstance(make_client("http://127.0.0.1:8000", "", 1, 1, transport="sdk"), SdkClient)
    assert isinstance(make_client("http://127.0.0.1:8000", "", 1, 1), ApiClient)


class Chat:
    path, name = "/chat/completions", "chat"

    def resource(self, sdk):
        return sdk.chat.completions


@pytest.mark.parametrize("transport", ["lean", "httpx", "sdk"])
def test_protocol_errors_are_bad_responses_not_refusals(transport):
    """Seen: a malformed response counted as "connection refused" and --stop-after-refused-s ended a
    run with "no server ... (did it die?)" while the server answered every request."""
    from vllm_locust.backend.client import connection_refused, describe_error, failure_kind

    def bad_chunk(server, conn, index):
        server.read_request(conn)
        conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\ndata\r\n")
        conn.close()

    server = ScriptedServer(bad_chunk)
    client = make_client(f"http://127.0.0.1:{server.port}", "", 5, 5, transport=transport)
    with pytest.raises(Exception) as caught:
        response = client.open(Chat(), {"model": "m", "messages": [], "stream": True}, Clock())
        list(response.reads())
    message = describe_error(caught.value, 5)
    assert message.startswith("bad response: "), message
    assert failure_kind(message) == "bad_response" and not connection_refused(caught.value)
    server.close()


@pytest.mark.parametrize("transport", ["lean", "httpx", "sdk"])
def test_every_request_asks_for_identity_encoding_with_bearer_auth(transport):
    server = ScriptedServer(keep_alive)
    client = make_client(f"http://127.0.0.1:{server.port}", "sk-k", 5, 5, transport=transport)
    response = client.open(Chat(), {"model": "m", "messages": [], "stream": True}, Clock())
    list(response.reads())
    response.close()
    [request] = server.requests
    head = request.split(b"\r\n\r\n")[0].lower()
    assert b"\r\naccept-encoding: identity" in head and b"gzip" not in head, head
    assert b"\r\nauthorization: bearer sk-k" in head and b"\r\ncontent-type: application/json" in head, head
    server.close()


def status_server(status: int, body: bytes, extra: bytes = b""):
    return ScriptedServer(answering(b"HTTP/1.1 %d Nope\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n"
                                    % (status, len(body), extra) + body))


@pytest.mark.parametrize("transport", ["lean", "httpx", "sdk"])
@pytest.mark.parametrize("status,kind", [(429, "http_429"), (400, "http_4xx"), (503, "http_5xx")])
def test_an_error_status_is_its_kind_with_the_servers_message(transport, status, kind):
    """Whichever client: the server's own message, the kind of its status, a 429's Retry-After."""
    from vllm_locust.backend.client import classify, retry_after_s

    server = status_server(status, b'{"error":{"message":"no %d"}}' % status, b"Retry-After: 3\r\n")
    client = make_client(f"http://127.0.0.1:{server.port}", "", 5, 5, transport=transport)
    with pytest.raises(Exception) as caught:
        client.open(Chat(), {"model": "m", "messages": [], "stream": True}, Clock())
    failure = classify(caught.value)
    assert failure.kind.value == kind and failure.message.startswith(f"HTTP {status}: no {status}"), failure
    assert retry_after_s(caught.value) == (3.0 if status == 429 else None)
    server.close()


def test_the_request_is_what_the_sdks_create_sends():
    """Differential: the same body, path and auth as the ``openai`` SDK's own ``create`` (its JSON
    with ``extra_body`` merged, its ``extra_headers``), from the suite's one serialisation."""
    import json

    from vllm_locust.backend.endpoints import endpoint

    server = ScriptedServer(keep_alive)
    body = endpoint("chat").body("m", 8, [{"role": "user", "content": "hi"}], continuous_usage=True, ignore_eos=True)
    body["extra_headers"] = {"X-Tenant": "a"}
    for transport in ("lean", "sdk"):
        client = make_client(f"http://127.0.0.1:{server.port}", "sk-k", 5, 5, transport=transport)
        response = client.open(endpoint("chat"), dict(body), Clock())
        list(response.reads())
        response.close()
    ours, sdks = server.requests
    for request in (ours, sdks):
        head, _, content = request.partition(b"\r\n\r\n")
        assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and b"\r\nX-Tenant: a" in head.replace(
            b"x-tenant", b"X-Tenant")
    assert json.loads(ours.partition(b"\r\n\r\n")[2]) == json.loads(sdks.partition(b"\r\n\r\n")[2])
    server.close()


def test_request_parts_take_every_mix_of_sdk_arguments_apart():
    """Every subset of ``create``'s SDK-only arguments: the body keeps its fields in order without
    them, ``extra_body`` merged last (overriding), and the rest come back as they were given."""
    import itertools
    import json

    from vllm_locust.backend.apiclient import SDK_ONLY, request_parts
    from vllm_locust.backend.endpoints import endpoint

    values = {"extra_body": {"ignore_eos": True, "max_tokens": 3}, "extra_headers": {"X-Tenant": "a"},
              "extra_query": {"q": "1"}, "timeout": 7.5}
    for n in range(len(SDK_ONLY) + 1):
        for keys in itertools.permutations(sorted(SDK_ONLY), n):
            body = endpoint("chat").body("m", 8, [{"role": "user", "content": "hi"}])
            for key in keys:
                body[key] = values[key]
            content, headers, query, timeout = request_parts(body)
            expected = {k: v for k, v in body.items() if k not in SDK_ONLY} | (values["extra_body"] if "extra_body" in keys else {})
            assert list(json.loads(content).items()) == list(expected.items()), keys
            assert (headers, query, timeout) == tuple(values[k] if k in keys else None
                                                      for k in ("extra_headers", "extra_query", "timeout")), keys


# -- the lean client's own promises ------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["lean", "lean-public"])
def test_a_connection_the_server_closed_while_idle_is_not_reused(kind):
    def one_per_connection(server, conn, index):
        server.read_request(conn)
        conn.sendall(CHUNKED_OK)
        conn.close()

    server = ScriptedServer(one_per_connection)
    client = client_of(kind)
    assert post(client, server.url)[0] == 200
    time.sleep(0.2)  # the server's close has reached the idle socket
    assert post(client, server.url)[0] == 200 and server.connections == 2
    assert len(server.requests) == 2, "the second request went once, on a new connection"
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
    client = LeanClient()
    assert post(client, server.url)[0] == 200
    assert post(client, server.url)[0] == 200, "the request is sent again on a new connection"
    assert server.connections == 2
    server.close()


def test_a_forked_worker_starts_its_own_read_watcher():
    """A process forked from one whose watcher ran (``--processes``) has no such thread, nor the
    parent's bodies to watch (it would shut down the parent's sockets): silence there must still
    time out. A real fork; the child's exit code is the verdict."""
    watch = leanclient._READ_WATCH
    watch.watch(leanclient.LeanResponse(LeanClient(), (), None, None, 60.0))  # the parent's watcher, a body
    assert watch.thread is not None and watch.bodies
    server = ScriptedServer(stall_after_headers)
    pid = os.fork()
    if pid == 0:  # the child: 0 = a fresh watcher timed the silence out
        code = 1
        try:
            if watch.thread is not None or watch.bodies:
                code = 3  # the parent's (dead) thread or bodies
            else:
                try:
                    post(LeanClient(), server.url, read_s=0.3)
                except ReadTimedOut:
                    code = 0 if watch.thread is not None else 4
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
    watch.bodies.clear()
    server.close()
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, done


def _count_timers(monkeypatch, *timeouts) -> list:
    import gevent.timeout

    armed = []
    start = gevent.timeout.Timeout._start_new_or_dummy  # what a gevent socket read with a timeout calls

    def counting(timeout, exception=None, ref=True):
        if timeout in timeouts:  # the client's (the scripted server's own waits differ)
            armed.append(timeout)
        return start(timeout, exception, ref)

    monkeypatch.setattr(gevent.timeout.Timeout, "_start_new_or_dummy", staticmethod(counting))
    return armed


def test_a_bodys_reads_arm_no_timer_each(monkeypatch):
    armed = _count_timers(monkeypatch, 30.0)
    server = ScriptedServer(_dribble(40, 0.005))
    status, reads = post(LeanClient(), server.url, connect_s=30.0, read_s=30.0)
    assert b"".join(reads).count(b"data:1") == 40 and len(reads) > 5, "the body did not arrive in pieces"
    assert len(armed) <= 4, f"{len(armed)} timers armed for one request of {len(reads)} reads (connect, headers: 3)"
    server.close()


def test_a_kept_alive_request_arms_no_timer(monkeypatch):
    """A request on a kept-alive connection arms no gevent timer (one per request before, issue 25)."""
    armed = _count_timers(monkeypatch, 30.0)
    server = ScriptedServer(keep_alive)
    client = LeanClient()
    assert post(client, server.url, connect_s=30.0, read_s=30.0)[0] == 200  # opens the connection
    armed.clear()
    for _ in range(3):
        status, reads = post(client, server.url, connect_s=30.0, read_s=30.0)
        assert status == 200 and b"".join(reads).count(b"data:") == 2
    assert server.connections == 1 and armed == [], f"{len(armed)} timers armed for 3 requests on a kept-alive connection"
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
    connect = LeanClient._connect

    def counting_connect(self, key, timeout_s):
        sock = connect(self, key, timeout_s)
        sock._sock = _CountingSocket(sock._sock)
        counted.append(sock._sock)
        return sock

    monkeypatch.setattr(LeanClient, "_connect", counting_connect)
    server = ScriptedServer(_dribble(40, 0.005))
    status, reads = post(LeanClient(), server.url, read_s=30.0)
    assert b"".join(reads).count(b"data:1") == 40 and len(reads) > 5, "the body did not arrive in pieces"
    assert len(counted) == 1 and counted[0].would_block <= 2, f"{counted[0].would_block} failed reads for {len(reads)} reads"
    server.close()


def _first_chunk_then_wait(split: bool):
    def handler(server, conn, index):
        server.read_request(conn)
        if split:  # the first chunk in a read of its own (the body's loop), not with the headers
            conn.sendall(PLAIN_HEAD)
            threading.Event().wait(0.2)
            conn.sendall(b"8\r\ndata:1\r\n\r\n")
        else:
            conn.sendall(PLAIN_HEAD + b"8\r\ndata:1\r\n\r\n")
        threading.Event().wait(3)  # the rest does not come in time: the reader waits on the socket
    return handler


@pytest.mark.parametrize("split", [False, True], ids=["chunk-with-headers", "chunk-read-alone"])
def test_reading_on_after_the_response_was_closed_is_a_cut_stream(split):
    """``close()`` between two reads, then the reads go on: a ``StreamCut`` (EBADF), not an
    ``AttributeError`` or gevent's ``ConcurrentObjectUseError`` (no request failure a user can read)."""
    server = ScriptedServer(_first_chunk_then_wait(split))
    response = LeanClient().send(prepared(server.url), Clock())
    reads = response.reads()
    assert next(reads) == b"data:1\r\n"
    response.close()
    with pytest.raises(StreamCut, match="Bad file descriptor"):
        next(reads)
    server.close()


def test_a_head_fed_in_pieces_is_split_and_parsed_again_whole():
    """llhttp hands a name or value cut by the end of a read over in two pieces: the lists no longer
    pair up, so a head that took several reads is parsed again in one piece."""
    split = _ResponseParser("POST")
    for i in range(0, len(ODD_HEAD), 3):
        split.feed(ODD_HEAD[i:i + 3])
    whole = _ResponseParser("POST")
    whole.feed(ODD_HEAD)
    assert len(split.names) > len(whole.names) == 8
    status, headers = whole.head()
    assert status == "Fine Thanks" and headers[1] == ("x-b", "two") and headers[4] == ("x-latin", "caf\xe9")
    assert headers.get("x-a") == "1" and _ResponseParser("POST").head()[1] == []


def test_a_request_head_is_made_again_only_when_it_changes():
    """``LeanClient._request_head`` keeps a request's lines but the body's length while its header
    tuple and route are the same objects; any other request's head is made again."""
    client = LeanClient()
    route = Route("POST", "http://127.0.0.1:9/v1/chat/completions")
    headers = ((b"Authorization", b"Bearer k"),)
    expected = b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:9\r\nAuthorization: Bearer k\r\nContent-Length: %d\r\n\r\n"
    first = client._request_head(PreparedRequest(route, headers, b"{}", Timeouts(1, 1)))
    kept = client._head
    again = client._request_head(PreparedRequest(route, headers, b"{1}", Timeouts(1, 1)))
    assert (first, again) == (expected % 2, expected % 3) and client._head is kept
    other = ((b"Authorization", b"Bearer other"),)
    assert client._request_head(PreparedRequest(route, other, b"{}", Timeouts(1, 1))) == (
        expected.replace(b"Bearer k", b"Bearer other") % 2)
    plain = client._request_head(PreparedRequest(Route("GET", "http://h/v1/models?x=1"), (), b"", Timeouts(1, 1)))
    assert plain == b"GET /v1/models?x=1 HTTP/1.1\r\nHost: h\r\nContent-Length: 0\r\n\r\n"


def test_a_kept_alive_request_sets_no_socket_timeout(monkeypatch):
    """A request on a kept-alive connection is sent by the C socket (non-blocking: what fits the
    buffer needs no write timeout) and its head and body are read without a socket timeout (the
    read watcher keeps it): no ``settimeout`` per request (three before)."""
    import gevent.socket

    calls = []
    real = gevent.socket.socket.settimeout
    monkeypatch.setattr(gevent.socket.socket, "settimeout", lambda self, t: calls.append(t) or real(self, t))
    server = ScriptedServer(keep_alive)
    client = LeanClient()
    for _ in range(4):
        assert post(client, server.url, connect_s=30.0, read_s=30.0)[0] == 200
    assert server.connections == 1
    assert calls == [30.0, None], "the connect timeout, then none for the first head: nothing per request"
    server.close()


def test_every_stream_client_is_registered():
    assert set(streamclient.CLIENTS) == {"lean", "httpx"}
    assert streamclient.CLIENTS["lean"] is LeanClient and streamclient.CLIENTS["httpx"] is HttpxClient


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
def test_the_sdk_clients_response_guard_decides_as_httpxs_own_header_lookups(fields):
    """``guard_response`` (the SDK client's hook) reads httpx's header triples in C: the same
    refusal and the same cap as httpx's own ``headers.get("content-encoding")`` and
    ``headers["content-type"]`` (repeated names joined by ", "), for every mix of the two."""
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
