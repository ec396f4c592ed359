"""The client's TTFT and ITL percentiles for the live charts, from raw sample values.

Locust's own live percentiles come from its response-time histogram; the web UI's "vLLM server"
tab shows the client's p50/p95 TTFT and ITL from the values themselves (sub-millisecond), on the
same time axis as the server's metrics. Each recording process collects its measured values
(``ClientWindow.add``, one list append per sample); a worker sends what it collected with each of
its stats reports to the master (``report_to_master``), a single local process hands it over
itself. The deciding process keeps the last ``WINDOW_S`` seconds of values (``ClientSeries``), as
Locust's "current" percentiles do, and adds one row per tick to the history the tab draws.
Above ``CAP`` values per metric in one report a uniform sample of ``CAP`` is sent (percentiles of a
uniform sample estimate those of the whole); the count is kept exact.
"""

from __future__ import annotations

import random
import time
from collections import deque

from .schema import ITL, TTFT

CAP = 2000  # values per metric per report
WINDOW_S = 10.0  # seconds of values behind each percentile, as Locust's current percentiles
HISTORY = 3600
REPORT_KEY = "vllm_locust_client"  # in a worker's stats report
METRICS = (TTFT, ITL)


class ClientWindow:
    """One recording process's measured TTFT and ITL values since its last report."""

    def __init__(self):
        self.values: dict[str, list[float]] = {m: [] for m in METRICS}
        self.requests = 0

    def add(self, metric: str, value_ms: float) -> None:
        values = self.values.get(metric)
        if values is not None:
            values.append(value_ms)
            if metric == TTFT:
                self.requests += 1

    def take(self) -> dict:
        """The values since the last take (a uniform sample above ``CAP``), and their counts."""
        out = {"counts": {m: len(v) for m, v in self.values.items()}}
        for metric, values in self.values.items():
            out[metric] = values if len(values) <= CAP else random.sample(values, CAP)
        self.values = {m: [] for m in METRICS}
        return out


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), on sorted values."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)


class ClientSeries:
    """The deciding process's recent client values and the history of their percentiles."""

    def __init__(self, window_s: float = WINDOW_S):
        self.window_s = window_s
        self.batches: deque[tuple[float, dict]] = deque()
        self.history: deque[dict] = deque(maxlen=HISTORY)

    def add(self, batch: dict | None, t_s: float | None = None) -> None:
        if batch:
            self.batches.append((time.time() if t_s is None else t_s, batch))

    def tick(self, users: int, t_s: float | None = None) -> dict:
        """One row of the history: p50/p95 TTFT and ITL (ms) over the last ``window_s``."""
        now = time.time() if t_s is None else t_s
        while self.batches and self.batches[0][0] < now - self.window_s:
            self.batches.popleft()
        row: dict = {"t_s": round(now, 3), "users": users}
        for metric in METRICS:
            values = sorted(v for _, batch in self.batches for v in batch.get(metric, ()))
            key = metric.lower()
            row[f"{key}_p50_ms"], row[f"{key}_p95_ms"] = percentile(values, 50), percentile(values, 95)
            row[f"{key}_count"] = sum(batch.get("counts", {}).get(metric, 0) for _, batch in self.batches)
        self.history.append(row)
        return row

    def clear(self) -> None:
        self.batches.clear()
        self.history.clear()
