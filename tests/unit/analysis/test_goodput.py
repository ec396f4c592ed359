"""Goodput: per-request thresholds, p95 ITL per request, latency from the intended send, failures."""

import pandas as pd
import pytest

from analysis.goodput import goodput, met_slo, parse_slo
from analysis.summary import open_loop_figures


def frames():
    # four requests of one run: fast, slow first token, one stalling stream, and a failure
    req = pd.DataFrame({
        "run_key": "k", "repeat": 1, "request_id": ["a", "b", "c", "d"],
        "ttft_ms": [100.0, 700.0, 100.0, None], "e2e_ms": [1000.0, 1600.0, 3000.0, None],
        "completion_tokens": [10, 10, 10, None], "content_chunks": [10, 10, 10, 0],
        "error": [None, None, None, "HTTP 500: boom"], "lateness_ms": [None] * 4, "queue_ms": [None] * 4})
    gaps = {"a": [10.0] * 9, "b": [10.0] * 9, "c": [10.0] * 7 + [900.0, 900.0]}
    samples = pd.DataFrame([{"run_key": "k", "request_id": r, "metric": "ITL", "value_ms": g}
                            for r, gs in gaps.items() for g in gs])
    return req, samples


def test_each_threshold_and_a_failure():
    req, samples = frames()
    assert met_slo(req, samples, parse_slo("ttft:500")).tolist() == [True, False, True, False]
    # c's own p95 ITL is a stall (two gaps of nine at 900 ms); a's and b's are 10 ms
    assert met_slo(req, samples, parse_slo("itl:50")).tolist() == [True, True, False, False]
    assert met_slo(req, samples, parse_slo("ttft:500,itl:50,e2e:2000")).tolist() == [True, False, False, False]
    # tpot: (e2e - ttft) / 9
    assert met_slo(req, samples, parse_slo("tpot:150")).tolist() == [True, True, False, False]


def test_goodput_share_and_rates():
    req, samples = frames()
    g = goodput(req, samples, parse_slo("ttft:500"), duration_s=2.0)
    assert g["slo_met_share"] == 0.5 and g["goodput_requests_per_s"] == 1.0 and g["goodput_tokens_per_s"] == 10.0
    assert g["slo"] == "ttft:500"


def test_open_loop_ttft_counts_from_the_intended_send():
    req, samples = frames()
    req["lateness_ms"] = [450.0, 0.0, 0.0, 0.0]  # a left 450 ms late: 550 ms from when it was due
    assert met_slo(req, samples, parse_slo("ttft:500")).tolist() == [False, False, True, False]


def test_lateness_queue_and_delivery():
    req, _ = frames()
    req["lateness_ms"] = [1.0, 2.0, 30.0, 1.5]
    req["queue_ms"] = [0.0, 0.0, 28.0, 0.0]
    out = open_loop_figures(req, max_send_lateness_ms=10.0)
    assert out["max_send_lateness_ms"] == 30.0 and out["queued_requests"] == 1
    assert out["mean_client_queue_ms"] == pytest.approx(7.0)
    assert out["load_delivered"] is False  # p99 of lateness is near 30 ms
    assert out["p50_ttft_from_intended_ms"] == pytest.approx(130.0), "succeeded: 101, 702, 130 ms from intended"
    assert open_loop_figures(req.assign(lateness_ms=None), 10.0)["load_delivered"] is None, "closed loop"


@pytest.mark.parametrize("text", ["ttft", "ttft:x", "foo:3", "itl:-1", ","])
def test_bad_slo_names_the_flag(text):
    with pytest.raises(ValueError, match="--slo"):
        parse_slo(text)


def test_the_checklist_says_when_an_open_loop_run_did_not_deliver_its_rate():
    from analysis.checklist import _late_sends

    req = pd.DataFrame({"run_key": ["a"] * 3 + ["b"] * 3 + ["c"] * 2, "lateness_ms": [1, 2, 3, 1, 2, 900, None, None]})
    runs, short = _late_sends(req, 10.0)
    assert runs == 2 and len(short) == 1 and short[0].startswith("b (p99")


def test_report_numbers_and_axes_are_readable_at_their_scale():
    """From a newcomer's report: mean_kv_cache_usage printed 0.00 for 0.0003-0.003, and the ITL
    distribution's linear axis ran to 2,500 ms with the mass under 30 ms."""
    import numpy as np

    from analysis.report import fmt_number, plot_distributions

    assert [fmt_number(v) for v in (0.0003, 0.0031, 0.0, 5.234, 1234.56, float("nan"))] == \
        ["0.0003", "0.0031", "0", "5.23", "1234.6", ""]
    # seen (issue 39): slo_met_share 0.998 showed as "1" while the console said 99.8%
    assert [fmt_number(v) for v in (0.998, 0.9999, 0.5, -0.997, 0.123)] == ["0.998", "0.9999", "0.5", "-0.997", "0.12"]
    rng = np.random.default_rng(0)
    itl = np.concatenate([rng.uniform(5, 30, 2000), [2500.0] * 5])
    samples = pd.DataFrame({"profile": "p", "request_rate": 0.0, "concurrency": 4, "metric": "ITL", "value_ms": itl})
    samples = pd.concat([samples, samples.assign(metric="TTFT", value_ms=rng.uniform(90, 110, len(itl)))])
    fig = plot_distributions(samples)
    assert [ax.get_xscale() for ax in fig.axes] == ["linear", "log"], "log only where the range demands it"
