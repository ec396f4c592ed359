"""The one definition of every latency metric this suite reports.

- TTFT: from sending the request to the first chunk that carries content. vLLM first sends a
  role-only chunk (``delta.role`` with empty content); it carries no token, so it does not stop the
  TTFT clock. Queueing, prefill and network time are all inside TTFT.
- ITL: every gap between two consecutive content chunks, one sample per gap.
- E2E: from sending the request to the last content chunk. The finish-only and usage chunks that
  follow carry no token, so they do not move the end time; hence ``E2E - TTFT == sum(ITL)``.
- TPOT: ``(E2E - TTFT) / (output_tokens - 1)``; the first token is left out because TTFT owns it.
  Undefined for a single-token output.

All values are milliseconds. Times in are ``time.perf_counter()`` seconds. Stdlib only.
``StreamTimer`` is the one calculation: the user feeds it arrivals as they come and fires what it
returns as live Locust events; the request row is built from the same object when the stream ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from .schema import E2E, ITL, METRIC_NAMES, TPOT, TTFT  # noqa: F401  (re-exported names)

UNIT = "ms"


@dataclass(frozen=True)
class RequestMetrics:
    """One request's latencies in ms; ``None`` where a request ended too early to define one."""

    ttft_ms: float | None
    e2e_ms: float | None = None
    tpot_ms: float | None = None


def ms_between(start_s: float, end_s: float) -> float:
    """Duration between two ``perf_counter`` instants, in ms."""
    return (end_s - start_s) * 1000.0


def tpot_ms(e2e_ms: float, ttft_ms: float, output_tokens: int) -> float | None:
    """Time per output token after the first; ``None`` for fewer than two tokens."""
    if output_tokens < 2:
        return None
    return (e2e_ms - ttft_ms) / (output_tokens - 1)


class StreamTimer:
    """One request's metrics, computed incrementally as content chunks arrive.

    ``content(t)`` returns the sample that arrival completes: ``(TTFT, ms)`` for the first content
    chunk, ``(ITL, ms)`` for each later one. ``finish(output_tokens)`` returns the request's
    ``RequestMetrics`` (E2E and TPOT) from the same instants, so live events and rows cannot differ.
    """

    __slots__ = ("sent_s", "first_s", "last_s", "chunks")

    def __init__(self, sent_s: float):
        self.sent_s = sent_s
        self.first_s: float | None = None
        self.last_s: float | None = None
        self.chunks = 0

    def content(self, t_s: float) -> tuple[str, float]:
        self.chunks += 1
        if self.first_s is None:
            self.first_s = self.last_s = t_s
            return TTFT, (t_s - self.sent_s) * 1000.0  # ``ms_between``, in line: once per chunk
        gap = (t_s - self.last_s) * 1000.0
        self.last_s = t_s
        return ITL, gap

    @property
    def ttft_ms(self) -> float | None:
        return None if self.first_s is None else ms_between(self.sent_s, self.first_s)

    @property
    def e2e_ms(self) -> float | None:
        return None if self.last_s is None else ms_between(self.sent_s, self.last_s)

    def finish(self, output_tokens: int | None = None) -> RequestMetrics:
        """E2E and TPOT; ``output_tokens`` defaults to the content chunks (chunks are not always tokens)."""
        if self.first_s is None:
            return RequestMetrics(ttft_ms=None)
        # ``ttft_ms``, ``e2e_ms`` and ``tpot_ms`` in line (once per request; the same arithmetic)
        sent = self.sent_s
        ttft, e2e = (self.first_s - sent) * 1000.0, (self.last_s - sent) * 1000.0
        tokens = output_tokens if output_tokens is not None else self.chunks
        return RequestMetrics(ttft, e2e, None if tokens < 2 else (e2e - ttft) / (tokens - 1))
