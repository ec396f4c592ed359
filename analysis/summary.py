"""One row per profile and concurrency (repeats aggregated): the columns of ``summary.csv``.

Percentiles come from the raw samples, never from Locust's rounded buckets. Throughput is output
tokens (``usage.completion_tokens``) and requests completed in the measured window, per second.
Where they apply (and only there: a run of plain streams keeps ``SUMMARY``'s columns), ITL per stream
part (``PART_SUMMARISED``: reasoning, answer) and, for the embeddings endpoint, inputs embedded per
second of the measured window (``inputs_per_s``) follow the fixed columns.
Each run also carries the client's audit of itself: a run whose event loop ran so late that the
errors it implies pass their limits (``core.trust``) measured its own lateness, not the server's,
and is marked untrusted.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from vllm_locust.core.schema import (CLIENT, CPU_PCT, E2E_FROM_INTENDED, IDS, ITL, LEVEL, LOOP_LAG_MS, OPTIONAL_SUMMARY,
                                     PART_SUMMARISED, PER_RUN, REQUEST, RUN, SAMPLE, SPAWN_TO_SEND_MS, SUMMARISED, SUMMARY,
                                     TTFT, TTFT_FROM_INTENDED, mean_col, pct_col)

from vllm_locust.core.trust import implied_errors

from . import runfigures
from . import server as server_stats
from .goodput import Slo, from_intended, goodput
from .stats import percentiles
from .tidy import (at_level, failed, failure_kinds, interrupted, output_tokens, succeeded, successful_samples, tidy_client,
                   tidy_completions, tidy_requests, tidy_samples, tidy_server)

# The trust rule is core.trust's (the errors a run's loop lag implies, fitted on real errors); a
# positive --max-client-lag-ms adds a ceiling on the lag's p99 of the user's own. 0: the rule alone.
DEFAULT_MAX_CLIENT_LAG_MS = 0.0
# Open loop: a run whose send lateness p99 exceeds this did not deliver the asked load. 10 ms: on
# this 2-core VM an idle client sends 0.9 ms (timer wake-up) + 1.5 ms (the SDK builds the request)
# after the instant; a backlog (every user busy) shows as seconds.
DEFAULT_MAX_SEND_LATENESS_MS = 10.0
# The endpoint whose rows' content_chunks are the inputs each request embedded (``plugin.user`` reply_record).
EMBEDDINGS = "embeddings"
runfigures.load_modules()  # speculative decoding, GPU energy: columns only where a run has them
SERVER_MEANS = (PER_RUN.mean_kv_cache_usage, PER_RUN.prefix_cache_hit_rate, PER_RUN.server_queue_ms,
                PER_RUN.server_prefill_ms, PER_RUN.server_decode_ms, PER_RUN.server_ttft_mean_ms,
                PER_RUN.server_itl_mean_ms, PER_RUN.server_p95_ttft_ms, PER_RUN.server_p95_itl_ms)


def run_throughput(requests: pd.DataFrame, duration_s: float, completed: pd.DataFrame | None = None,
                   window_s: float = 0.0) -> tuple[float, float]:
    """(output tokens/s, requests/s) of one run: what completed inside its measured window
    (``tidy.window_completions``) per second of it; without a window (an imported file), its
    successful requests over ``duration_s``."""
    if completed is not None and window_s > 0:
        return float(completed["tokens"].sum()) / window_s, len(completed) / window_s
    ok = succeeded(requests)
    if duration_s <= 0 or ok.empty:
        return float("nan"), float("nan")
    tokens = output_tokens(ok).sum()
    return float(tokens) / duration_s, len(ok) / duration_s


def run_inputs_per_s(requests: pd.DataFrame, seconds: float) -> float | None:
    """Inputs embedded per second of one run's measured window: the content_chunks (inputs) of its
    successful embeddings requests over ``seconds``; None for a run that sent no embeddings."""
    if REQUEST.endpoint not in requests or not (requests[REQUEST.endpoint] == EMBEDDINGS).any():
        return None
    ok = succeeded(requests)
    inputs = ok.loc[ok[REQUEST.endpoint] == EMBEDDINGS, REQUEST.content_chunks].sum() if len(ok) else 0
    return float(inputs) / seconds if seconds > 0 else float("nan")


def measured_window(samples: pd.DataFrame, requests: pd.DataFrame) -> tuple[float, float]:
    start = float(requests[REQUEST.sent_at_s].min()) if len(requests) else float(samples[SAMPLE.t_s].min())
    return start, float(samples[SAMPLE.t_s].max())


def client_audit(client: pd.DataFrame, max_lag_ms: float = DEFAULT_MAX_CLIENT_LAG_MS) -> dict:
    """One run's audit: loop-lag p99 and the errors it implies (over every process's ticks), peak
    CPU, slowest user start; untrusted where an implied error passes its limit (``core.trust``) or,
    with a positive ``max_lag_ms``, the lag's p99 passes that."""
    def values(metric):
        return client.loc[client[CLIENT.metric] == metric, CLIENT.value].to_numpy(dtype=float)

    lag, cpu, spawn = values(LOOP_LAG_MS), values(CPU_PCT), values(SPAWN_TO_SEND_MS)
    p99 = float(np.percentile(lag, 99)) if len(lag) else float("nan")
    implied = implied_errors(list(lag))
    trusted = None if implied is None else bool(implied.trusted and not (max_lag_ms and max_lag_ms > 0 and p99 > max_lag_ms))
    return {PER_RUN.client_loop_lag_p99_ms: p99,
            PER_RUN.client_implied_itl_p95_error_ms: implied.itl_p95_ms if implied else float("nan"),
            PER_RUN.client_implied_ttft_p95_error_ms: implied.ttft_p95_ms if implied else float("nan"),
            PER_RUN.client_cpu_max_pct: float(cpu.max()) if len(cpu) else float("nan"),
            PER_RUN.client_spawn_to_send_max_ms: float(spawn.max()) if len(spawn) else float("nan"),
            # no audit rows (a run recorded before the audit existed): unknown, not untrusted
            PER_RUN.client_trusted: trusted}


