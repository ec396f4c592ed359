"""Where each request's time went: vLLM's own span of it (``--server-spans``) joined to its row.

The receiver keeps vLLM's request spans in ``server-spans-*.csv`` (``schema.ServerSpanRow``); here
each is joined to its request row by trace id (the client's ``traceparent``), falling back to vLLM's
request id (``chatcmpl-<X-Request-Id>``, the trace id again). A joined row gets ``schema.JOINED``'s
columns; a row without a span keeps them empty and is counted, never guessed.

From the joined rows, per load level (and persona, and turn): each component's percentiles, and the
tail attribution: among the requests above the level's p95 TTFT, the share of their TTFT spent in
vLLM's queue, in prefill, in admission (arrival to queue) and outside the engine. Between profiles,
each component's mean over the tail, candidate minus baseline, with a bootstrap interval: what a
p95 TTFT gain is made of.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from vllm_locust.core.schema import (IDS, JOINED, REQUEST, SERVER_SPANS_PREFIX, SPAN, TTFT, Columns, ServerSpanRow,
                                     level_name)
from vllm_locust.core.tracecontext import base_request_id

from .stats import percentiles
from .tidy import succeeded
from .validate import annotations, check_csv, empty_csv, numeric_columns

SPAN_NUMERIC = numeric_columns(ServerSpanRow)
COMPONENTS = {"queue": JOINED.server_queue_ms, "prefill": JOINED.server_prefill_ms,
              "admission": JOINED.server_admission_ms, "outside": JOINED.outside_engine_ttft_ms}
SHOWN = {"queue": JOINED.server_queue_ms, "prefill": JOINED.server_prefill_ms, "decode": JOINED.server_decode_ms,
         "server_ttft": JOINED.server_ttft_ms, "outside": JOINED.outside_engine_ttft_ms}
TAIL_Q = 95
SPANS = Columns(
    "profile", "request_rate", "concurrency", "group", "answered", "joined", "joined_share",
    *(f"p{q}_{name}_ms" for name in SHOWN for q in (50, 95, 99)),
    "tail_requests", "tail_p95_ttft_ms", "tail_mean_ttft_ms",
    *(f"tail_{name}_share" for name in COMPONENTS), *(f"all_{name}_share" for name in COMPONENTS))
SPAN_COMPARISON = Columns("profile", "baseline", "request_rate", "concurrency", "component", "baseline_tail_mean_ms",
                          "candidate_tail_mean_ms", "delta_ms", "ci_low_ms", "ci_high_ms")
SERVER_SPANS_CSV = "server_spans.csv"
SPAN_COMPARISON_CSV = "comparison_server_spans.csv"
REQUEST_SPANS_CSV = "request_spans.csv"


def read_spans(directory: Path) -> pd.DataFrame:
    """Every ``server-spans-*.csv`` of a directory, checked; one row per span (a span sent twice: once)."""
    frames = []
    for path in sorted(Path(directory).glob(f"{SERVER_SPANS_PREFIX}*.csv")):
        if path.stat().st_size == 0:
            raise empty_csv(path)
        frame = pd.read_csv(path, dtype={SPAN.trace_id: str, SPAN.span_id: str, SPAN.request_id: str,
                                         SPAN.parent_span_id: str, SPAN.run_id: str})
        if not frame.empty:
            frames.append(check_csv(frame, path, tuple(annotations(ServerSpanRow)), SPAN_NUMERIC))
    if not frames:
        return pd.DataFrame(columns=list(SPAN))
    spans = pd.concat(frames, ignore_index=True)
    return spans.drop_duplicates(subset=[SPAN.trace_id, SPAN.span_id]).reset_index(drop=True)


def join(requests: pd.DataFrame, spans: pd.DataFrame) -> pd.DataFrame:
    """``requests`` with ``JOINED``'s columns from each row's span: by trace id, else by vLLM's
    request id; rows without a trace id or a span keep them empty (``server_span`` False)."""
    out = requests.copy()
    for column in JOINED:
        out[column] = False if column == JOINED.server_span else np.nan
    if out.empty or spans.empty or REQUEST.trace_id not in out:
        return out
    spans = spans.assign(**{SPAN.trace_id: spans[SPAN.trace_id].fillna("").astype(str).str.lower()})
    spans = spans[spans[SPAN.ttft_ms].notna()]
    by_trace = spans.drop_duplicates(SPAN.trace_id).set_index(SPAN.trace_id)
    by_id = spans.assign(base=spans[SPAN.request_id].fillna("").astype(str).map(base_request_id).str.lower())
    by_id = by_id[by_id["base"] != ""].drop_duplicates("base").set_index("base")
    # vLLM's request id names the row's trace id too (X-Request-Id): a span whose trace context was
    # lost (or replaced by the user's own traceparent) joins by it.
    columns = [SPAN.queue_ms, SPAN.prefill_ms, SPAN.decode_ms, SPAN.ttft_ms, SPAN.e2e_ms]
    lookup = pd.concat([by_trace[columns], by_id.loc[~by_id.index.isin(by_trace.index), columns]])
    trace = out[REQUEST.trace_id].fillna("").astype(str).str.lower()
    # A trace id on several rows (a paired run's two copies of one request went to two servers
    # with one trace context) cannot say which span is whose: those rows stay unjoined.
    shared = trace.duplicated(keep=False)
    source = lookup.reindex(trace.where((trace != "") & ~shared, "-"))
    source.index = out.index
    joined = source[SPAN.ttft_ms].notna()
    out[JOINED.server_span] = joined.to_numpy()
    out[JOINED.server_queue_ms] = source[SPAN.queue_ms].astype(float)
    out[JOINED.server_prefill_ms] = source[SPAN.prefill_ms].astype(float)
    out[JOINED.server_decode_ms] = source[SPAN.decode_ms].astype(float)
    out[JOINED.server_ttft_ms] = source[SPAN.ttft_ms].astype(float)
    out[JOINED.server_e2e_ms] = source[SPAN.e2e_ms].astype(float)
    out[JOINED.server_admission_ms] = (source[SPAN.ttft_ms] - source[SPAN.queue_ms] - source[SPAN.prefill_ms]).astype(float)
    out[JOINED.outside_engine_ttft_ms] = (pd.to_numeric(out[REQUEST.ttft_ms], errors="coerce")
                                          - source[SPAN.ttft_ms].astype(float))
    return out


def has_spans(requests: pd.DataFrame) -> bool:
    return JOINED.server_span in requests and bool(requests[JOINED.server_span].fillna(False).astype(bool).any())


def _answered(requests: pd.DataFrame) -> pd.DataFrame:
    """Succeeded requests with a TTFT: those vLLM answered, which should each have a span."""
    ok = succeeded(requests)
    return ok[pd.to_numeric(ok[REQUEST.ttft_ms], errors="coerce").notna()] if len(ok) else ok


def _shares(rows: pd.DataFrame) -> dict[str, float]:
    total = rows[REQUEST.ttft_ms].astype(float).sum()
    return {name: float(rows[column].astype(float).sum() / total) if total > 0 else float("nan")
            for name, column in COMPONENTS.items()}


def tail_of(rows: pd.DataFrame) -> pd.DataFrame:
    """The joined requests above their own p95 client TTFT (at least one: the slowest)."""
    ttft = rows[REQUEST.ttft_ms].astype(float)
    if rows.empty:
        return rows
    cut = float(np.percentile(ttft, TAIL_Q))
    tail = rows[ttft > cut]
    return tail if len(tail) else rows[ttft == ttft.max()]


def _row(rows: pd.DataFrame) -> dict:
    answered = _answered(rows)
    joined = answered[answered[JOINED.server_span].fillna(False).astype(bool)]
    out = {SPANS.answered: int(len(answered)), SPANS.joined: int(len(joined)),
           SPANS.joined_share: float(len(joined) / len(answered)) if len(answered) else float("nan")}
    for name, column in SHOWN.items():
        for q, v in percentiles(joined[column].dropna().to_numpy(dtype=float), (50, 95, 99)).items():
            out[f"p{q}_{name}_ms"] = v
    tail = tail_of(joined)
    out[SPANS.tail_requests] = int(len(tail))
    ttft = joined[REQUEST.ttft_ms].to_numpy(dtype=float)
    out[SPANS.tail_p95_ttft_ms] = float(np.percentile(ttft, TAIL_Q)) if len(ttft) else float("nan")
    out[SPANS.tail_mean_ttft_ms] = float(tail[REQUEST.ttft_ms].astype(float).mean()) if len(tail) else float("nan")
    for name, share in _shares(tail).items():
        out[f"tail_{name}_share"] = share
    for name, share in _shares(joined).items():
        out[f"all_{name}_share"] = share
    return out


def span_table(requests: pd.DataFrame, by: str | None = None) -> pd.DataFrame:
    """One row per profile and load level (and value of ``by``: persona, turn) with a joined request."""
    if not has_spans(requests):
        return pd.DataFrame(columns=list(SPANS))
    keys = [IDS.profile, IDS.request_rate, IDS.concurrency]
    rows = []
    frame = requests if by is None else requests[requests[by].notna() & (requests[by].astype(str) != "")]
    for key, group in frame.groupby(keys + ([by] if by else []), sort=True):
        rows.append({SPANS.profile: key[0], SPANS.request_rate: key[1], SPANS.concurrency: key[2],
                     SPANS.group: "" if by is None else f"{by}={key[3]}", **_row(group)})
    return pd.DataFrame(rows, columns=list(SPANS))


def _tail_means(rows: pd.DataFrame) -> np.ndarray:
    tail = tail_of(rows)
    return np.array([tail[column].astype(float).mean() for column in COMPONENTS.values()])


def compare_components(requests: pd.DataFrame, baseline: str, n: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Each candidate's tail component means against the baseline's at each level, with a bootstrap
    interval (requests resampled on each side, the tail taken again in each draw)."""
    rows = []
    if not has_spans(requests):
        return pd.DataFrame(columns=list(SPAN_COMPARISON))
    joined = _answered(requests)
    joined = joined[joined[JOINED.server_span].fillna(False).astype(bool)]
    rng = np.random.default_rng(seed)
    for (rate, concurrency), level in joined.groupby([IDS.request_rate, IDS.concurrency], sort=True):
        base = level[level[IDS.profile] == baseline]
        if len(base) < 2:
            continue
        for profile, cand in level.groupby(IDS.profile, sort=True):
            if profile == baseline or len(cand) < 2:
                continue
            b_point, c_point = _tail_means(base), _tail_means(cand)
            draws = np.empty((max(0, n), len(COMPONENTS)))
            for i in range(max(0, n)):
                b = base.iloc[rng.integers(0, len(base), len(base))]
                c = cand.iloc[rng.integers(0, len(cand), len(cand))]
                draws[i] = _tail_means(c) - _tail_means(b)
            for j, name in enumerate(COMPONENTS):
                low, high = (np.nanpercentile(draws[:, j], [2.5, 97.5]) if n > 0 else (np.nan, np.nan))
                rows.append({SPAN_COMPARISON.profile: profile, SPAN_COMPARISON.baseline: baseline,
                             SPAN_COMPARISON.request_rate: rate, SPAN_COMPARISON.concurrency: concurrency,
                             SPAN_COMPARISON.component: name, SPAN_COMPARISON.baseline_tail_mean_ms: float(b_point[j]),
                             SPAN_COMPARISON.candidate_tail_mean_ms: float(c_point[j]),
                             SPAN_COMPARISON.delta_ms: float(c_point[j] - b_point[j]),
                             SPAN_COMPARISON.ci_low_ms: float(low), SPAN_COMPARISON.ci_high_ms: float(high)})
    return pd.DataFrame(rows, columns=list(SPAN_COMPARISON))


