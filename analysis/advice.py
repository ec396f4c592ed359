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


def client_lag_advice(loop_lag_p99_ms: float, cpu_max_pct: float | None, max_lag_ms: float) -> str:
    """One sentence for a run (or level) whose loop-lag p99 exceeded ``max_lag_ms``: what was
    measured (lag, the process's peak CPU share) and the remedy that fits it."""
    lag = f"loop lag p99 {loop_lag_p99_ms:.1f} ms (over {max_lag_ms:g} ms)"
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
