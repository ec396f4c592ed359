"""A steered run, phase by phase: one row per step (``phases.csv``).

A run steered from the web UI, by ``--schedule`` or by ``--ramp-until-slo`` makes each change a
step (``Steering``): the load record keeps the changes, and the raw rows carry the step. Here each
step of each run is summarised on its own measured window (the warm-up after its change left out,
as every warm-up is): the settings asked (the change and what was in force after it), when it
held, the load it really delivered (requests sent per measured second; in open loop beside the
rate asked), its percentiles and, with ``--slo``, its goodput. Two steps at the same rate and cap
stay two rows here; ``summary.csv`` pools them as one level.
"""

from __future__ import annotations

import json

import pandas as pd

from vllm_locust.core.schema import E2E, ITL, PER_RUN, REQUEST, SUMMARY, TPOT, TTFT, TTFT_FROM_INTENDED, IDS, pct_col

from .goodput import Slo
from .summary import summarize

PHASES_CSV = "phases.csv"
PHASE_COLUMNS = ("profile", "run_id", "step", "from_s", "to_s", "measured_s", "source", "change", "rate_asked",
                 "burstiness", "weights", "max_in_flight", "think_time", "users", "concurrency", "requests", "failures",
                 "delivered_rate", "intended_rate", "load_delivered", "requests_per_s", "output_tokens_per_s", pct_col(TTFT, 50), pct_col(TTFT, 95),
                 pct_col(TTFT, 99), pct_col(ITL, 50), pct_col(ITL, 95), pct_col(ITL, 99), pct_col(TPOT, 95),
                 pct_col(E2E, 95), pct_col(TTFT_FROM_INTENDED, 95), "slo_met_share", "goodput_requests_per_s")


def steered(runs: list) -> list:
    """The runs (one per step) of recordings that were steered."""
    return [r for r in runs if getattr(r, "steering", None)]


def _text(value) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":")) if value else ""


def phase_table(runs: list, samples: pd.DataFrame, requests: pd.DataFrame, frame: pd.DataFrame,
                slo: Slo | None = None) -> pd.DataFrame:
    """One row per step of every steered run, in the order they held."""
    rows = []
    for run in steered(runs):
        key = run.run_key
        s = samples[samples[IDS.run_key] == key]
        r = requests[requests[IDS.run_key] == key]
        f = frame[frame[PER_RUN.run_key] == key] if PER_RUN.run_key in frame else frame.iloc[0:0]
        if s.empty or f.empty:
            continue
        summary = summarize(s, r, f, slo).iloc[0]
        step = run.record.get("step")
        changes = run.steering
        origin = float(changes[0]["at_s"]) - float(changes[0]["t_s"])
        mine = [c for c in changes if c.get("step") == step]
        change = mine[-1] if mine else {}
        settings = change.get("settings") or {}
        windows = run.windows or []
        measured = sum(b - a for a, b in windows)
        sent = r[REQUEST.sent_at_s].between(min(a for a, _ in windows), max(b for _, b in windows)) \
            if windows and len(r) else pd.Series(dtype=bool)
        # the schedule's own rate in the window (open loop: each row's intended instant), which a
        # replay reproduces exactly; what was sent also depends on whether the client kept up
        meant = r[REQUEST.intended_at_s].between(min(a for a, _ in windows), max(b for _, b in windows)) \
            if windows and len(r) and REQUEST.intended_at_s in r else pd.Series(dtype=bool)
        rows.append({
            "profile": run.profile, "run_id": run.record.get("run_id"), "step": -1 if step is None else int(step),
            "from_s": round(min(a for a, _ in windows) - origin, 3) if windows else float("nan"),
            "to_s": round(max(b for _, b in windows) - origin, 3) if windows else float("nan"),
            "measured_s": round(measured, 3), "source": change.get("source", "start"),
            "change": _text(change.get("change")), "rate_asked": run.request_rate or float("nan"),
            "burstiness": settings.get("burstiness"), "weights": _text(settings.get("weights")),
            "max_in_flight": settings.get("max_in_flight"), "think_time": _text(settings.get("think_time")),
            "users": settings.get("users"), "concurrency": int(run.record.get("concurrency") or 0),
            "requests": int(summary[SUMMARY.requests]), "failures": int(summary[SUMMARY.failures]),
            "delivered_rate": round(float(sent.sum()) / measured, 4) if measured > 0 else float("nan"),
            "intended_rate": round(float(meant.sum()) / measured, 4) if measured > 0 and meant.any() else float("nan"),
            "load_delivered": summary.get(SUMMARY.load_delivered),
            **{c: summary.get(c) for c in PHASE_COLUMNS if c in summary.index and c not in ("profile", "concurrency",
                                                                                             "requests", "failures")}})
    table = pd.DataFrame(rows, columns=list(PHASE_COLUMNS))
    return table.sort_values(["profile", "run_id", "from_s"], kind="stable").reset_index(drop=True)


def phase_lines(table: pd.DataFrame) -> list[str]:
    """One line per phase: ``phase 2 (rate 8/s): delivered 7.9 requests/s, p95 TTFT 52.1 ms``."""
    lines = []
    for row in table.itertuples(index=False):
        name = "start" if row.step < 0 else f"step {row.step}"
        asked = f"rate {row.rate_asked:g}/s" if row.rate_asked == row.rate_asked else f"{row.concurrency} streams"
        lines.append(f"{row.profile} {name} ({asked}{', ' + row.source if row.source != 'start' else ''}): "
                     f"delivered {row.delivered_rate:.2f} requests/s over {row.measured_s:.0f} s, "
                     f"p95 TTFT {getattr(row, pct_col(TTFT, 95).replace('-', '_'), float('nan')):.1f} ms, "
                     f"p95 ITL {getattr(row, pct_col(ITL, 95).replace('-', '_'), float('nan')):.2f} ms")
    return lines
