"""Server-sent events, bytes in: the ``data:`` payloads of a streamed completion, stamped by arrival.

The suite reads the response body itself instead of letting the ``openai`` SDK build a pydantic
object per chunk (over half of the client's CPU per chunk before). Each raw read is stamped the
moment it returns; every event it completes arrived then. Knows nothing of Locust, gevent or HTTP
libraries: tests feed it byte strings.

Linear in the bytes fed, whatever the reads: each read is appended once and only its new bytes are
searched for the end of an event (re-splitting the whole buffer per read took 26.7 s for one
40 MB event). An event longer than ``max_event_bytes`` raises ``EventTooLarge``: a hostile or
broken server cannot make the client hold an unbounded event in memory.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable, Iterator

DONE = b"[DONE]"
DEFAULT_MAX_EVENT_BYTES = 1 << 20  # a vLLM chunk is a few hundred bytes; 1 MiB is far above any real one


class EventTooLarge(ValueError):
    """An event grew past the decoder's limit before it ended: one line, with the limit."""

    def __init__(self, limit: int):
        super().__init__(f"event over --max-event-bytes ({limit} bytes)")
        self.limit = limit


class SseDecoder:
    """Incremental SSE framing: ``feed(bytes)`` returns the complete events' ``data`` payloads.

    Events end with a blank line (``\\n\\n`` or ``\\r\\n\\r\\n``: ``\\r\\n`` is read as ``\\n``); a
    payload split over reads is held until its end arrives. Lines other than ``data:`` (comments,
    ``event:``, ``id:``) are skipped, as the OpenAI protocol carries everything in ``data``.
    ``max_event_bytes`` (0: no limit) bounds an event's size, its line ends included.
    """

    __slots__ = ("_buffer", "_scan", "_cr", "max_event_bytes")

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES):
        self._buffer = bytearray()  # the unfinished event, line ends normalised to \n
        self._scan = 0  # where the search for the next event end resumes (bytes before: none there)
        self._cr = False  # the last read ended with \r: its \n may start the next one
        self.max_event_bytes = max_event_bytes

    def feed(self, data: bytes) -> list[bytes]:
        if self._cr:
            data, self._cr = b"\r" + data, False
        if b"\r" in data:
            if data.endswith(b"\r"):
                data, self._cr = data[:-1], True  # held back until the next read says if a \n follows
            data = data.replace(b"\r\n", b"\n")
        buffer = self._buffer
        if not buffer:
            # The common case: a read that ends on an event boundary is split without a copy.
            if data.endswith(b"\n\n") and not self._cr:
                events = data.split(b"\n\n")
                if not events[-1]:  # "...\n\n\n" leaves a "\n" that may start the next event's end
                    events.pop()
                    return self._payloads(events)
            buffer += data
            scan = 0
        else:
            scan = self._scan
            buffer += data
        events = []
        start = 0
        while True:
            end = buffer.find(b"\n\n", scan)
            if end < 0:
                break
            events.append(bytes(buffer[start:end]))
            start = scan = end + 2
        if start:
            del buffer[:start]  # amortised: once per read that completes events
        self._scan = max(0, len(buffer) - 1)  # a trailing \n may be the first half of the next end
        if self.max_event_bytes and len(buffer) + self._cr > self.max_event_bytes:
            raise EventTooLarge(self.max_event_bytes)
        return self._payloads(events)

    def _payloads(self, events: list[bytes]) -> list[bytes]:
        limit = self.max_event_bytes
        payloads = []
        for event in events:
            if limit and len(event) + 2 > limit:
                raise EventTooLarge(limit)
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
        return bytes(self._buffer) + (b"\r" if self._cr else b"")


def stamped_payloads(reads: Iterable[bytes], clock: Callable[[], float] = time.perf_counter,
                     max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> Iterator[tuple[float, bytes]]:
    """``(arrival_s, payload)`` for every event in the raw reads; the arrival is the read's return."""
    decoder = SseDecoder(max_event_bytes)
    buffer = decoder._buffer
    limit = max_event_bytes  # 0: no limit
    for data in reads:
        now = clock()
        # The common read, one whole one-line ``data:`` event and nothing held back: its payload
        # without the decoder's splitting (what ``feed`` returns for it, within the limit).
        if (not buffer and data[:5] == b"data:" and data.find(b"\n") == len(data) - 2 and data[-1:] == b"\n"
                and not decoder._cr and b"\r" not in data and (not limit or len(data) <= limit)):
            yield now, data[5:-2].lstrip(b" ")
            continue
        for payload in decoder.feed(data):
            yield now, payload
