"""What vLLM's own /metrics say about one run's measured window: queueing, KV cache, preemptions.

All from the tidy ``server`` frame of one run. Series of one name are summed over labels other than
``le`` (several engines or models add up). Counters and histograms are taken as increases over the
window, so a server restart between runs (counters back at zero) changes nothing.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from vllm_locust.core.schema import PER_RUN, SERVER, VLLM

from .stats import counter_increase

GAUGE_MAX = {PER_RUN.max_num_requests_running: "vllm:num_requests_running",
             PER_RUN.max_num_requests_waiting: "vllm:num_requests_waiting"}
HISTOGRAM_MEANS = {
    PER_RUN.server_queue_ms: "vllm:request_queue_time_seconds",
    PER_RUN.server_prefill_ms: "vllm:request_prefill_time_seconds",
    PER_RUN.server_decode_ms: "vllm:request_decode_time_seconds",
    PER_RUN.server_ttft_mean_ms: "vllm:time_to_first_token_seconds",
    PER_RUN.server_itl_mean_ms: "vllm:inter_token_latency_seconds",
}
HISTOGRAM_P95 = {PER_RUN.server_p95_ttft_ms: "vllm:time_to_first_token_seconds",
                 PER_RUN.server_p95_itl_ms: "vllm:inter_token_latency_seconds"}


def series(server: pd.DataFrame, name: str) -> pd.Series:
    """Value over time of one sample name, summed over its label sets."""
    rows = server[server[SERVER.name] == name]
    return rows.groupby(SERVER.t_s)[SERVER.value].sum().sort_index()


def increase(server: pd.DataFrame, name: str) -> float:
    rows = server[server[SERVER.name] == name]
    return float(sum(counter_increase(g.sort_values("t_s")["value"]) for _, g in rows.groupby("labels")))


def histogram_quantile(server: pd.DataFrame, name: str, q: float) -> float:
    """Quantile of a Prometheus histogram's increase over the window (as PromQL's, linear in a bucket)."""
    rows = server[server[SERVER.name] == name + "_bucket"].copy()
    if rows.empty:
        return float("nan")
    rows["le"] = rows["labels"].map(lambda s: float(json.loads(s).get("le", "nan")))
    increases = rows.groupby(["le", "labels"]).apply(lambda g: counter_increase(g.sort_values("t_s")["value"]),
                                                     include_groups=False)
    buckets = increases.groupby(level="le").sum().sort_index()
    total = buckets.iloc[-1]
    if total <= 0:
        return float("nan")
    rank, lower_le, lower_count = q * total, 0.0, 0.0
    for le, count in buckets.items():
        if count >= rank:
            if np.isinf(le):
                return lower_le * 1000.0
            width = count - lower_count
            frac = (rank - lower_count) / width if width > 0 else 0.0
            return (lower_le + (le - lower_le) * frac) * 1000.0
        lower_le, lower_count = le, count
    return float("nan")


# vLLM's prefix-cache counters (tokens queried, tokens found cached), newest names first: vLLM 0.7-0.9
# called them ``gpu_prefix_cache_*``; its V0 engine exported only a hit-rate gauge.
PREFIX_COUNTERS = ((VLLM.prefix_hits, VLLM.prefix_queries),
                   ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"))
PREFIX_GAUGE = "vllm:gpu_prefix_cache_hit_rate"


def prefix_cache_hit_rate(server: pd.DataFrame) -> float:
    """The share of prompt tokens the server found in its prefix cache over the window: the
    counters' increases (hits / queries), else the mean of an older server's hit-rate gauge; NaN
    when the server exports neither or queried nothing."""
    for hits_name, queries_name in PREFIX_COUNTERS:
        queries = increase(server, queries_name)
        if queries > 0:
            return increase(server, hits_name) / queries
    gauge = server.loc[server[SERVER.name] == PREFIX_GAUGE, SERVER.value]  # a share: averaged, never summed
    return float(gauge.mean()) if len(gauge) else float("nan")


def window(server: pd.DataFrame, start_s: float, end_s: float) -> pd.DataFrame:
    """Scrapes from just before the measured window to just after it (scrapes are ~1 s apart)."""
    return server[(server["t_s"] >= start_s - 1.5) & (server["t_s"] <= end_s + 1.5)]


def run_server_stats(server: pd.DataFrame) -> dict:
    """One run's server-side figures; NaN where the server does not export a series."""
    out: dict[str, float] = {}
    for key, name in GAUGE_MAX.items():
        s = series(server, name)
        out[key] = float(s.max()) if len(s) else float("nan")
    kv = series(server, "vllm:kv_cache_usage_perc")
    out[PER_RUN.mean_kv_cache_usage] = float(kv.mean()) if len(kv) else float("nan")
    out[PER_RUN.preemptions] = increase(server, "vllm:num_preemptions_total") if len(server) else float("nan")
    out[PER_RUN.prefix_cache_hit_rate] = prefix_cache_hit_rate(server)
    for key, name in HISTOGRAM_MEANS.items():
        count = increase(server, name + "_count")
        out[key] = increase(server, name + "_sum") / count * 1000.0 if count > 0 else float("nan")
    for key, name in HISTOGRAM_P95.items():
        out[key] = histogram_quantile(server, name, 0.95)
    return out
