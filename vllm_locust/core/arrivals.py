"""Open-loop arrivals: when each request is meant to leave, whatever the server is doing.

One seeded schedule for the whole run, shared by every process: the ``k``-th arrival is at the
same instant on every process, and a process of ``count`` sends only the arrivals with
``k % count == index``, so the total rate is the asked rate whatever the number of workers.

Inter-arrival gaps follow vLLM's ``bench serve``: gamma with shape ``burstiness`` and mean
``1 / rate`` (``burstiness`` 1: a Poisson process; larger: steadier; smaller: burstier). A linear
ramp from ``rate0`` to ``rate1`` uses the same gaps in *operational time* (``Lambda(t)``, the
expected number of arrivals by ``t``), mapped back to real time by inverting ``Lambda``: the
standard time-rescaling of a renewal process.

With personas (``--personas``) the schedule stays one: ``persona_of`` gives arrival ``k`` to a
persona by a seeded weighted draw that depends on ``(seed, key, k)`` only, so every process
agrees on it without a word, and each persona's users take only the arrivals drawn to it
(``persona_offsets``: a persona's arrivals are sliced over the processes that hold its users).

A trace (``--workload trace``) brings its own send times instead: ``trace_offsets`` divides them
by the replay speed and slices them over the processes the same way (arrival ``k`` to process
``k % count``).

Stdlib only and no gevent: the schedule is arithmetic, ``Pacer`` (``pacer.py``) hands it to users.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_right
from dataclasses import dataclass
from itertools import accumulate


@dataclass(frozen=True)
class Segment:
    """From ``epoch_s`` (unix seconds, the deciding process's clock): ``rate0`` requests/s, rising
    (or falling) linearly to ``rate1`` over ``ramp_s`` seconds and holding ``rate1`` after; with
    ``ramp_s`` 0, ``rate0`` throughout. A segment lasts until the run state replaces it."""

    epoch_s: float
    rate0: float
    rate1: float
    ramp_s: float = 0.0
    key: int = 0  # the segment's number in the run: it seeds the schedule

    def __post_init__(self):
        for rate in (self.rate0, self.rate1):
            if not (rate > 0 and math.isfinite(rate)):
                raise ValueError(f"--request-rate: rates must be positive numbers, got {rate:g}")
        if self.ramp_s < 0:
            raise ValueError(f"a ramp of {self.ramp_s:g} s")

    @property
    def _ramps(self) -> bool:
        return self.rate0 != self.rate1 and self.ramp_s > 0

    def expected_by(self, t_s: float) -> float:
        """``Lambda(t)``: arrivals expected in the first ``t_s`` seconds."""
        if not self._ramps:
            return self.rate0 * t_s
        r = min(t_s, self.ramp_s)
        ramped = self.rate0 * r + 0.5 * (self.rate1 - self.rate0) / self.ramp_s * r * r
        return ramped + self.rate1 * max(0.0, t_s - self.ramp_s)

    def time_of(self, expected: float) -> float:
        """The inverse of ``expected_by``: seconds at which ``expected`` arrivals are due."""
        if not self._ramps:
            return expected / self.rate0
        in_ramp = 0.5 * (self.rate0 + self.rate1) * self.ramp_s
        if expected >= in_ramp:
            return self.ramp_s + (expected - in_ramp) / self.rate1
        slope = (self.rate1 - self.rate0) / self.ramp_s
        # 0.5 a t^2 + r0 t - L = 0, the root with t >= 0, written to stay exact for small slopes
        return 2.0 * expected / (self.rate0 + math.sqrt(self.rate0 * self.rate0 + 2.0 * slope * expected))

    def rate_at(self, t_s: float) -> float:
        if not self._ramps:
            return self.rate0
        return self.rate0 + (self.rate1 - self.rate0) * min(max(t_s / self.ramp_s, 0.0), 1.0)


def unit_gaps(seed: int, segment: Segment, burstiness: float):
    """Gaps of mean 1 (gamma, shape ``burstiness``): the same sequence on every process, and for
    every profile at the same rate (common random numbers: the compared servers see the same
    bursts); another sequence at another rate, so the probes of a search are independent draws
    rather than scaled copies of one (seed 0's first 40 arrivals came slow at every rate)."""
    check_burstiness(burstiness)
    rng = random.Random(f"vllm-locust-arrivals/{seed}/{segment.key}/{segment.rate0:g}/{segment.rate1:g}")
    if math.isinf(burstiness):
        while True:
            yield 1.0
    while True:
        yield rng.gammavariate(burstiness, 1.0 / burstiness)


def offsets(segment: Segment, seed: int, burstiness: float, index: int = 0, count: int = 1):
    """Seconds after ``segment.epoch_s`` of this process's arrivals (``k % count == index``), without
    end: ``(k, offset_s)`` pairs, ``k`` the arrival's number in the segment's schedule."""
    if not 0 <= index < count:
        raise ValueError(f"process slice {index} of {count}")
    expected = 0.0
    for k, gap in enumerate(unit_gaps(seed, segment, burstiness)):
        expected += gap
        if k % count == index:
            yield k, segment.time_of(expected)


_MASK64 = (1 << 64) - 1


def splitmix64(x: int) -> int:
    """A fast, well-mixed 64-bit integer hash (splitmix64's finaliser): the same on every process."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def cumulative_weights(weights) -> list[float]:
    """``[3, 1]`` -> ``[3, 4]``: ``persona_of``'s table (weights must be finite and at least 0, one of
    them positive; a weight of 0, steered, is never drawn)."""
    weights = list(weights)
    if not weights or any(not (w >= 0 and math.isfinite(w)) for w in weights) or not any(w > 0 for w in weights):
        raise ValueError(f"persona weights {weights!r}: numbers of at least 0, one of them positive")
    return list(accumulate(weights))


def persona_of(k: int, seed: int, cumulative_weights: list[float], key: int = 0) -> int:
    """The index of the persona that arrival ``k`` is drawn to: a hash of ``(seed, key, k)`` made
    uniform in [0, 1) and looked up in the cumulative weights. No state, no order: a process
    draws only the arrivals of its own slice and still agrees with every other process."""
    h = splitmix64(splitmix64((seed & _MASK64) ^ splitmix64(key & _MASK64)) ^ (k & _MASK64))
    index = bisect_right(cumulative_weights, (h >> 11) * 2.0 ** -53 * cumulative_weights[-1])
    return min(index, len(cumulative_weights) - 1)  # never past the last, whatever the rounding


def persona_offsets(segment: Segment, seed: int, burstiness: float, persona: int, cumulative: list[float],
                    index: int = 0, count: int = 1):
    """This process's share of persona ``persona``'s arrivals (those ``persona_of`` draws to it):
    the persona's own ``j``-th arrival goes to process ``j % count`` of the ``count`` that hold its
    users. ``(k, offset_s)`` pairs, ``k`` the arrival's number in the whole schedule."""
    if not 0 <= index < count:
        raise ValueError(f"process slice {index} of {count}")
    j = 0
    for k, offset_s in offsets(segment, seed, burstiness):
        if persona_of(k, seed, cumulative, segment.key) == persona:
            if j % count == index:
                yield k, offset_s
            j += 1


def trace_offsets(times, speed: float = 1.0, index: int = 0, count: int = 1, checked: bool = False):
    """Seconds after the replay's start of this process's share of a trace (``k % count == index``):
    ``(k, times[k] / speed)`` pairs in the trace's order, made as they are taken (a 1 M-row trace's
    pairs were a list of a million tuples), ``times`` its send times in seconds from its start
    (ascending). Checked whole before the first pair (``check_trace_times``; ``checked``: already
    done): a bad trace is refused, not half sent."""
    check_trace_speed(speed)
    if not 0 <= index < count:
        raise ValueError(f"process slice {index} of {count}")
    if not hasattr(times, "__getitem__"):
        times = list(times)
    if not checked:
        check_trace_times(times)
    return ((k, times[k] / speed) for k in range(index, len(times), count))


def check_trace_times(times) -> None:
    """Every request of a trace has a send time >= 0, in the order they are sent; one line if not."""
    before = 0.0
    for k, t in enumerate(times):
        if t is None or not (isinstance(t, (int, float)) and math.isfinite(t) and t >= 0):
            raise ValueError(f"trace request {k}: no send time (got {t!r}); a trace's requests each carry one")
        if k and t < before:
            raise ValueError(f"trace request {k}: sent at {t:g} s, before request {k - 1} ({before:g} s); "
                             "a trace's requests come in the order they are sent")
        before = t


def check_trace_speed(speed: float) -> None:
    if not (isinstance(speed, (int, float)) and speed > 0 and math.isfinite(speed)):
        shown = f"{speed:g}" if isinstance(speed, (int, float)) else repr(speed)
        raise ValueError(f"--trace-speed {shown}: must be a positive number (2: twice as fast, 0.5: half as fast)")


def check_burstiness(burstiness: float) -> None:
    if not burstiness > 0:
        raise ValueError(f"--burstiness {burstiness:g}: must be positive (1: Poisson; larger: steadier)")


def parse_rates(text: str, steps: bool = True) -> list[float]:
    """``"1,2,4.5"`` -> ``[1.0, 2.0, 4.5]`` requests/s; empty: closed loop (``[]``). With ``steps``
    False (a run without the steps shape) one rate at most."""
    text = str(text or "").replace(" ", "")
    if not text:
        return []
    try:
        rates = [float(s) for s in text.split(",") if s]
    except ValueError:
        raise ValueError(f"--request-rate {text!r}: expected requests/s such as 4 or 1,2,4,8") from None
    if any(not (r > 0 and math.isfinite(r)) for r in rates):
        raise ValueError(f"--request-rate {text!r}: every rate must be a positive number of requests/s")
    if len(rates) > 1 and not steps:
        raise ValueError(f"--request-rate {text}: several rates are steps, which need --request-rate on the command "
                         "line (or LOCUST_REQUEST_RATE) when Locust starts; give one rate here")
    return rates
