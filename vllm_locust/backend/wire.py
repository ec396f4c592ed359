"""Stamp the instant a request's first byte goes out, not when the SDK starts building it.

The ``openai`` SDK spends about 1-2 ms building a request before httpx writes it; that would be
read as server latency. httpx's request hook attaches httpcore's ``trace`` extension, whose
``http11.send_request_headers.started`` event is the instant the first request byte is written
(after a new connection's TCP connect: connection set-up is the client pool's, not the server's).

The hook is the httpx client's (each user has its own client, ``client.make_client``), and it finds
the clock of the user whose greenlet is sending through a greenlet-local: ``with clock.active():
create(...)``.
Arrivals are stamped where the suite reads the body (``sse.stamped_payloads``).

Just before the stamp the sending greenlet yields once (``time.sleep(0)``: gevent's under Locust's
monkey-patching): requests that become ready in the same instant (a closed-loop wave, a burst of
arrivals) all finish their setup first and then go out back to back, instead of each send waiting
for the setups of the requests ahead of it (issue 25). The stamp is taken after the yield.
"""

from __future__ import annotations

import threading
import time

import httpx2

# This greenlet's own namespace: .clock, the WireClock of the request it is sending (and
# ``templated.py``'s .built). The standard library's ``threading.local`` keeps the backend free of
# gevent: Locust's monkey-patching turns it into gevent's greenlet-local. It is made at the first
# request, not at import, because a local made before the patch would stay a thread-local that every
# greenlet of the process shares.
_sending: threading.local | None = None


def greenlet_local() -> threading.local:
    """The sending greenlet's namespace (a thread's, without gevent)."""
    global _sending
    if _sending is None:
        _sending = threading.local()
    return _sending


class WireClock:
    """One per Locust user: the wire instants of its current request."""

    SEND_EVENT = "http11.send_request_headers.started"

    def __init__(self, yield_before_send: bool = True):
        self.sent_at_s = 0.0  # unix seconds
        self.sent_perf_s = 0.0
        self.yield_before_send = yield_before_send
        self.yielded = False  # set at the yield before a send; the user's wait between tasks clears it
        self.waiting_to_send = False  # parked in that yield: a user killed there sent nothing

    def on_request_started(self) -> None:
        """Before the SDK call: a request that fails before reaching the wire still has a start."""
        self.waiting_to_send = False
        self.stamp_send()

    def stamp_send(self) -> None:
        self.sent_at_s, self.sent_perf_s = time.time(), time.perf_counter()

    def trace(self, name: str, info: dict) -> None:
        if name == self.SEND_EVENT:
            if self.yield_before_send:
                self.waiting_to_send = True  # stays set if the greenlet is killed in the yield
                time.sleep(0)  # the others ready now build theirs first (see the module's docstring)
                self.waiting_to_send, self.yielded = False, True
            self.stamp_send()

    def active(self) -> "WireClock":
        """``with clock.active():`` requests sent from this greenlet inside the block are stamped on
        this clock. The clock is its own context manager (a generator-based one cost about 2% of a
        short request's CPU)."""
        return self

    def __enter__(self) -> "WireClock":
        (_sending or greenlet_local()).clock = self
        return self

    def __exit__(self, *_exc) -> None:
        (_sending or greenlet_local()).clock = None


def on_request(request: httpx2.Request) -> None:
    clock = getattr(_sending or greenlet_local(), "clock", None)
    if clock is not None:
        clock.stamp_send()  # replaced by the trace event when the bytes go out
        request.extensions["trace"] = clock.trace


def event_hooks() -> dict:
    return {"request": [on_request]}
