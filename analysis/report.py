"""Write report.md and a self-contained report.html (plots inlined). Formatting only: no statistics.

Both files come from one list of sections, so they say the same thing in the same order: the
verdict and a picture of the effect sizes with their intervals first, then the detail. Free text
(labels, marker labels, error messages) is escaped in both (``markup``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from vllm_locust.core.schema import E2E, E2E_FROM_INTENDED, SUMMARY, TTFT, TTFT_FROM_INTENDED, level_name, pct_col, write_atomic
from vllm_locust.core.schema import OPTIONAL_SUMMARY, PART_SUMMARISED

from .advice import client_lag_advice, lag_text
from .figures import (markers_in_windows, plot_distributions, plot_forest, plot_p95, plot_timeline,  # noqa: F401
                      png, profile_colors, wide_range)
from .markup import TABLE_CSS, cells, fmt_number, html_table, html_text, md_table, md_text  # noqa: F401
from .notes import coalesced_gap_notes, delivered_token_notes, energy_and_speculation_notes, number_notes  # noqa: F401
from .summary import DEFAULT_MAX_CLIENT_LAG_MS
from .verdict import Rule

TRUST_SHOWN = [SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, SUMMARY.client_trusted, SUMMARY.client_loop_lag_p99_ms,
               SUMMARY.client_implied_itl_p95_error_ms, SUMMARY.client_implied_ttft_p95_error_ms, SUMMARY.client_cpu_max_pct,
               SUMMARY.client_spawn_to_send_max_ms, SUMMARY.client_minus_server_ttft_ms, SUMMARY.client_minus_server_itl_ms,
               SUMMARY.chunks_per_token, SUMMARY.p50_itl_ms, SUMMARY.p50_itl_per_token_ms, SUMMARY.p95_itl_per_token_ms, SUMMARY.prefix_cache_hit_rate]
TRUST_TEXT = ("Each Locust process timed its own event loop (a 10 ms timer's lateness) during the measured phase: "
              "a chunk is stamped only when the loop gets to it, so the lag implies how far off TTFT and ITL are "
              "(implied errors: a fit of real errors against an exact-timing server, vllm_locust/core/trust.py); "
              "past their limits the numbers include the client's lateness (untrusted). Why it ran late shows in the client process's own CPU "
              "share (client_cpu_max_pct, percent of one core): near a full core the client was short of CPU and more "
              "worker processes help; well below it, something else on the machine held its core, and the advice "
              "below each such level says so. CPU share alone misses bursty overload. "
              "Client minus server: the client's mean TTFT and ITL minus vLLM's own histogram means over the same "
              "window (network, HTTP and detokenization; ITL differences near zero are expected). Chunks per token "
              "below 1 means chunks carried several tokens (speculative decoding, detokenizer hold-back): ITL per "
              "chunk (vLLM's definition) then differs from ITL per token. A prefix-cache hit rate near 0 shows that "
              "prompts did not repeat.")
SUMMARY_SHOWN = [SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, SUMMARY.repeats, SUMMARY.requests, SUMMARY.failures, SUMMARY.p50_ttft_ms, SUMMARY.p95_ttft_ms,
                 SUMMARY.p99_ttft_ms, SUMMARY.p50_itl_ms, SUMMARY.p95_itl_ms, SUMMARY.p99_itl_ms, SUMMARY.p95_tpot_ms, SUMMARY.output_tokens_per_s,
                 SUMMARY.requests_per_s, SUMMARY.max_num_requests_waiting, SUMMARY.mean_kv_cache_usage, SUMMARY.preemptions,
                 SUMMARY.prefix_cache_hit_rate]
OPEN_LOOP_SHOWN = [SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, SUMMARY.requests_per_s,
                   pct_col(TTFT, 50), pct_col(TTFT_FROM_INTENDED, 50), pct_col(TTFT, 95), pct_col(TTFT_FROM_INTENDED, 95),
                   pct_col(E2E, 95), pct_col(E2E_FROM_INTENDED, 95), SUMMARY.p50_send_lateness_ms,
                   SUMMARY.p95_send_lateness_ms, SUMMARY.max_send_lateness_ms, SUMMARY.queued_requests,
                   SUMMARY.mean_client_queue_ms, SUMMARY.load_delivered]
OPEN_LOOP_TEXT = ("Open loop: requests were due at the instants of a seeded arrival schedule (or a trace's "
                  "timestamps), whether or not the server kept up. Latency from the intended instant counts the "
                  "time a request waited to be sent "
                  "(coordinated omission: without it a backlog hides behind the requests that left late). Send "
                  "lateness is intended to actual send; client queue time is the part spent waiting for a free "
                  "user (the cap on requests in flight). A run whose lateness p99 exceeds the threshold did not "
                  "deliver the asked load and is not trusted.")
TURNS_TEXT = ("Requests of conversation sessions by their turn: turns 1 to 5 each, 6+ (every turn above 5) "
              "together, and 2+ (every turn after the first). A later turn sends its session's history again. "
              "TTFT and ITL come from the raw samples of succeeded requests; the session columns describe the load "
              "level (the same on each of its rows): sessions seen in the measured phase, turns each played there, "
              "and sessions whose every request succeeded. The table is summary_by_turn.csv.")
SPANS_TEXT = ("vLLM's own span of each request (--server-spans: OpenTelemetry, joined by the trace id each "
              "request carried): its time in vLLM's queue, in prefill (first token minus scheduled), in decode, "
              "admission (arrival in the engine to its queue) and outside the engine (the client's TTFT minus "
              "vLLM's: the API server, tokenization, network and the client). The tail is the requests above the "
              "level's p95 TTFT; its shares are of their summed client TTFT. Rows by persona and turn follow each "
              "level's (group). The tables are server_spans.csv, comparison_server_spans.csv and, per request, "
              "request_spans.csv.")
PERSONAS_TEXT = ("Each persona's own requests (summary_by_persona.csv): latency from the raw samples of its succeeded "
                 "requests, throughput from its requests completed in the measured window, the share meeting its SLO "
                 "and goodput against its own slo. The server's figures are the level's, in the summary above.")
EVERY_PERSONA_TEXT = ("--every-persona-within-slo: a candidate beats the baseline at a level only if each of its "
                      "personas is also within its own SLO there.")
STREAM_EVENTS_TEXT = ("Stream events past the first token, ms from the send, per succeeded request: TTFR the first "
                      "reasoning delta, TTFA the first answer delta, TOOL_CALL the first tool-call delta, TOOL_ARGS "
                      "the tool arguments complete; mean reasoning and answer tokens. ITL_REASONING and ITL_ANSWER: "
                      "the gaps within the reasoning and within the answer, from the raw samples (the gap from the "
                      "reasoning to the answer is in neither; ITL above keeps every gap).")
STREAM_EVENT_PREFIXES = ("p50_ttfr", "p95_ttfr", "p50_ttfa", "p95_ttfa", "p50_tool_", "p95_tool_", "mean_reasoning_",
                         "mean_answer_", *(column for summarised in PART_SUMMARISED for column in summarised.columns()))
GOODPUT_SHOWN = [SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, SUMMARY.slo, SUMMARY.slo_met_share,
                 SUMMARY.goodput_requests_per_s, SUMMARY.goodput_tokens_per_s, SUMMARY.requests_per_s]


def _lead(item) -> tuple[str, str]:
    return item if isinstance(item, tuple) else ("", item)


def _md(part) -> list[str]:
    kind, value = part
    if kind == "text":
        return [md_text(value), ""]
    if kind == "list":
        return [f"- **{md_text(lead)}**: {md_text(text)}" if lead else f"- {md_text(text)}"
                for lead, text in map(_lead, value)] + [""]
    if kind == "checks":
        return [f"- [{'x' if ok else ' ' if ok is False else '?'}] {md_text(text)}" for ok, text in value] + [""]
    if kind == "table":
        return [md_table(value), ""]
    return [f"![{value.replace('-', ' ')}](report-figures/{value}.png)", ""]


def _html(part, figures: dict[str, bytes]) -> str:
    kind, value = part
    if kind == "text":
        return f"<p>{html_text(value)}</p>"
    if kind == "list":
        return "<ul>" + "".join(f"<li><b>{html_text(lead)}</b>: {html_text(text)}</li>" if lead else
                                f"<li>{html_text(text)}</li>" for lead, text in map(_lead, value)) + "</ul>"
    if kind == "checks":
        return "<ul>" + "".join(f"<li>{'&#9745;' if ok else '&#9744;' if ok is False else '?'} {html_text(text)}</li>"
                                for ok, text in value) + "</ul>"
    if kind == "table":
        return html_table(value)
    return (f'<img alt="{value.replace("-", " ")}" src="data:image/png;base64,{base64.b64encode(figures[value]).decode()}" '
            'style="max-width:100%">')


@dataclass
class ReportInput:
    """Everything the report shows, computed before it (``report.py`` only formats)."""

    baseline: str
    summary: pd.DataFrame  # schema.SUMMARY
    comparison: pd.DataFrame  # schema.COMPARISON
    per_level: pd.DataFrame  # schema.VERDICT
    overall: dict  # profile -> "beats" / "mixed" / "does not beat"
    attribution: pd.DataFrame
    checklist: list  # (item, ok, facts)
    samples: pd.DataFrame
    server: pd.DataFrame
    runs: pd.DataFrame  # schema.PER_RUN
    rule: Rule
    untrusted: dict = field(default_factory=dict)  # profile -> the levels where the client was not trusted
    markers: pd.DataFrame | None = None
    extra_notes: list[str] = field(default_factory=list)
    failed: pd.DataFrame | None = None  # load.failed_runs
    max_client_lag_ms: float = DEFAULT_MAX_CLIENT_LAG_MS
    by_turn: pd.DataFrame | None = None  # turns.BY_TURN: conversation runs only
    turn_notes: list[str] = field(default_factory=list)  # turns.turn_lines and trimmed_note
    personas: list = field(default_factory=list)  # personas.persona_sections: (name, SLO text, table, lines)
    every_persona: bool = False  # --every-persona-within-slo took effect
    spans: pd.DataFrame | None = None  # spans.SPANS: vLLM's own spans joined (--server-spans runs only)
    span_lines: list[str] = field(default_factory=list)  # spans.attribution_lines and coverage_lines
    span_comparison: pd.DataFrame | None = None  # spans.SPAN_COMPARISON
    slowest_figure: object = None  # spans.plot_slowest's figure


def sections(r: ReportInput, figures: dict[str, bytes], forest) -> list[tuple[str, list]]:
    """The report as data: (heading, parts), each part ``(kind, value)`` for ``_md`` / ``_html``."""
    summary, baseline, untrusted = r.summary, r.baseline, r.untrusted
    placed = markers_in_windows(r.markers, r.runs)
    notes = [*r.extra_notes, *number_notes(summary), *coalesced_gap_notes(r.samples),
             *energy_and_speculation_notes(summary)]

    def verdict_text(p, v):
        note = (f" (UNTRUSTED at {', '.join(untrusted[p])}: the client fell behind or did not send the asked load, "
                "so the numbers include its own lateness)") if p in untrusted else ""
        return f"{v} the baseline `{baseline}`{note}"

    verdict_lines = [(str(p), verdict_text(p, v)) for p, v in sorted(r.overall.items())] or \
        ["only one label was measured: a summary, no verdict"]
    picture = ([("text", "Each candidate's change against the baseline, one row per metric and load level, with its "
                         "95% interval (the picture of the table \"Changes against the baseline\" below):"),
                ("image", "effect-sizes")] if forest is not None else [])
    late = summary[summary[SUMMARY.client_trusted] == False]  # noqa: E712 (None: not audited)
    advice = [(f"{row.profile} {level_name(row.request_rate, row.concurrency)}",
               client_lag_advice(lag_text(row.client_loop_lag_p99_ms, row.client_implied_itl_p95_error_ms,
                                          row.client_implied_ttft_p95_error_ms, r.max_client_lag_ms), row.client_cpu_max_pct))
              for row in late.itertuples()]
    # open loop by its rows (send lateness), not by an asked rate: a trace replay asks none
    open_loop = summary[summary[SUMMARY.p99_send_lateness_ms].notna()]
    by_turn = r.by_turn if r.by_turn is not None else pd.DataFrame()
    events = [c for c in summary.columns if c.startswith(STREAM_EVENT_PREFIXES)]
    persona_parts = [(f"Persona {name}", [("text", slo_text), ("table", table), *([("list", lines)] if lines else [])])
                     for name, slo_text, table, lines in r.personas]
    failed = r.failed
    return [
        ("Verdict", [("list", verdict_lines), *picture, ("text", r.rule.text),
                     *([("text", EVERY_PERSONA_TEXT)] if r.every_persona else [])]),
        ("Per load level", [("table", r.per_level)]),
        ("Changes against the baseline (percent, 95% interval)", [("table", r.comparison)]),
        ("Summary (percentiles from raw samples)",
         [("table", summary[[*SUMMARY_SHOWN, *(c for c in [OPTIONAL_SUMMARY.inputs_per_s] if c in summary)]])]),
        *((("Stream events: reasoning, answer, tool calls",
            [("text", STREAM_EVENTS_TEXT), ("table", summary[[*SUMMARY_SHOWN[:3], *events]])]),) if events else ()),
        *((("Personas", [("text", PERSONAS_TEXT)]),) if persona_parts else ()),
        *persona_parts,
        *((("Conversations: TTFT by turn", [("text", TURNS_TEXT), *([("list", r.turn_notes)] if r.turn_notes else []),
                                              ("table", by_turn)]),) if len(by_turn) else ()),
        *((("Where each request's time went (vLLM's spans)",
            [("text", SPANS_TEXT), *([("list", r.span_lines)] if r.span_lines else []), ("table", r.spans),
             *([("table", r.span_comparison)] if r.span_comparison is not None and len(r.span_comparison) else []),
             *([("image", "slowest-requests")] if "slowest-requests" in figures else [])]),)
          if r.spans is not None and len(r.spans) else ()),
        ("Can the client's numbers be trusted?", [("text", TRUST_TEXT), *([("list", advice)] if advice else []),
                                                  ("table", summary[TRUST_SHOWN])]),
        *((("Open loop: latency from the intended send, lateness, client queue",
            [("text", OPEN_LOOP_TEXT), ("table", open_loop[OPEN_LOOP_SHOWN])]),) if len(open_loop) else ()),
        *((("Goodput", [("table", summary[GOODPUT_SHOWN])]),) if r.rule.slo is not None else ()),
        ("Where the latency came from", [("list", [(f"{row.profile} {level_name(row.request_rate, row.concurrency)}",
                                                    row.source) for row in r.attribution.itertuples()])]),
        ("Release checklist", [("checks", [(ok, f"{item}: {facts}") for item, ok, facts in r.checklist])]),
        *((("Runs that failed (kept out of the numbers; their raw files are kept)", [("table", failed)]),)
          if failed is not None and len(failed) else ()),
        *((("Markers set during the runs (web UI)", [("table", placed)]),) if len(placed) else ()),
        *((("Notes on the numbers", [("list", notes)]),) if notes else ()),
        ("Figures", [("image", name) for name in figures if name not in ("effect-sizes", "slowest-requests")]),
    ]


def write_reports(out_dir: Path, r: ReportInput) -> tuple[Path, Path]:
    """``report.md`` and ``report.html`` (and ``report-figures/*.png``) in ``out_dir``, from one list of sections."""
    summary, baseline = r.summary, r.baseline
    colors = profile_colors(summary[SUMMARY.profile].unique(), baseline)
    forest = plot_forest(r.comparison, colors, baseline)
    figures = {**({"effect-sizes": png(forest)} if forest is not None else {}),
               "distributions": png(plot_distributions(r.samples, colors)), "p95-vs-load": png(plot_p95(summary, colors)),
               "timeline": png(plot_timeline(r.samples, r.server, r.runs, r.markers, colors))}
    if r.slowest_figure is not None:
        figures["slowest-requests"] = png(r.slowest_figure)
    fig_dir = out_dir / "report-figures"
    fig_dir.mkdir(exist_ok=True)
    for name, data in figures.items():
        write_atomic(fig_dir / f"{name}.png", data)
    parts_of = sections(r, figures, forest)
    title = "Baseline vs candidates: vLLM latency report"
    md = [f"# {title}", ""]
    for heading, parts in parts_of:
        md += [f"## {heading}", ""]
        for part in parts:
            md += _md(part)
    md_path = out_dir / "report.md"
    write_atomic(md_path, "\n".join(md))

    body = [f"<h1>{title}</h1>"]
    for heading, parts in parts_of:
        body.append(f"<h2>{html_text(heading)}</h2>" + "".join(_html(part, figures) for part in parts))
    html_path = out_dir / "report.html"
    write_atomic(html_path, "<!doctype html><html><head><meta charset='utf-8'><title>vLLM latency report</title>"
                            "<style>body{font-family:sans-serif;max-width:1100px;margin:auto;padding:0 1em}"
                            + TABLE_CSS + "</style></head><body>" + "\n".join(body) + "</body></html>")
    return md_path, html_path
