"""python -m analysis RUNS_DIR [--baseline PROFILE]: summary.csv, comparison.csv, verdict.csv, failures.csv, report.md, report.html.

Conversation runs (requests with a turn) also get summary_by_turn.csv: TTFT by turn (``turns.py``).
Personas runs (requests with a persona) also get summary_by_persona.csv, comparison_by_persona.csv and
verdict_by_persona.csv, each persona judged against its own SLO (``personas.py``).

Every run is also written as vLLM ``bench serve`` result JSON under ``RUNS_DIR/bench-serve/``, and
``--import-bench FILE.json[:LABEL]`` reads such files (from ``vllm bench serve --save-result
--save-detailed``) in as a label beside the suite's runs.

Exit codes: 0 done; 1 a gate failed (--fail-unless-beats, --slo-p95-ttft-ms, --slo-p95-itl-ms);
2 bad input (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from vllm_locust.core.schema import IDS, ITL, REQUEST, SUMMARY, TTFT, level_name, pct_col, write_atomic

from .advice import client_lag_advice, lag_text
from .csvtext import csv_text
from .attribution import attribution_table
from .benchjson import export_runs, import_specs
from .calibration import calibration_lines, note_verdicts, with_calibration
from .checklist import checklist
from .load import AnalysisError, failed_runs, load_runs
from .report import ReportInput, write_reports
from .goodput import parse_slo
from .phases import PHASES_CSV, phase_lines, phase_table
from .summary import DEFAULT_MAX_CLIENT_LAG_MS, DEFAULT_MAX_SEND_LATENESS_MS, runs_per_run, summarize
from .events import with_stream_events
from .paired import is_paired
from .personas import (COMPARISON_BY_PERSONA_CSV, PERSONA, SUMMARY_BY_PERSONA_CSV, VERDICT_BY_PERSONA_CSV, by_persona,
                       has_personas, persona_of, persona_sections, require_every_persona, slo_lines)
from .turns import SUMMARY_BY_TURN_CSV, by_turn, trimmed_note, turn_lines
from .spans import (REQUEST_SPANS_CSV, SERVER_SPANS_CSV, SPAN_COMPARISON_CSV, attribution_lines, compare_components,
                    coverage_lines, has_spans, plot_slowest, request_spans, span_table)
from .tidy import check_same_model, check_same_workload, failure_table, tidy_markers, tidy_server
from .verdict import Rule, compare, overall, trust_of, untrusted_levels, verdicts, worse_lines


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.splitlines()[0])
    p.add_argument("runs_dir", type=Path)
    p.add_argument("--allow-model-mismatch", action="store_true",
                   help="compare labels whose requests named different models (the same weights under other names)")
    p.add_argument("--baseline", help="profile (or --label) to compare against; default: one named baseline*")
    p.add_argument("--max-throughput-drop", type=float, default=20.0, help="percent (default 20)")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (default 1000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-client-lag-ms", type=float, default=DEFAULT_MAX_CLIENT_LAG_MS,
                   help="also untrusted: a run whose client event-loop lag p99 exceeds this (ms); default 0: only the "
                        "trust rule (the TTFT/ITL errors the lag implies, vllm_locust/core/trust.py)")
    p.add_argument("--max-send-lateness-ms", type=float, default=DEFAULT_MAX_SEND_LATENESS_MS,
                   help="open loop: a run whose send lateness p99 exceeds this did not deliver the asked load (default 10)")
    p.add_argument("--slo", default="", help="goodput thresholds per request, ms: e.g. ttft:500,itl:50,e2e:10000 "
                                             "(itl: the request's own p95 gap; see analysis/goodput.py)")
    p.add_argument("--rule", choices=["latency", "goodput"], default="latency",
                   help="verdict: latency (p95 TTFT and ITL improve, throughput holds; default) or goodput (needs --slo)")
    p.add_argument("--every-persona-within-slo", action="store_true",
                   help="personas runs: a candidate beats the baseline at a level only if each of its personas is also "
                        "within its own SLO there (every threshold at p95; see analysis/personas.py)")
    p.add_argument("--import-bench", action="append", default=[], metavar="FILE.json[:LABEL]",
                   help="a vllm bench serve result (--save-result --save-detailed) as a label; repeat for more")
    p.add_argument("--fail-unless-beats", action="store_true",
                   help="exit 1 unless every candidate beats the baseline at every concurrency")
    p.add_argument("--slo-p95-ttft-ms", type=float, help="exit 1 if a candidate's p95 TTFT exceeds this")
    p.add_argument("--slo-p95-itl-ms", type=float, help="exit 1 if a candidate's p95 ITL exceeds this")
    return p.parse_args(argv)


def pick_baseline(profiles: list[str], wanted: str | None) -> str:
    if wanted:
        if wanted not in profiles:
            raise AnalysisError(f"--baseline {wanted!r} has no runs here; profiles: {', '.join(profiles)}")
        return wanted
    if len(profiles) == 1:
        return profiles[0]  # one label: a summary and a report, no verdict
    named = [p for p in profiles if p.startswith("baseline")]
    if len(named) == 1:
        return named[0]
    raise AnalysisError(f"say which profile is the baseline: --baseline one of {', '.join(profiles)}")


def not_compared(summary, baseline: str, result: dict) -> dict[str, str]:
    """Each candidate label with no verdict (it shares no load level with the baseline), and the
    line that says so with every label's levels: a gate must not pass a candidate it never judged."""
    levels = {p: sorted({level_name(r.request_rate, r.concurrency) for r in rows.itertuples()})
              for p, rows in summary.groupby(SUMMARY.profile)}
    return {p: f"{p}: not compared with {baseline}: no load level in common ({p}: {', '.join(levels[p])}; "
               f"{baseline}: {', '.join(levels.get(baseline, [])) or 'none'})"
            for p in sorted(levels) if p != baseline and p not in result}


