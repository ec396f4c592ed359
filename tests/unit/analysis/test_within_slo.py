"""The one SLO test (``analysis.goodput.within_slo``) that the boundary search and the per-persona
verdict share: every threshold at p95 (open loop from the intended send), at most 5% failed."""

from __future__ import annotations

import math

from analysis.goodput import parse_slo, within_slo
from launch import boundary
from analysis import personas


def row(rate=0.0, requests=100, failures=0, **p95):
    base = {"request_rate": rate, "requests": requests, "failures": failures, "p95_ttft_ms": 400.0,
            "p95_ttft_from_intended_ms": 900.0, "p95_itl_ms": 20.0, "p95_tpot_ms": 18.0, "p95_e2e_ms": 3000.0,
            "p95_e2e_from_intended_ms": 3500.0}
    return {**base, **p95}


def test_closed_loop_judges_ttft_from_the_send_and_open_loop_from_the_intended_instant():
    slo = parse_slo("ttft:500,itl:50")
    assert within_slo(row(), slo) == (True, {"p95_ttft_ms": 400.0, "p95_itl_ms": 20.0}, "")
    passed, figures, why = within_slo(row(rate=10.0), slo)
    assert not passed and figures["p95_ttft_from_intended_ms"] == 900.0
    assert why == "p95_ttft_from_intended_ms 900.0 > 500"


def test_more_than_one_failure_in_twenty_or_nothing_measured_misses():
    slo = parse_slo("itl:50")
    assert within_slo(row(failures=5), slo)[0], "5 of 100 is what p95 allows"
    assert within_slo(row(failures=6), slo)[2] == "6 of 100 requests failed"
    assert not within_slo(row(requests=0), slo)[0]
    assert not within_slo(row(p95_itl_ms=math.nan), slo)[0], "NaN (nothing measured) misses"


def test_the_boundary_search_and_the_persona_verdict_judge_alike():
    slo = parse_slo("ttft:500,tpot:10")
    r = row(p95_tpot_ms=12.0)
    assert boundary.judge(r, slo)[0] is personas.judge(r, slo)[0] is False
    assert personas.judge(r, slo)[1] == boundary.judge(r, slo)[2] == "p95_tpot_ms 12.0 > 10"
    assert personas.judge(r, None) == (None, "")
