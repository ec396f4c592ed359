"""Conversations: TTFT by turn (``summary_by_turn.csv``). A later turn resends its session's whole
history, so how its TTFT compares with the first turn's is what a person tuning prefix caching or
KV offload looks at; the report states the numbers and the server's prefix-cache hit rate beside
them, never a cause.

One row per label, load level and turn bucket: ``"1"`` ... ``"5"``, ``"6+"`` (turns above 5
together: few sessions get that far, and their percentiles alone would be noise), and ``"2+"``
(every turn after the first: the comparison the report makes). The session columns describe the
level, the same on each of its rows: sessions seen in the measured phase, the turns each played
there (mean, max), and the sessions whose every request succeeded.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from vllm_locust.core.outcome import Outcome
from vllm_locust.core.schema import IDS, ITL, LEVEL, REQUEST, SAMPLE, SUMMARY, TTFT, Columns, level_name, mean_col, pct_col

from .markup import fmt_number
from .stats import percentiles
from .tidy import outcomes

SINGLE_TURNS = 5  # turns 1..5 each a bucket; the rest in "6+"
LATER = "2+"
ABOVE = f"{SINGLE_TURNS + 1}+"
BUCKETS = (*(str(t) for t in range(1, SINGLE_TURNS + 1)), ABOVE, LATER)
TTFT_PCTS, ITL_PCTS = (50, 95, 99), (50, 95)
BY_TURN = Columns(
    "profile", "request_rate", "concurrency", "turn", "requests", "failures", "trimmed_requests",
    *(pct_col(TTFT, q) for q in TTFT_PCTS), mean_col(TTFT), *(pct_col(ITL, q) for q in ITL_PCTS), "mean_prompt_tokens",
    "sessions", "mean_turns_per_session", "max_turns_per_session", "sessions_completed")
SUMMARY_BY_TURN_CSV = "summary_by_turn.csv"
TRIMMED_TEXT = "sent a trimmed history (oldest turns dropped to fit max_model_len)"


def bucket(turn: int) -> str:
    return str(turn) if turn <= SINGLE_TURNS else ABOVE


def conversation_requests(requests: pd.DataFrame) -> pd.DataFrame:
    """The requests that were turns of a conversation (``turn`` set), ``turn`` as int."""
    if requests.empty or REQUEST.turn not in requests:
        return requests.iloc[0:0]
    turn = pd.to_numeric(requests[REQUEST.turn], errors="coerce")
    conv = requests[turn.notna()].copy()
    conv[REQUEST.turn] = turn[turn.notna()].astype(int)
    return conv


def _sessions(conv: pd.DataFrame) -> dict:
    """One level's sessions: count, turns per session (mean, max), all of its requests ok."""
    named = conv[conv[REQUEST.session_id].fillna("").astype(str) != ""] if REQUEST.session_id in conv else conv.iloc[0:0]
    if named.empty:
        return {BY_TURN.sessions: 0, BY_TURN.mean_turns_per_session: float("nan"),
                BY_TURN.max_turns_per_session: 0, BY_TURN.sessions_completed: 0}
    ok = (outcomes(named) == Outcome.OK.value).rename("ok")
    per = named.assign(ok=ok).groupby([IDS.run_key, REQUEST.session_id]).agg(
        turns=(REQUEST.turn, "nunique"), ok=("ok", "all"))
    return {BY_TURN.sessions: int(len(per)), BY_TURN.mean_turns_per_session: float(per["turns"].mean()),
            BY_TURN.max_turns_per_session: int(per["turns"].max()), BY_TURN.sessions_completed: int(per["ok"].sum())}


def _bucket_row(rows: pd.DataFrame, samples: pd.DataFrame) -> dict:
    """Counts and latencies of one bucket's requests; ``samples`` are its succeeded requests' own."""
    kinds = outcomes(rows)
    ok = rows[kinds == Outcome.OK.value]
    trimmed = pd.to_numeric(rows.get(REQUEST.trimmed_turns), errors="coerce") if REQUEST.trimmed_turns in rows else None
    row = {BY_TURN.requests: int((kinds != Outcome.INTERRUPTED.value).sum()),
           BY_TURN.failures: int((~kinds.isin((Outcome.OK.value, Outcome.INTERRUPTED.value))).sum()),
           # of the requests counted: an interrupted one (the run's stop) is not a request here
           BY_TURN.trimmed_requests: int(((trimmed > 0) & (kinds != Outcome.INTERRUPTED.value)).sum())
           if trimmed is not None else 0,
           BY_TURN.mean_prompt_tokens: float(ok[REQUEST.prompt_tokens].mean()) if len(ok) else float("nan")}
    ttft = samples.loc[samples[SAMPLE.metric] == TTFT, SAMPLE.value_ms].to_numpy(dtype=float)
    for q, v in percentiles(ttft, TTFT_PCTS).items():
        row[pct_col(TTFT, q)] = v
    row[mean_col(TTFT)] = float(ttft.mean()) if len(ttft) else float("nan")
    itl = samples.loc[samples[SAMPLE.metric] == ITL, SAMPLE.value_ms].to_numpy(dtype=float)
    for q, v in percentiles(itl, ITL_PCTS).items():
        row[pct_col(ITL, q)] = v
    return row


