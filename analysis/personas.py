"""Personas (``--personas``): each tenant summarised, compared and judged on its own requests, against
its own SLO, beside the whole run (``summary.csv`` as before).

- ``summary_by_persona.csv``: one row per label, load level and persona: the summary's columns for
  that persona's requests (latency percentiles, throughput: its requests completed in the measured
  window per second, requests, failures, the share meeting its SLO and goodput), without the
  server-wide ones (one server serves every persona), and whether it was within its SLO.
- ``comparison_by_persona.csv`` and ``verdict_by_persona.csv``: the comparison with the baseline
  (``verdict.compare``: the same bootstrap intervals) and its verdict, per persona.

A persona's SLO is the ``slo`` of its entry in the load record (``"ttft:500,itl:50"``, the ``--slo``
syntax), else the analysis's ``--slo``. Within SLO at a load level is the SLO-boundary search's
test (``launch/boundary.py``): every threshold holds at p95 (TTFT and E2E from the intended send in
open loop) and at most 5% of the requests failed; one slow request in twenty is what p95 allows.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import pandas as pd

from vllm_locust.core.schema import (IDS, ITL, OPTIONAL_SUMMARY, REQUEST, RUN, SUMMARY, TTFT, VERDICT, level_name,
                                     pct_col)

from .goodput import MAX_FAILED_SHARE, Slo, parse_slo, within_slo
from .load import AnalysisError, Run
from .summary import per_run, summarize
from .tidy import tidy_client, tidy_completions, tidy_server
from .verdict import Rule, compare, overall, trust_of, verdicts

PERSONA = "persona"
SUMMARY_BY_PERSONA_CSV = "summary_by_persona.csv"
COMPARISON_BY_PERSONA_CSV = "comparison_by_persona.csv"
VERDICT_BY_PERSONA_CSV = "verdict_by_persona.csv"
WITHIN_SLO, SLO_WHY = "within_slo", "slo_why"
SLO_SOURCE = "slo_source"  # "persona", "option" (the analysis's --slo) or "" (none); no cell starts with "-" (csvsafe)
# One server serves every persona: its figures describe the level, not a persona.
SERVER_WIDE = (SUMMARY.max_num_requests_running, SUMMARY.max_num_requests_waiting, SUMMARY.mean_kv_cache_usage,
               SUMMARY.preemptions, SUMMARY.prefix_cache_hit_rate, SUMMARY.server_queue_ms, SUMMARY.server_prefill_ms,
               SUMMARY.server_decode_ms, SUMMARY.server_ttft_mean_ms, SUMMARY.server_itl_mean_ms,
               SUMMARY.server_p95_ttft_ms, SUMMARY.server_p95_itl_ms, SUMMARY.client_minus_server_ttft_ms,
               SUMMARY.client_minus_server_itl_ms)
HEAD = (SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency)
BY_PERSONA = (*HEAD, PERSONA, *(c for c in SUMMARY if c not in HEAD and c not in SERVER_WIDE), SLO_SOURCE, WITHIN_SLO,
              SLO_WHY)


def persona_of(frame: pd.DataFrame) -> pd.Series:
    """Each row's persona as text, "" where none (runs without ``--personas``, imported files)."""
    if PERSONA not in frame:
        return pd.Series("", index=frame.index, dtype=object)
    return frame[PERSONA].astype(object).where(frame[PERSONA].notna(), "").astype(str)


def has_personas(requests: pd.DataFrame) -> bool:
    return bool(len(requests)) and bool((persona_of(requests) != "").any())


def _slo_text(value) -> str:
    """A persona's ``slo``: ``"ttft:500,itl:50"`` or a table ``{ttft = 500, itl = 50}``."""
    if isinstance(value, dict):
        return ",".join(f"{k}:{v}" for k, v in value.items())
    return str(value)


