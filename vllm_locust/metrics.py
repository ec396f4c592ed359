"""The one definition of every latency metric this suite reports.

- TTFT: from sending the request to the first chunk that carries content. vLLM first sends a
  role-only chunk (``delta.role`` with empty content); it carries no token, so it does not stop the
  TTFT clock. Queueing, prefill and network time are all inside TTFT.
- ITL: every gap between two consecutive content chunks, one sample per gap.
- E2E: from sending the request to the last content chunk. The finish-only and usage chunks that
  follow carry no token, so they do not move the end time; hence ``E2E - TTFT == sum(ITL)``.
- TPOT: ``(E2E - TTFT) / (output_tokens - 1)``; the first token is left out because TTFT owns it.
  Undefined for a single-token output.

All values are milliseconds. Times in are ``time.perf_counter()`` seconds. Stdlib only: the user,
the recorder and ``analysis/`` all import this module, and nothing else computes a metric.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TTFT = "TTFT"
ITL = "ITL"
TPOT = "TPOT"
E2E = "E2E"
METRIC_NAMES = (TTFT, ITL, TPOT, E2E)
UNIT = "ms"


@dataclass(frozen=True)
class RequestMetrics:
    """One request's latencies in ms; ``None`` where a request ended too early to define one."""

    ttft_ms: float | None
    itl_ms: list[float] = field(default_factory=list)
    e2e_ms: float | None = None
    tpot_ms: float | None = None


def ms_between(start_s: float, end_s: float) -> float:
    """Duration between two ``perf_counter`` instants, in ms."""
    return (end_s - start_s) * 1000.0


def gaps_ms(times_s: list[float]) -> list[float]:
    """Gaps between consecutive instants, in ms."""
    return [ms_between(a, b) for a, b in zip(times_s, times_s[1:])]


def tpot_ms(e2e_ms: float, ttft_ms: float, output_tokens: int) -> float | None:
    """Time per output token after the first; ``None`` for fewer than two tokens."""
    if output_tokens < 2:
        return None
    return (e2e_ms - ttft_ms) / (output_tokens - 1)


def request_metrics(sent_at_s: float, content_times_s: list[float], output_tokens: int | None = None) -> RequestMetrics:
    """Metrics of one request from its send instant and the arrival instants of its content chunks.

    ``output_tokens`` is the server's ``usage.completion_tokens`` when it sent one; otherwise the
    number of content chunks stands in for it (chunks are not always tokens).
    """
    if not content_times_s:
        return RequestMetrics(ttft_ms=None)
    ttft = ms_between(sent_at_s, content_times_s[0])
    e2e = ms_between(sent_at_s, content_times_s[-1])
    tokens = output_tokens if output_tokens is not None else len(content_times_s)
    return RequestMetrics(ttft_ms=ttft, itl_ms=gaps_ms(content_times_s), e2e_ms=e2e, tpot_ms=tpot_ms(e2e, ttft, tokens))
