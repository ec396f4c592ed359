from vllm_locust.core.metrics import gaps_ms, request_metrics, tpot_ms


def test_request_metrics_from_scripted_clock():
    sent = 10.0
    arrivals = [10.150, 10.165, 10.181, 10.200]
    m = request_metrics(sent, arrivals, output_tokens=4)
    assert abs(m.ttft_ms - 150.0) < 1e-9, "TTFT runs from send to the first content chunk"
    assert [round(g, 6) for g in m.itl_ms] == [15.0, 16.0, 19.0], "one ITL per gap between content chunks"
    assert abs(m.e2e_ms - 200.0) < 1e-9, "E2E ends at the last content chunk"
    assert abs(m.e2e_ms - m.ttft_ms - sum(m.itl_ms)) < 1e-9, "E2E - TTFT must equal the sum of ITLs"
    assert abs(m.tpot_ms - 50.0 / 3) < 1e-9, "TPOT leaves out the first token"


def test_tpot_uses_usage_tokens_not_chunks():
    m = request_metrics(0.0, [0.1, 0.2], output_tokens=5)
    assert abs(m.tpot_ms - 25.0) < 1e-9, "(200-100)/(5-1) with usage tokens, not the 2 chunks"


def test_single_token_has_no_tpot_and_no_content_has_no_ttft():
    assert tpot_ms(100.0, 100.0, 1) is None
    assert request_metrics(0.0, [0.05]).itl_ms == []
    assert request_metrics(0.0, []).ttft_ms is None


def test_gaps():
    assert gaps_ms([1.0, 1.5, 3.0]) == [500.0, 1500.0]
