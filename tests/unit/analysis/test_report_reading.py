"""The report a person reads (issue 21, item 16): it leads with the verdict and a picture of the
effect sizes, its tables fit the page, it renders inline code, shows no column that is empty in
every row, escapes free text (web-UI marker labels), draws each label in one colour everywhere and
the KV cache on one scale, explains sub-0.01 ms ITL gaps, and gives advice only where the
measurements support it."""

import contextlib
import io
import re
from html.parser import HTMLParser

import matplotlib.colors as mcolors
import pandas as pd
import pytest

from analysis.__main__ import main
from tests.unit.analysis.rundir import T0, write_run

SCRIPT = "<script>alert(1)</script>"


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """Two labels at two levels each; the candidate's stream coalesces every 5th gap, a marker with
    an HTML label is set on it, and the two labels' KV-cache usage differ (10-21% and 50-61%)."""
    out = tmp_path_factory.mktemp("report") / "runs"
    for c in (2, 4):
        write_run(out, "baseline", concurrency=c, ttft_ms=40, itl_ms=5, kv=0.1)
        write_run(out, "fast", concurrency=c, ttft_ms=20, itl_ms=2, kv=0.5, coalesced_every=5,
                  markers=[{"t_s": T0 + 3, "label": SCRIPT, "kind": "marker"}])
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        assert main([str(out), "--bootstrap", "50"]) == 0
    return out


class Tables(HTMLParser):
    """Every <table>'s rows of cell texts, and the open tags around each table."""

    def __init__(self):
        super().__init__()
        self.tables, self.stack, self.wrapped, self._cell = [], [], [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.wrapped.append(any(t == "div" and "overflow-x:auto" in (a.get("style") or "") + CSS_OF.get(a.get("class"), "")
                                    for t, a in self.stack))
            self.tables.append([])
        elif tag == "tr" and self.tables:
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""
        self.stack.append((tag, dict(attrs)))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][-1].append(self._cell.strip())
            self._cell = None
        while self.stack and self.stack.pop()[0] != tag:
            pass

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


CSS_OF: dict = {}


def html_tables(text: str) -> Tables:
    CSS_OF.clear()
    for name, rules in re.findall(r"\.([\w-]+)\{([^}]*)\}", text):
        CSS_OF[name] = rules
    parser = Tables()
    parser.feed(text)
    return parser


