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

The same window carries what a live SLO judgement needs (``RequestLedger``): each measured
request's figures (``add_request``: persona, step, outcome, TTFT and E2E from the intended instant,
TPOT, its own p95 gap) and the ITL gaps of each step, so the deciding process can judge a step's
window with ``core.slo.judge`` (``--ramp-until-slo``) and show goodput by persona.
"""

from __future__ import annotations

import math
import random
import time
from collections import deque

from .schema import ITL, TTFT
from .slo import Slo, judge, percentile, request_meets

CAP = 2000  # values per metric per report
WINDOW_S = 10.0  # seconds of values behind each percentile, as Locust's current percentiles
HISTORY = 3600
REPORT_KEY = "vllm_locust_client"  # in a worker's stats report
METRICS = (TTFT, ITL)
REQUEST_CAP = 5000  # measured requests' figures per report (a uniform sample above it; the count exact)
LEDGER_S = 900.0  # seconds of request figures the deciding process keeps


class ClientWindow:
    """One recording process's measured TTFT and ITL values since its last report, its measured
    requests' figures, and each step's ITL gaps."""

    def __init__(self):
        self.values: dict[str, list[float]] = {m: [] for m in METRICS}
        self.requests = 0
        self.figures: list[list] = []  # [persona, step, ok, ttft_ms, e2e_ms, tpot_ms, itl_p95_ms] per request
        self.gaps: dict = {}  # step -> ITL gaps (ms)

    def add(self, metric: str, value_ms: float, step: int | None = None) -> None:
        values = self.values.get(metric)
        if values is not None:
            values.append(value_ms)
            if metric == TTFT:
                self.requests += 1
            elif metric == ITL:
                gaps = self.gaps.get(step)
                if gaps is None:
                    gaps = self.gaps[step] = []
                gaps.append(value_ms)

    def add_request(self, persona: str, step: int | None, ok: bool, ttft_ms: float | None, e2e_ms: float | None,
                    tpot_ms: float | None, itl_p95_ms: float | None) -> None:
        """A measured request that ended (an interrupted one is not: the run's end is no verdict)."""
        self.figures.append([persona, step, 1 if ok else 0, ttft_ms, e2e_ms, tpot_ms, itl_p95_ms])

    def take(self) -> dict:
        """The values since the last take (a uniform sample above ``CAP``), and their counts."""
        out: dict = {"counts": {m: len(v) for m, v in self.values.items()}}
        for metric, values in self.values.items():
            out[metric] = values if len(values) <= CAP else random.sample(values, CAP)
        if self.figures:
            figures = self.figures
            out["requests"] = figures if len(figures) <= REQUEST_CAP else random.sample(figures, REQUEST_CAP)
            out["requests_total"] = len(figures)
        if self.gaps:
            out["steps"] = [[step, gaps if len(gaps) <= CAP else random.sample(gaps, CAP), len(gaps)]
                            for step, gaps in self.gaps.items()]
        self.values = {m: [] for m in METRICS}
        self.figures, self.gaps = [], {}
        return out


class RequestLedger:
    """The deciding process's measured requests' figures and ITL gaps, by arrival: a step's window
    judged against an SLO, and goodput by persona over the last seconds."""

    def __init__(self, keep_s: float = LEDGER_S):
        self.keep_s = keep_s
        self.batches: deque[tuple[float, list, float, list]] = deque()  # (t_s, figures, weight, steps)

    def add(self, batch: dict | None, t_s: float | None = None) -> None:
        if not batch or not (batch.get("requests") or batch.get("steps")):
            return
        now = time.time() if t_s is None else t_s
        figures = list(batch.get("requests") or ())
        weight = (batch.get("requests_total") or len(figures)) / len(figures) if figures else 1.0
        self.batches.append((now, figures, weight, list(batch.get("steps") or ())))
        while self.batches and self.batches[0][0] < now - self.keep_s:
            self.batches.popleft()

    def clear(self) -> None:
        self.batches.clear()

    def window(self, step: int | None, since_s: float) -> tuple[list, list]:
        """The figures and ITL gaps of ``step`` that arrived since ``since_s``."""
        figures, gaps = [], []
        for t_s, batch, _weight, steps in self.batches:
            if t_s < since_s:
                continue
            figures += [f for f in batch if f[1] == step]
            for s, values, _count in steps:
                if s == step:
                    gaps += values
        return figures, gaps

    def judge(self, slo: Slo, step: int | None, since_s: float) -> tuple[bool, str, dict, int]:
        """``core.slo.judge`` on a step's window: its p95s (TTFT and E2E from the intended instant,
        TPOT, every ITL gap), its requests and failures. Returns the verdict, why, the p95s and the
        requests judged."""
        figures, gaps = self.window(step, since_s)
        ok = [f for f in figures if f[2]]
        p95 = {"ttft": _p95([f[3] for f in ok]), "e2e": _p95([f[4] for f in ok]),
               "tpot": _p95([f[5] for f in ok]), "itl": _p95(gaps)}
        passed, why = judge(p95, len(figures), len(figures) - len(ok), slo)
        return passed, why, p95, len(figures)

    def goodput(self, slos: dict, window_s: float, now: float | None = None) -> dict:
        """``{persona: {requests, met, met_share, goodput_rps}}`` over the last ``window_s`` seconds,
        each persona judged by ``slos[persona]`` (else ``slos[""]``); personas without an SLO left out."""
        now = time.time() if now is None else now
        out: dict = {}
        for t_s, batch, weight, _steps in self.batches:
            if t_s < now - window_s:
                continue
            for persona, _step, ok, ttft, e2e, tpot, itl in batch:
                slo = slos.get(persona) or slos.get("")
                if slo is None:
                    continue
                row = out.setdefault(persona, {"requests": 0.0, "met": 0.0})
                row["requests"] += weight
                if ok and request_meets(slo, ttft, e2e, tpot, itl):
                    row["met"] += weight
        for row in out.values():
            row["met_share"] = row["met"] / row["requests"] if row["requests"] else math.nan
            row["goodput_rps"] = row["met"] / window_s
            row["requests"], row["met"] = round(row["requests"]), round(row["met"])
        return out


def _p95(values: list) -> float:
    found = percentile(sorted(v for v in values if v is not None), 95)
    return math.nan if found is None else found


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
