"""The seed's release checklist, filled in with this run's facts."""

from __future__ import annotations

import pandas as pd

import numpy as np

from vllm_locust.core.schema import IDS, PER_RUN, REQUEST
from vllm_locust.core import trust
from vllm_locust.core.sources import shares_prefixes

from .advice import client_lag_advice, lag_text
from .load import Run
from .server import increase
from .summary import DEFAULT_MAX_CLIENT_LAG_MS, DEFAULT_MAX_SEND_LATENESS_MS, client_audit
from .tidy import failed, measured, succeeded


def _max_model_len(run: Run) -> int | None:
    cmd = run.manifest.get("command", [])
    if "--max-model-len" in cmd:
        try:
            return int(cmd[cmd.index("--max-model-len") + 1])
        except (IndexError, ValueError):  # a command cut short, or a value like 32k: not known
            return None
    return None


def _locust_cpu_warned(run: Run) -> bool:
    """Locust logs 'CPU usage above 90%' (or 'exceeded') when its process cannot keep up."""
    return any("CPU usage" in log.read_text(errors="replace") for log in run.dir.glob("locust*.log"))


def _prefix_hit_rate(run: Run) -> float:
    if run.metrics.empty:
        return 0.0
    queries = increase(run.metrics, "vllm:prefix_cache_queries_total")
    return increase(run.metrics, "vllm:prefix_cache_hits_total") / queries if queries > 0 else 0.0


def repeated_into_cache(runs: list[Run]) -> list[str]:
    """Runs whose prompts hit the prefix cache over 10% although their workload shares no prefix on
    purpose (a conversation's history, a trace's blocks and shared-prefix's system prompt do)."""
    return [r.run_key for r in runs if _prefix_hit_rate(r) > 0.1
            and not any(shares_prefixes(str(w)) for w in set(r.requests.get("workload", [])))]


def _late_sends(requests: pd.DataFrame, max_send_lateness_ms: float) -> tuple[int, list[str]]:
    """Open-loop runs, and those whose send lateness p99 exceeded the threshold."""
    if REQUEST.lateness_ms not in requests:
        return 0, []
    sent = requests[requests[REQUEST.lateness_ms].notna()]
    p99 = sent.groupby(IDS.run_key)[REQUEST.lateness_ms].apply(lambda v: float(np.percentile(v, 99)))
    return len(p99), [f"{k} (p99 {v:.1f} ms)" for k, v in p99.items() if v > max_send_lateness_ms]


def cache_item(runs: list[Run]) -> tuple[str, bool, str]:
    """The checklist's prefix-cache item; runs that share prefixes by design are named, not judged
    (seen: a conversation run at 52% was said to be "under 10% in every run")."""
    cached = repeated_into_cache(runs)
    sharing = [r for r in runs if any(shares_prefixes(str(w)) for w in set(r.requests.get("workload", [])))]
    judged = ("hit rate under 10% in every run" if not sharing else
              f"hit rate under 10% in every run whose prompts share no prefix by design; {len(sharing)} run(s) "
              "share them by design (conversation history, trace blocks, a shared prefix), hit rate up to "
              f"{max(_prefix_hit_rate(r) for r in sharing):.0%}, not judged here")
    return ("Prompts did not repeat into the prefix cache", not cached,
            judged if not cached else
            f"prefix-cache hit rate over 10% in {', '.join(cached)}: prompts repeated within a run "
            "(was --no-unique-prompts given?)")


