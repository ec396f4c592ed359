"""Compare each profile with the baseline: percent changes with bootstrap intervals, and a verdict.

The rule (the seed's): a profile beats the baseline at a concurrency only if p95 TTFT and p95 ITL
both improve with 95% intervals that exclude zero, and output throughput falls by no more than
``max_throughput_drop_pct`` (20%). Over all concurrencies: ``beats`` (at every one), ``mixed``,
or ``does not beat``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from vllm_locust.schema import COMPARISON, IDS, PER_RUN, SAMPLE, SUMMARY, VERDICT, pct_col

from .stats import bootstrap_ci, pct_change

METRICS = (("TTFT", 50), ("TTFT", 95), ("ITL", 50), ("ITL", 95), ("TPOT", 95), ("E2E", 95))


@dataclass(frozen=True)
class Rule:
    max_throughput_drop_pct: float = 20.0
    bootstrap: int = 1000
    level: float = 0.95
    seed: int = 0


def request_groups(samples: pd.DataFrame, metric: str) -> list[list[np.ndarray]]:
    """Per repeat, per request: the metric's samples (the bootstrap's resampling units)."""
    rows = samples[samples[SAMPLE.metric] == metric]
    return [[g[SAMPLE.value_ms].to_numpy() for _, g in rep.groupby(SAMPLE.request_id)] for _, rep in rows.groupby(IDS.repeat)]


def _quantile(q: float):
    return lambda values: float(np.percentile(values, q)) if len(values) else float("nan")


def throughput_ci(base: np.ndarray, cand: np.ndarray, n: int, rng: np.random.Generator, level: float):
    """Percent change of mean throughput; the interval resamples runs (NaN with one run a side)."""
    if len(base) < 2 and len(cand) < 2:
        return pct_change(base.mean(), cand.mean()), float("nan"), float("nan")
    as_groups = lambda values: [[np.array([v]) for v in values]]  # noqa: E731 (one run = one unit)
    return bootstrap_ci(as_groups(base), as_groups(cand), np.mean, n, rng, level)


def compare(samples: pd.DataFrame, runs: pd.DataFrame, baseline: str, rule: Rule) -> pd.DataFrame:
    """Tidy comparison: one row per candidate profile, concurrency and metric."""
    rng = np.random.default_rng(rule.seed)
    rows = []
    for profile in sorted(set(samples[IDS.profile]) - {baseline}):
        for c in sorted(set(samples.loc[samples[IDS.profile] == profile, IDS.concurrency])
                        & set(samples.loc[samples[IDS.profile] == baseline, IDS.concurrency])):
            b = samples[(samples[IDS.profile] == baseline) & (samples[IDS.concurrency] == c)]
            k = samples[(samples[IDS.profile] == profile) & (samples[IDS.concurrency] == c)]
            for metric, q in METRICS:
                bg, kg = request_groups(b, metric), request_groups(k, metric)
                if not bg or not kg:
                    continue
                point, low, high = bootstrap_ci(bg, kg, _quantile(q), rule.bootstrap, rng, rule.level)
                rows.append({COMPARISON.profile: profile, COMPARISON.concurrency: c, COMPARISON.metric: pct_col(metric, q),
                             COMPARISON.change_pct: point, COMPARISON.ci_low_pct: low, COMPARISON.ci_high_pct: high})
            bt = runs[(runs[PER_RUN.profile] == baseline) & (runs[PER_RUN.concurrency] == c)][PER_RUN.output_tokens_per_s].to_numpy()
            kt = runs[(runs[PER_RUN.profile] == profile) & (runs[PER_RUN.concurrency] == c)][PER_RUN.output_tokens_per_s].to_numpy()
            point, low, high = throughput_ci(bt, kt, rule.bootstrap, rng, rule.level)
            rows.append({COMPARISON.profile: profile, COMPARISON.concurrency: c, COMPARISON.metric: PER_RUN.output_tokens_per_s,
                         COMPARISON.change_pct: point, COMPARISON.ci_low_pct: low, COMPARISON.ci_high_pct: high})
    return pd.DataFrame(rows, columns=list(COMPARISON))


def _improves(row: pd.Series | None) -> bool:
    return row is not None and row[COMPARISON.ci_high_pct] < 0


def trust_of(summary: pd.DataFrame) -> dict:
    """``(profile, concurrency) -> True/False/None``: did the client keep up in every run of that point."""
    return {(r[SUMMARY.profile], r[SUMMARY.concurrency]): r[SUMMARY.client_trusted] for _, r in summary.iterrows()}


def verdicts(comparison: pd.DataFrame, rule: Rule, trust: dict | None = None, baseline: str | None = None) -> pd.DataFrame:
    """One row per candidate and concurrency: beats or not, why, and whether the client's numbers
    on both sides can be trusted (a verdict on untrusted runs says so in ``why``)."""
    trust = trust or {}
    rows = []
    for (profile, c), g in comparison.groupby([COMPARISON.profile, COMPARISON.concurrency]):
        by = {r[COMPARISON.metric]: r for _, r in g.iterrows()}
        ttft, itl, tput = by.get(pct_col("TTFT", 95)), by.get(pct_col("ITL", 95)), by.get(PER_RUN.output_tokens_per_s)
        reasons = []
        if not _improves(ttft):
            reasons.append("p95 TTFT does not improve with an interval excluding zero")
        if not _improves(itl):
            reasons.append("p95 ITL does not improve with an interval excluding zero")
        if tput is None or not tput[COMPARISON.change_pct] >= -rule.max_throughput_drop_pct:
            reasons.append(f"throughput falls more than {rule.max_throughput_drop_pct:g}%")
        sides = [trust.get((profile, c)), trust.get((baseline, c))]
        trusted = False if False in sides else (None if None in sides else True)
        why = "; ".join(reasons) or "p95 TTFT and p95 ITL improve, throughput holds"
        if trusted is False:
            late = [p for p, t in ((profile, sides[0]), (baseline, sides[1])) if t is False]
            why = f"UNTRUSTED: the client fell behind (loop lag) in {', '.join(map(str, late))}; " + why
        rows.append({VERDICT.profile: profile, VERDICT.concurrency: c, VERDICT.beats: not reasons,
                     VERDICT.p95_ttft_change_pct: ttft[COMPARISON.change_pct] if ttft is not None else np.nan,
                     VERDICT.p95_itl_change_pct: itl[COMPARISON.change_pct] if itl is not None else np.nan,
                     VERDICT.throughput_change_pct: tput[COMPARISON.change_pct] if tput is not None else np.nan,
                     VERDICT.trusted: trusted, VERDICT.why: why})
    return pd.DataFrame(rows, columns=list(VERDICT))


def overall(per_level: pd.DataFrame) -> dict[str, str]:
    """``beats`` at every concurrency, ``mixed`` at some, ``does not beat`` at none."""
    result = {}
    for profile, g in per_level.groupby(VERDICT.profile):
        result[profile] = "beats" if g[VERDICT.beats].all() else "mixed" if g[VERDICT.beats].any() else "does not beat"
    return result


def untrusted_levels(per_level: pd.DataFrame) -> dict[str, list]:
    """Per candidate, the concurrencies whose verdict rests on runs where the client fell behind."""
    bad = per_level[per_level[VERDICT.trusted] == False]  # noqa: E712 (None means unknown, not False)
    return {p: sorted(g[VERDICT.concurrency].tolist()) for p, g in bad.groupby(VERDICT.profile)}
