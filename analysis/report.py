"""Write report.md and a self-contained report.html (plots inlined). Formatting only: no statistics."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from vllm_locust.schema import (IDS, LEVEL, PER_RUN, SAMPLE, SUMMARY, TTFT, level_name, pct_col,  # noqa: E402
                                write_atomic)

from .server import series  # noqa: E402

TRUST_SHOWN = [SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, SUMMARY.client_trusted, SUMMARY.client_loop_lag_p99_ms, SUMMARY.client_cpu_max_pct,
               SUMMARY.client_spawn_to_send_max_ms, SUMMARY.client_minus_server_ttft_ms, SUMMARY.client_minus_server_itl_ms,
               SUMMARY.chunks_per_token, SUMMARY.p50_itl_ms, SUMMARY.p50_itl_per_token_ms, SUMMARY.p95_itl_per_token_ms, SUMMARY.prefix_cache_hit_rate]
TRUST_TEXT = ("Each Locust process timed its own event loop (a 10 ms timer's lateness) during the measured phase: "
              "a chunk is stamped only when the loop gets to it, so a loop-lag p99 over the threshold means TTFT and "
              "ITL include the client's lateness (untrusted; add --workers). CPU share alone misses bursty overload. "
              "Client minus server: the client's mean TTFT and ITL minus vLLM's own histogram means over the same "
              "window (network, HTTP and detokenization; ITL differences near zero are expected). Chunks per token "
              "below 1 means chunks carried several tokens (speculative decoding, detokenizer hold-back): ITL per "
              "chunk (vLLM's definition) then differs from ITL per token. A prefix-cache hit rate near 0 shows that "
              "prompts did not repeat.")
SUMMARY_SHOWN = [SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, SUMMARY.repeats, SUMMARY.requests, SUMMARY.failures, SUMMARY.p50_ttft_ms, SUMMARY.p95_ttft_ms,
                 SUMMARY.p99_ttft_ms, SUMMARY.p50_itl_ms, SUMMARY.p95_itl_ms, SUMMARY.p99_itl_ms, SUMMARY.p95_tpot_ms, SUMMARY.output_tokens_per_s,
                 SUMMARY.requests_per_s, SUMMARY.max_num_requests_waiting, SUMMARY.mean_kv_cache_usage, SUMMARY.preemptions]
OPEN_LOOP_SHOWN = [SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, SUMMARY.requests_per_s,
                   pct_col("TTFT", 50), pct_col("TTFT_FROM_INTENDED", 50), pct_col("TTFT", 95), pct_col("TTFT_FROM_INTENDED", 95),
                   pct_col("E2E", 95), pct_col("E2E_FROM_INTENDED", 95), SUMMARY.p50_send_lateness_ms,
                   SUMMARY.p95_send_lateness_ms, SUMMARY.max_send_lateness_ms, SUMMARY.queued_requests,
                   SUMMARY.mean_client_queue_ms, SUMMARY.load_delivered]
OPEN_LOOP_TEXT = ("Open loop: requests were due at the instants of a seeded arrival schedule, whether or not the "
                  "server kept up. Latency from the intended instant counts the time a request waited to be sent "
                  "(coordinated omission: without it a backlog hides behind the requests that left late). Send "
                  "lateness is intended to actual send; client queue time is the part spent waiting for a free "
                  "user (the cap on requests in flight). A run whose lateness p99 exceeds the threshold did not "
                  "deliver the asked load and is not trusted.")
GOODPUT_SHOWN = [SUMMARY.profile, SUMMARY.request_rate, SUMMARY.concurrency, SUMMARY.slo, SUMMARY.slo_met_share,
                 SUMMARY.goodput_requests_per_s, SUMMARY.goodput_tokens_per_s, SUMMARY.requests_per_s]


def _ecdf(ax, values, label):
    v = np.sort(values)
    if len(v):
        ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=label)


def wide_range(values) -> bool:
    """A range a linear axis cannot show: the tail is over 50 times the bulk (log axis then)."""
    v = np.asarray(values, dtype=float)
    v = v[v > 0]
    return len(v) > 1 and np.percentile(v, 99.9) > 50 * max(np.percentile(v, 1), 1e-3)


def plot_distributions(samples: pd.DataFrame):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric in zip(axes, ("TTFT", "ITL")):
        values = samples[samples[SAMPLE.metric] == metric]
        for (profile, rate, c), g in values.groupby([IDS.profile, *LEVEL]):
            _ecdf(ax, g[SAMPLE.value_ms].to_numpy(), f"{profile} {level_name(rate, c)}")
        if wide_range(values[SAMPLE.value_ms]):
            ax.set_xscale("log")  # an ITL tail of seconds over a bulk of milliseconds
        ax.set(xlabel=f"{metric} (ms)", ylabel="fraction of samples", title=f"{metric} distribution")
        ax.axhline(0.95, color="grey", lw=0.5, ls="--")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_p95(summary: pd.DataFrame):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, col in zip(axes, (SUMMARY.p95_ttft_ms, SUMMARY.p95_itl_ms)):
        for (profile, open_loop), g in summary.groupby([SUMMARY.profile, summary[SUMMARY.request_rate] > 0]):
            x = g[SUMMARY.request_rate] if open_loop else g[SUMMARY.concurrency]
            ax.plot(x, g[col], marker="o", label=f"{profile} ({'requests/s' if open_loop else 'streams'})")
        ax.set(xlabel="load: concurrency (streams) or request rate (requests/s)", ylabel=col, title=f"{col} against load")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


BURST_ITL_MS = 1.0  # a client ITL p50 below this: chunks came in bursts, not one per decode step


def number_notes(summary: pd.DataFrame) -> list[str]:
    """A line wherever a figure is not what it seems at first reading."""
    notes = []
    for r in summary.itertuples(index=False):
        row = r._asdict()
        where = f"{row['profile']} {level_name(row['request_rate'], row['concurrency'])}"
        p50_itl, server_itl = row.get(pct_col("ITL", 50)), row.get("server_itl_mean_ms")
        if pd.notna(p50_itl) and p50_itl < BURST_ITL_MS:
            seen = f" while vLLM's own ITL mean is {fmt_number(server_itl)} ms" if pd.notna(server_itl) else ""
            notes.append(f"{where}: client ITL p50 {fmt_number(p50_itl)} ms{seen}: chunks reach the client in bursts "
                         f"(the API server or the network delivers several at once, {fmt_number(row.get('chunks_per_token'))} "
                         "chunks per token), so half the gaps are the spacing inside a burst; the wait between "
                         "bursts shows in p95/p99 ITL and in TPOT")
        kv = row.get("mean_kv_cache_usage")
        if pd.notna(kv) and kv == 0 and (row.get("max_num_requests_running") or 0) == 0 and (row.get("requests") or 0) > 0:
            notes.append(f"{where}: vLLM's scheduler gauges (running, waiting, KV cache) read 0 while requests were "
                         "served (seen on its CPU build): they were not measured, they are not zero")
    notes += delivered_token_notes(summary)
    return notes


DELIVERED_TOLERANCE = 0.01  # token counts per request that differ more than 1% across labels get a note


def delivered_token_notes(summary: pd.DataFrame) -> list[str]:
    """Where labels asked for the same load but their servers delivered different token counts per
    request (an engine that stops early, or counts prompt tokens its own way): say by how much,
    since throughput and TPOT compare differently then."""
    notes = []
    for (rate, concurrency), level in summary.groupby([SUMMARY.request_rate, SUMMARY.concurrency]):
        for column, what in (("mean_output_tokens", "output"), ("mean_prompt_tokens", "prompt")):
            if column not in level:
                continue
            values = level.set_index(SUMMARY.profile)[column].dropna()
            if len(values) < 2 or values.max() <= 0 or values.min() / values.max() >= 1 - DELIVERED_TOLERANCE:
                continue
            listing = ", ".join(f"{p} {fmt_number(v)}" for p, v in values.items())
            notes.append(f"{level_name(rate, concurrency)}: the same asked load delivered different {what} tokens per "
                         f"request ({listing}): compare throughput in tokens/s and TPOT with that in mind")
    return notes


def markers_in_windows(markers: pd.DataFrame, runs: pd.DataFrame) -> pd.DataFrame:
    """Each marker once, with the run whose measured window holds it and its second in that window
    (a marker between steps keeps the nearest run before it)."""
    if markers is None or markers.empty:
        return pd.DataFrame(columns=["profile", "run", "s_into_window", "kind", "label"])
    rows = []
    for m in markers.drop_duplicates(["profile", "t_s", "label"]).sort_values("t_s").itertuples():
        own = runs[runs[PER_RUN.profile] == m.profile].sort_values(PER_RUN.window_start_s)
        before = own[own[PER_RUN.window_start_s] <= m.t_s]
        run = before.iloc[-1] if len(before) else (own.iloc[0] if len(own) else None)
        if run is None:
            continue
        rows.append({"profile": m.profile, "run": run[PER_RUN.run_key],
                     "s_into_window": round(m.t_s - run[PER_RUN.window_start_s], 1), "kind": m.kind, "label": m.label})
    return pd.DataFrame(rows, columns=["profile", "run", "s_into_window", "kind", "label"])


def _draw_markers(axes, placed: pd.DataFrame, run_key: str) -> None:
    for i, m in enumerate(placed[placed["run"] == run_key].itertuples()):
        for ax in axes:
            ax.axvline(m.s_into_window, color="0.3", ls="--", lw=1)
        axes[0].annotate(m.label, (m.s_into_window, 1 - 0.08 * (i % 3)), xycoords=("data", "axes fraction"),
                         xytext=(3, -10), textcoords="offset points", fontsize=7, color="0.2")


def plot_timeline(samples: pd.DataFrame, server: pd.DataFrame, runs: pd.DataFrame, markers: pd.DataFrame | None = None):
    """Per profile (its first run at the highest load, or the run a person marked), one quantity per
    axis: requests running and waiting (left) with KV-cache usage in % (right), and below it the
    client's TTFT in ms; markers set from the web UI as dashed lines."""
    placed = markers_in_windows(markers, runs)
    ordered = runs.assign(_marked=runs[PER_RUN.run_key].isin(set(placed["run"])))
    picks = ordered.sort_values(["_marked", PER_RUN.request_rate, PER_RUN.concurrency, PER_RUN.repeat],
                                ascending=[False, False, False, True]).groupby(PER_RUN.profile).head(1)
    fig, axes = plt.subplots(2 * len(picks), 1, figsize=(11, 4.5 * max(1, len(picks))), squeeze=False, sharex=False)
    for i, (_, run) in enumerate(picks.iterrows()):
        ax, below = axes[2 * i, 0], axes[2 * i + 1, 0]
        t0 = run[PER_RUN.window_start_s]
        srv = server[server[IDS.run_key] == run[PER_RUN.run_key]]
        for name, label in (("vllm:num_requests_waiting", "waiting"), ("vllm:num_requests_running", "running")):
            s = series(srv, name)
            ax.step(s.index - t0, s.values, where="post", label=label)
        ax.set(ylabel="requests", title=f"{run['profile']} {level_name(run['request_rate'], run['concurrency'])} r={run['repeat']}")
        right = ax.twinx()
        kv = series(srv, "vllm:kv_cache_usage_perc")
        right.plot(kv.index - t0, kv.values * 100, color="tab:green", lw=1, label="KV cache %")
        right.set_ylabel("KV cache (%)")
        lines, more = ax.get_legend_handles_labels(), right.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
        ttft = samples[(samples[IDS.run_key] == run[PER_RUN.run_key]) & (samples[SAMPLE.metric] == TTFT)]
        below.scatter(ttft[SAMPLE.t_s] - t0, ttft[SAMPLE.value_ms], s=6, color="tab:red")
        if wide_range(ttft[SAMPLE.value_ms]):
            below.set_yscale("log")
        below.set(xlabel="seconds into the measured window", ylabel="client TTFT (ms)")
        below.set_xlim(ax.get_xlim())
        _draw_markers([ax, below], placed, run[PER_RUN.run_key])
    fig.tight_layout()
    return fig


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return buf.getvalue()