def md_tables(text: str) -> list[list[list[str]]]:
    tables, current = [], None
    for line in text.splitlines():
        if line.startswith("|"):
            if current is None:
                current = []
                tables.append(current)
            if not set(line) <= set("|-: "):
                current.append([c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
        else:
            current = None
    return tables


def empty_columns(tables) -> list:
    out = []
    for table in tables:
        header, *rows = table
        for i, name in enumerate(header):
            if rows and all(i >= len(r) or r[i] in ("", "nan", "None") for r in rows):
                out.append(name)
    return out


def test_html_renders_inline_code_and_shows_no_backticks(report):
    text = (report / "report.html").read_text()
    assert "`" not in text, "backticks show literally"
    assert "<code>baseline</code>" in text


def test_every_html_table_scrolls_inside_its_own_container(report):
    tables = html_tables((report / "report.html").read_text())
    assert tables.tables and all(tables.wrapped), tables.wrapped


def test_no_column_is_empty_in_every_row(report):
    assert empty_columns(md_tables((report / "report.md").read_text())) == []
    assert empty_columns(html_tables((report / "report.html").read_text()).tables) == []


def test_a_marker_label_is_text_in_both_reports(report):
    for name in ("report.md", "report.html"):
        text = (report / name).read_text()
        assert SCRIPT not in text, name
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text, name


def test_the_effect_sizes_picture_comes_first(report):
    html = (report / "report.html").read_text()
    forest = html.index('alt="effect sizes')
    assert html.index("<h2>Verdict") < forest < html.index("<h2>Per load level")
    assert (report / "report-figures" / "effect-sizes.png").stat().st_size > 1000
    md = (report / "report.md").read_text()
    assert md.index("## Verdict") < md.index("](report-figures/effect-sizes.png)") < md.index("## Per load level")


def test_sub_hundredth_millisecond_gaps_are_explained(report):
    md = (report / "report.md").read_text()
    lines = [l for l in md.splitlines() if "under 0.01 ms" in l]
    assert [l.split(":")[0] for l in lines] == ["- fast c=2", "- fast c=4"], "only the stream that coalesced"
    assert all("19.4% of ITL gaps (14 of 72)" in l and "same socket read" in l for l in lines), lines


# -- the plots, through their matplotlib objects -------------------------------------------------
@pytest.fixture(scope="module")
def frames(report):
    from analysis.load import load_runs
    from analysis.summary import runs_per_run, summarize
    from analysis.tidy import tidy_server
    from analysis.verdict import Rule, compare

    runs = load_runs(report)
    samples, requests, per_run = runs_per_run(runs)
    summary = summarize(samples, requests, per_run)
    comparison = compare(samples, per_run, "baseline", Rule(bootstrap=30), requests)
    return dict(samples=samples, summary=summary, per_run=per_run, server=tidy_server(runs), comparison=comparison)


def test_both_timeline_panels_show_kv_cache_on_one_scale(frames):
    from analysis.report import plot_timeline

    fig = plot_timeline(frames["samples"], frames["server"], frames["per_run"])
    kv = [ax for ax in fig.axes if "KV cache" in ax.get_ylabel()]
    assert len(kv) == 2, [ax.get_ylabel() for ax in fig.axes]
    assert {ax.get_ylabel() for ax in kv} == {"KV cache usage (%)"}
    assert [tuple(ax.get_ylim()) for ax in kv] == [(0.0, 100.0), (0.0, 100.0)]


def test_a_label_has_one_colour_in_every_plot(frames):
    from analysis.report import plot_distributions, plot_forest, plot_p95, profile_colors

    colors = profile_colors(["fast", "baseline"], baseline="baseline")
    assert colors == profile_colors(["baseline", "fast"], baseline="baseline"), "the mapping does not depend on order"
    seen: dict[str, set] = {}
    figures = [plot_distributions(frames["samples"], colors), plot_p95(frames["summary"], colors),
               plot_forest(frames["comparison"], colors, "baseline")]
    for fig in figures:
        for ax in fig.axes:
            for line in ax.get_lines():
                label = line.get_label()
                profile = label.split()[0] if not label.startswith("_") else None
                if profile in ("baseline", "fast"):
                    seen.setdefault(profile, set()).add(mcolors.to_hex(line.get_color()))
            for container in ax.containers:
                profile = (container.get_label() or "").split()[0] if container.get_label() else None
                if profile in ("baseline", "fast"):
                    seen.setdefault(profile, set()).add(mcolors.to_hex(container.lines[0].get_color()))
    assert seen["baseline"] == {mcolors.to_hex(colors["baseline"])}, seen
    assert seen["fast"] == {mcolors.to_hex(colors["fast"])}, seen
    assert colors["baseline"] != colors["fast"]


def test_the_forest_plot_has_one_row_per_metric_and_level(frames):
    from analysis.report import plot_forest, profile_colors

    comparison = frames["comparison"]
    fig = plot_forest(comparison, profile_colors(["baseline", "fast"], "baseline"), "baseline")
    labels = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    rows = comparison.dropna(subset=["change_pct"])
    assert len(labels) == len(rows) and any("c=2" in l and "TTFT" in l.upper() for l in labels), labels


def test_throughput_is_not_drawn_on_the_latency_axis(frames):
    """Seen: throughput's change sat on the axis that says "below 0 is lower latency"."""
    from analysis.report import plot_forest, profile_colors
    from analysis.verdict import HIGHER_IS_BETTER

    comparison = frames["comparison"].dropna(subset=["change_pct"])
    assert comparison["metric"].isin(HIGHER_IS_BETTER).any() and (~comparison["metric"].isin(HIGHER_IS_BETTER)).any()
    fig = plot_forest(comparison, profile_colors(["baseline", "fast"], "baseline"), "baseline")
    for ax in fig.axes:
        metrics = {t.get_text().split()[-1] for t in ax.get_yticklabels()}
        higher = metrics & set(HIGHER_IS_BETTER)
        if "below 0 is faster" in ax.get_xlabel():
            assert not higher, f"{higher} on the latency axis"
        else:
            assert "above 0 is more" in ax.get_xlabel() and metrics == higher, (ax.get_xlabel(), metrics)
    assert len(fig.axes) == 2


def test_a_png_keeps_a_long_label_whole():
    import matplotlib.pyplot as plt
    from PIL import Image

    from analysis.figures import png

    fig, ax = plt.subplots(figsize=(3, 2))
    ax.set_yticks([0], ["a label far longer than the three-inch figure it belongs to, which clipped it"])
    width = Image.open(io.BytesIO(png(fig))).size[0]
    assert width > 3 * 90, f"{width} px: the label was clipped to the figure's 270"


# -- advice only where the measurements support it -----------------------------------------------
def test_more_workers_only_when_the_client_process_used_a_full_core():
    from analysis.advice import client_lag_advice, lag_text

    lag = lag_text(5.0, 4.3, 6.0)
    assert lag == ("loop lag p99 5.0 ms: its stamps imply ITL p95 off by about 4.3 ms (limit 1.5) and TTFT p95 by "
                   "about 6.0 ms (limit 6)")
    assert lag_text(5.0, 4.3, 6.0, max_lag_ms=2.0).endswith("(over the ceiling of 2 ms asked)")
    shared = client_lag_advice(lag, cpu_max_pct=15.0)
    assert "--workers" not in shared and "15%" in shared and "5.0 ms" in shared
    busy = client_lag_advice(lag, cpu_max_pct=97.0)
    assert "--workers" in busy and "97%" in busy
    unknown = client_lag_advice(lag, cpu_max_pct=float("nan"))
    assert "not recorded" in unknown


def test_a_lagging_client_on_a_shared_core_is_not_told_to_add_workers(tmp_path):
    out = tmp_path / "runs"
    write_run(out, "baseline", loop_lag_ms=5.0, cpu_pct=15.0)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        assert main([str(out), "--bootstrap", "20"]) == 0, stderr.getvalue()
    assert "untrusted: baseline c=2" in stdout.getvalue() and "15%" in stdout.getvalue()
    for text in (stdout.getvalue(), (out / "report.md").read_text(), (out / "report.html").read_text()):
        assert "--workers" not in text


def test_the_waiting_gauge_is_called_unmeasured_only_when_it_read_0_throughout():
    from analysis.attribution import attribution_table
    from vllm_locust.core.schema import SERVER

    row = dict(profile="p", request_rate=0.0, concurrency=4, server_queue_ms=300.0, server_prefill_ms=50.0,
               server_decode_ms=400.0, max_num_requests_waiting=0.0, mean_ttft_ms=380.0, server_ttft_mean_ms=360.0,
               preemptions=0.0, mean_kv_cache_usage=0.1, prefix_cache_hit_rate=float("nan"))
    summary = pd.DataFrame([row])

    def server(waiting):
        return pd.DataFrame({SERVER.t_s: range(len(waiting)), SERVER.name: "vllm:num_requests_waiting",
                             SERVER.labels: "{}", SERVER.value: waiting, "profile": "p"})

    never = attribution_table(summary, server([0, 0, 0])).source.iloc[0]
    assert "does not measure" in never
    elsewhere = attribution_table(summary, server([0, 4, 0])).source.iloc[0]
    assert "does not measure" not in elsewhere and "up to 4" in elsewhere
    assert "none waiting at this level" in elsewhere and "elsewhere in the run" not in elsewhere, elsewhere
