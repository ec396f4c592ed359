"""The floor under any gevent client: keep-alive sockets that send a chat request and read its stream.

Why: ``request_cost.py`` measures what a request costs the suite's Locust process; part of that is
paid by every Python client on gevent, whatever it does (the loop's wake-ups, the socket calls, the
kernel's loopback TCP on the sending side). This client does only that part: one greenlet per user,
one kept-alive connection each, the same request bytes sent again and again, the response read
until the chunked body's last chunk, nothing parsed, stamped or recorded but a request's send and
end. ``request_cost.py --client floor`` runs it in place of Locust (the same mock, users, reply
lengths and CPU accounting), so the suite's fixed cost per request splits into this floor and the
suite's own part (issue 25).

    python benchmarks/request_floor.py --host http://127.0.0.1:8000 --users 16 --duration 20 \
        --max-tokens 2 --out DIR    # writes DIR/requests-floor.csv (sent_at_s, e2e_ms, kind)
"""

from gevent import monkey

monkey.patch_all()

import argparse  # noqa: E402
import csv  # noqa: E402
import json  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
import urllib.request  # noqa: E402
from pathlib import Path  # noqa: E402
from urllib.parse import urlsplit  # noqa: E402

import gevent  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from vllm_locust.plugin.webui.websecurity import is_loopback  # noqa: E402  (no Locust loaded)

LAST_CHUNK = b"\r\n0\r\n\r\n"  # the chunked body's end: the previous chunk's CRLF, size 0, CRLF


def chat_request(host: str, port: int, model: str, max_tokens: int, prompt_words: int) -> bytes:
    """The bytes of one streamed chat request, with the headers the ``openai`` SDK sends."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": " ".join(["word"] * prompt_words)}],
                       "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True},
                       "ignore_eos": True}).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\nAccept-Encoding: identity\r\n"
            "Connection: keep-alive\r\nAccept: application/json\r\nContent-Type: application/json\r\n"
            "User-Agent: OpenAI/Python\r\nAuthorization: Bearer EMPTY\r\nX-Stainless-Lang: python\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def user(address: tuple[str, int], request: bytes, stop_at: float, done: list) -> None:
    """Send, read to the body's end, again, until ``stop_at``; (sent, end) unix seconds into ``done``."""
    sock = socket.create_connection(address)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    while time.time() < stop_at:
        sent = time.time()
        sock.sendall(request)
        tail = b""
        while not tail.endswith(LAST_CHUNK):
            data = sock.recv(65536)
            if not data:
                raise ConnectionError("the server closed the connection mid-response")
            tail = (tail + data)[-len(LAST_CHUNK):]
        done.append((sent, time.time()))
    sock.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True, help="the mock's URL (loopback)")
    parser.add_argument("--users", type=int, default=16)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--max-tokens", type=int, default=2)
    parser.add_argument("--prompt-words", type=int, default=64)
    parser.add_argument("--out", required=True, help="folder for requests-floor.csv")
    args = parser.parse_args()
    url = urlsplit(args.host)
    if not is_loopback(url.hostname or ""):
        raise SystemExit(f"request_floor.py: --host {args.host}: load goes to a loopback mock only")
    with urllib.request.urlopen(f"{args.host}/v1/models", timeout=10) as reply:
        model = json.load(reply)["data"][0]["id"]
    request = chat_request(url.hostname, url.port, model, args.max_tokens, args.prompt_words)
    done: list[tuple[float, float]] = []
    stop_at = time.time() + args.duration
    gevent.joinall([gevent.spawn(user, (url.hostname, url.port), request, stop_at, done)
                    for _ in range(args.users)], raise_error=True)
    with open(Path(args.out) / "requests-floor.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["sent_at_s", "e2e_ms", "kind"])
        writer.writerows((f"{sent:.6f}", f"{(end - sent) * 1000:.3f}", "ok") for sent, end in done)


if __name__ == "__main__":
    main()
