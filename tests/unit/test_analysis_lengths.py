"""Natural output lengths (--no-ignore-eos): TPOT is each request's (E2E - TTFT) / (output tokens - 1)
and undefined for a one-token output (left out, never a zero); throughput and the mean output
length count usage's completion tokens, else the content chunks of a stream without usage."""

import pytest

from analysis.load import load_runs
from analysis.summary import runs_per_run, summarize
from tests.unit.test_analysis_turns import WINDOW_S, Spec, write_recording

TTFT_MS = 100.0


@pytest.fixture(scope="module")
def summary(tmp_path_factory):
    root = tmp_path_factory.mktemp("lengths")
    write_recording(root, "natural", [
        Spec(at_s=0, ttft_ms=TTFT_MS, gaps_ms=()),  # 1 token: no TPOT
        Spec(at_s=1, ttft_ms=TTFT_MS, gaps_ms=(30.0,)),  # 2 tokens: TPOT 30 ms
        Spec(at_s=2, ttft_ms=TTFT_MS, gaps_ms=(10.0,) * 49),  # 50 tokens: TPOT 10 ms
        Spec(at_s=3, ttft_ms=TTFT_MS, gaps_ms=(20.0,) * 9, usage=False),  # 10 chunks, no usage: TPOT 20 ms
    ], workload="sharegpt")
    samples, requests, frame = runs_per_run(load_runs(root))
    return samples, summarize(samples, requests, frame).iloc[0]


def test_a_one_token_output_has_no_tpot(summary):
    samples, _ = summary
    tpot = samples[samples["metric"] == "TPOT"].sort_values("value_ms")
    assert tpot["value_ms"].tolist() == pytest.approx([10.0, 20.0, 30.0], abs=1e-3)
    assert tpot["tokens"].tolist() == [50, 10, 2]


def test_tpot_percentiles_are_over_the_requests_that_have_one(summary):
    row = summary[1]
    assert row["p50_tpot_ms"] == pytest.approx(20.0, abs=1e-3)
    assert row["p95_tpot_ms"] == pytest.approx(20.0 + 0.9 * 10.0, abs=1e-3)  # (n-1)*0.95 = 1.9 between 20 and 30
    assert row["p50_e2e_ms"] == pytest.approx((130.0 + 280.0) / 2, abs=1e-3)  # E2E 100, 130, 280, 590


def test_throughput_counts_the_actual_output_tokens(summary):
    row = summary[1]
    assert row["output_tokens_per_s"] == pytest.approx((1 + 2 + 50 + 10) / WINDOW_S)
    assert row["requests_per_s"] == pytest.approx(4 / WINDOW_S)
    assert row["mean_output_tokens"] == pytest.approx((1 + 2 + 50 + 10) / 4), "the stream without usage counts its chunks"
    assert row["chunks_per_token"] == pytest.approx(1.0), "over the requests whose usage counted their tokens"