def persona_slos(runs: list[Run], default: Slo | None) -> dict[str, tuple[Slo | None, str]]:
    """Persona name -> (its SLO, where it came from: ``persona``, ``--slo`` or ""), from the load
    records. A bad ``slo``, or one persona with two SLOs in different labels (their verdicts would
    not judge the same thing), is an ``AnalysisError`` naming the run, the persona and the key."""
    own: dict[str, tuple[Slo, str]] = {}
    for run in runs:
        for entry in run.personas or []:
            if not isinstance(entry, dict) or not entry.get("name"):
                continue
            name = str(entry["name"])
            raw = entry.get("slo", (entry.get("overrides") or {}).get("slo"))
            if raw in (None, "", {}):
                continue
            try:
                slo = parse_slo(_slo_text(raw))
            except ValueError as err:
                raise AnalysisError(f"{run.dir}: persona {name!r}: slo: {err}") from None
            if name in own and own[name][0] != slo:
                raise AnalysisError(f"persona {name!r}: slo {own[name][0]} in {own[name][1]} but {slo} in {run.run_key}: "
                                    "labels compared must judge a persona against one SLO")
            own.setdefault(name, (slo, run.run_key))
    names = {str(e["name"]) for r in runs for e in r.personas or [] if isinstance(e, dict) and e.get("name")}
    out = {name: (slo, "persona") for name, (slo, _) in own.items()}
    for name in names - set(own):
        out[name] = (default, "option" if default is not None else "")
    return out


def judge(row: dict, slo: Slo | None) -> tuple[bool | None, str]:
    """Was one persona's level within its SLO (``goodput.within_slo``)? None without an SLO.
    Returns the verdict and, when missed, why in numbers."""
    if slo is None:
        return None, ""
    passed, _figures, why = within_slo(row, slo)
    return passed, why


@dataclass
class PersonaResult:
    summary: pd.DataFrame  # BY_PERSONA
    comparison: pd.DataFrame  # COMPARISON + persona
    verdicts: pd.DataFrame  # VERDICT + persona, within_slo (the candidate's)
    overall: dict = field(default_factory=dict)  # (profile, persona) -> beats / mixed / does not beat
    slos: dict = field(default_factory=dict)  # persona_slos

    @property
    def judged(self) -> bool:
        """Any persona with an SLO to be within."""
        return bool(len(self.summary)) and self.summary[WITHIN_SLO].notna().any()


