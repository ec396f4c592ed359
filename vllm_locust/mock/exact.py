"""The exact-timing server for high event rates: one event loop a process, several processes on one port.

``server.py`` gives every stream its own thread; at a thousand streams a chunk each 10 ms (100,000
events/s) its threads wake late by tenths of a millisecond, so the truth it records is noisier than
the client it judges. Here one loop per process (``selectors`` and a heap of due writes) writes
every stream's chunks: it sleeps until the next due write, wakes a little early and waits out the
rest (``time.sleep``, or a spin with ``--spin`` for a server on cores of its own), and writes every
chunk that is due in one pass. ``--processes N`` runs N such loops on one port (``SO_REUSEPORT``:
the kernel spreads the connections over them).

It plays ``server.py``'s plain script and nothing else: the response headers at once, the first
content chunk ``ttft_ms`` after the request arrived (chat: after a role-only chunk, in the same
write, as vLLM sends them), one chunk every ``itl_ms`` (``max_tokens`` chunks, or ``--tokens``), the
last with ``finish_reason`` ``length``, then a usage chunk and ``[DONE]``; keep-alive, chunked, with
``stream_options.continuous_usage_stats`` honoured. ``GET /v1/models``, ``/version``, ``/health`` and
``/metrics`` (no vLLM series) answer as vLLM's do; a non-streamed or unknown request is refused.

Each process records when each request arrived and the ``perf_counter`` instant it handed each content
chunk to the socket (one clock for every process on Linux), and writes that record as JSON into
``--record-dir`` when it is stopped (SIGTERM): ``{"requests": [{"recv": s, "sends": [s, ...]}, ...]}``,
the format of ``server.py``'s ``GET /_log``. ``ExactPool`` starts the processes and reads the truth back.

    python -m vllm_locust.mock.exact --processes 8 --ttft-ms 50 --itl-ms 10 --tokens 128 --record-dir DIR
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "fake-model"
MAX_HEAD_BYTES = 64 << 10  # a request's line and headers
MAX_BODY_BYTES = 64 << 20  # a request's body (a long prompt is a few hundred kB)
EARLY_WAKE_S = 0.0015  # epoll waits in whole milliseconds: wake this early, then wait out the rest
KINDS = {True: "chat.completion.chunk", False: "text_completion"}


def frame(data: bytes) -> bytes:
    """One HTTP/1.1 chunk."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def event(payload: dict) -> bytes:
    return frame(b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n")


def prompt_tokens(body: dict) -> int:
    """``server.py``'s word-count "tokenizer": chat adds 2 a message and 1 for the reply."""
    def words(text) -> int:
        if isinstance(text, list):
            return sum(words(p.get("text", "")) for p in text if isinstance(p, dict))
        return len(str(text or "").split())

    if isinstance(body.get("messages"), list):
        return sum(words(m.get("content", "")) + 2 for m in body["messages"] if isinstance(m, dict)) + 1
    return words(body.get("prompt", ""))


class Stream:
    """One streamed answer: its connection, its schedule, and the instants its chunks went out."""

    __slots__ = ("conn", "chat", "tokens", "next", "recv", "sends", "usage", "prompt")

    def __init__(self, conn, chat: bool, tokens: int, recv: float, usage: bool, prompt: int):
        self.conn, self.chat, self.tokens, self.recv = conn, chat, tokens, recv
        self.next, self.sends, self.usage, self.prompt = 0, [], usage, prompt

    def usage_of(self, done: int) -> dict:
        return {"prompt_tokens": self.prompt, "completion_tokens": done, "total_tokens": self.prompt + done}

    def chunk(self, i: int) -> bytes:
        """The bytes of content chunk ``i`` (with the role chunk before the first, the end after the last)."""
        last = i == self.tokens - 1
        kind = KINDS[self.chat]
        choice = ({"index": 0, "delta": {"content": f" t{i}"}, "finish_reason": "length" if last else None} if self.chat
                  else {"index": 0, "text": f" t{i}", "finish_reason": "length" if last else None})
        payload = {"id": "c", "object": kind, "choices": [choice]}
        if self.usage:
            payload["usage"] = self.usage_of(i + 1)
        data = event(payload)
        if i == 0 and self.chat:
            role = {"id": "c", "object": kind,
                    "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
            if self.usage:
                role["usage"] = self.usage_of(0)
            data = event(role) + data
        if last:
            data += (event({"id": "c", "object": kind, "choices": [], "usage": self.usage_of(self.tokens)})
                     + frame(b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return data


class Connection:
    __slots__ = ("sock", "inbuf", "outbuf", "stream", "closed")

    def __init__(self, sock: socket.socket):
        self.sock, self.inbuf, self.outbuf, self.stream, self.closed = sock, b"", b"", None, False


class ExactServer:
    """One process's loop: accept, read requests, write every due chunk on time, record the instants."""

    def __init__(self, port: int = 0, ttft_ms: float = 50.0, itl_ms: float = 10.0, tokens: int = 128,
                 model: str = MODEL, spin: bool = False):
        self.ttft_s, self.itl_s, self.tokens, self.model, self.spin = ttft_ms / 1000, itl_ms / 1000, tokens, model, spin
        self.listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        self.listener.bind(("127.0.0.1", port))  # loopback only
        self.listener.listen(4096)
        self.listener.setblocking(False)
        self.port = self.listener.getsockname()[1]
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.listener, selectors.EVENT_READ, None)
        self.due: list[tuple[float, int, Stream]] = []  # (instant, sequence, stream) of each stream's next chunk
        self.sequence = 0
        self.record: list[dict] = []
        self.stopping = False

    # -- the loop -----------------------------------------------------------------------------
    def serve_forever(self) -> None:
        perf = time.perf_counter
        while not self.stopping:
            wait = self.due[0][0] - perf() if self.due else 0.25
            try:
                ready = self.selector.select(wait - EARLY_WAKE_S if wait > 2 * EARLY_WAKE_S else 0)
            except InterruptedError:
                continue
            for key, mask in ready:
                if key.data is None:
                    self.accept()
                elif mask & selectors.EVENT_READ:
                    self.read(key.data)
                if key.data is not None and mask & selectors.EVENT_WRITE:
                    self.flush(key.data)
            if not ready and self.due:
                rest = self.due[0][0] - perf()
                if 0 < rest <= 2 * EARLY_WAKE_S:
                    if self.spin:
                        end = self.due[0][0]
                        while perf() < end:
                            pass
                    else:
                        time.sleep(rest)
            self.write_due()

    def write_due(self) -> None:
        perf = time.perf_counter
        while self.due and self.due[0][0] <= perf():
            _, _, stream = heapq.heappop(self.due)
            conn = stream.conn
            if conn.closed:
                continue
            i = stream.next
            data = stream.chunk(i)
            stream.sends.append(perf())  # the instant the bytes are handed to the socket
            self.send(conn, data)
            stream.next = i + 1
            if stream.next < stream.tokens:
                self.schedule(stream, stream.recv + self.ttft_s + stream.next * self.itl_s)
            else:
                self.record.append({"recv": stream.recv, "sends": stream.sends})
                conn.stream = None
                if conn.inbuf and not conn.closed:
                    self.handle_requests(conn)  # a request that came while this one streamed

    def schedule(self, stream: Stream, at: float) -> None:
        self.sequence += 1
        heapq.heappush(self.due, (at, self.sequence, stream))

    # -- sockets ------------------------------------------------------------------------------
    def accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # small writes go out at once
            conn = Connection(sock)
            self.selector.register(sock, selectors.EVENT_READ, conn)

    def read(self, conn: Connection) -> None:
        try:
            data = conn.sock.recv(1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            return self.close(conn)
        conn.inbuf += data
        if len(conn.inbuf) > MAX_HEAD_BYTES + MAX_BODY_BYTES:
            return self.close(conn)
        if conn.stream is None:
            self.handle_requests(conn)

    def send(self, conn: Connection, data: bytes) -> None:
        if conn.outbuf:  # the client reads slower than we write: keep the order
            conn.outbuf += data
            return
        self.write(conn, data)
        if conn.outbuf:
            self.selector.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    def flush(self, conn: Connection) -> None:
        if conn.closed or not conn.outbuf:
            return
        data, conn.outbuf = conn.outbuf, b""
        self.write(conn, data)
        if not conn.closed and not conn.outbuf:
            self.selector.modify(conn.sock, selectors.EVENT_READ, conn)

    def write(self, conn: Connection, data: bytes) -> None:
        """As much of ``data`` as the socket takes now; the rest waits in ``conn.outbuf``."""
        try:
            sent = conn.sock.send(data)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            return self.close(conn)
        conn.outbuf = data[sent:]

    def close(self, conn: Connection) -> None:
        if conn.closed:
            return
        conn.closed = True
        try:
            self.selector.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    # -- HTTP ---------------------------------------------------------------------------------
    def handle_requests(self, conn: Connection) -> None:
        """Answer the requests complete in ``conn``'s buffer, up to the first that streams."""
        while conn.stream is None and not conn.closed:
            head_end = conn.inbuf.find(b"\r\n\r\n")
            if head_end < 0:
                if len(conn.inbuf) > MAX_HEAD_BYTES:
                    self.close(conn)
                return
            lines = conn.inbuf[:head_end].decode("latin-1").split("\r\n")
            parts = lines[0].split(" ")
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            try:
                length = int(headers.get("content-length", "0"))
            except ValueError:
                length = -1
            if len(parts) != 3 or length < 0 or length > MAX_BODY_BYTES or "chunked" in headers.get("transfer-encoding", ""):
                self.answer(conn, 400, {"error": {"message": "malformed request", "code": 400}})
                return self.close(conn)
            if len(conn.inbuf) < head_end + 4 + length:
                return
            body_bytes = conn.inbuf[head_end + 4:head_end + 4 + length]
            conn.inbuf = conn.inbuf[head_end + 4 + length:]
            self.route(conn, parts[0], parts[1].split("?")[0], body_bytes, time.perf_counter())

    def route(self, conn: Connection, method: str, path: str, body_bytes: bytes, recv: float) -> None:
        if method == "GET":
            if path == "/v1/models":
                return self.answer(conn, 200, {"object": "list", "data": [
                    {"id": self.model, "object": "model", "owned_by": "vllm", "root": self.model, "parent": None}]})
            if path == "/version":
                return self.answer(conn, 200, {"version": "exact-timing mock"})
            if path == "/health":
                return self.answer(conn, 200, None)
            if path == "/metrics":
                return self.answer(conn, 200, b"# the exact-timing mock exports no vLLM series\n", "text/plain")
            return self.answer(conn, 404, {"error": {"message": f"no route {path}", "code": 404}})
        if method != "POST" or path not in ("/v1/chat/completions", "/v1/completions"):
            return self.answer(conn, 404, {"error": {"message": f"no route {method} {path}", "code": 404}})
        try:
            body = json.loads(body_bytes or b"{}")
        except ValueError:
            body = None
        if not isinstance(body, dict) or not body.get("stream"):
            return self.answer(conn, 400, {"error": {"message": "the exact-timing mock only streams", "code": 400}})
        if body.get("model") != self.model:
            return self.answer(conn, 404, {"error": {"message": f"The model `{body.get('model')}` does not exist.",
                                                     "type": "NotFoundError", "param": "model", "code": 404}})
        tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or self.tokens)
        usage = bool((body.get("stream_options") or {}).get("continuous_usage_stats"))
        stream = Stream(conn, path.endswith("chat/completions"), max(1, tokens), recv, usage, prompt_tokens(body))
        conn.stream = stream
        self.send(conn, b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
                        b"transfer-encoding: chunked\r\n\r\n")
        self.schedule(stream, recv + self.ttft_s)

    def answer(self, conn: Connection, status: int, payload, content_type: str = "application/json") -> None:
        data = payload if isinstance(payload, bytes) else b"" if payload is None else json.dumps(payload).encode()
        reason = {200: "OK", 400: "Bad Request", 404: "Not Found"}.get(status, "Error")
        self.send(conn, f"HTTP/1.1 {status} {reason}\r\ncontent-type: {content_type}\r\n"
                        f"content-length: {len(data)}\r\n\r\n".encode() + data)

    def stop(self, *_args) -> None:
        self.stopping = True


class ExactPool:
    """``processes`` exact-timing processes on one port (``taskset`` to ``cpus`` when named): its URL
    while it runs, and every process's record (``log``) once it is stopped."""

    def __init__(self, processes: int = 1, ttft_ms: float = 50.0, itl_ms: float = 10.0, tokens: int = 128,
                 cpus: str = "", spin: bool = False, python: str = sys.executable):
        self.record_dir = tempfile.mkdtemp(prefix="exact-mock-")
        cmd = [python, "-m", "vllm_locust.mock.exact", "--processes", str(processes), "--ttft-ms", f"{ttft_ms:g}",
               "--itl-ms", f"{itl_ms:g}", "--tokens", str(tokens), "--record-dir", self.record_dir,
               *(["--spin"] if spin else [])]
        if cpus:
            cmd = ["taskset", "-c", cpus, *cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True,
                                     cwd=str(Path(__file__).resolve().parents[2]))
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.proc.kill()
            raise RuntimeError(f"the exact-timing mock did not start: {line!r}")
        self.port = int(line.split()[1])
        self.url = f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        self.proc.wait(timeout=60)

    def log(self) -> list[dict]:
        """Every process's requests (the pool is stopped first: the records are written at exit)."""
        self.stop()
        return [r for path in sorted(Path(self.record_dir).glob("exact-*.json"))
                for r in json.loads(path.read_text())["requests"]]


def run_one(args) -> None:
    """One process: serve until SIGTERM, then write the record."""
    server = ExactServer(args.port, args.ttft_ms, args.itl_ms, args.tokens, args.model, args.spin)
    signal.signal(signal.SIGTERM, server.stop)
    signal.signal(signal.SIGINT, server.stop)
    print(f"PORT {server.port}", flush=True)
    server.serve_forever()
    if args.record_dir:
        path = Path(args.record_dir) / f"exact-{os.getpid()}.json"
        path.write_text(json.dumps({"requests": server.record}))


def run_pool(args) -> None:
    """``--processes N``: N children on one port (the first picks it), stopped together."""
    base = [sys.executable, "-m", "vllm_locust.mock.exact", "--processes", "1", "--ttft-ms", f"{args.ttft_ms:g}",
            "--itl-ms", f"{args.itl_ms:g}", "--tokens", str(args.tokens), "--model", args.model,
            *(["--spin"] if args.spin else []), *(["--record-dir", args.record_dir] if args.record_dir else [])]
    children, port = [], args.port
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    try:
        for _ in range(args.processes):
            child = subprocess.Popen([*base, "--port", str(port)], stdout=subprocess.PIPE, text=True)
            children.append(child)
            line = child.stdout.readline()
            if not line.startswith("PORT "):
                raise SystemExit(f"an exact-timing mock process did not start: {line!r}")
            port = int(line.split()[1])
        print(f"PORT {port}", flush=True)
        while not stopping and all(c.poll() is None for c in children):
            time.sleep(0.1)
    finally:
        for child in children:
            if child.poll() is None:
                child.terminate()
        for child in children:
            child.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description="exact-timing streaming server for high event rates")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--processes", type=int, default=1, help="loops on one port (SO_REUSEPORT)")
    parser.add_argument("--ttft-ms", type=float, default=50.0)
    parser.add_argument("--itl-ms", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=128, help="chunks of a request without max_tokens")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--spin", action="store_true",
                        help="wait out the last 3 ms before a write spinning, not sleeping (cores of its own)")
    parser.add_argument("--record-dir", default="", help="each process writes exact-<pid>.json here when stopped")
    args = parser.parse_args()
    if args.processes > 1:
        run_pool(args)
    else:
        run_one(args)


if __name__ == "__main__":
    main()
