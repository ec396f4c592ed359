"""Server-sent events, bytes in: the ``data:`` payloads of a streamed completion, stamped by arrival.

The suite reads the response body itself instead of letting the ``openai`` SDK build a pydantic
object per chunk (over half of the client's CPU per chunk before). Each raw read is stamped the
moment it returns; every event it completes arrived then. Knows nothing of Locust, gevent or HTTP
libraries: tests feed it byte strings.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

DONE = b"[DONE]"


class SseDecoder:
    """Incremental SSE framing: ``feed(bytes)`` returns the complete events' ``data`` payloads.

    Events end with a blank line (``\\n\\n`` or ``\\r\\n\\r\\n``); a payload split over reads is
    held until its end arrives. Lines other than ``data:`` (comments, ``event:``, ``id:``) are
    skipped, as the OpenAI protocol carries everything in ``data``.
    """

    __slots__ = ("_buffer",)

    def __init__(self):
        self._buffer = b""

    def feed(self, data: bytes) -> list[bytes]:
        buffer = self._buffer + data if self._buffer else data
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        events = buffer.split(b"\n\n")
        self._buffer = events.pop()  # the unfinished tail (b"" when the read ended on a boundary)
        payloads = []
        for event in events:
            if event.startswith(b"data:") and b"\n" not in event:  # the common case: one data line
                payloads.append(event[5:].lstrip(b" "))
                continue
            lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
            if lines:
                payloads.append(b"\n".join(lines))
        return payloads

    @property
    def pending(self) -> bytes:
        """Bytes of an event that has not ended (a stream cut mid-event leaves some)."""
        return self._buffer


def stamped_payloads(reads: Iterable[bytes], clock: Callable[[], float] = time.perf_counter) -> Iterator[tuple[float, bytes]]:
    """``(arrival_s, payload)`` for every event in the raw reads; the arrival is the read's return."""
    decoder = SseDecoder()
    for data in reads:
        now = clock()
        for payload in decoder.feed(data):
            yield now, payload
