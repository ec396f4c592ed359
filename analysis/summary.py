"""One row per profile and concurrency (repeats aggregated): the columns of ``summary.csv``.

Percentiles come from the raw samples, never from Locust's rounded buckets. Throughput is output
tokens (``usage.completion_tokens``) and requests completed in the measured window, per second.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from . import server as server_stats
from .stats import percentiles
from .tidy import succeeded

COLUMNS = [
    "profile", "concurrency", "repeats", "requests", "failures",
    "p50_ttft_ms", "p95_ttft_ms", "p99_ttft_ms", "mean_ttft_ms",
    "p50_itl_ms", "p95_itl_ms", "p99_itl_ms", "mean_itl_ms",
    "p50_tpot_ms", "p95_tpot_ms", "p50_e2e_ms", "p95_e2e_ms",
    "output_tokens_per_s", "requests_per_s",
    "max_num_requests_running", "max_num_requests_waiting", "mean_kv_cache_usage", "preemptions",
    "prefix_cache_hit_rate", "server_queue_ms", "server_prefill_ms", "server_decode_ms",
    "server_ttft_mean_ms", "server_p95_ttft_ms", "server_p95_itl_ms",
]


def run_throughput(requests: pd.DataFrame, duration_s: float) -> tuple[float, float]:
    """(output tokens/s, requests/s) of one run over its measured duration."""
    ok = succeeded(requests)
    if duration_s <= 0 or ok.empty:
        return float("nan"), float("nan")
    tokens = ok["completion_tokens"].fillna(ok["content_chunks"]).sum()
    return float(tokens) / duration_s, len(ok) / duration_s


def measured_window(samples: pd.DataFrame, requests: pd.DataFrame) -> tuple[float, float]:
    start = float(requests["sent_at_s"].min()) if len(requests) else float(samples["t_s"].min())
    return start, float(samples["t_s"].max())


def per_run(samples: pd.DataFrame, requests: pd.DataFrame, server: pd.DataFrame, durations: dict) -> pd.DataFrame:
    """One row per run: throughput and server figures (the inputs that aggregate across repeats)."""
    rows = []
    for run_key, s in samples.groupby("run_key"):
        r = requests[requests["run_key"] == run_key]
        start, end = measured_window(s, r)
        tok_s, req_s = run_throughput(r, durations.get(run_key, end - start))
        srv = server_stats.run_server_stats(server_stats.window(server[server["run_key"] == run_key], start, end))
        rows.append({"run_key": run_key, "profile": s["profile"].iloc[0], "concurrency": int(s["concurrency"].iloc[0]),
                     "repeat": int(s["repeat"].iloc[0]), "output_tokens_per_s": tok_s, "requests_per_s": req_s,
                     "window_start_s": start, "window_end_s": end, **srv})
    return pd.DataFrame(rows)


def summarize(samples: pd.DataFrame, requests: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (profile, concurrency), s in samples.groupby(["profile", "concurrency"]):
        r = requests[(requests["profile"] == profile) & (requests["concurrency"] == concurrency)]
        per = runs[(runs["profile"] == profile) & (runs["concurrency"] == concurrency)]
        row = {"profile": profile, "concurrency": int(concurrency), "repeats": int(per["repeat"].nunique()),
               "requests": int(len(r)), "failures": len(r) - len(succeeded(r))}
        for metric, qs in (("ttft", (50, 95, 99)), ("itl", (50, 95, 99)), ("tpot", (50, 95)), ("e2e", (50, 95))):
            values = s.loc[s["metric"] == metric.upper(), "value_ms"].to_numpy()
            for q, v in percentiles(values, qs).items():
                row[f"p{q}_{metric}_ms"] = v
            if metric in ("ttft", "itl"):
                row[f"mean_{metric}_ms"] = float(values.mean()) if len(values) else float("nan")
        row["output_tokens_per_s"] = float(per["output_tokens_per_s"].mean())
        row["requests_per_s"] = float(per["requests_per_s"].mean())
        row["max_num_requests_running"] = float(per["max_num_requests_running"].max())
        row["max_num_requests_waiting"] = float(per["max_num_requests_waiting"].max())
        row["preemptions"] = float(per["preemptions"].sum())
        for key in ("mean_kv_cache_usage", "prefix_cache_hit_rate", "server_queue_ms", "server_prefill_ms",
                    "server_decode_ms", "server_ttft_mean_ms", "server_p95_ttft_ms", "server_p95_itl_ms"):
            row[key] = float(np.nanmean(per[key])) if per[key].notna().any() else float("nan")
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS).sort_values(["profile", "concurrency"]).reset_index(drop=True)
