"""Lines for the report's "Notes on the numbers": wherever a figure is not what it seems at first
reading, say why, with the measured share or size."""

from __future__ import annotations

import pandas as pd

from vllm_locust.core.schema import IDS, ITL, LEVEL, SAMPLE, SUMMARY, level_name, pct_col

from .markup import fmt_number

BURST_ITL_MS = 1.0  # a client ITL p50 below this: chunks came in bursts, not one per decode step


def number_notes(summary: pd.DataFrame) -> list[str]:
    """A line wherever a figure is not what it seems at first reading."""
    notes = []
    for r in summary.itertuples(index=False):
        row = r._asdict()
        where = f"{row['profile']} {level_name(row['request_rate'], row['concurrency'])}"
        p50_itl, server_itl = row.get(pct_col(ITL, 50)), row.get("server_itl_mean_ms")
        if pd.notna(p50_itl) and p50_itl < BURST_ITL_MS:
            seen = f" while vLLM's own ITL mean is {fmt_number(server_itl)} ms" if pd.notna(server_itl) else ""
            notes.append(f"{where}: client ITL p50 {fmt_number(p50_itl)} ms{seen}: chunks reach the client in bursts "
                         f"(the API server or the network delivers several at once, {fmt_number(row.get('chunks_per_token'))} "
                         "chunks per token), so half the gaps are the spacing inside a burst; the wait between "
                         "bursts shows in p95/p99 ITL and in TPOT")
        kv = row.get("mean_kv_cache_usage")
        if pd.notna(kv) and kv == 0 and (row.get("max_num_requests_running") or 0) == 0 and (row.get("requests") or 0) > 0:
            notes.append(f"{where}: vLLM's scheduler gauges (running, waiting, KV cache) read 0 while requests were "
                         "served (seen on its CPU build): they were not measured, they are not zero")
    notes += delivered_token_notes(summary)
    return notes


def energy_and_speculation_notes(summary: pd.DataFrame) -> list[str]:
    """Why the GPU columns are absent, and what speculative decoding's figures mean here."""
    notes = []
    if len(summary) and "gpu_j_per_output_token" not in summary:
        notes.append("GPU power and energy: not measured (no run has a gpu.csv: no GPU on the load generator's host "
                     "and no --dcgm-url, or --gpu-telemetry off); the columns are left out, not zero")
    if "spec_acceptance_rate" in summary and summary["spec_acceptance_rate"].notna().any():
        notes.append("Speculative decoding: acceptance rate is accepted / drafted tokens, mean accepted length "
                     "1 + accepted / drafts (vLLM's convention, the bonus token counted), from vLLM's counters over "
                     "each window; a chunk then carries several tokens, so ITL per chunk sits beside ITL per token "
                     "(p*_itl_per_token_ms). On dummy weights acceptance is chance: the figures show the counters "
                     "flow, not what a trained model accepts")
    return notes


DELIVERED_TOLERANCE = 0.01  # token counts per request that differ more than 1% across labels get a note


def delivered_token_notes(summary: pd.DataFrame) -> list[str]:
    """Where labels asked for the same load but their servers delivered different token counts per
    request (an engine that stops early, or counts prompt tokens its own way): say by how much,
    since throughput and TPOT compare differently then."""
    notes = []
    for (rate, concurrency), level in summary.groupby([SUMMARY.request_rate, SUMMARY.concurrency]):
        for column, what in (("mean_output_tokens", "output"), ("mean_prompt_tokens", "prompt")):
            if column not in level:
                continue
            values = level.set_index(SUMMARY.profile)[column].dropna()
            if len(values) < 2 or values.max() <= 0 or values.min() / values.max() >= 1 - DELIVERED_TOLERANCE:
                continue
            listing = ", ".join(f"{p} {fmt_number(v)}" for p, v in values.items())
            notes.append(f"{level_name(rate, concurrency)}: the same asked load delivered different {what} tokens per "
                         f"request ({listing}): compare throughput in tokens/s and TPOT with that in mind")
    return notes

COALESCED_MS = 0.01  # an ITL gap under this is no decode step: the chunks arrived together


def coalesced_gap_notes(samples: pd.DataFrame) -> list[str]:
    """Per label and level, the share of ITL gaps under 0.01 ms, and what they are. The suite stamps
    each socket read once, when it returns (``vllm_locust.core.sse.stamped_payloads``): every chunk that
    one read completed gets the same instant, a gap of 0; reads that return back to back from the
    kernel's buffer differ by microseconds. Either way the server (its API process flushing
    several chunks at once) or the network (Nagle, proxies) coalesced the chunks."""
    notes = []
    itl = samples[samples[SAMPLE.metric] == ITL] if SAMPLE.metric in samples else samples.iloc[0:0]
    for (profile, rate, concurrency), g in itl.groupby([IDS.profile, *LEVEL]):
        values = g[SAMPLE.value_ms].to_numpy(dtype=float)
        tiny = int((values < COALESCED_MS).sum())
        if not tiny:
            continue
        notes.append(f"{profile} {level_name(rate, concurrency)}: {tiny / len(values):.1%} of ITL gaps ({tiny} of "
                     f"{len(values)}) are under {COALESCED_MS:g} ms: chunks that arrived in the same socket read (the "
                     "suite stamps a read once, when it returns, so every chunk in it gets the same instant) or in "
                     "reads back to back from the kernel's buffer; the server or the network coalesced them. They "
                     "are real arrivals: the wait before such a burst is in the gap that precedes it, and they pull "
                     "ITL percentiles below the decode step")
    return notes
