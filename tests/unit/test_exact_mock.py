"""The exact-timing mock of high event rates (``mock/exact.py``): its script, its record, its refusals.

A real pool of two processes on one port, spoken to with plain sockets; every assertion is on
counts, bytes and order (no chunk before its instant: the loop waits for it), never on how late."""

from __future__ import annotations

import json
import socket

import pytest

from vllm_locust.mock.exact import ExactPool


def post(sock: socket.socket, path: str, body: dict) -> None:
    data = json.dumps(body).encode()
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)


def read_stream(sock: socket.socket) -> bytes:
    buf = b""
    while not buf.endswith(b"0\r\n\r\n"):
        chunk = sock.recv(65536)
        assert chunk, buf
        buf += chunk
    return buf


def events(raw: bytes) -> list:
    """The SSE data of a chunked response (one event a frame, the frames' sizes checked)."""
    body = raw.split(b"\r\n\r\n", 1)[1]
    out = []
    while body:
        size_text, _, rest = body.partition(b"\r\n")
        size = int(size_text, 16)
        if size == 0:
            break
        frame, body = rest[:size], rest[size + 2:]
        for part in frame.split(b"\n\n"):
            if part.startswith(b"data: "):
                payload = part[len(b"data: "):]
                out.append(payload.decode() if payload == b"[DONE]" else json.loads(payload))
    return out


@pytest.fixture(scope="module")
def pool():
    server = ExactPool(processes=2, ttft_ms=20, itl_ms=3, tokens=5)
    yield server
    server.stop()


def test_streams_the_script_on_one_kept_alive_connection_and_records_every_chunk():
    pool = ExactPool(processes=2, ttft_ms=20, itl_ms=3, tokens=5)
    try:
        with socket.create_connection(("127.0.0.1", pool.port)) as sock:
            post(sock, "/v1/chat/completions", {"model": "fake-model", "messages": [{"role": "user", "content": "a b c"}],
                                                "max_tokens": 4, "stream": True})
            chat = events(read_stream(sock))
            post(sock, "/v1/completions", {"model": "fake-model", "prompt": "x y", "stream": True,
                                           "stream_options": {"continuous_usage_stats": True}})
            plain = events(read_stream(sock))
    finally:
        log = pool.log()
    assert chat[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"]["content"] for c in chat[1:5]] == [" t0", " t1", " t2", " t3"]
    assert [c["choices"][0]["finish_reason"] for c in chat[1:5]] == [None, None, None, "length"]
    assert chat[5]["usage"] == {"prompt_tokens": 6, "completion_tokens": 4, "total_tokens": 10} and chat[6] == "[DONE]"
    assert [c["choices"][0]["text"] for c in plain[:5]] == [" t0", " t1", " t2", " t3", " t4"], "--tokens without max_tokens"
    assert [c["usage"]["completion_tokens"] for c in plain[:5]] == [1, 2, 3, 4, 5], "continuous usage honoured"
    assert sorted(len(r["sends"]) for r in log) == [4, 5], "one record a request, one instant a content chunk"
    for record in log:
        due = [record["recv"] + 0.020 + i * 0.003 for i in range(len(record["sends"]))]
        assert all(sent >= at for sent, at in zip(record["sends"], due)), "no chunk before its instant"
        assert record["sends"] == sorted(record["sends"])


def test_many_connections_spread_over_the_processes_are_all_recorded(pool):
    pool2 = ExactPool(processes=2, ttft_ms=5, itl_ms=1, tokens=3)
    socks = []
    try:
        for i in range(12):
            sock = socket.create_connection(("127.0.0.1", pool2.port))
            post(sock, "/v1/chat/completions", {"model": "fake-model", "messages": [{"role": "user", "content": f"m{i}"}],
                                                "stream": True})
            socks.append(sock)
        for sock in socks:
            assert events(read_stream(sock))[-1] == "[DONE]"
    finally:
        for sock in socks:
            sock.close()
        log = pool2.log()
    assert len(log) == 12 and all(len(r["sends"]) == 3 for r in log)


@pytest.mark.parametrize("path, body, status", [
    ("/v1/chat/completions", {"model": "fake-model", "messages": [], "stream": False}, b"400"),
    ("/v1/chat/completions", {"model": "other", "messages": [], "stream": True}, b"404"),
    ("/v1/embeddings", {"model": "fake-model", "input": "x"}, b"404"),
])
def test_what_it_does_not_serve_is_refused_with_a_status(pool, path, body, status):
    with socket.create_connection(("127.0.0.1", pool.port)) as sock:
        post(sock, path, body)
        head = sock.recv(65536)
    assert head.split(b" ")[1] == status, head


def test_lists_its_model_as_vllm_does(pool):
    with socket.create_connection(("127.0.0.1", pool.port)) as sock:
        sock.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = sock.recv(65536)
    assert json.loads(raw.split(b"\r\n\r\n", 1)[1])["data"][0]["id"] == "fake-model"
