"""Compare each profile with the baseline: percent changes with bootstrap intervals, and a verdict.

The rule (the seed's): a profile beats the baseline at a load level (a concurrency, or a request
rate) only if p95 TTFT and p95 ITL both improve with 95% intervals that exclude zero, and output
throughput falls by no more than ``max_throughput_drop_pct`` (20%). With ``--slo`` and
``--rule goodput`` it beats when the share of requests meeting the SLO rises with an interval
excluding zero (at the same offered load, that is goodput). Over all levels: ``beats`` (at every
one), ``mixed``, or ``does not beat``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from vllm_locust.core.schema import (COMPARISON, E2E, IDS, ITL, LEVEL, PER_RUN, SAMPLE, SUMMARY, TPOT, TTFT, VERDICT,
                                     level_name, pct_col)

from . import runfigures
from .goodput import Slo, met_groups
from .stats import bootstrap_ci, pct_change
from .tidy import at_level

METRICS = ((TTFT, 50), (TTFT, 95), (ITL, 50), (ITL, 95), (TPOT, 95), (E2E, 95))


@dataclass(frozen=True)
class Rule:
    max_throughput_drop_pct: float = 20.0
    bootstrap: int = 1000
    level: float = 0.95
    seed: int = 0
    slo: Slo | None = None
    on: str = "latency"  # or "goodput" (needs slo)

    @property
    def text(self) -> str:
        """The rule in one sentence, for the report: built from the fields, never parsed back."""
        if self.on == "goodput":
            return (f"Rule: the share of requests meeting the SLO ({self.slo}) rises with a 95% bootstrap interval "
                    f"that excludes zero ({self.bootstrap} resamples of requests within repeats).")
        return ("Rule: p95 TTFT and p95 ITL both improve with 95% bootstrap intervals that exclude zero, and output "
                f"throughput falls by at most {self.max_throughput_drop_pct:g}% ({self.bootstrap} resamples of "
                "requests within repeats).")


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


def levels_of(frame: pd.DataFrame, profile: str) -> set:
    return set(map(tuple, frame.loc[frame[IDS.profile] == profile, list(LEVEL)].drop_duplicates().to_numpy().tolist()))


def compare(samples: pd.DataFrame, runs: pd.DataFrame, baseline: str, rule: Rule,
            requests: pd.DataFrame | None = None) -> pd.DataFrame:
    """Tidy comparison: one row per candidate profile, load level and metric."""
    rng = np.random.default_rng(rule.seed)
    rows = []

    def add(profile, level, metric, change):
        point, low, high = change
        rows.append({COMPARISON.profile: profile, COMPARISON.request_rate: level[0], COMPARISON.concurrency: int(level[1]),
                     COMPARISON.metric: metric, COMPARISON.change_pct: point, COMPARISON.ci_low_pct: low,
                     COMPARISON.ci_high_pct: high})

    for profile in sorted(set(samples[IDS.profile]) - {baseline}):
        for level in sorted(levels_of(samples, profile) & levels_of(samples, baseline)):
            b, k = at_level(samples, baseline, *level), at_level(samples, profile, *level)
            for metric, q in METRICS:
                bg, kg = request_groups(b, metric), request_groups(k, metric)
                if bg and kg:
                    add(profile, level, pct_col(metric, q), bootstrap_ci(bg, kg, _quantile(q), rule.bootstrap, rng, rule.level))
            for column in (PER_RUN.output_tokens_per_s, *((PER_RUN.goodput_requests_per_s,) if rule.slo else ())):
                bt, kt = at_level(runs, baseline, *level)[column].to_numpy(), at_level(runs, profile, *level)[column].to_numpy()
                add(profile, level, column, throughput_ci(bt, kt, rule.bootstrap, rng, rule.level))
            for column in (c for c in runfigures.compared_columns() if c in runs):  # energy per token, ...
                bt = at_level(runs, baseline, *level)[column].to_numpy(dtype=float)
                kt = at_level(runs, profile, *level)[column].to_numpy(dtype=float)
                bt, kt = bt[~np.isnan(bt)], kt[~np.isnan(kt)]
                if len(bt) and len(kt):  # a figure one side lacks (a GPU on one host only): no comparison
                    add(profile, level, column, throughput_ci(bt, kt, rule.bootstrap, rng, rule.level))
            if rule.slo is not None and requests is not None:
                bg = met_groups(at_level(requests, baseline, *level), b, rule.slo)
                kg = met_groups(at_level(requests, profile, *level), k, rule.slo)
                if any(bg) and any(kg):
                    add(profile, level, SUMMARY.slo_met_share, bootstrap_ci(bg, kg, np.mean, rule.bootstrap, rng, rule.level))
    return pd.DataFrame(rows, columns=list(COMPARISON))


def _improves(row: pd.Series | None) -> bool:
    return row is not None and row[COMPARISON.ci_high_pct] < 0


def trust_of(summary: pd.DataFrame) -> dict:
    """``(profile, rate, concurrency) -> True/False/None``: did the client keep up in every run of
    that point, and (open loop) send the asked load on time."""
    out = {}
    for _, r in summary.iterrows():
        kept_up, delivered = r[SUMMARY.client_trusted], r.get(SUMMARY.load_delivered)
        trusted = False if False in (kept_up, delivered) else kept_up
        out[(r[SUMMARY.profile], r[SUMMARY.request_rate], r[SUMMARY.concurrency])] = trusted
    return out


def verdicts(comparison: pd.DataFrame, rule: Rule, trust: dict | None = None, baseline: str | None = None) -> pd.DataFrame:
    """One row per candidate and concurrency: beats or not, why, and whether the client's numbers
    on both sides can be trusted (a verdict on untrusted runs says so in ``why``)."""
    trust = trust or {}
    rows = []
    worse_at = worse(comparison)
    for (profile, rate, c), g in comparison.groupby([COMPARISON.profile, *LEVEL]):
        by = {r[COMPARISON.metric]: r for _, r in g.iterrows()}
        ttft, itl, tput = by.get(pct_col(TTFT, 95)), by.get(pct_col(ITL, 95)), by.get(PER_RUN.output_tokens_per_s)
        share, good = by.get(SUMMARY.slo_met_share), by.get(PER_RUN.goodput_requests_per_s)
        reasons = []
        if rule.on == "goodput":
            if share is None or not share[COMPARISON.ci_low_pct] > 0:
                reasons.append(f"the share of requests meeting the SLO ({rule.slo}) does not rise with an interval excluding zero")
            praise = f"more requests meet the SLO ({rule.slo}): goodput rises at the same load"
        else:
            if not _improves(ttft):
                reasons.append("p95 TTFT does not improve with an interval excluding zero")
            if not _improves(itl):
                reasons.append("p95 ITL does not improve with an interval excluding zero")
            if tput is None or not tput[COMPARISON.change_pct] >= -rule.max_throughput_drop_pct:
                reasons.append(f"throughput falls more than {rule.max_throughput_drop_pct:g}%")
            praise = "p95 TTFT and p95 ITL improve, throughput holds"
        sides = [trust.get((profile, rate, c)), trust.get((baseline, rate, c))]
        trusted = False if False in sides else (None if None in sides else True)
        why = "; ".join(reasons) or praise
        if (profile, rate, c) in worse_at:
            why += "; worse: " + ", ".join(f"{m} {_change_text(*n)}" for m, *n in worse_at[(profile, rate, c)])
        if trusted is False:
            late = [p for p, t in ((profile, sides[0]), (baseline, sides[1])) if t is False]
            why = (f"UNTRUSTED: the client fell behind (loop lag) or did not send the asked load on time in "
                   f"{', '.join(map(str, late))}; " + why)
        pick = lambda r: r[COMPARISON.change_pct] if r is not None else np.nan  # noqa: E731
        rows.append({VERDICT.profile: profile, VERDICT.request_rate: rate, VERDICT.concurrency: c, VERDICT.beats: not reasons,
                     VERDICT.p95_ttft_change_pct: pick(ttft), VERDICT.p95_itl_change_pct: pick(itl),
                     VERDICT.throughput_change_pct: pick(tput), VERDICT.goodput_change_pct: pick(good),
                     VERDICT.trusted: trusted, VERDICT.why: why})
    return pd.DataFrame(rows, columns=list(VERDICT))


LOWER_IS_BETTER = {pct_col(m, q) for m, q in METRICS}
HIGHER_IS_BETTER = {PER_RUN.output_tokens_per_s, PER_RUN.goodput_requests_per_s, SUMMARY.slo_met_share}


def _metric_text(metric: str) -> str:
    """``p95_itl_ms`` -> ``p95 ITL``; ``output_tokens_per_s`` -> ``output tokens/s``."""
    head, _, rest = metric.partition("_")
    if head[:1] == "p" and head[1:].isdigit() and rest.endswith("_ms"):
        return f"{head} {rest[:-3].upper()}"
    return metric.replace("_per_s", "/s").replace("_", " ")


def worse(comparison: pd.DataFrame) -> dict[tuple, list[tuple[str, float, float, float]]]:
    """``(profile, rate, concurrency) -> [("p95 ITL", 36.0, 7.0, 74.0), ...]``: the metrics a
    candidate is significantly worse on there (a latency's interval above zero, a throughput's
    below), so a verdict never hides a worse candidate behind "does not beat"."""
    out: dict[tuple, list] = {}
    for _, row in comparison.iterrows():
        metric, low, high = row[COMPARISON.metric], row[COMPARISON.ci_low_pct], row[COMPARISON.ci_high_pct]
        if (metric in LOWER_IS_BETTER and low > 0) or (metric in HIGHER_IS_BETTER and high < 0):
            key = (row[COMPARISON.profile], row[COMPARISON.request_rate], row[COMPARISON.concurrency])
            out.setdefault(key, []).append((_metric_text(metric), row[COMPARISON.change_pct], low, high))
    return out


def _change_text(change: float, low: float, high: float) -> str:
    return f"{change:+.0f}% [{low:.0f}, {high:.0f}]"


def worse_lines(comparison: pd.DataFrame) -> dict[str, str]:
    """Per candidate, one clause for the console: ``worse on p95 ITL at c=4 (+36% [7, 74]), ...``."""
    by_profile: dict[str, list[str]] = {}
    for (profile, rate, c), items in sorted(worse(comparison).items()):
        by_profile.setdefault(profile, []).extend(
            f"{metric} at {level_name(rate, c)} ({_change_text(*numbers)})" for metric, *numbers in items)
    return {p: "worse on " + ", ".join(items) + " (intervals on the worse side of zero)" for p, items in by_profile.items()}


def overall(per_level: pd.DataFrame) -> dict[str, str]:
    """``beats`` at every concurrency, ``mixed`` at some, ``does not beat`` at none."""
    result = {}
    for profile, g in per_level.groupby(VERDICT.profile):
        result[profile] = "beats" if g[VERDICT.beats].all() else "mixed" if g[VERDICT.beats].any() else "does not beat"
    return result


def untrusted_levels(per_level: pd.DataFrame) -> dict[str, list]:
    """Per candidate, the load levels (``c=64``, ``rate=4/s``) whose verdict rests on runs where the
    client fell behind."""
    bad = per_level[per_level[VERDICT.trusted] == False]  # noqa: E712 (None means unknown, not False)
    return {p: [level_name(r, c) for r, c in sorted(zip(g[VERDICT.request_rate], g[VERDICT.concurrency]))]
            for p, g in bad.groupby(VERDICT.profile)}
