"""Say where the latency came from: waiting for a slot (queueing) or running (prefill, decode)."""

from __future__ import annotations

import math

import pandas as pd

from vllm_locust.core.schema import SERVER, SUMMARY, VLLM


def _fmt(x: float, unit: str = " ms") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1f}{unit}"


def waiting_gauge(waiting: float, seen_max: float | None, queue_ms: float) -> str:
    """What the waiting gauge says at this level. "Not measured" only when it read 0 in every
    scrape of the label (``seen_max``, the gauge's maximum over its whole recording) while vLLM's
    queue-time histogram says requests did queue: a gauge that read 4 elsewhere in the run works."""
    if waiting is None or (isinstance(waiting, float) and math.isnan(waiting)):
        return "no waiting gauge in /metrics"
    if waiting > 0:
        return f"up to {waiting:.0f} waiting"
    if seen_max is not None and not math.isnan(seen_max) and seen_max > 0:
        # not this level's count: only the proof that the gauge works (seen quoted as if it were this level's)
        return (f"none waiting at this level (the gauge works: it read above 0, up to {seen_max:.0f}, in another "
                "run or moment of this label)")
    if queue_ms is not None and not math.isnan(queue_ms) and queue_ms >= QUEUED_MS:
        return "the waiting gauge read 0 throughout, which this build does not measure"
    return "none waiting"


QUEUED_MS = 1.0  # a mean queue time at or above this: requests did wait, whatever the gauge says


def waiting_seen(server: pd.DataFrame | None) -> dict[str, float]:
    """Label -> the waiting gauge's maximum over every scrape of its runs (the tidy server frame)."""
    if server is None or server.empty or SERVER.name not in server:
        return {}
    rows = server[server[SERVER.name] == VLLM.waiting]
    return {str(p): float(g[SERVER.value].max()) for p, g in rows.groupby("profile")}


def attribute(row: pd.Series, seen_max: float | None = None) -> str:
    """One sentence for one summary row (a profile at a load level): the largest of the parts of
    the client's mean TTFT it can measure: waiting in vLLM's queue, prefill, or time outside the
    engine (client mean TTFT minus vLLM's own TTFT mean: HTTP, tokenization, streaming, network,
    the client). Queueing is read from vLLM's queue-time histogram, not its waiting gauge, which
    reads 0 under load on the CPU build."""
    queue, prefill, decode = row[SUMMARY.server_queue_ms], row[SUMMARY.server_prefill_ms], row[SUMMARY.server_decode_ms]
    waiting = row[SUMMARY.max_num_requests_waiting]
    if any(isinstance(v, float) and math.isnan(v) for v in (queue, prefill)):
        return "no server-side queue/prefill histograms in /metrics: cannot attribute"
    server_ttft = row.get(SUMMARY.server_ttft_mean_ms, float("nan"))
    outside = row[SUMMARY.mean_ttft_ms] - server_ttft if not math.isnan(server_ttft) else float("nan")
    gauge = waiting_gauge(waiting, seen_max, queue)
    parts_ms = {"queueing": queue, "prefill": prefill, "outside the engine": outside if not math.isnan(outside) else -1.0}
    source = max(parts_ms, key=parts_ms.get)
    detail = (f"{_fmt(queue)} in vLLM's queue ({gauge}), {_fmt(prefill)} of prefill"
              + (f", {_fmt(outside)} outside the engine" if not math.isnan(outside) else ""))
    parts = [f"TTFT came mostly from {source}: {detail}; decode {_fmt(decode)} per request"]
    if not math.isnan(server_ttft):
        share = outside / row[SUMMARY.mean_ttft_ms] * 100 if row[SUMMARY.mean_ttft_ms] else float("nan")
        parts.append(f"client mean TTFT {_fmt(row['mean_ttft_ms'])} against the engine's {_fmt(server_ttft)}: "
                     f"{_fmt(outside)} ({share:.0f}%) outside the engine (HTTP, tokenization, streaming, network, client)")
    if (row[SUMMARY.preemptions] or 0) > 0:
        parts.append(f"{row['preemptions']:.0f} preemptions (KV cache full; mean usage {row['mean_kv_cache_usage'] * 100:.0f}%)")
    if not math.isnan(row.get(SUMMARY.prefix_cache_hit_rate, float("nan"))):
        parts.append(f"prefix-cache hit rate {row['prefix_cache_hit_rate'] * 100:.0f}%")
    return "; ".join(parts) + "."


def attribution_table(summary: pd.DataFrame, server: pd.DataFrame | None = None) -> pd.DataFrame:
    """One sentence per summary row; ``server`` (the tidy server frame) says whether each label's
    waiting gauge ever read above 0."""
    seen = waiting_seen(server)
    source = summary.apply(lambda r: attribute(r, seen.get(str(r[SUMMARY.profile]))), axis=1)
    return summary.assign(source=source)[[SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, "source"]]
