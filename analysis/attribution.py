"""Say where the latency came from: waiting for a slot (queueing) or running (prefill, decode)."""

from __future__ import annotations

import math

import pandas as pd

from vllm_locust.schema import SUMMARY


def _fmt(x: float, unit: str = " ms") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}{unit}"


def attribute(row: pd.Series) -> str:
    """One sentence for one summary row (a profile at a concurrency)."""
    queue, prefill, decode = row[SUMMARY.server_queue_ms], row[SUMMARY.server_prefill_ms], row[SUMMARY.server_decode_ms]
    waiting = row[SUMMARY.max_num_requests_waiting]
    if any(isinstance(v, float) and math.isnan(v) for v in (queue, prefill)):
        return "no server-side queue/prefill histograms in /metrics: cannot attribute"
    if queue > prefill and (waiting or 0) > 0:
        source = "queueing"
        detail = f"requests waited {_fmt(queue)} on average for a slot (up to {waiting:.0f} waiting) against {_fmt(prefill)} of prefill"
    else:
        source = "execution"
        detail = f"prefill took {_fmt(prefill)} on average against {_fmt(queue)} in the queue (at most {waiting:.0f} waiting)"
    parts = [f"TTFT came mostly from {source}: {detail}; decode {_fmt(decode)} per request"]
    server_ttft = row.get(SUMMARY.server_ttft_mean_ms, float("nan"))
    if not math.isnan(server_ttft):
        outside = row[SUMMARY.mean_ttft_ms] - server_ttft
        parts.append(f"client mean TTFT {_fmt(row['mean_ttft_ms'])} against the engine's {_fmt(server_ttft)}: "
                     f"{_fmt(outside)} outside the engine (HTTP, tokenization, streaming, network, client)")
    if (row[SUMMARY.preemptions] or 0) > 0:
        parts.append(f"{row['preemptions']:.0f} preemptions (KV cache full; mean usage {row['mean_kv_cache_usage'] * 100:.0f}%)")
    if not math.isnan(row.get(SUMMARY.prefix_cache_hit_rate, float("nan"))):
        parts.append(f"prefix-cache hit rate {row['prefix_cache_hit_rate'] * 100:.0f}%")
    return "; ".join(parts) + "."


def attribution_table(summary: pd.DataFrame) -> pd.DataFrame:
    return summary.assign(source=summary.apply(attribute, axis=1))[[SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, "source"]]
