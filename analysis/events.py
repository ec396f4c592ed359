"""Stream events past the first token (reasoning, answer, tool calls): p50 and p95 of each event's
time from the send, and mean reasoning and answer tokens, appended to a summary table (the whole
run's or the per-persona one) only where some succeeded request of the run recorded them, so a
run of plain streams keeps exactly today's columns. The numbers come from the request rows'
columns (``ttfr_ms`` ... ``tool_args_ms``), one value per request.
"""

from __future__ import annotations

import pandas as pd

from vllm_locust.core.schema import IDS, REQUEST, STREAM_EVENT_METRICS, SUMMARY, pct_col

from .stats import percentiles
from .tidy import succeeded

# The request-row column of each event metric (schema: TTFR -> ttfr_ms, TOOL_CALL -> tool_call_ms ...).
EVENT_COLUMNS = {metric: f"{metric.lower()}_ms" for metric in STREAM_EVENT_METRICS}
TOKEN_COLUMNS = (REQUEST.reasoning_tokens, REQUEST.answer_tokens)
QS = (50, 95)


def present(requests: pd.DataFrame) -> list[str]:
    """The event and token columns some succeeded request has a value in."""
    ok = succeeded(requests)
    wanted = [*EVENT_COLUMNS.values(), *TOKEN_COLUMNS]
    return [c for c in wanted if c in ok and pd.to_numeric(ok[c], errors="coerce").notna().any()]


def with_stream_events(table: pd.DataFrame, requests: pd.DataFrame, by: tuple[str, ...] = ()) -> pd.DataFrame:
    """``table`` (one row per profile and level, and per ``by`` columns) with ``p50_ttfr_ms`` ...
    ``p95_tool_args_ms``, ``mean_reasoning_tokens``, ``mean_answer_tokens`` where recorded."""
    columns = present(requests) if len(table) else []
    if not columns:
        return table
    ok = succeeded(requests)
    keys = [IDS.profile, IDS.request_rate, IDS.concurrency, *by]
    out = table.copy()
    groups = {k if isinstance(k, tuple) else (k,): g for k, g in ok.groupby(keys)}
    head = [SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, *by]
    for column in columns:
        metric = next((m for m, c in EVENT_COLUMNS.items() if c == column), None)
        values = [pd.to_numeric(groups.get(tuple(k), ok.iloc[0:0]).get(column, pd.Series(dtype=float)),
                                errors="coerce").dropna().to_numpy(dtype=float) for k in out[head].itertuples(index=False)]
        if metric is None:
            out[f"mean_{column}"] = [float(v.mean()) if len(v) else float("nan") for v in values]
            continue
        for q in QS:
            out[pct_col(metric, q)] = [percentiles(v, (q,))[q] for v in values]
    return out
