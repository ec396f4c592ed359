"""The SLO boundary: per profile, the highest request rate (or concurrency) at which p95 TTFT and
p95 ITL (and any other ``--slo`` metric) still meet their thresholds; capacity planning's answer.

    python -m launch.boundary --profiles baseline-cpu,optimized-cpu --slo ttft:500,itl:50 \\
        --start 1 --warmup 10 --duration 30 --out runs/NAME [-- LOCUST_ARGS...]
    python -m launch.boundary --external-url http://127.0.0.1:8000 --label NAME --slo ... (same options)

For each profile it starts the server once, then probes: from ``--start`` it doubles the load
until a probe fails (or halves it until one passes), then bisects between the highest passing and
the lowest failing load until they are within ``--tolerance`` of each other. Each probe is one
sweep run (same layout, ``OUT/<label>/rate<R>/r<k>``, so the analysis reads it and an interrupted
search resumes); probes inside the bracket run ``--repeats`` times and are judged on the pooled
samples. Open-loop probes judge TTFT and E2E from the instant each request was due: a load the
client could not send on time fails instead of hiding its backlog.

Writes ``boundary.csv`` (one row per profile: the highest passing and lowest failing load, the
interval) and ``probes.csv`` (every probe, its p95s and the verdict), and prints the comparison:
``optimized-cpu serves 31% more requests/s within SLO than baseline-cpu``.
Exit codes: 0 done; 1 a run or server failed; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import math
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from analysis.goodput import Slo, parse_slo, within_slo as judge
from analysis.load import AnalysisError, load_runs
from analysis.summary import runs_per_run, summarize
from launch.server import ServerError
from launch.sweep import Plan, Sweep, SweepError, _interrupt, log, parse_with_sweep, validate
from vllm_locust.core.schema import SUMMARY, level_dir
BOUNDARY_COLUMNS = ("profile", "search", "slo", "boundary", "first_failing", "interval_low", "interval_high", "probes", "note")


@dataclass
class Probe:
    load: float
    passed: bool
    p95s: dict = field(default_factory=dict)
    why: str = ""


def evaluate(level_path: Path, slo: Slo) -> Probe:
    """Judge the finished runs under one level's directory on their pooled samples."""
    runs = load_runs(level_path)
    samples, requests, frame = runs_per_run(runs, slo)
    summary = summarize(samples, requests, frame, slo)
    row = summary.iloc[0]
    passed, figures, why = judge(row, slo)
    load = float(row[SUMMARY.request_rate]) or float(row[SUMMARY.concurrency])
    return Probe(load, passed, figures, why)


class BoundarySearch:
    """Bracket, then bisect, one profile at a time, on one server start per profile."""

    def __init__(self, sweep: Sweep, args):
        self.sweep, self.args = sweep, args
        self.slo = parse_slo(args.slo)
        self.rates = args.search == "rate"

    def level(self, load: float) -> tuple:
        return (float(load), self.args.max_concurrency) if self.rates else (None, int(load))

    def probe(self, label: str, load: float, repeats: int, served: tuple) -> Probe:
        level = self.level(load)
        for r in range(1, repeats + 1):
            self.sweep.run_level(label, level, r, served)
        path = Path(self.sweep.out) / label / level_dir(level[1], level[0])
        try:
            probe = evaluate(path, self.slo)
        except AnalysisError as err:
            probe = Probe(load, False, {}, f"nothing to judge: {err}")
        log(f"{label}: {'pass' if probe.passed else 'FAIL'} at {self.name(load)}"
            + (f" ({probe.why})" if probe.why else ""))
        return probe

    def name(self, load: float) -> str:
        return f"{load:g} requests/s" if self.rates else f"{int(load)} streams"

    def next_load(self, low: float, high: float) -> float | None:
        """The midpoint to probe, or None when the bracket is within the tolerance."""
        if (high - low) / low <= self.args.tolerance:
            return None
        mid = (low + high) / 2
        if not self.rates:
            mid = math.floor(mid)
            if mid <= low:
                return None
        return round(mid, 3)

    def search(self, label: str) -> tuple[dict, list[Probe]]:
        probes: list[Probe] = []
        low = high = None
        load = self.args.start
        with self.sweep.serving(label) as served:
            first = self.probe(label, load, 1, served)
            probes.append(first)
            step = 2.0 if first.passed else 0.5
            while True:  # bracket: double until a failure, or halve until a pass
                last = probes[-1]
                if last.passed:
                    low = last.load if low is None else max(low, last.load)
                else:
                    high = last.load if high is None else min(high, last.load)
                if low is not None and high is not None:
                    break
                load = last.load * step
                if load > self.args.max or load < self.args.min or (not self.rates and load < 1):
                    break
                probes.append(self.probe(label, load if self.rates else max(1, round(load)), 1, served))
            while low is not None and high is not None:  # bisect, with repeats inside the bracket
                mid = self.next_load(low, high)
                if mid is None:
                    break
                p = self.probe(label, mid, self.args.repeats, served)
                probes.append(p)
                low, high = (mid, high) if p.passed else (low, mid)
        note = ("" if low is not None and high is not None else
                f"passes at every load up to --max {self.args.max:g}" if high is None else
                f"fails at every load down to --min {self.args.min:g}")
        row = {"profile": label, "search": self.args.search, "slo": str(self.slo), "boundary": low,
               "first_failing": high, "interval_low": low, "interval_high": high, "probes": len(probes), "note": note}
        return row, probes


