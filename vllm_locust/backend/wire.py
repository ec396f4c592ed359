"""Stamp the instant a request's first byte goes out, not when the client starts building it.

Each user has a ``WireClock`` and passes it with every request (``StreamClient.send(request,
clock)``); the client calls ``clock.sending()`` just before the request's first byte is written,
after a new connection's connect (connection set-up is the client's, not the server's). Arrivals
are stamped where the suite reads the body (``sse.stamped_payloads``).

Just before the stamp the sending greenlet yields once (``time.sleep(0)``: gevent's under Locust's
monkey-patching): requests that become ready in the same instant (a closed-loop wave, a burst of
arrivals) all finish their setup first and then go out back to back, instead of each send waiting
for the setups of the requests ahead of it (issue 25). The stamp is taken after the yield.
"""

from __future__ import annotations

import time


class WireClock:
    """One per Locust user (and one per paired target): the wire instants of its current request."""

    def __init__(self, yield_before_send: bool = True):
        self.sent_at_s = 0.0  # unix seconds
        self.sent_perf_s = 0.0
        self.yield_before_send = yield_before_send
        self.yielded = False  # set at the yield before a send; the user's wait between tasks clears it
        self.waiting_to_send = False  # parked in that yield: a user killed there sent nothing

    def on_request_started(self) -> None:
        """Before the client is called: a request that fails before reaching the wire still has a start."""
        self.waiting_to_send = False
        self.stamp_send()

    def stamp_send(self) -> None:
        self.sent_at_s, self.sent_perf_s = time.time(), time.perf_counter()

    def sending(self) -> None:
        """The client is about to write the request's first byte (see the module's docstring)."""
        if self.yield_before_send:
            self.waiting_to_send = True  # stays set if the greenlet is killed in the yield
            time.sleep(0)  # the others ready now build theirs first
            self.waiting_to_send, self.yielded = False, True
        self.stamp_send()
