"""What to do about a client whose event loop ran late, from what was measured about it.

Loop lag says the client stamped chunks late; it does not say why. The client process's own CPU
share says which: near a full core, the process itself was the bottleneck (more worker processes
help); well below it, something else on the machine kept it from running (other jobs on a shared
core: more workers would only add contenders). Seen: "add --workers" advised for a client at
12-19% of a core on a core shared with other jobs.
"""

from __future__ import annotations

import math

FULL_CORE_PCT = 80.0  # the client process at this share of one core or more: it was short of CPU itself


def lag_text(loop_lag_p99_ms: float, implied_itl_ms: float | None = None, implied_ttft_ms: float | None = None,
             max_lag_ms: float = 0.0) -> str:
    """What was measured of a run's loop: its lag p99, the errors that implies (``core.trust``), and a
    user's own lag ceiling where one was set and passed."""
    from vllm_locust.core.trust import ImpliedErrors

    text = f"loop lag p99 {loop_lag_p99_ms:.1f} ms"
    known = [v for v in (implied_itl_ms, implied_ttft_ms) if v is not None and not math.isnan(v)]
    if len(known) == 2:
        text += ": " + ImpliedErrors(float(implied_itl_ms), float(implied_ttft_ms)).text()
    if max_lag_ms and max_lag_ms > 0 and loop_lag_p99_ms > max_lag_ms:
        text += f" (over the ceiling of {max_lag_ms:g} ms asked)"
    return text


def client_lag_advice(lag: str, cpu_max_pct: float | None) -> str:
    """One sentence for a run (or level) whose client was not trusted: what was measured (``lag_text``,
    the process's peak CPU share) and the remedy that fits it."""
    if cpu_max_pct is None or (isinstance(cpu_max_pct, float) and math.isnan(cpu_max_pct)):
        return (f"{lag}; the client's CPU share was not recorded, so whether the client process or the machine "
                "was short cannot be told: look at what else ran on the client's cores before adding worker processes")
    if cpu_max_pct >= FULL_CORE_PCT:
        return (f"{lag} with the client process at {cpu_max_pct:.0f}% of a core: the client ran out of CPU; "
                "add --workers (one process per free core)")
    return (f"{lag} while the client process used at most {cpu_max_pct:.0f}% of a core: it was not short of CPU "
            "itself, so the machine delayed it (other processes on its core, a busy or throttled host); free a core "
            "for the client (stop other jobs, pin it with taskset) and rerun, since more worker processes would "
            "only compete for the same cores")