def coverage_lines(requests: pd.DataFrame) -> list[str]:
    """What the join could not do, per run: answered requests without a span, said, never guessed."""
    if JOINED.server_span not in requests or not has_spans(requests):
        return []
    lines = []
    answered = _answered(requests)
    for run_key, rows in answered.groupby(IDS.run_key, sort=True):
        missing = int((~rows[JOINED.server_span].fillna(False).astype(bool)).sum())
        if missing:
            lines.append(f"{run_key}: {missing} of {len(rows)} answered requests got no span from vLLM (left out of "
                         "the server columns, not estimated)")
    return lines


def attribution_lines(table: pd.DataFrame, comparison: pd.DataFrame) -> list[str]:
    """One line per level on its tail, and one per candidate on what its tail change is made of."""
    lines = []
    for row in table[table[SPANS.group] == ""].itertuples():
        if not row.tail_requests:
            continue
        parts = ", ".join(f"{name} {getattr(row, f'tail_{name}_share'):.0%}" for name in COMPONENTS)
        lines.append(f"{row.profile} {level_name(row.request_rate, row.concurrency)}: the {row.tail_requests} requests "
                     f"above p95 TTFT ({row.tail_p95_ttft_ms:.1f} ms) spent their TTFT: {parts} "
                     f"({row.joined} of {row.answered} answered requests joined)")
    for (profile, rate, concurrency), rows in comparison.groupby(
            [SPAN_COMPARISON.profile, SPAN_COMPARISON.request_rate, SPAN_COMPARISON.concurrency], sort=True):
        top = rows.loc[rows[SPAN_COMPARISON.delta_ms].abs().idxmax()]
        lines.append(f"{profile} {level_name(rate, concurrency)}: its tail TTFT change is mostly {top.component} time: "
                     f"{top.delta_ms:+.1f} ms [{top.ci_low_ms:+.1f}, {top.ci_high_ms:+.1f}] against {top.baseline} "
                     "(mean over the requests above each side's p95 TTFT)")
    return lines


