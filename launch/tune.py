"""The seed's method, automated: change one knob at a time from the current best, keep a value only
when it beats the best with intervals that exclude zero.

    python -m launch.tune --base baseline-cpu --knobs profiles/knobs-cpu.conf --concurrency 16 \\
        --warmup 5 --duration 20 --repeats 1 --max-repeats 3 --out runs/tune-NAME [-- LOCUST_ARGS...]

The knobs file (next to the profiles) has one knob per line, vLLM's flag name and the candidate
values: ``max-num-seqs=8,64,256``, ``enable-prefix-caching=true,false``. The base is measured
first (``--repeats``); then, knob by knob, each candidate value becomes a profile of its own
(``OUT/profiles/<base>--<knob>-<value>.conf``: ``include=`` the current best plus that one line),
served by a fresh server, warmed up and measured like any sweep run, and compared with the current
best by the analysis' rule (``--rule latency``: p95 TTFT and p95 ITL improve with bootstrap
intervals excluding zero and throughput falls at most ``--max-throughput-drop``%; ``--rule
goodput --slo ...``: the share of requests within the SLO rises). A candidate stops early as soon
as its verdict is decided: it beats the best, or one of p95 TTFT/ITL is worse with an interval
that excludes zero; otherwise it gets another repeat, up to ``--max-repeats``, and is "not better".
A kept value becomes the new best, which the next knobs start from.

Runs are sweep runs (``OUT/<label>/c<N>/r<k>``): an interrupted tuning resumes where it stopped
(finished runs are not redone, and a candidate whose runs are all there needs no server). Writes
``path.csv`` (every candidate, its verdict, its numbers), the winning profile
``OUT/<base>-tuned.conf`` (``--write-profile``: also ``profiles/<base>-tuned.conf``) and the
report of the whole tuning (``python -m analysis OUT --baseline BASE``).
Exit codes: 0 done; 1 a server or run failed; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd

from analysis.goodput import parse_slo
from analysis.load import AnalysisError, load_runs
from analysis.summary import runs_per_run, summarize
from analysis.verdict import Rule, compare, trust_of, verdicts
from launch.server import ServerError
from launch.sweep import LABEL_CHARS, Plan, Sweep, SweepError, _interrupt, log, parse_with_sweep, validate
from vllm_locust.core.schema import COMPARISON, ITL, TTFT, VERDICT, level_name, pct_col, write_atomic

ROOT = Path(__file__).resolve().parents[1]
PATH_COLUMNS = ("step", "knob", "value", "candidate", "against", "repeats", "verdict", "kept", "level",
                "p95_ttft_change_pct", "p95_ttft_ci", "p95_itl_change_pct", "p95_itl_ci", "throughput_change_pct",
                "trusted", "why")
BEATS, WORSE, NOT_BETTER = "beats", "worse", "not better"


def read_knobs(path: Path) -> list[tuple[str, list[str]]]:
    """``knob=v1,v2`` lines (``#`` comments); a knob is a vLLM flag name, values are data."""
    knobs = []
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise SweepError(f"--knobs {path}: {err.strerror}") from None
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, sep, values = line.partition("=")
        key = key.strip()
        if not sep or not re.fullmatch(r"[a-z0-9][a-z0-9-]*", key) or key in ("model", "include", "port", "host"):
            raise SweepError(f"{path}:{n}: expected knob=value1,value2 with a vLLM flag name, got {line!r}")
        choices = [v.strip() for v in values.split(",") if v.strip()]
        if not choices or any(not set(v) <= LABEL_CHARS for v in choices):
            raise SweepError(f"{path}:{n}: values are letters, digits, '.', '_' and '-' only: {values!r}")
        knobs.append((key, choices))
    if not knobs:
        raise SweepError(f"--knobs {path}: no knobs")
    return knobs


def candidate_name(base: str, knob: str, value: str) -> str:
    return f"{base}--{knob}-{value}"


def decide(per_level: pd.DataFrame, comparison: pd.DataFrame, candidate: str) -> tuple[str, list[dict]]:
    """The candidate's verdict against the best over every load level: ``beats`` (at every level),
    ``worse`` (p95 TTFT or ITL higher with an interval excluding zero at some level: no repeat will
    turn that around) or undecided (None: also a beat on untrusted numbers); and the figures per
    level for the path."""
    rows, decided = [], []
    mine = per_level[per_level[VERDICT.profile] == candidate]
    for v in mine.itertuples(index=False):
        rate = 0.0 if pd.isna(v.request_rate) else float(v.request_rate)
        at = comparison[(comparison[COMPARISON.profile] == candidate) & (comparison[COMPARISON.concurrency] == v.concurrency)
                        & (comparison[COMPARISON.request_rate].fillna(0.0) == rate)]
        by = {r[COMPARISON.metric]: r for _, r in at.iterrows()}

        def ci(metric):
            r = by.get(metric)
            return "" if r is None else f"[{r[COMPARISON.ci_low_pct]:.1f}, {r[COMPARISON.ci_high_pct]:.1f}]"

        worse = any(by.get(m) is not None and by[m][COMPARISON.ci_low_pct] > 0 for m in (pct_col(TTFT, 95), pct_col(ITL, 95)))
        # A beat measured by a client that fell behind is no beat: in CI the client, starved of its
        # core, read max-num-seqs=1 as 65% better p95 TTFT (its lateness, not the server's speed).
        # Undecided instead: another repeat, and at --max-repeats the knob is not kept.
        decided.append(BEATS if bool(v.beats) and bool(v.trusted) else WORSE if worse else None)
        rows.append({"level": level_name(rate, v.concurrency),
                     "p95_ttft_change_pct": v.p95_ttft_change_pct, "p95_ttft_ci": ci(pct_col(TTFT, 95)),
                     "p95_itl_change_pct": v.p95_itl_change_pct, "p95_itl_ci": ci(pct_col(ITL, 95)),
                     "throughput_change_pct": v.throughput_change_pct, "trusted": v.trusted, "why": v.why})
    if decided and all(d == BEATS for d in decided):
        return BEATS, rows
    if any(d == WORSE for d in decided):
        return WORSE, rows
    return None, rows


class Tuner:
    def __init__(self, sweep: Sweep, args, rule: Rule):
        self.sweep, self.args, self.rule = sweep, args, rule
        self.out = Path(args.out).resolve()
        self.profiles = self.out / "profiles"
        self.path: list[dict] = []

    # -- profiles -----------------------------------------------------------------------------
    def prepare_profiles(self) -> None:
        """The repository's profiles and the candidates in one directory that serve.sh reads."""
        self.profiles.mkdir(parents=True, exist_ok=True)
        source = Path(os.environ.get("PROFILES_DIR") or ROOT / "profiles")
        for conf in source.glob("*.conf"):
            if not (self.profiles / conf.name).exists():
                shutil.copy(conf, self.profiles / conf.name)
        os.environ["PROFILES_DIR"] = str(self.profiles)

    def write_candidate(self, best: str, knob: str, value: str) -> str:
        name = candidate_name(self.args.base, knob, value) if best == self.args.base else f"{best}--{knob}-{value}"
        if len(name) > 150:
            raise SweepError(f"the candidate's name grew too long ({name[:60]}...): fewer knobs per pass")
        write_atomic(self.profiles / f"{name}.conf", f"# launch/tune.py: {best} with {knob}={value}\n"
                                                      f"include={best}\n{knob}={value}\n")
        return name

    # -- measuring ------------------------------------------------------------------------------
    def measure(self, label: str, repeats: range, stop=None) -> int:
        """Runs ``label`` at every level for each repeat in ``repeats``, its server started only
        when a run is missing; after each repeat ``stop()`` may end it early. The repeats done."""
        done = 0
        with contextlib.ExitStack() as stack:
            served = None
            for r in repeats:
                for level in self.sweep.plan.levels:
                    if self.sweep.finished(self.sweep.run_dir(label, level, r)):
                        self.sweep.k += 1
                        continue
                    if served is None:
                        served = stack.enter_context(self.sweep.serving(label))
                    self.sweep.run_level(label, level, r, served)
                done = r
                if stop is not None and stop(r):
                    break
        return done

    def verdict(self, best: str, candidate: str) -> tuple[str | None, list[dict]]:
        try:
            runs = [r for r in load_runs(self.out) if r.profile in (best, candidate)]
        except AnalysisError as err:
            raise SweepError(str(err)) from None
        samples, requests, frame = runs_per_run(runs, self.rule.slo)
        comparison = compare(samples, frame, best, self.rule, requests)
        trust = trust_of(summarize(samples, requests, frame, self.rule.slo))
        return decide(verdicts(comparison, self.rule, trust, best), comparison, candidate)

    # -- the method ---------------------------------------------------------------------------
    def run(self, knobs: list[tuple[str, list[str]]]) -> str:
        self.prepare_profiles()
        best = self.args.base
        log(f"tune: measuring the base {best}")
        self.measure(best, range(1, self.args.repeats + 1))
        current = dict(self.base_values())
        step = 0
        for knob, values in knobs:
            for value in values:
                if current.get(knob) == value:
                    continue
                step += 1
                candidate = self.write_candidate(best, knob, value)
                outcome: dict = {"verdict": None, "rows": []}

                def stop(r: int, candidate=candidate, outcome=outcome) -> bool:
                    if r < self.args.repeats:
                        return False
                    outcome["verdict"], outcome["rows"] = self.verdict(best, candidate)
                    log(f"tune: {candidate} after {r} repeat(s): {outcome['verdict'] or 'undecided'}")
                    return outcome["verdict"] is not None

                repeats = self.measure(candidate, range(1, self.args.max_repeats + 1), stop)
                verdict = outcome["verdict"] or NOT_BETTER
                kept = verdict == BEATS
                for row in outcome["rows"] or [{}]:
                    self.path.append({"step": step, "knob": knob, "value": value, "candidate": candidate, "against": best,
                                      "repeats": repeats, "verdict": verdict, "kept": kept, **row})
                log(f"tune: {knob}={value}: {verdict} {best}" + (" -> kept" if kept else ""))
                if kept:
                    best, current[knob] = candidate, value
        return best

    def base_values(self, name: str | None = None, depth: int = 0) -> dict:
        """The base profile's flag values, its includes read first (later lines win), as written:
        a candidate equal to the base's own value is not measured."""
        values: dict = {}
        path = self.profiles / f"{name or self.args.base}.conf"
        for line in path.read_text().splitlines() if path.exists() and depth < 8 else []:
            key, sep, value = line.strip().partition("=")
            if not sep or key.startswith("#"):
                continue
            if key == "include":
                values.update(self.base_values(value, depth + 1))
            else:
                values[key] = value
        return values

    def write_outputs(self, best: str) -> Path:
        write_atomic(self.out / "path.csv", pd.DataFrame(self.path, columns=list(PATH_COLUMNS)).to_csv(index=False))
        kept = {row["knob"]: row["value"] for row in self.path if row["kept"]}
        candidates = len({row["candidate"] for row in self.path})
        load = f"rate {self.args.request_rate}" if self.args.request_rate else f"concurrency {self.args.concurrency}"
        text = (f"# launch/tune.py: {self.args.base} tuned at {load} ({candidates} candidates, best {best}; "
                f"path in path.csv)\ninclude={self.args.base}\n" + "".join(f"{k}={v}\n" for k, v in kept.items()))
        tuned = self.out / f"{self.args.base}-tuned.conf"
        write_atomic(tuned, text)
        if self.args.write_profile:
            write_atomic(ROOT / "profiles" / tuned.name, text)
        return tuned


def parse_args(argv: list[str]):
    p = argparse.ArgumentParser(prog="python -m launch.tune", description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the profile to start from (profiles/NAME.conf)")
    p.add_argument("--knobs", required=True, type=Path, help="knob=value1,value2 lines (e.g. profiles/knobs-cpu.conf)")
    p.add_argument("--max-repeats", type=int, default=3, help="repeats before an undecided candidate is 'not better'")
    p.add_argument("--rule", choices=["latency", "goodput"], default="latency")
    p.add_argument("--slo", default="", help="with --rule goodput: e.g. ttft:500,itl:50")
    p.add_argument("--max-throughput-drop", type=float, default=20.0)
    p.add_argument("--bootstrap", type=int, default=500)
    p.add_argument("--write-profile", action="store_true", help="also write profiles/<base>-tuned.conf")
    return parse_with_sweep(p, argv)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
        if args.external_url:
            raise SweepError("the tuner restarts the server for each candidate: no --external-url")
        if args.max_repeats < args.repeats:
            raise SweepError(f"--max-repeats {args.max_repeats} is below --repeats {args.repeats}")
        slo = parse_slo(args.slo)
        if args.rule == "goodput" and slo is None:
            raise SweepError("--rule goodput needs --slo, e.g. --slo ttft:500,itl:50")
        knobs = read_knobs(args.knobs)
        args.profiles = args.base
        plan = validate(args)  # the base profile and the levels, checked before anything starts
    except (SweepError, ValueError) as err:
        print(f"tune: {err}", file=sys.stderr)
        return 2
    rule = Rule(max_throughput_drop_pct=args.max_throughput_drop, bootstrap=args.bootstrap, slo=slo, on=args.rule)
    sweep = Sweep(args, Plan([args.base], plan.levels, 1, "", open_ended=True))
    tuner = Tuner(sweep, args, rule)
    try:
        best = tuner.run(knobs)
    except (ServerError, SweepError) as err:
        print(f"tune: {err}", file=sys.stderr)
        tuner.write_outputs(args.base)
        return 1
    except KeyboardInterrupt:
        print("tune: interrupted; finished runs are kept, rerun the same command to resume", file=sys.stderr)
        return 130
    tuned = tuner.write_outputs(best)
    print(f"tune: best {best}; profile {tuned}; path {tuner.out / 'path.csv'}")
    report = subprocess.run([sys.executable, "-m", "analysis", str(tuner.out), "--baseline", args.base, "--bootstrap",
                             str(args.bootstrap)], cwd=ROOT, capture_output=True, text=True)
    print(report.stdout.strip().splitlines()[-1] if report.stdout.strip() else report.stderr.strip()[-300:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
