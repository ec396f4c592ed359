"""The client's calibrated error (``--calibrate``) beside every level, and the differences it could explain.

A run made with ``--calibrate`` carries the client's error budget at its load (``core.calibration``,
the load record's ``calibration``): its TTFT and ITL p95 errors against the exact-timing mock on the
same machine, at the run's largest level. Each level of that run shows them (an upper bound for its
smaller levels); a candidate whose p95 TTFT or ITL differs from the baseline's by less than the
larger budget of the two sides is called out: that difference could be the client's own.
"""

from __future__ import annotations

import pandas as pd

from vllm_locust.core.calibration import budget_ms, describe
from vllm_locust.core.schema import ITL, LEVEL, OPTIONAL_SUMMARY, SUMMARY, TTFT, VERDICT, pct_col

COLUMNS = {TTFT: OPTIONAL_SUMMARY.calibrated_ttft_p95_error_ms, ITL: OPTIONAL_SUMMARY.calibrated_itl_p95_error_ms}


def budgets(runs: list) -> dict[tuple, dict]:
    """``(profile, rate, concurrency) -> {TTFT: ms, ITL: ms}``: the largest budget of that level's runs."""
    out: dict[tuple, dict] = {}
    for run in runs:
        calibration = getattr(run, "calibration", None) or {}
        if not calibration or calibration.get("error"):
            continue
        key = (run.profile, float(run.request_rate), int(run.record.get("concurrency") or 0))
        mine = out.setdefault(key, {})
        for metric in (TTFT, ITL):
            value = budget_ms(calibration, metric)
            if value is not None:
                mine[metric] = max(value, mine.get(metric, 0.0))
    return out


def with_calibration(summary: pd.DataFrame, runs: list) -> pd.DataFrame:
    """``summary`` with each level's calibrated p95 errors, where any run was calibrated."""
    found = budgets(runs)
    if not found or summary.empty:
        return summary
    out = summary.copy()
    keys = list(zip(out[SUMMARY.profile], out[SUMMARY.request_rate].astype(float), out[SUMMARY.concurrency].astype(int)))
    for metric, column in COLUMNS.items():
        out[column] = [found.get(k, {}).get(metric) for k in keys]
    return out


def within_budget(summary: pd.DataFrame, baseline: str) -> dict[tuple, list[str]]:
    """``(profile, rate, concurrency) -> clauses``: where a candidate's p95 TTFT or ITL differs from the
    baseline's by less than the client's calibrated error on either side."""
    if COLUMNS[TTFT] not in summary:
        return {}
    base = summary[summary[SUMMARY.profile] == baseline].set_index([*LEVEL])
    out: dict[tuple, list[str]] = {}
    for _, row in summary[summary[SUMMARY.profile] != baseline].iterrows():
        level = tuple(row[c] for c in LEVEL)
        if level not in base.index:
            continue
        other = base.loc[level]
        for metric, column in COLUMNS.items():
            sides = [v for v in (row.get(column), other.get(column)) if pd.notna(v)]
            if not sides:
                continue
            diff = float(row[pct_col(metric, 95)] - other[pct_col(metric, 95)])
            if abs(diff) < max(sides):
                out.setdefault((row[SUMMARY.profile], *level), []).append(
                    f"p95 {metric} differs by {diff:+.2f} ms, within the client's calibrated error ({max(sides):.2f} ms)")
    return out


def note_verdicts(per_level: pd.DataFrame, summary: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Each verdict's ``why`` says where a difference is within the client's calibrated error."""
    found = within_budget(summary, baseline)
    if not found or per_level.empty:
        return per_level
    out = per_level.copy()
    out[VERDICT.why] = [
        why + "".join(f"; {clause}" for clause in found.get((p, r, c), []))
        for why, p, r, c in zip(out[VERDICT.why], out[VERDICT.profile], out[VERDICT.request_rate], out[VERDICT.concurrency])]
    return out


def calibration_lines(runs: list) -> list[str]:
    """One line per profile and calibration, for the report's notes and the console."""
    lines, seen = [], set()
    for run in runs:
        calibration = getattr(run, "calibration", None) or {}
        line = describe(calibration)
        if line and (run.profile, line) not in seen:
            seen.add((run.profile, line))
            lines.append(f"{run.profile}: {line}")
    return lines
