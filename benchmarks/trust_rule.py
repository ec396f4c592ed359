"""The trust rule against the truth: each recorded run's implied errors beside its real ones.

Reads JSON lines of runs (``measurement_error.py --lag-series``: the suite's loop-lag series and its
real TTFT/ITL p95 errors against the exact-timing mock; ``tests/data/trust_calibration.jsonl`` keeps
them as histograms, ``--store`` writes that form). Each run is good (real ITL p95 error within 1 ms
and TTFT p95 within 5 ms: no warning wanted), bad (above 2 or 10 ms: a warning needed) or between;
prints each run's figures, the least-squares lines the rule's constants come from, and the false
alarms (a good run flagged) and missed errors (a bad run not flagged) of the rule and of the fixed
2 ms lag-p99 rule it replaced.

    python benchmarks/trust_rule.py tests/data/trust_calibration.jsonl
    python benchmarks/trust_rule.py --store tests/data/trust_calibration.jsonl --source "2-core VM" /tmp/local.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from vllm_locust.core.trust import error_class, implied_errors, quantile  # noqa: E402

OLD_RULE_LAG_P99_MS = 2.0


def lags_of(run: dict) -> list[float]:
    """The run's lag series, from its values or its histogram ([value, count] pairs)."""
    if "loop_lag_ms" in run:
        return [float(v) for v in run["loop_lag_ms"]]
    return [float(v) for v, n in run.get("loop_lag_hist", []) for _ in range(int(n))]


def kind(run: dict) -> str:
    """The run's class by its real errors (``core.trust.error_class``)."""
    return error_class(run["itl_p95_error_ms"], run["ttft_p95_error_ms"])


def recorded(path: Path) -> list[dict]:
    """The runs of a JSON-lines file, each with its ``lags`` (from values or histogram)."""
    runs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for run in runs:
        run["lags"] = lags_of(run)
    return runs


def judged(runs: list[dict]) -> list[dict]:
    out = []
    for run in runs:
        lags = run["lags"] if "lags" in run else lags_of(run)
        implied = implied_errors(lags)
        out.append({**{k: run.get(k) for k in ("source", "streams", "processes", "itl_ms", "trial", "note")},
                    "lag p95": round(quantile(lags, 95), 2), "lag p99": round(quantile(lags, 99), 2),
                    "ITL p95 error": run["itl_p95_error_ms"], "TTFT p95 error": run["ttft_p95_error_ms"],
                    "implied ITL": round(implied.itl_p95_ms, 2), "implied TTFT": round(implied.ttft_p95_ms, 2),
                    "kind": kind(run), "warned": not implied.trusted,
                    "old rule warned": quantile(lags, 99) > OLD_RULE_LAG_P99_MS})
    return out


def rates(rows: list[dict], column: str) -> str:
    good = [r for r in rows if r["kind"] == "good"]
    bad = [r for r in rows if r["kind"] == "bad"]
    alarms = sum(r[column] for r in good)
    missed = sum(not r[column] for r in bad)
    return (f"false alarms {alarms} of {len(good)} good runs ({alarms / max(1, len(good)):.0%}), missed errors "
            f"{missed} of {len(bad)} bad runs ({missed / max(1, len(bad)):.0%})")


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def store(paths: list[Path], out: Path, source: str) -> None:
    """Append the runs of ``paths`` to ``out`` with their series as histograms of 0.01 ms."""
    with open(out, "a") as f:
        for path in paths:
            for line in path.read_text().splitlines():
                run = json.loads(line)
                counts: dict[float, int] = {}
                for v in lags_of(run):
                    key = round(v, 2)
                    counts[key] = counts.get(key, 0) + 1
                run.pop("loop_lag_ms", None)
                run["loop_lag_hist"] = sorted([k, n] for k, n in counts.items())
                run.setdefault("source", source)
                f.write(json.dumps(run) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", type=Path, nargs="+")
    parser.add_argument("--store", type=Path, help="append the runs to this file (histograms) instead")
    parser.add_argument("--source", default="", help="--store: where the runs were measured")
    args = parser.parse_args()
    if args.store:
        store(args.runs, args.store, args.source)
        return
    runs = [run for path in args.runs for run in recorded(path)]
    rows = judged(runs)
    import pandas as pd

    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    small = [r for r in rows if r["lag p95"] < 20]
    print("\nITL p95 error = %.2f * lag p95 %+.2f ms" % fit([r["lag p95"] for r in small], [r["ITL p95 error"] for r in small]))
    small = [r for r in rows if r["lag p99"] < 30]
    print("TTFT p95 error = %.2f * lag p99 %+.2f ms" % fit([r["lag p99"] for r in small], [r["TTFT p95 error"] for r in small]))
    print(f"\n{len(rows)} runs: {sum(r['kind'] == 'good' for r in rows)} good, "
          f"{sum(r['kind'] == 'between' for r in rows)} between, {sum(r['kind'] == 'bad' for r in rows)} bad")
    print("the rule (implied errors):", rates(rows, "warned"))
    print(f"the fixed rule (lag p99 > {OLD_RULE_LAG_P99_MS:g} ms):", rates(rows, "old rule warned"))


if __name__ == "__main__":
    main()