def per_run(samples: pd.DataFrame, requests: pd.DataFrame, server: pd.DataFrame, durations: dict,
            client: pd.DataFrame | None = None, max_client_lag_ms: float = DEFAULT_MAX_CLIENT_LAG_MS,
            slo: Slo | None = None, completions: tuple[pd.DataFrame, dict] | None = None,
            windows: dict | None = None) -> pd.DataFrame:
    """One row per run: throughput, server figures and the client audit (inputs to the repeats' aggregate).
    ``completions``: ``tidy.tidy_completions(runs)``, the throughput's source where a run has a window;
    ``windows``: each run's measured windows (``Run.windows``), over which its energy is counted."""
    client = client if client is not None else pd.DataFrame(columns=[IDS.run_key, *CLIENT])
    done, window_s = completions if completions is not None else (None, {})
    rows = []
    for run_key, s in samples.groupby(IDS.run_key):
        r = requests[requests[IDS.run_key] == run_key]
        start, end = measured_window(s, r)
        windowed = window_s.get(run_key, 0.0) > 0
        tok_s, req_s = run_throughput(r, durations.get(run_key, end - start),
                                      done[done[IDS.run_key] == run_key] if windowed else None, window_s.get(run_key, 0.0))
        mine = server[server[IDS.run_key] == run_key]
        srv = server_stats.run_server_stats(server_stats.window(mine, start, end))
        seconds = window_s[run_key] if windowed else durations.get(run_key, end - start)
        spans = tuple((windows or {}).get(run_key) or ()) if windowed else ()
        extra = runfigures.figures_of(runfigures.RunWindow(
            server_stats.window(mine, min([start, *(a for a, _ in spans)]), max([end, *(b for _, b in spans)])),
            start, end, seconds, tok_s * seconds if tok_s == tok_s else 0.0, req_s * seconds if req_s == req_s else 0.0,
            spans, mine))
        audit = client_audit(client[client[IDS.run_key] == run_key], max_client_lag_ms)
        good = goodput(r, s, slo, durations.get(run_key, end - start), (req_s, tok_s) if windowed else None)
        inputs_s = run_inputs_per_s(r, window_s[run_key] if windowed else durations.get(run_key, end - start))
        rows.append({PER_RUN.run_key: run_key, PER_RUN.profile: s[IDS.profile].iloc[0],
                     PER_RUN.request_rate: float(s[IDS.request_rate].iloc[0]),
                     PER_RUN.concurrency: int(s[IDS.concurrency].iloc[0]), PER_RUN.repeat: int(s[IDS.repeat].iloc[0]),
                     PER_RUN.output_tokens_per_s: tok_s, PER_RUN.requests_per_s: req_s,
                     PER_RUN.goodput_requests_per_s: good[PER_RUN.goodput_requests_per_s],
                     PER_RUN.goodput_tokens_per_s: good[PER_RUN.goodput_tokens_per_s],
                     PER_RUN.window_start_s: start, PER_RUN.window_end_s: end, **srv, **audit,
                     **({} if inputs_s is None else {OPTIONAL_SUMMARY.inputs_per_s: inputs_s}), **extra})
    embeds = [OPTIONAL_SUMMARY.inputs_per_s] if any(OPTIONAL_SUMMARY.inputs_per_s in row for row in rows) else []
    return pd.DataFrame(rows, columns=[*(c for c in PER_RUN if c != PER_RUN.step), *embeds,
                                       *runfigures.present(rows)])


