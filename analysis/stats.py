"""Pure statistics on arrays: percentiles and bootstrap confidence intervals. No I/O, no globals."""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

PERCENTILES = (50, 95, 99)


def percentiles(values, qs: Sequence[float] = PERCENTILES) -> dict[float, float]:
    """``{q: value}`` from raw samples (linear interpolation); NaN for no samples."""
    arr = np.asarray(values, dtype=float)
    if arr.size == 0:
        return {q: float("nan") for q in qs}
    return dict(zip(qs, np.percentile(arr, qs).tolist()))


def p95(values) -> float:
    return float(np.percentile(values, 95)) if len(values) else float("nan")


def pct_change(baseline: float, candidate: float) -> float:
    return (candidate - baseline) / baseline * 100.0 if baseline else float("nan")


def _resample(groups: list[list[np.ndarray]], rng: np.random.Generator) -> np.ndarray:
    """One cluster-bootstrap draw: repeats with replacement, then requests within each repeat."""
    picked = []
    for r in rng.integers(0, len(groups), len(groups)):
        requests = groups[r]
        for i in rng.integers(0, len(requests), len(requests)):
            picked.append(requests[i])
    return np.concatenate(picked) if picked else np.array([])


def bootstrap_ci(baseline: list[list[np.ndarray]], candidate: list[list[np.ndarray]],
                 stat: Callable[[np.ndarray], float], n: int, rng: np.random.Generator,
                 level: float = 0.95) -> tuple[float, float, float]:
    """Percent change of ``stat`` from baseline to candidate, with a bootstrap interval.

    Each side is a list of repeats, each a list of per-request sample arrays: requests are the
    resampling unit (a request's ITLs are not independent of each other), repeats the outer level.
    Returns ``(point, low, high)`` in percent.
    """
    flat_b = np.concatenate([a for rep in baseline for a in rep])
    flat_c = np.concatenate([a for rep in candidate for a in rep])
    point = pct_change(stat(flat_b), stat(flat_c))
    draws = np.empty(n)
    for i in range(n):
        draws[i] = pct_change(stat(_resample(baseline, rng)), stat(_resample(candidate, rng)))
    alpha = (1 - level) / 2
    low, high = np.nanpercentile(draws, [alpha * 100, (1 - alpha) * 100])
    return point, float(low), float(high)


def counter_increase(values) -> float:
    """Increase of a Prometheus counter over a series, counting a drop as a restart from zero."""
    arr = np.asarray(values, dtype=float)
    if arr.size < 2:
        return 0.0
    diffs = np.diff(arr)
    return float(np.where(diffs >= 0, diffs, arr[1:]).sum())
