"""The knee search: the highest request rate that holds an SLO, bracketed then bisected.

The same search ``launch/boundary.py`` runs offline (one Locust run per probe): from ``start`` it
doubles the rate until a probe fails (or halves it until one passes), then bisects between the
highest passing and the lowest failing rate until they are within ``tolerance`` of each other.
``--ramp-until-slo`` runs it live, each probe a window of one running test. A failed window is
judged again before it counts (``confirm``): the first *sustained* breach stops the climb, not one
unlucky window. A decisive breach (``decisive``: a p95 at twice its threshold or more, or twice
the failures allowed, on enough requests) counts at once, and the ramp ends its window early, as
it does for a clear pass (``clear_pass``: every p95 at half its threshold or less, nothing failed).
Stdlib only: the plugin's ramp drives it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class KneeProbe:
    rate: float
    passed: bool
    why: str = ""
    p95_ms: dict = field(default_factory=dict)
    goodput_rps: float | None = None
    window: int = 1  # 2: the failure's confirming window
    decisive: bool = False  # a breach far past the SLO (``decisive``): it counts without a second window


@dataclass
class KneeSearch:
    start: float
    tolerance: float = 0.1
    low_bound: float = 0.05
    high_bound: float = 4096.0
    confirm: bool = True  # a failure is judged in a second window before it counts
    low: float | None = None  # the highest rate that held the SLO
    high: float | None = None  # the lowest rate that breached it (sustained)
    probes: list[KneeProbe] = field(default_factory=list)
    _pending: float | None = None  # a rate that failed once, to judge again

    def __post_init__(self):
        if not (self.start > 0 and self.tolerance > 0 and self.low_bound <= self.start <= self.high_bound):
            raise ValueError(f"a ramp from {self.start:g} requests/s: the start must lie in "
                             f"[{self.low_bound:g}, {self.high_bound:g}] and the tolerance be positive")

    def next_rate(self) -> float | None:
        """The rate to hold next, or None when the search is over."""
        if self._pending is not None:
            return self._pending
        if not self.probes:
            return self.start
        if self.low is None or self.high is None:  # bracketing
            last = self.probes[-1]
            rate = last.rate * (2.0 if last.passed else 0.5)
            return rate if self.low_bound <= rate <= self.high_bound else None
        if (self.high - self.low) / self.low <= self.tolerance:
            return None
        return round((self.low + self.high) / 2, 3)

    def record(self, probe: KneeProbe) -> None:
        """The verdict of the window at ``probe.rate`` (the rate ``next_rate`` gave)."""
        self.probes.append(probe)
        if not probe.passed and self.confirm and self._pending is None and not probe.decisive:
            self._pending = probe.rate  # once more before it counts
            return
        self._pending = None
        if probe.passed:
            self.low = probe.rate if self.low is None else max(self.low, probe.rate)
        else:
            self.high = probe.rate if self.high is None else min(self.high, probe.rate)

    @property
    def confirming(self) -> bool:
        """The next window judges again a rate that failed once."""
        return self._pending is not None

    @property
    def done(self) -> bool:
        return self.next_rate() is None

    def note(self) -> str:
        if self.low is not None and self.high is not None:
            return ""
        if self.high is None:
            return f"held the SLO at every rate up to {self.probes[-1].rate if self.probes else self.start:g} requests/s"
        return f"breached the SLO at every rate down to {self.probes[-1].rate if self.probes else self.start:g} requests/s"


DECISIVE_FACTOR = 2.0
DECISIVE_REQUESTS = 30


def decisive(p95_ms: dict, limits: dict, requests: int, failures: int, max_failed_share: float) -> bool:
    """A breach no more waiting can undo: on at least ``DECISIVE_REQUESTS`` requests, a p95 at
    ``DECISIVE_FACTOR`` times its threshold or more, or that many times the failures allowed."""
    if requests < DECISIVE_REQUESTS:
        return False
    if failures > DECISIVE_FACTOR * max_failed_share * requests:
        return True
    return any((p95_ms.get(metric) or 0.0) >= DECISIVE_FACTOR * limit for metric, limit in limits.items())


CLEAR_FACTOR = 0.5
CLEAR_REQUESTS = 50


def clear_pass(p95_ms: dict, limits: dict, requests: int, failures: int) -> bool:
    """A window held so far within the SLO that no more waiting would change it: on at least
    ``CLEAR_REQUESTS`` requests, none failed and every p95 at most ``CLEAR_FACTOR`` of its
    threshold (the climb's first rates, far below the knee, end early; the ramp never ends a window
    early this way once a breach is known: near the knee a queue builds slowly)."""
    if requests < CLEAR_REQUESTS or failures:
        return False
    return all((p95_ms.get(metric) if p95_ms.get(metric) is not None else float("inf")) <= CLEAR_FACTOR * limit
               for metric, limit in limits.items())