def checklist(runs: list[Run], requests: pd.DataFrame, max_client_lag_ms: float = DEFAULT_MAX_CLIENT_LAG_MS,
              max_send_lateness_ms: float = DEFAULT_MAX_SEND_LATENESS_MS) -> list[tuple[str, bool | None, str]]:
    """``(item, ok, facts)``; ok is None where the facts cannot settle it."""
    items = []
    vllm = sorted({r.manifest.get("versions", {}).get("vllm") or "external/unknown" for r in runs})
    locust = sorted({str(r.record.get("versions", {}).get("locust")) for r in runs})
    torch = sorted({str(r.manifest.get("versions", {}).get("torch")) for r in runs if r.manifest})
    items.append(("Pinned versions recorded", len(vllm) == 1 and "external/unknown" not in vllm,
                  f"vLLM {', '.join(vllm)}; torch {', '.join(torch) or 'n/a'}; locust {', '.join(locust)}"))
    ok = succeeded(requests)
    longest = int((ok["prompt_tokens"] + ok["completion_tokens"]).max()) if len(ok) else 0
    limits = sorted({m for m in (_max_model_len(r) for r in runs) if m})
    items.append(("max-model-len covers the observed lengths", (min(limits) >= longest) if limits else None,
                  f"longest request {longest} tokens; --max-model-len {', '.join(map(str, limits)) or 'model default'}"))
    warmups = sorted({float(r.record.get("warmup_s", 0)) for r in runs})
    items.append(("Warm-up before every measured run", min(warmups) > 0,
                  f"warm-up {', '.join(f'{w:g}' for w in warmups)} s, samples discarded"))
    scraped = [r.run_key for r in runs if r.metrics.empty]
    items.append(("/metrics scraped during every run", not scraped,
                  "all runs" if not scraped else f"missing in {', '.join(scraped)}"))
    restarts = {}
    for r in runs:
        if r.record.get("server_dir"):
            restarts.setdefault(r.profile, set()).add(r.record.get("server_dir"))
    external = sorted({r.profile for r in runs if r.record.get("external")})
    # A plain Locust recording (headless or the web UI) names no server the suite started: unknown.
    recorded = sorted({r.profile for r in runs if not r.record.get("server_dir")})
    not_ours = [*external, *(p for p in recorded if p not in external)]
    items.append(("Server restarted for each profile", None if not_ours else True,
                  "; ".join(f"{p}: {len(d)} start(s)" for p, d in sorted(restarts.items()))
                  + (f" (external, not restarted by the sweep: {', '.join(external)})" if external else "")
                  + (f"{'; ' if restarts or external else ''}{', '.join(p for p in recorded if p not in external)}: "
                     "a Locust recording against a server the suite did not start (restarts unknown)"
                     if [p for p in recorded if p not in external] else "")))
    repeats = sorted({int(r.record.get("repeat", 1)) for r in runs})
    items.append(("Three or more repeats per point", max(repeats) >= 3, f"{max(repeats)} repeat(s) per point"))
    audits = {r.run_key: client_audit(measured(r.client), max_client_lag_ms) for r in runs if not r.client.empty}
    late = [f"{k} ({client_lag_advice(lag_text(a[PER_RUN.client_loop_lag_p99_ms], a[PER_RUN.client_implied_itl_p95_error_ms], a[PER_RUN.client_implied_ttft_p95_error_ms], max_client_lag_ms), a[PER_RUN.client_cpu_max_pct])})"
            for k, a in audits.items() if a[PER_RUN.client_trusted] is False]
    warned = [f"{r.run_key} (Locust CPU warning)" for r in runs if _locust_cpu_warned(r)]
    late += warned
    unaudited = [r.run_key for r in runs if r.client.empty]
    items.append(("Load generator kept up (the errors its event-loop lag implies within "
                  f"{trust.ITL_LIMIT_MS:g} ms at ITL p95 and {trust.TTFT_LIMIT_MS:g} ms at TTFT p95"
                  + (f", lag p99 within {max_client_lag_ms:g} ms" if max_client_lag_ms and max_client_lag_ms > 0 else "")
                  + ", no Locust CPU warning)",
                  (not late) if not unaudited or late else None,
                  ("every run" if not late else
                   f"fell behind in {', '.join(late)}: chunks waited in the client, so its TTFT/ITL there are not "
                   "the server's" + ("; where Locust warned of its CPU, rerun with more --workers" if warned else ""))
                  + (f"; no audit recorded in {', '.join(unaudited)}" if unaudited else "")))
    open_loop, short = _late_sends(requests, max_send_lateness_ms)
    if open_loop:
        items.append((f"Open loop: the asked rate was delivered (send lateness p99 within {max_send_lateness_ms:g} ms)",
                      not short, f"every one of {open_loop} run(s)" if not short else
                      f"not in {', '.join(short)}: requests left late (every user busy, or the client fell behind); "
                      "raise --max-concurrency or add workers, or read it as the server's saturation"))
    items.append(cache_item(runs))
    failures = len(failed(requests))
    items.append(("No failed requests", failures == 0, f"{failures} failed of {len(requests)}"))
    return items