def fmt_number(x) -> str:
    """A table cell a person can read at its scale: 0.0003 stays 0.0003 (not 0.00), 1234.5 is 1234.5."""
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, (float, np.floating)):
        return "" if x is None else str(x)
    if np.isnan(x):
        return ""
    if x == 0 or abs(x) >= 100:
        return f"{x:.1f}" if x else "0"
    return f"{x:.2f}" if abs(x) >= 1 else f"{x:.2g}"


def _cells(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.map(fmt_number) if len(frame) else frame


def _table_md(frame: pd.DataFrame) -> str:
    return _cells(frame).to_markdown(index=False) if len(frame) else "(none)"


def write_reports(out_dir: Path, *, baseline: str, summary: pd.DataFrame, comparison: pd.DataFrame,
                  per_level: pd.DataFrame, overall: dict, attribution: pd.DataFrame, checklist: list,
                  samples: pd.DataFrame, server: pd.DataFrame, runs: pd.DataFrame, rule,
                  untrusted: dict | None = None, markers: pd.DataFrame | None = None,
                  extra_notes: list[str] | None = None, failed: pd.DataFrame | None = None) -> tuple[Path, Path]:
    untrusted = untrusted or {}
    trust = summary[TRUST_SHOWN]
    figures = {"distributions": _png(plot_distributions(samples)), "p95-vs-load": _png(plot_p95(summary)),
               "timeline": _png(plot_timeline(samples, server, runs, markers))}
    placed = markers_in_windows(markers, runs)
    notes = [*(extra_notes or []), *number_notes(summary)]
    fig_dir = out_dir / "report-figures"
    fig_dir.mkdir(exist_ok=True)
    for name, data in figures.items():
        write_atomic(fig_dir / f"{name}.png", data)

    def verdict_text(p, v):
        note = (f" (UNTRUSTED at {', '.join(untrusted[p])}: the client fell behind or did not send the asked load, "
                "so the numbers include its own lateness)") if p in untrusted else ""
        return f"{v} the baseline `{baseline}`{note}"

    verdict_lines = [f"- **{p}**: {verdict_text(p, v)}" for p, v in sorted(overall.items())] or \
        ["- only one label was measured: a summary, no verdict"]
    check_lines = [f"- [{'x' if ok else ' ' if ok is False else '?'}] {item}: {facts}" for item, ok, facts in checklist]
    rule_text = (f"Rule: the share of requests meeting the SLO ({rule.slo}) rises with a 95% bootstrap interval that "
                 f"excludes zero ({rule.bootstrap} resamples of requests within repeats)." if rule.on == "goodput" else
                 "Rule: p95 TTFT and p95 ITL both improve with 95% bootstrap intervals that exclude zero, and output "
                 f"throughput falls by at most {rule.max_throughput_drop_pct:g}% ({rule.bootstrap} resamples of "
                 "requests within repeats).")
    open_loop = summary[summary[SUMMARY.request_rate] > 0]
    sections = [
        ("Verdict", "\n".join(verdict_lines) + "\n\n" + rule_text),
        ("Per load level", _table_md(per_level)),
        ("Changes against the baseline (percent, 95% interval)", _table_md(comparison)),
        ("Summary (percentiles from raw samples)", _table_md(summary[SUMMARY_SHOWN])),
        ("Can the client's numbers be trusted?", TRUST_TEXT + "\n\n" + _table_md(trust)),
        *((("Open loop: latency from the intended send, lateness, client queue", OPEN_LOOP_TEXT + "\n\n"
            + _table_md(open_loop[OPEN_LOOP_SHOWN])),) if len(open_loop) else ()),
        *((("Goodput", _table_md(summary[GOODPUT_SHOWN])),) if rule.slo is not None else ()),
        ("Where the latency came from", "\n".join(f"- {r.profile} {level_name(r.request_rate, r.concurrency)}: {r.source}"
                                                   for r in attribution.itertuples())),
        ("Release checklist", "\n".join(check_lines)),
        *((("Runs that failed (kept out of the numbers; their raw files are kept)", _table_md(failed)),)
          if failed is not None and len(failed) else ()),
        *((("Markers set during the runs (web UI)", _table_md(placed)),) if len(placed) else ()),
        *((("Notes on the numbers", "\n".join(f"- {n}" for n in notes)),) if notes else ()),
    ]
    md = ["# Baseline vs candidates: vLLM latency report", ""]
    for title, body in sections:
        md += [f"## {title}", "", body, ""]
    md += ["## Figures", ""] + [f"![{n}](report-figures/{n}.png)" for n in figures] + [""]
    md_path = out_dir / "report.md"
    write_atomic(md_path, "\n".join(md))

    def table_html(frame: pd.DataFrame) -> str:
        return _cells(frame).to_html(index=False, border=0) if len(frame) else "<p>(none)</p>"

    body = ["<h1>Baseline vs candidates: vLLM latency report</h1>",
            "<h2>Verdict</h2><ul>" + ("".join(f"<li><b>{html.escape(p)}</b>: {html.escape(verdict_text(p, v))}</li>"
                                              for p, v in sorted(overall.items()))
                                      or "<li>only one label was measured: a summary, no verdict</li>") + "</ul>",
            f"<p>{html.escape(sections[0][1].split(chr(10) * 2, 1)[-1])}</p>",
            "<h2>Per load level</h2>" + table_html(per_level),
            "<h2>Changes against the baseline</h2>" + table_html(comparison),
            "<h2>Summary</h2>" + table_html(summary[SUMMARY_SHOWN]),
            "<h2>Can the client's numbers be trusted?</h2><p>" + html.escape(TRUST_TEXT) + "</p>" + table_html(trust),
            *(["<h2>Open loop</h2><p>" + html.escape(OPEN_LOOP_TEXT) + "</p>" + table_html(open_loop[OPEN_LOOP_SHOWN])]
              if len(open_loop) else []),
            *(["<h2>Goodput</h2>" + table_html(summary[GOODPUT_SHOWN])] if rule.slo is not None else []),
            "<h2>Where the latency came from</h2><ul>" + "".join(
                f"<li>{html.escape(r.profile)} {level_name(r.request_rate, r.concurrency)}: {html.escape(r.source)}</li>"
                for r in attribution.itertuples()) + "</ul>",
            "<h2>Release checklist</h2><ul>" + "".join(
                f"<li>{'&#9745;' if ok else '&#9744;' if ok is False else '?'} {html.escape(item)}: {html.escape(facts)}</li>"
                for item, ok, facts in checklist) + "</ul>",
            *(["<h2>Runs that failed</h2><p>Kept out of the numbers; their raw files are kept.</p>" + table_html(failed)]
              if failed is not None and len(failed) else []),
            *(["<h2>Markers set during the runs (web UI)</h2>" + table_html(placed)] if len(placed) else []),
            *(["<h2>Notes on the numbers</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"]
              if notes else []),
            "<h2>Figures</h2>" + "".join(
                f'<img alt="{n}" src="data:image/png;base64,{base64.b64encode(d).decode()}" style="max-width:100%">'
                for n, d in figures.items())]
    html_path = out_dir / "report.html"
    write_atomic(html_path, "<!doctype html><html><head><meta charset='utf-8'><title>vLLM latency report</title>"
                         "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse;"
                         "font-size:12px}td,th{padding:2px 6px;border-bottom:1px solid #ddd;text-align:right}</style>"
                         "</head><body>" + "\n".join(body) + "</body></html>")
    return md_path, html_path
