"""The client's error budget (``--calibrate``): what it read against what an exact-timing server did.

Before the load, the suite's own client runs for a few seconds against the exact-timing mock
(``mock/exact.py``) on the same machine, at the run's streams and process count; the mock records
when each request arrived and each chunk left. Comparing the client's TTFT and ITL percentiles with
the truth's gives this client's error on this machine at this load: the budget a difference between
two configs must beat to be the server's and not the client's. Stdlib only: the plugin writes the
budget (``calibration-<run_id>.json`` and the load record's ``calibration``), the analysis reads it.
"""

from __future__ import annotations

import math
from pathlib import Path

from .trust import quantile

QUANTILES = (50, 95, 99)
PREFIX = "calibration-"
# The budget a difference is judged against: the client's p95 error of each metric.
BUDGET_KEYS = {"ttft": "ttft_p95_error_ms", "itl": "itl_p95_error_ms"}


def calibration_file(directory: str | Path, run_id: str) -> Path:
    return Path(directory) / f"{PREFIX}{run_id}.json"


def _sd(values: list[float]) -> float:
    if not values:
        return float("nan")
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))


def truth_of(requests: list[dict]) -> tuple[list[float], list[float]]:
    """The server's TTFT and ITL in ms from its record (``{"recv": s, "sends": [s, ...]}`` a request)."""
    ttft = [(r["sends"][0] - r["recv"]) * 1000 for r in requests if r.get("sends")]
    itl = [(b - a) * 1000 for r in requests for a, b in zip(r.get("sends", []), r.get("sends", [])[1:])]
    return ttft, itl


def error_budget(client_ttft_ms: list[float], client_itl_ms: list[float], truth: list[dict]) -> dict:
    """Per metric and quantile, the client's percentile minus the truth's (ms); the TTFT mean error;
    the ITL's spread on both sides (a stall that delays one stamp lengthens one gap and shortens the next)."""
    true_ttft, true_itl = truth_of(truth)
    out: dict = {}
    for name, client, true in (("ttft", client_ttft_ms, true_ttft), ("itl", client_itl_ms, true_itl)):
        for q in QUANTILES:
            out[f"{name}_p{q}_error_ms"] = _round(quantile(client, q) - quantile(true, q))
    if client_ttft_ms and true_ttft:
        out["ttft_mean_error_ms"] = _round(sum(client_ttft_ms) / len(client_ttft_ms) - sum(true_ttft) / len(true_ttft))
    out["itl_sd_client_ms"] = _round(_sd(client_itl_ms))
    out["itl_sd_truth_ms"] = _round(_sd(true_itl))
    out["requests"] = len(true_ttft)
    return out


def _round(value: float) -> float | None:
    return None if value is None or math.isnan(value) else round(value, 3)


def budget_ms(calibration: dict, metric: str) -> float | None:
    """The size of the client's error on ``metric`` (``ttft`` or ``itl``): its p95 error's magnitude."""
    value = (calibration or {}).get(BUDGET_KEYS.get(metric.lower(), ""))
    return abs(float(value)) if _number(value) else None


def describe(calibration: dict) -> str:
    """One line: this client, on this machine, at this load, reads TTFT and ITL within this much."""
    if not calibration:
        return ""
    if calibration.get("error"):
        return f"client calibration failed: {calibration['error']}"

    def ms(key: str) -> str:
        value = calibration.get(key)
        return f"{value:+.2f} ms" if _number(value) else "?"

    def num(key: str, spec: str = "g") -> str:
        value = calibration.get(key)
        return format(value, spec) if _number(value) else "?"

    processes = calibration.get("processes")
    return (f"client calibration: at {num('streams')} streams ({num('processes')} process{'' if processes == 1 else 'es'}, "
            f"{num('events_per_s', ',.0f')} chunks/s asked, exact-timing mock at TTFT {num('ttft_ms')} ms / ITL "
            f"{num('itl_ms')} ms) this client on this machine reads TTFT p95 {ms('ttft_p95_error_ms')} "
            f"(p99 {ms('ttft_p99_error_ms')}), ITL p95 {ms('itl_p95_error_ms')} (p99 {ms('itl_p99_error_ms')}) "
            f"off the truth; {num('cpu_us_per_chunk')} us CPU a chunk")


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