def request_spans(requests: pd.DataFrame) -> pd.DataFrame:
    """The joined rows, one per answered request: the per-request table behind the section."""
    keep = [IDS.run_key, IDS.profile, IDS.request_rate, IDS.concurrency, REQUEST.request_id, REQUEST.trace_id,
            REQUEST.persona, REQUEST.turn, REQUEST.sent_at_s, REQUEST.ttft_ms, REQUEST.e2e_ms, *JOINED]
    answered = _answered(requests)
    return answered[[c for c in keep if c in answered]].reset_index(drop=True)


def plot_slowest(requests: pd.DataFrame, count: int = 30):
    """Stacked components of the slowest joined requests (by client TTFT), one bar each: a figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    answered = _answered(requests)
    joined = answered[answered[JOINED.server_span].fillna(False).astype(bool)]
    if joined.empty:
        return None
    slowest = joined.sort_values(REQUEST.ttft_ms, ascending=False).head(count)
    fig, ax = plt.subplots(figsize=(10, 4))
    bottom = np.zeros(len(slowest))
    x = np.arange(len(slowest))
    for name, column in COMPONENTS.items():
        values = slowest[column].astype(float).clip(lower=0).fillna(0).to_numpy()
        ax.bar(x, values, bottom=bottom, label=name)
        bottom += values
    labels = [f"{p} {level_name(r, c)}" for p, r, c in zip(slowest[IDS.profile], slowest[IDS.request_rate],
                                                            slowest[IDS.concurrency])]
    ax.set_xticks(x, labels, rotation=90, fontsize=6)
    ax.set_ylabel(f"client {TTFT} (ms)")
    ax.set_title(f"The {len(slowest)} slowest requests by TTFT: where their time went (vLLM's spans)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
