"""SLO thresholds and their judge: one test for the analysis, the boundary search and a live ramp.

``"ttft:500,itl:50"``: per-metric thresholds in ms, judged at p95 (``judge``), with at most
``MAX_FAILED_SHARE`` of the requests failed; per request (``request_meets``) for goodput. In open
loop TTFT and E2E count from the instant the schedule meant the request to leave. The analysis
(``analysis/goodput.py``) judges its summary rows with ``judge``; ``--ramp-until-slo`` judges each
window of a running test with the same function, on the same figures taken from its raw values.
Stdlib only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SLO_METRICS = ("ttft", "itl", "tpot", "e2e")
MAX_FAILED_SHARE = 0.05  # one failed request in twenty is what a p95 threshold allows


@dataclass(frozen=True)
class Slo:
    limits_ms: tuple[tuple[str, float], ...]

    def __str__(self) -> str:
        return ",".join(f"{k}:{v:g}" for k, v in self.limits_ms)


def parse_slo(text: str | None, flag: str = "--slo") -> Slo | None:
    """``"ttft:500,itl:50"`` -> ``Slo``; empty: none. A bad entry names the flag and the metrics."""
    if not text:
        return None
    limits = {}
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        name, _, value = part.partition(":")
        try:
            limit = float(value)
        except ValueError:
            limit = float("nan")
        if name.lower() not in SLO_METRICS or not limit > 0:
            raise ValueError(f"{flag} {text!r}: expected metric:ms pairs such as ttft:500,itl:50 "
                             f"(metrics: {', '.join(SLO_METRICS)}; ms > 0)")
        limits[name.lower()] = limit
    if not limits:
        raise ValueError(f"{flag} {text!r}: no thresholds")
    return Slo(tuple(sorted(limits.items(), key=lambda kv: SLO_METRICS.index(kv[0]))))


def judge(p95_ms: dict, requests: int, failures: int, slo: Slo, names: dict | None = None) -> tuple[bool, str]:
    """Does a level meet ``slo``: each metric's p95 (``p95_ms[metric]``, NaN or absent: nothing
    measured, a miss) within its threshold and at most ``MAX_FAILED_SHARE`` of ``requests`` failed?
    Returns the verdict and, when missed, why in numbers (``names``: how to call each metric)."""
    misses = []
    for metric, limit in slo.limits_ms:
        value = p95_ms.get(metric, math.nan)
        value = math.nan if value is None else float(value)
        if not value <= limit:
            misses.append(f"{(names or {}).get(metric, metric + ' p95')} {value:.1f} > {limit:g}")
    if requests == 0 or failures > MAX_FAILED_SHARE * requests:
        misses.append(f"{failures} of {requests} requests failed")
    return not misses, "; ".join(misses)


def request_meets(slo: Slo, ttft_ms: float | None, e2e_ms: float | None, tpot_ms: float | None,
                  itl_p95_ms: float | None) -> bool:
    """One succeeded request against every threshold (TTFT and E2E from the intended instant in
    open loop; ITL: the request's own p95 gap). No TPOT (one token) or no gap: nothing to miss."""
    limits = dict(slo.limits_ms)
    for metric, value in (("ttft", ttft_ms), ("e2e", e2e_ms)):
        if metric in limits and not (value is not None and value <= limits[metric]):
            return False
    for metric, value in (("tpot", tpot_ms), ("itl", itl_p95_ms)):
        if metric in limits and value is not None and not value <= limits[metric]:
            return False
    return True


def percentile(sorted_values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's and pandas' default), on sorted values."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (pos - low)