def main(argv=None) -> int:
    """Bad input anywhere (an option, a damaged run file: ``load.BadRunFile``) is one line on stderr
    and exit 2, caught here once; exit 1 is kept for a gate that failed."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return analyse(args)
    except AnalysisError as err:
        print(f"analysis: {err}", file=sys.stderr)
        return 2


def analyse(args) -> int:
    try:
        slo = parse_slo(args.slo)
    except ValueError as err:
        raise AnalysisError(str(err)) from None
    if args.rule == "goodput" and slo is None:
        raise AnalysisError("--rule goodput needs --slo, e.g. --slo ttft:500,itl:50")
    imported = import_specs(args.import_bench)
    runs = load_runs(args.runs_dir, allow_empty=bool(imported)) + imported
    if any(is_paired(r) for r in runs):
        raise AnalysisError(f"{args.runs_dir}: a paired run (--paired-host): its two servers' requests are "
                            f"compared pair by pair with python -m analysis.paired {args.runs_dir}")
    check_same_workload(runs)
    model_note = check_same_model(runs, args.allow_model_mismatch)
    samples, requests, run_frame = runs_per_run(runs, slo, args.max_client_lag_ms)
    if samples.empty:
        raise AnalysisError(f"{args.runs_dir}: no measured samples (was every run all warm-up?)")
    baseline = pick_baseline(sorted(samples[IDS.profile].unique()), args.baseline)
    rule = Rule(max_throughput_drop_pct=args.max_throughput_drop, bootstrap=args.bootstrap, seed=args.seed,
                slo=slo, on=args.rule)
    summary = with_calibration(summarize(samples, requests, run_frame, slo, args.max_send_lateness_ms), runs)
    comparison = compare(samples, run_frame, baseline, rule, requests)
    per_level = note_verdicts(verdicts(comparison, rule, trust_of(summary), baseline), summary, baseline)
    personas = by_persona(runs, samples, requests, rule, baseline, args.max_client_lag_ms, args.max_send_lateness_ms)
    if args.every_persona_within_slo:
        if not has_personas(requests):
            print("--every-persona-within-slo: no request carries a persona (not a --personas run): no effect")
        elif not personas.judged:
            print("--every-persona-within-slo: no persona has an SLO (its own slo or --slo): no effect")
        else:
            per_level = require_every_persona(per_level, personas.summary)
    result = overall(per_level)
    summary = with_stream_events(summary, requests)
    persona_summary = with_stream_events(personas.summary, requests.assign(**{PERSONA: persona_of(requests)}),
                                         (PERSONA,)) if len(personas.summary) else personas.summary
    untrusted = untrusted_levels(per_level)
    out = args.runs_dir
    out.mkdir(parents=True, exist_ok=True)
    export_runs([r for r in runs if not r.record.get("imported")], out / "bench-serve")
    failed = failed_runs(args.runs_dir)
    write_atomic(out / "summary.csv", csv_text(summary))
    write_atomic(out / "comparison.csv", csv_text(comparison))
    write_atomic(out / "verdict.csv", csv_text(per_level))
    write_atomic(out / "failures.csv", csv_text(failure_table(requests)))
    turns = by_turn(samples, requests)
    if len(turns):
        write_atomic(out / SUMMARY_BY_TURN_CSV, csv_text(turns))
    if len(persona_summary):
        write_atomic(out / SUMMARY_BY_PERSONA_CSV, csv_text(persona_summary))
        if len(personas.comparison):
            write_atomic(out / COMPARISON_BY_PERSONA_CSV, csv_text(personas.comparison))
            write_atomic(out / VERDICT_BY_PERSONA_CSV, csv_text(personas.verdicts))
    phases = phase_table(runs, samples, requests, run_frame, slo)
    phase_notes = phase_lines(phases)
    if len(phases):  # a steered run: one row per step
        write_atomic(out / PHASES_CSV, csv_text(phases))
    trimmed = trimmed_note(requests)
    spans = span_comparison = None
    span_notes: list[str] = []
    if has_spans(requests):  # --server-spans: vLLM's own span of each request
        spans = pd.concat([span_table(requests)] + [span_table(requests, by) for by in (PERSONA, REQUEST.turn)
                                                     if by in requests], ignore_index=True)
        span_comparison = compare_components(requests, baseline, args.bootstrap, args.seed)
        span_notes = [*attribution_lines(spans, span_comparison), *coverage_lines(requests)]
        write_atomic(out / SERVER_SPANS_CSV, csv_text(spans))
        write_atomic(out / SPAN_COMPARISON_CSV, csv_text(span_comparison))
        write_atomic(out / REQUEST_SPANS_CSV, csv_text(request_spans(requests)))
    server = tidy_server(runs)
    md, html = write_reports(out, ReportInput(
        baseline=baseline, summary=summary, comparison=comparison, per_level=per_level, overall=result,
        attribution=attribution_table(summary, server),
        checklist=checklist(runs, requests, args.max_client_lag_ms, args.max_send_lateness_ms),
        samples=samples, server=server, runs=run_frame, rule=rule, untrusted=untrusted, markers=tidy_markers(runs),
        extra_notes=[*([model_note] if model_note else []), *calibration_lines(runs), *phase_notes], failed=failed, max_client_lag_ms=args.max_client_lag_ms,
        by_turn=turns, turn_notes=[*turn_lines(turns, summary), *([trimmed] if trimmed else [])],
        personas=persona_sections(personas, baseline), every_persona=bool(args.every_persona_within_slo and personas.judged),
        spans=spans, span_lines=span_notes, span_comparison=span_comparison,
        slowest_figure=plot_slowest(requests) if spans is not None else None))
    for line in [*span_notes, *phase_notes]:
        print(line)
    for row in failed.itertuples():
        print(f"failed run (left out): {row.run}: {row.reason}")
    for line in calibration_lines(runs):
        print(line)
    worse_at = worse_lines(comparison)
    for profile, verdict in sorted(result.items()):
        note = (f" (UNTRUSTED at {', '.join(untrusted[profile])}: the client fell behind or did not send the asked load)"
                if profile in untrusted else "")
        print(f"{profile}: {verdict} {baseline}{note}" + (f"; {worse_at[profile]}" if profile in worse_at else ""))
    late = summary[summary[SUMMARY.client_trusted] == False]  # noqa: E712
    for row in late.itertuples():
        print(f"untrusted: {row.profile} {level_name(row.request_rate, row.concurrency)}: client event-loop lag p99 "
              f"{row.client_loop_lag_p99_ms:.2f} ms: its TTFT/ITL include the client's own lateness; "
              + client_lag_advice(lag_text(row.client_loop_lag_p99_ms, row.client_implied_itl_p95_error_ms,
                                           row.client_implied_ttft_p95_error_ms, args.max_client_lag_ms),
                                  row.client_cpu_max_pct))
    short = summary[summary[SUMMARY.load_delivered] == False]  # noqa: E712
    for row in short.itertuples():
        print(f"load not delivered: {row.profile} {level_name(row.request_rate, row.concurrency)}: send lateness p99 "
              f"{row.p99_send_lateness_ms:.1f} ms > {args.max_send_lateness_ms:g} ms ({row.queued_requests} requests waited "
              f"for a free user, mean {row.mean_client_queue_ms:.1f} ms): the server saw less than the asked rate; "
              f"latency from the intended send is p95 TTFT {row.p95_ttft_from_intended_ms:.1f} ms")
    if slo is not None:
        for row in summary.itertuples():
            print(f"goodput {row.profile} {level_name(row.request_rate, row.concurrency)}: {row.slo_met_share:.1%} of requests "
                  f"meet {slo}: {row.goodput_requests_per_s:.2f} req/s, {row.goodput_tokens_per_s:.1f} tok/s")
    for line in slo_lines(personas.summary):
        print(line)
    for (profile, persona), verdict in sorted(personas.overall.items()):
        print(f"persona {persona}: {profile}: {verdict} {baseline}")
    uncompared = not_compared(summary, baseline, result)
    for profile, line in uncompared.items():
        print(line)
    if not result and not uncompared:
        print(f"{baseline}: one label, so a summary and no verdict")
    print(f"wrote {out / 'summary.csv'}, {f'{SUMMARY_BY_TURN_CSV}, ' if len(turns) else ''}"
          f"{f'{SUMMARY_BY_PERSONA_CSV}, ' if len(persona_summary) else ''}{md.name}, {html.name}")

    failed = []
    if args.fail_unless_beats and any(v != "beats" for v in result.values()):
        failed.append("a candidate does not beat the baseline")
    if args.fail_unless_beats and uncompared:
        failed.append(f"{', '.join(uncompared)} not compared with {baseline} (no load level in common)")
    if args.fail_unless_beats and not result and not uncompared:
        failed.append(f"only {baseline} was measured: nothing was compared")
    candidates = summary[summary[SUMMARY.profile] != baseline] if len(result) else summary
    for col, limit in ((pct_col(TTFT, 95), args.slo_p95_ttft_ms), (pct_col(ITL, 95), args.slo_p95_itl_ms)):
        if limit is not None:
            over = candidates[candidates[col] > limit]
            for row in over.itertuples():
                failed.append(f"{row.profile} {level_name(row.request_rate, row.concurrency)}: {col} "
                              f"{getattr(row, col):.1f} > SLO {limit:g}")
    for line in failed:
        print(f"gate failed: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
