"""The report's figures (matplotlib, PNG). Drawing only: no statistics.

Every figure takes one label -> colour mapping (``profile_colors``), so a colour means the same
label in every plot (seen: one colour was the baseline in one plot and the candidate in the next,
because each plot cycled colours over its own lines). Load levels differ by line style, and the
timeline's quantities (running, waiting, KV cache) are drawn in neutral colours no label gets.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from vllm_locust.core.schema import COMPARISON, IDS, LEVEL, PER_RUN, SAMPLE, SUMMARY, TTFT, ITL, level_name  # noqa: E402

from .server import series  # noqa: E402
from .verdict import HIGHER_IS_BETTER  # noqa: E402

# Label colours: matplotlib's tab10 without its grey (kept for the timeline's KV cache).
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
LEVEL_STYLES = ("-", "--", ":", "-.")
RUNNING, WAITING, KV_CACHE = "black", "0.45", "#7f7f7f"
KV_LABEL = "KV cache usage (%)"  # one label and one scale (0-100 %) on every timeline panel


def profile_colors(profiles, baseline: str | None = None) -> dict[str, str]:
    """Label -> colour: the baseline first, then the others by name, so the mapping does not depend
    on the order a plot meets the labels in."""
    names = sorted({str(p) for p in profiles} - {baseline}) if baseline is not None else sorted({str(p) for p in profiles})
    ordered = ([baseline] if baseline is not None and baseline in {str(p) for p in profiles} else []) + names
    return {p: PALETTE[i % len(PALETTE)] for i, p in enumerate(ordered)}


def _colors_for(frame: pd.DataFrame, column: str, colors: dict | None) -> dict:
    return colors if colors is not None else profile_colors(frame[column].unique() if column in frame else [])


def wide_range(values) -> bool:
    """A range a linear axis cannot show: the tail is over 50 times the bulk (log axis then)."""
    v = np.asarray(values, dtype=float)
    v = v[v > 0]
    return len(v) > 1 and np.percentile(v, 99.9) > 50 * max(np.percentile(v, 1), 1e-3)


def _level_styles(frame: pd.DataFrame) -> dict:
    levels = sorted(set(map(tuple, frame[list(LEVEL)].drop_duplicates().to_numpy().tolist()))) if len(frame) else []
    return {level: LEVEL_STYLES[i % len(LEVEL_STYLES)] for i, level in enumerate(levels)}


def plot_distributions(samples: pd.DataFrame, colors: dict | None = None):
    """ECDFs of TTFT and ITL: one line per label and level (colour: label; style: level)."""
    colors = _colors_for(samples, IDS.profile, colors)
    styles = _level_styles(samples)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric in zip(axes, (TTFT, ITL)):
        values = samples[samples[SAMPLE.metric] == metric]
        for (profile, rate, c), g in values.groupby([IDS.profile, *LEVEL]):
            v = np.sort(g[SAMPLE.value_ms].to_numpy())
            if len(v):
                ax.plot(v, np.arange(1, len(v) + 1) / len(v), label=f"{profile} {level_name(rate, c)}",
                        color=colors.get(str(profile)), ls=styles.get((rate, c), "-"))
        if wide_range(values[SAMPLE.value_ms]):
            ax.set_xscale("log")  # an ITL tail of seconds over a bulk of milliseconds
        ax.set(xlabel=f"{metric} (ms)", ylabel="fraction of samples", title=f"{metric} distribution")
        ax.axhline(0.95, color="grey", lw=0.5, ls="--")
        if ax.get_legend_handles_labels()[1]:
            ax.legend(fontsize=7)
        else:  # an embeddings run has no TTFT or ITL: say so instead of a legend of nothing (a UserWarning)
            ax.text(0.5, 0.5, f"no {metric} samples", transform=ax.transAxes, ha="center", va="center")
    fig.tight_layout()
    return fig


def plot_p95(summary: pd.DataFrame, colors: dict | None = None):
    colors = _colors_for(summary, SUMMARY.profile, colors)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, col in zip(axes, (SUMMARY.p95_ttft_ms, SUMMARY.p95_itl_ms)):
        for (profile, open_loop), g in summary.groupby([SUMMARY.profile, summary[SUMMARY.request_rate] > 0]):
            x = g[SUMMARY.request_rate] if open_loop else g[SUMMARY.concurrency]
            ax.plot(x, g[col], marker="o", color=colors.get(str(profile)), ls="--" if open_loop else "-",
                    label=f"{profile} ({'requests/s' if open_loop else 'streams'})")
        ax.set(xlabel="load: concurrency (streams) or request rate (requests/s)", ylabel=col, title=f"{col} against load")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def plot_forest(comparison: pd.DataFrame, colors: dict, baseline: str):
    """Each candidate's change against the baseline with its 95% interval: one row per label, load
    level and metric, a line at 0. Latencies (below 0 is faster) and throughput or goodput (above 0
    is more) get a panel each: on one axis a throughput row read as a latency. None when there is
    nothing to compare (one label)."""
    rows = comparison.dropna(subset=[COMPARISON.change_pct]) if len(comparison) else comparison
    if rows is None or rows.empty:
        return None
    rows = rows.sort_values([COMPARISON.profile, *LEVEL]).reset_index(drop=True)
    more = rows[COMPARISON.metric].isin(HIGHER_IS_BETTER)
    panels = [(part.reset_index(drop=True), xlabel) for part, xlabel in (
        (rows[~more], "latency change against the baseline (%), 95% interval: below 0 is faster"),
        (rows[more], "throughput change against the baseline (%), 95% interval: above 0 is more")) if len(part)]
    heights = [len(part) for part, _ in panels]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 0.28 * sum(heights) + 1.6 * len(panels)), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (part, xlabel) in zip(axes[:, 0], panels):
        _forest_panel(ax, part, colors, baseline)
        ax.set_xlabel(xlabel, fontsize=8)
    axes[0, 0].set_title("Effect sizes")
    fig.tight_layout()
    return fig


def _forest_panel(ax, rows: pd.DataFrame, colors: dict, baseline: str) -> None:
    y = np.arange(len(rows))[::-1]
    for profile, g in rows.groupby(COMPARISON.profile, sort=False):
        ys = y[g.index.to_numpy()]
        point = g[COMPARISON.change_pct].to_numpy(float)
        low = (point - g[COMPARISON.ci_low_pct].to_numpy(float)).clip(min=0)
        high = (g[COMPARISON.ci_high_pct].to_numpy(float) - point).clip(min=0)
        ax.errorbar(point, ys, xerr=np.vstack([np.nan_to_num(low), np.nan_to_num(high)]), fmt="o", ms=4, capsize=3,
                    color=colors.get(str(profile)), label=f"{profile} against {baseline}")
    ax.axvline(0, color="grey", lw=1)
    ax.set_yticks(y, [f"{r.profile} {level_name(r.request_rate, r.concurrency)} {r.metric}" for r in rows.itertuples()],
                  fontsize=7)
    ax.legend(fontsize=7, loc="best")


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
        # a label is free text from the web UI: drawn as typed (no $...$ mathtext)
        axes[0].annotate(str(m.label)[:60], (m.s_into_window, 1 - 0.08 * (i % 3)), xycoords=("data", "axes fraction"),
                         xytext=(3, -10), textcoords="offset points", fontsize=7, color="0.2", parse_math=False)


def plot_timeline(samples: pd.DataFrame, server: pd.DataFrame, runs: pd.DataFrame, markers: pd.DataFrame | None = None,
                  colors: dict | None = None):
    """Per profile (its first run at the highest load, or the run a person marked), one quantity per
    axis: requests running and waiting (left) with KV-cache usage on 0-100 % (right), and below it
    the client's TTFT in ms in the label's colour; markers set from the web UI as dashed lines."""
    colors = _colors_for(runs, PER_RUN.profile, colors)
    placed = markers_in_windows(markers, runs)
    ordered = runs.assign(_marked=runs[PER_RUN.run_key].isin(set(placed["run"])))
    picks = ordered.sort_values(["_marked", PER_RUN.request_rate, PER_RUN.concurrency, PER_RUN.repeat],
                                ascending=[False, False, False, True]).groupby(PER_RUN.profile).head(1)
    fig, axes = plt.subplots(2 * len(picks), 1, figsize=(11, 4.5 * max(1, len(picks))), squeeze=False, sharex=False)
    for i, (_, run) in enumerate(picks.iterrows()):
        ax, below = axes[2 * i, 0], axes[2 * i + 1, 0]
        t0 = run[PER_RUN.window_start_s]
        srv = server[server[IDS.run_key] == run[PER_RUN.run_key]]
        for name, label, color, style in (("vllm:num_requests_waiting", "waiting", WAITING, "--"),
                                          ("vllm:num_requests_running", "running", RUNNING, "-")):
            s = series(srv, name)
            ax.step(s.index - t0, s.values, where="post", label=label, color=color, ls=style)
        ax.set(ylabel="requests", title=f"{run['profile']} {level_name(run['request_rate'], run['concurrency'])} r={run['repeat']}")
        right = ax.twinx()
        kv = series(srv, "vllm:kv_cache_usage_perc")
        right.plot(kv.index - t0, kv.values * 100, color=KV_CACHE, lw=1, label=KV_LABEL)
        right.set_ylim(0, 100)
        right.set_ylabel(KV_LABEL)
        lines, more = ax.get_legend_handles_labels(), right.get_legend_handles_labels()
        ax.legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="upper left")
        ttft = samples[(samples[IDS.run_key] == run[PER_RUN.run_key]) & (samples[SAMPLE.metric] == TTFT)]
        below.scatter(ttft[SAMPLE.t_s] - t0, ttft[SAMPLE.value_ms], s=6, color=colors.get(str(run["profile"])))
        if wide_range(ttft[SAMPLE.value_ms]):
            below.set_yscale("log")
        below.set(xlabel="seconds into the measured window", ylabel="client TTFT (ms)")
        below.set_xlim(ax.get_xlim())
        _draw_markers([ax, below], placed, run[PER_RUN.run_key])
    fig.tight_layout()
    return fig


def png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")  # long tick labels are kept, not clipped
    plt.close(fig)
    return buf.getvalue()