def by_turn(samples: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """The ``BY_TURN`` table: ``samples`` of succeeded requests (``tidy.successful_samples``) and the
    measured requests, both with the ``IDS`` columns; empty (its columns only) without conversations."""
    conv = conversation_requests(requests)
    if conv.empty:
        return pd.DataFrame(columns=list(BY_TURN))
    keys = [IDS.run_key, REQUEST.request_id]
    turns = conv[[*keys, REQUEST.turn]]
    timed = samples[samples[SAMPLE.metric].isin((TTFT, ITL))].merge(turns, on=keys, how="inner")
    rows = []
    for (profile, rate, concurrency), level in conv.groupby([IDS.profile, *LEVEL]):
        level_samples = timed[(timed[IDS.profile] == profile) & (timed[IDS.request_rate] == rate)
                              & (timed[IDS.concurrency] == concurrency)]
        sessions = _sessions(level)
        names = level[REQUEST.turn].map(bucket)
        sample_names = level_samples[REQUEST.turn].map(bucket)
        for name in BUCKETS:
            if name == LATER:
                mask, sample_mask = level[REQUEST.turn] >= 2, level_samples[REQUEST.turn] >= 2
            else:
                mask, sample_mask = names == name, sample_names == name
            if not mask.any():
                continue
            rows.append({BY_TURN.profile: profile, BY_TURN.request_rate: float(rate), BY_TURN.concurrency: int(concurrency),
                         BY_TURN.turn: name, **_bucket_row(level[mask], level_samples[sample_mask]), **sessions})
    return pd.DataFrame(rows, columns=list(BY_TURN))


def turn_lines(table: pd.DataFrame, summary: pd.DataFrame | None = None) -> list[str]:
    """Per label and level, turn 1 against the later turns, in numbers; the server's prefix-cache
    hit rate of that level beside them where the summary has one."""
    lines = []
    p50, p95 = pct_col(TTFT, 50), pct_col(TTFT, 95)
    for (profile, rate, concurrency), level in table.groupby([BY_TURN.profile, BY_TURN.request_rate, BY_TURN.concurrency]):
        by = level.set_index(BY_TURN.turn)
        if "1" not in by.index or LATER not in by.index:
            continue
        first, later = by.loc["1"], by.loc[LATER]
        line = (f"{profile} {level_name(rate, concurrency)}: later turns ({LATER}, {int(later[BY_TURN.requests])} requests): "
                f"p95 TTFT {fmt_number(later[p95])} ms vs {fmt_number(first[p95])} ms on turn 1 "
                f"({int(first[BY_TURN.requests])} requests); p50 {fmt_number(later[p50])} ms vs {fmt_number(first[p50])} ms")
        hit = _hit_rate(summary, profile, rate, concurrency)
        if not np.isnan(hit):
            line += f"; the server's prefix-cache hit rate over the level: {hit:.1%}"
        lines.append(line)
    return lines


def _hit_rate(summary: pd.DataFrame | None, profile, rate, concurrency) -> float:
    if summary is None or summary.empty or SUMMARY.prefix_cache_hit_rate not in summary:
        return float("nan")
    row = summary[(summary[SUMMARY.profile] == profile) & (summary[SUMMARY.request_rate] == rate)
                  & (summary[SUMMARY.concurrency] == concurrency)]
    return float(row[SUMMARY.prefix_cache_hit_rate].iloc[0]) if len(row) else float("nan")


def trimmed_note(requests: pd.DataFrame) -> str | None:
    """``"N requests sent a trimmed history ..."`` (by label when several), or None when none did."""
    if requests.empty or REQUEST.trimmed_turns not in requests:
        return None
    trimmed = requests[pd.to_numeric(requests[REQUEST.trimmed_turns], errors="coerce") > 0]
    if trimmed.empty:
        return None
    counts = trimmed.groupby(IDS.profile).size()
    by_label = f": {', '.join(f'{p} {n}' for p, n in counts.items())}" if requests[IDS.profile].nunique() > 1 else ""
    return f"{len(trimmed)} requests {TRIMMED_TEXT}{by_label}"