def _with_persona(samples: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """The samples with their request's persona (sample rows of older files may lack it)."""
    keys = [IDS.run_key, REQUEST.request_id]
    who = requests[keys].assign(**{PERSONA: persona_of(requests)}).drop_duplicates(keys)
    return samples.drop(columns=[PERSONA], errors="ignore").merge(who, on=keys, how="left").fillna({PERSONA: ""})


def by_persona(runs: list[Run], samples: pd.DataFrame, requests: pd.DataFrame, rule: Rule, baseline: str | None,
               max_client_lag_ms: float, max_send_lateness_ms: float) -> PersonaResult:
    """Summary, comparison and verdict per persona (``runs_per_run``'s samples and requests);
    empty tables when no request carries a persona."""
    empty = PersonaResult(pd.DataFrame(columns=list(BY_PERSONA)), pd.DataFrame(), pd.DataFrame())
    if not has_personas(requests):
        return empty
    slos = persona_slos(runs, rule.slo)
    requests = requests.assign(**{PERSONA: persona_of(requests)})
    samples = _with_persona(samples, requests)
    server, client = tidy_server(runs), tidy_client(runs)
    done, window_s = tidy_completions(runs)
    durations = {r.run_key: float(r.record.get(RUN.duration_s) or 0) for r in runs}
    summaries, comparisons, judged = [], [], []
    for name in sorted(set(requests[PERSONA]) - {""}):
        slo, source = slos.get(name, (rule.slo, "option" if rule.slo is not None else ""))
        s, r = samples[samples[PERSONA] == name], requests[requests[PERSONA] == name]
        if s.empty:
            continue
        mine = done[done[PERSONA] == name] if PERSONA in done else done.iloc[0:0]
        runs_p = per_run(s, r, server, durations, client, max_client_lag_ms, slo, (mine, window_s))
        table = summarize(s, r, runs_p, slo, max_send_lateness_ms)
        within = [judge(row, slo) for row in table.to_dict("records")]
        table = table.assign(**{PERSONA: name, SLO_SOURCE: source, WITHIN_SLO: [w for w, _ in within],
                                SLO_WHY: [why for _, why in within]})
        summaries.append(table)
        if baseline is not None and s[IDS.profile].nunique() > 1:
            rule_p = replace(rule, slo=slo if slo is not None else rule.slo)
            comparison = compare(s, runs_p, baseline, rule_p, r)
            comparisons.append(comparison.assign(**{PERSONA: name}))
            level = verdicts(comparison, rule_p, trust_of(table), baseline)
            met = {(p, rate, c): w for p, rate, c, w in zip(table[SUMMARY.profile], table[SUMMARY.request_rate],
                                                            table[SUMMARY.concurrency], table[WITHIN_SLO])}
            level[WITHIN_SLO] = [met.get(k) for k in zip(level[VERDICT.profile], level[VERDICT.request_rate],
                                                          level[VERDICT.concurrency])]
            judged.append(level.assign(**{PERSONA: name}))
    frame = pd.concat(summaries, ignore_index=True) if summaries else None
    # a run's optional columns (ITL per stream part, embeddings' inputs/s) follow, where it has them
    summary = (frame[[*BY_PERSONA, *(c for c in OPTIONAL_SUMMARY if c in frame)]].sort_values([*HEAD, PERSONA])
               .reset_index(drop=True) if frame is not None else empty.summary)
    comparison = pd.concat(comparisons, ignore_index=True) if comparisons else pd.DataFrame()
    verdict = pd.concat(judged, ignore_index=True) if judged else pd.DataFrame()
    if len(comparison):
        comparison = comparison[[PERSONA, *(c for c in comparison.columns if c != PERSONA)]]
    results = {}
    if len(verdict):
        verdict = verdict[[PERSONA, *(c for c in verdict.columns if c != PERSONA)]]
        results = {(p, name): v for name, g in verdict.groupby(PERSONA) for p, v in overall(g).items()}
    return PersonaResult(summary, comparison, verdict, results, slos)


def missed_levels(summary: pd.DataFrame) -> dict[tuple, list[str]]:
    """(profile, rate, concurrency) -> ``["chat: p95_ttft_ms 620.0 > 500", ...]``: the personas not
    within their SLO there (personas without an SLO are not judged)."""
    out: dict[tuple, list[str]] = {}
    for row in summary[summary[WITHIN_SLO] == False].itertuples():  # noqa: E712 (None: no SLO)
        key = (row.profile, row.request_rate, row.concurrency)
        out.setdefault(key, []).append(f"{row.persona} ({row.slo}): {row.slo_why}")
    return out


def require_every_persona(per_level: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """``--every-persona-within-slo``: a candidate beats the baseline at a level only if every one of
    its personas was also within its SLO there; the verdict's ``why`` names those that were not."""
    missed = missed_levels(summary)
    out = per_level.copy()
    for i, row in out.iterrows():
        misses = missed.get((row[VERDICT.profile], row[VERDICT.request_rate], row[VERDICT.concurrency]))
        if misses:
            out.at[i, VERDICT.beats] = False
            out.at[i, VERDICT.why] = f"{row[VERDICT.why]}; not every persona within its SLO: {'; '.join(misses)}"
    return out


def slo_lines(summary: pd.DataFrame) -> list[str]:
    """One line per label, level and persona with an SLO: within it, or what missed."""
    lines = []
    for row in summary[summary[WITHIN_SLO].notna()].itertuples():
        state = "within SLO" if row.within_slo else f"NOT within SLO: {row.slo_why}"
        lines.append(f"persona {row.persona} {row.profile} {level_name(row.request_rate, row.concurrency)} "
                     f"({row.slo}, {row.slo_source}): {state}; {row.slo_met_share:.1%} of requests meet it")
    return lines


def persona_sections(result: PersonaResult, baseline: str) -> list[tuple[str, str, pd.DataFrame, list[str]]]:
    """Per persona: (name, its SLO in words, its rows of the summary, its verdict lines) for the report."""
    shown = [SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, SUMMARY.requests, SUMMARY.failures,
             pct_col(TTFT, 50), pct_col(TTFT, 95), pct_col(ITL, 50), pct_col(ITL, 95), SUMMARY.output_tokens_per_s,
             SUMMARY.requests_per_s, SUMMARY.slo_met_share, SUMMARY.goodput_requests_per_s, WITHIN_SLO]
    out = []
    for name, rows in result.summary.groupby(PERSONA, sort=True):
        slo, source = result.slos.get(name, (None, ""))
        said = (f"SLO {slo} ({'its own' if source == 'persona' else 'the run-wide --slo'}); within SLO means every "
                f"threshold holds at p95 and at most {MAX_FAILED_SHARE:.0%} of requests failed") if slo else \
            "no SLO (neither its own slo nor --slo): summarised, not judged"
        lines = [f"{r.profile} {level_name(r.request_rate, r.concurrency)}: "
                 + ("within its SLO" if r.within_slo else f"NOT within its SLO: {r.slo_why}")
                 for r in rows[rows[WITHIN_SLO].notna()].itertuples()]
        lines += [f"{profile}: {v} {baseline} for this persona" for (profile, who), v in sorted(result.overall.items())
                  if who == name]
        out.append((str(name), said, rows[[c for c in shown if c in rows]], lines))
    return out
