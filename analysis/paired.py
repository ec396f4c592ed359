"""Paired runs (``locust --paired-host``): both servers got every prompt at the same instant, so
the analysis compares them request by request, and whatever the host did in that moment (another
process, a clock step, thermal drift) falls on both sides of each pair and cancels.

For each load level and metric (TTFT, TPOT, E2E: one value per request, so each has a partner;
ITL gaps have none), the percentile's change from target a (``--host``) to target b, with two 95%
bootstrap intervals: resampling pairs (the paired design) and resampling each side on its own (what
two separate runs of the same requests would give, without the drift between them: a lower bound for
sequential runs). From each interval's width: the requests a verdict needs (its half-width equal to
the change; the width shrinks as one over the square root of the count).

    python -m analysis.paired RUN_DIR [--labels baseline,candidate] [--bootstrap 1000]
    -> RUN_DIR/paired.csv, RUN_DIR/paired.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from vllm_locust.core.schema import REQUEST, write_atomic

from .csvtext import csv_text
from .load import AnalysisError, Run, load_runs
from .tidy import measured, output_tokens, succeeded

QUANTILES = {"ttft_ms": (50, 95, 99), "tpot_ms": (50, 95), "e2e_ms": (50, 95)}
COLUMNS = ("run", "concurrency", "metric", "pairs", "a", "b", "change_pct", "paired_low_pct", "paired_high_pct",
           "unpaired_low_pct", "unpaired_high_pct", "decided_paired", "decided_unpaired",
           "requests_needed_paired", "requests_needed_unpaired")


def is_paired(run: Run) -> bool:
    return "target" in run.requests and (run.requests["target"] == "b").any()


def pairs(requests: pd.DataFrame) -> pd.DataFrame:
    """One row per pair whose two copies both succeeded in the measured phase: ``<metric>_a``, ``<metric>_b``."""
    ok = succeeded(measured(requests))
    ok = ok[ok["target"].isin(("a", "b"))].copy()
    tokens = output_tokens(ok)
    ok["tpot_ms"] = (ok[REQUEST.e2e_ms] - ok[REQUEST.ttft_ms]) / (tokens - 1).where(tokens > 1)
    wide = ok.pivot_table(index="pair_id", columns="target", values=list(QUANTILES), aggfunc="first")
    wide.columns = [f"{metric}_{target}" for metric, target in wide.columns]
    both = [f"{m}_{t}" for m in QUANTILES for t in "ab"]
    return wide.dropna(subset=[c for c in both if c in wide]).reset_index()


def change_intervals(a: np.ndarray, b: np.ndarray, q: float, resamples: int, seed: int) -> tuple[float, tuple, tuple]:
    """(change %, paired interval, unpaired interval) of the q-th percentile from a to b."""
    rng = np.random.default_rng(seed)
    n = len(a)
    change = 100.0 * (np.percentile(b, q) / np.percentile(a, q) - 1.0)
    idx, other = rng.integers(0, n, (resamples, n)), rng.integers(0, n, (resamples, n))
    base = np.percentile(a[idx], q, axis=1)
    base = np.where(base > 0, base, np.nan)  # a resample whose percentile is 0 (one-chunk TPOTs) has no ratio
    paired = 100.0 * (np.percentile(b[idx], q, axis=1) / base - 1.0)
    unpaired = 100.0 * (np.percentile(b[other], q, axis=1) / base - 1.0)
    return change, tuple(np.nanpercentile(paired, (2.5, 97.5))), tuple(np.nanpercentile(unpaired, (2.5, 97.5)))


def requests_needed(n: int, change: float, low: float, high: float) -> float:
    """Pairs at which the interval's half-width equals the change (n when already decided)."""
    if low > 0 or high < 0:
        return float(n)
    if change == 0:
        return float("inf")
    return float(np.ceil(n * ((high - low) / 2.0 / abs(change)) ** 2))


def compare_pairs(runs: list[Run], resamples: int = 1000, seed: int = 0) -> pd.DataFrame:
    rows = []
    for run in runs:
        if not is_paired(run):
            continue
        frame = pairs(run.requests)
        for metric, quantiles in QUANTILES.items():
            a, b = frame[f"{metric}_a"].to_numpy(float), frame[f"{metric}_b"].to_numpy(float)
            if len(a) < 2:
                continue
            for q in quantiles:
                change, (pl, ph), (ul, uh) = change_intervals(a, b, q, resamples, seed)
                rows.append({"run": run.run_key, "concurrency": int(run.record["concurrency"]), "metric": f"p{q}_{metric}",
                             "pairs": len(a), "a": float(np.percentile(a, q)), "b": float(np.percentile(b, q)),
                             "change_pct": change, "paired_low_pct": pl, "paired_high_pct": ph,
                             "unpaired_low_pct": ul, "unpaired_high_pct": uh,
                             "decided_paired": bool(pl > 0 or ph < 0), "decided_unpaired": bool(ul > 0 or uh < 0),
                             "requests_needed_paired": requests_needed(len(a), change, pl, ph),
                             "requests_needed_unpaired": requests_needed(len(a), change, ul, uh)})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m analysis.paired", description=__doc__.splitlines()[0])
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--labels", default="a,b", help="names of --host and --paired-host in the table, e.g. baseline,candidate")
    p.add_argument("--bootstrap", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    names = [x.strip() for x in args.labels.split(",")]
    try:
        if len(names) != 2 or not all(names):
            raise AnalysisError(f"--labels {args.labels!r}: two names, e.g. baseline,candidate")
        table = compare_pairs(load_runs(args.runs_dir), args.bootstrap, args.seed)
        if table.empty:
            raise AnalysisError(f"{args.runs_dir}: no paired requests (record with locust --paired-host URL)")
    except AnalysisError as err:
        print(f"analysis.paired: {err}", file=sys.stderr)
        return 2
    write_atomic(args.runs_dir / "paired.csv", csv_text(table))
    shown = table.rename(columns={"a": f"{names[0]} (a)", "b": f"{names[1]} (b)"})
    text = (f"# Paired: {names[1]} (b) against {names[0]} (a), pair by pair\n\n"
            + shown.to_markdown(index=False, floatfmt=".2f") + "\n")
    write_atomic(args.runs_dir / "paired.md", text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