def comparison_lines(boundaries: pd.DataFrame, unit: str) -> list[str]:
    """``X serves N% more <unit> within SLO than BASE``, against the first (or baseline*) profile."""
    rows = boundaries.dropna(subset=["boundary"])
    if len(rows) < 2:
        return []
    named = rows[rows["profile"].str.startswith("baseline")]
    base = (named if len(named) == 1 else rows).iloc[0]
    lines = []
    for _, row in rows.iterrows():
        if row["profile"] == base["profile"]:
            continue
        change = (row["boundary"] - base["boundary"]) / base["boundary"] * 100
        more = "more" if change >= 0 else "fewer"
        lines.append(f"{row['profile']} serves {abs(change):.0f}% {more} {unit} within SLO than {base['profile']} "
                     f"({row['boundary']:g} vs {base['boundary']:g}; boundaries within "
                     f"[{row['interval_low']:g}, {row['interval_high'] if pd.notna(row['interval_high']) else float('nan'):g}] and "
                     f"[{base['interval_low']:g}, {base['interval_high'] if pd.notna(base['interval_high']) else float('nan'):g}])")
    return lines


def parse_args(argv: list[str]):
    p = argparse.ArgumentParser(prog="python -m launch.boundary", description=__doc__.splitlines()[0])
    p.add_argument("--slo", required=True, help="thresholds in ms judged at p95, e.g. ttft:500,itl:50")
    p.add_argument("--search", choices=["rate", "concurrency"], default="rate")
    p.add_argument("--start", type=float, default=1.0, help="first load probed (requests/s or streams)")
    p.add_argument("--min", type=float, default=0.05)
    p.add_argument("--max", type=float, default=4096.0)
    p.add_argument("--tolerance", type=float, default=0.1, help="stop when (high - low) / low is at most this")
    return parse_with_sweep(p, argv)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)  # stop the server it started, as on Ctrl-C (the sweep's way)
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        slo = parse_slo(args.slo)
        if slo is None:
            raise SweepError("--slo needs thresholds, e.g. ttft:500,itl:50")
        if not (0 < args.start and 0 < args.tolerance and args.min <= args.start <= args.max):
            raise SweepError("--start must lie in [--min, --max] and --tolerance be positive")
        if args.search == "rate":
            args.request_rate = f"{args.start:g}"  # validated like a sweep's rates
        else:
            args.request_rate, args.concurrency = "", str(max(1, int(args.start)))
        plan = validate(args)
    except (SweepError, ValueError) as err:
        print(f"boundary: {err}", file=sys.stderr)
        return 2
    sweep = Sweep(args, Plan(plan.labels, [], 1, plan.external, open_ended=True))
    search = BoundarySearch(sweep, args)
    rows, probe_rows = [], []
    try:
        for label in plan.labels:
            row, probes = search.search(label)
            rows.append(row)
            probe_rows += [{"profile": label, "load": p.load, "passed": p.passed, "why": p.why, **p.p95s} for p in probes]
            log(f"{label}: boundary {row['boundary']} (first failing {row['first_failing']}) {row['note']}")
    except ServerError as err:
        print(f"boundary: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("boundary: interrupted; finished probes are kept, rerun the same command to resume", file=sys.stderr)
        return 130
    out = Path(args.out)
    boundaries = pd.DataFrame(rows, columns=list(BOUNDARY_COLUMNS))
    boundaries.to_csv(out / "boundary.csv", index=False)
    pd.DataFrame(probe_rows).to_csv(out / "probes.csv", index=False)
    for row in boundaries.itertuples():
        print(f"{row.profile}: highest {args.search} within SLO {row.slo}: {row.boundary} "
              f"(first failing: {row.first_failing}){' - ' + row.note if row.note else ''}")
    for line in comparison_lines(boundaries, "requests/s" if args.search == "rate" else "streams"):
        print(line)
    return 1 if sweep.failed else 0


if __name__ == "__main__":
    sys.exit(main())
