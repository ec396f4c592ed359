"""Stamp requests and responses where they meet the socket, not where the SDK hands them over.

The ``openai`` SDK spends about 1-2 ms building a request before httpx writes it, and parses
every chunk (SSE framing, JSON, pydantic) before yielding it: 0.3-1 ms on a small machine. Both
would be read as server latency. httpx's hooks let us stamp the wire instead:

- the request hook attaches httpcore's ``trace`` extension, whose
  ``http11.send_request_headers.started`` event is the instant the first request byte is written
  (after a new connection's TCP connect: connection set-up is the client pool's, not the server's);
- the response hook wraps the body stream, so ``now()`` is the instant of the latest raw read.
  When the SDK yields a chunk, the read that completed it is the latest one: that is its arrival.
"""

from __future__ import annotations

import time

import httpx2


class _StampedStream(httpx2.SyncByteStream):
    def __init__(self, inner, clock: "WireClock"):
        self.inner = inner
        self.clock = clock

    def __iter__(self):
        for part in self.inner:
            self.clock.last_read_perf_s = time.perf_counter()
            yield part

    def close(self) -> None:
        close = getattr(self.inner, "close", None)
        if close is not None:
            close()


class WireClock:
    """One per client (so one per Locust user): the wire instants of its current request."""

    SEND_EVENT = "http11.send_request_headers.started"

    def __init__(self):
        self.sent_at_s = 0.0  # unix seconds
        self.sent_perf_s = 0.0
        self.last_read_perf_s = 0.0

    def on_request_started(self) -> None:
        """Before the SDK call: a request that fails before reaching the wire still has a start."""
        self._stamp_send()
        self.last_read_perf_s = self.sent_perf_s

    def _stamp_send(self) -> None:
        self.sent_at_s, self.sent_perf_s = time.time(), time.perf_counter()

    def _trace(self, name: str, info: dict) -> None:
        if name == self.SEND_EVENT:
            self._stamp_send()

    def on_request(self, request: httpx2.Request) -> None:
        self._stamp_send()  # replaced by the trace event when the bytes go out
        request.extensions["trace"] = self._trace

    def on_response(self, response: httpx2.Response) -> None:
        self.last_read_perf_s = time.perf_counter()
        response.stream = _StampedStream(response.stream, self)

    def now(self) -> float:
        """Arrival instant of the data the SDK is handing over now."""
        return self.last_read_perf_s

    def event_hooks(self) -> dict:
        return {"request": [self.on_request], "response": [self.on_response]}