def runs_per_run(runs: list, slo: Slo | None = None, max_client_lag_ms: float = DEFAULT_MAX_CLIENT_LAG_MS
                 ) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Loaded runs -> (measured samples of succeeded requests, measured requests, ``per_run``): the
    first steps of every consumer (the analysis, the tuner, the boundary search)."""
    requests = tidy_requests(runs)
    samples = successful_samples(tidy_samples(runs), requests)
    durations = {r.run_key: float(r.record.get(RUN.duration_s) or 0) for r in runs}
    frame = per_run(samples, requests, tidy_server(runs), durations, tidy_client(runs), max_client_lag_ms, slo,
                    tidy_completions(runs), {r.run_key: list(r.windows) for r in runs if r.windows})
    return samples, requests, frame


def itl_per_token(itl: pd.DataFrame) -> np.ndarray:
    """Each gap spread over the tokens its chunk carried: a chunk of k tokens counts k times as gap/k."""
    known = itl[itl[SAMPLE.tokens].notna() & (itl[SAMPLE.tokens] > 0)]
    if known.empty:
        return np.array([])
    k = known[SAMPLE.tokens].to_numpy(dtype=int)
    return np.repeat(known[SAMPLE.value_ms].to_numpy() / k, k)


def _mean(per: pd.DataFrame, key: str) -> float:
    return float(np.nanmean(per[key])) if per[key].notna().any() else float("nan")


def open_loop_figures(requests: pd.DataFrame, max_send_lateness_ms: float) -> dict:
    """Latency from the intended instant, send lateness, client queue time, and whether the run
    delivered the asked load. All NaN (``load_delivered`` None) for a closed-loop level."""
    sent = requests[requests[REQUEST.lateness_ms].notna()] if REQUEST.lateness_ms in requests else requests.iloc[0:0]
    out = {c: float("nan") for c in (pct_col(TTFT_FROM_INTENDED, 50), pct_col(TTFT_FROM_INTENDED, 95),
                                     pct_col(E2E_FROM_INTENDED, 50), pct_col(E2E_FROM_INTENDED, 95),
                                     SUMMARY.p50_send_lateness_ms, SUMMARY.p95_send_lateness_ms, SUMMARY.p99_send_lateness_ms,
                                     SUMMARY.max_send_lateness_ms, SUMMARY.mean_client_queue_ms, SUMMARY.p95_client_queue_ms,
                                     SUMMARY.queued_requests)}
    out[SUMMARY.load_delivered] = None
    if sent.empty:
        return out
    ok = succeeded(sent)
    for name, column in ((TTFT_FROM_INTENDED, REQUEST.ttft_ms), (E2E_FROM_INTENDED, REQUEST.e2e_ms)):
        for q, v in percentiles(from_intended(ok, column).dropna().to_numpy(), (50, 95)).items():
            out[pct_col(name, q)] = v
    late = sent[REQUEST.lateness_ms].to_numpy(dtype=float)
    q = percentiles(late, (50, 95, 99))
    out[SUMMARY.p50_send_lateness_ms], out[SUMMARY.p95_send_lateness_ms], out[SUMMARY.p99_send_lateness_ms] = q[50], q[95], q[99]
    out[SUMMARY.max_send_lateness_ms] = float(late.max())
    queue = sent[REQUEST.queue_ms].fillna(0.0).to_numpy(dtype=float)
    out[SUMMARY.mean_client_queue_ms] = float(queue.mean())
    out[SUMMARY.p95_client_queue_ms] = percentiles(queue, (95,))[95]
    out[SUMMARY.queued_requests] = int((queue > 0).sum())
    out[SUMMARY.load_delivered] = bool(q[99] <= max_send_lateness_ms)
    return out


def summarize(samples: pd.DataFrame, requests: pd.DataFrame, runs: pd.DataFrame, slo: Slo | None = None,
              max_send_lateness_ms: float = DEFAULT_MAX_SEND_LATENESS_MS) -> pd.DataFrame:
    rows = []
    for (profile, rate, concurrency), s in samples.groupby([IDS.profile, *LEVEL]):
        r = at_level(requests, profile, rate, concurrency)
        per = at_level(runs, profile, rate, concurrency)
        row = {SUMMARY.profile: profile, SUMMARY.request_rate: float(rate), SUMMARY.concurrency: int(concurrency),
               SUMMARY.repeats: int(per[PER_RUN.repeat].nunique()),
               SUMMARY.requests: int(len(r) - len(interrupted(r))), SUMMARY.failures: int(len(failed(r))),
               SUMMARY.failure_kinds: failure_kinds(r),
               SUMMARY.interrupted: int(len(interrupted(r)))}
        for summarised in SUMMARISED:
            metric = summarised.metric
            values = s.loc[s[SAMPLE.metric] == metric, SAMPLE.value_ms].to_numpy()
            for q, v in percentiles(values, summarised.percentiles).items():
                row[pct_col(metric, q)] = v
            if summarised.mean:
                row[mean_col(metric)] = float(values.mean()) if len(values) else float("nan")
        per_token = itl_per_token(s[s[SAMPLE.metric] == ITL])
        per_token_q = percentiles(per_token, (50, 95))
        row[SUMMARY.p50_itl_per_token_ms], row[SUMMARY.p95_itl_per_token_ms] = per_token_q[50], per_token_q[95]
        ok = succeeded(r)
        counted = ok[ok[REQUEST.completion_tokens].notna()] if len(ok) else ok  # chunks per token: where usage counted both
        tokens = counted[REQUEST.completion_tokens].sum() if len(counted) else 0
        row[SUMMARY.chunks_per_token] = float(counted[REQUEST.content_chunks].sum() / tokens) if tokens else float("nan")
        row[SUMMARY.mean_prompt_tokens] = float(ok[REQUEST.prompt_tokens].mean()) if len(ok) else float("nan")
        # as the throughput counts them: usage's completion tokens, else the content chunks
        row[SUMMARY.mean_output_tokens] = float(output_tokens(ok).mean()) if len(ok) else float("nan")
        row[SUMMARY.output_tokens_per_s] = float(per[PER_RUN.output_tokens_per_s].mean())
        row[SUMMARY.requests_per_s] = float(per[PER_RUN.requests_per_s].mean())
        row[SUMMARY.max_num_requests_running] = float(per[PER_RUN.max_num_requests_running].max())
        row[SUMMARY.max_num_requests_waiting] = float(per[PER_RUN.max_num_requests_waiting].max())
        row[SUMMARY.preemptions] = float(per[PER_RUN.preemptions].sum())
        for key in SERVER_MEANS:
            row[key] = _mean(per, key)
        row[SUMMARY.client_minus_server_ttft_ms] = row[mean_col(TTFT)] - row[SUMMARY.server_ttft_mean_ms]
        row[SUMMARY.client_minus_server_itl_ms] = row[mean_col(ITL)] - row[SUMMARY.server_itl_mean_ms]
        row[SUMMARY.client_loop_lag_p99_ms] = float(per[PER_RUN.client_loop_lag_p99_ms].max())
        row[SUMMARY.client_implied_itl_p95_error_ms] = float(per[PER_RUN.client_implied_itl_p95_error_ms].max())
        row[SUMMARY.client_implied_ttft_p95_error_ms] = float(per[PER_RUN.client_implied_ttft_p95_error_ms].max())
        row[SUMMARY.client_cpu_max_pct] = float(per[PER_RUN.client_cpu_max_pct].max())
        row[SUMMARY.client_spawn_to_send_max_ms] = float(per[PER_RUN.client_spawn_to_send_max_ms].max())
        trusted = per[PER_RUN.client_trusted].dropna()
        row[SUMMARY.client_trusted] = bool(trusted.all()) if len(trusted) else None
        row.update(open_loop_figures(r, max_send_lateness_ms))
        good = goodput(r, s, slo, 1.0)  # the share over all repeats; the rates are the runs' mean
        row[SUMMARY.slo], row[SUMMARY.slo_met_share] = good[SUMMARY.slo], good[SUMMARY.slo_met_share]
        row[SUMMARY.goodput_requests_per_s] = _mean(per, PER_RUN.goodput_requests_per_s)
        row[SUMMARY.goodput_tokens_per_s] = _mean(per, PER_RUN.goodput_tokens_per_s)
        if OPTIONAL_SUMMARY.inputs_per_s in per:
            row[OPTIONAL_SUMMARY.inputs_per_s] = _mean(per, OPTIONAL_SUMMARY.inputs_per_s)
        extras = [c for c in runfigures.present([dict.fromkeys(runs.columns)]) if c in per]
        row.update({c: runfigures.combine(per, c) for c in extras})
        rows.append(row)
    embeds = [OPTIONAL_SUMMARY.inputs_per_s] if any(OPTIONAL_SUMMARY.inputs_per_s in row for row in rows) else []
    table = pd.DataFrame(rows, columns=[*SUMMARY, *embeds, *runfigures.present(rows)]).sort_values([SUMMARY.profile, *LEVEL]).reset_index(drop=True)
    return with_part_itl(table, samples)


def with_part_itl(table: pd.DataFrame, samples: pd.DataFrame, by: tuple[str, ...] = ()) -> pd.DataFrame:
    """``table`` (one row per profile and level, and per ``by`` columns of ``samples``) with the
    percentiles and mean of each ``PART_SUMMARISED`` metric some of ``samples`` carry (ITL per stream
    part), from the raw samples as the other latencies; a run without them keeps its columns."""
    metrics = set(samples[SAMPLE.metric].unique()) if len(samples) and len(table) else set()
    wanted = [summarised for summarised in PART_SUMMARISED if summarised.metric in metrics]
    if not wanted:
        return table
    keys = [IDS.profile, *LEVEL, *by]
    parts = samples[samples[SAMPLE.metric].isin([summarised.metric for summarised in wanted])]
    groups = {k if isinstance(k, tuple) else (k,): g for k, g in parts.groupby(keys)}
    head = [SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, *by]
    out = table.copy()
    mine = [groups.get(tuple(k), parts.iloc[0:0]) for k in out[head].itertuples(index=False)]
    for summarised in wanted:
        values = [g.loc[g[SAMPLE.metric] == summarised.metric, SAMPLE.value_ms].to_numpy(dtype=float) for g in mine]
        for q in summarised.percentiles:
            out[pct_col(summarised.metric, q)] = [percentiles(v, (q,))[q] for v in values]
        if summarised.mean:
            out[mean_col(summarised.metric)] = [float(v.mean()) if len(v) else float("nan") for v in values]
    return out
