"""ITL per stream part and embeddings' inputs/s in the summary, on synthetic runs: the percentiles and
mean of ITL_REASONING and ITL_ANSWER come from their raw samples (one level, two levels apart), a run
without them keeps exactly the summary's fixed columns; ``inputs_per_s`` is the successful embeddings
requests' inputs over the measured window, and only where the endpoint is embeddings."""

import numpy as np
import pandas as pd
import pytest

from analysis.load import Run, measured_spans
from analysis.summary import runs_per_run, summarize, with_part_itl
from vllm_locust.core.schema import (ITL_ANSWER, ITL_REASONING, OPTIONAL_SUMMARY, SUMMARY, mean_col, pct_col)

T0, MEASURED_AT, STOP = 1000.0, 1001.0, 1011.0  # 1 s warm-up, a 10 s measured window


def run(requests: list[dict], samples: list[dict], concurrency: int = 2, profile: str = "p") -> Run:
    load = {"timeline": [{"t_s": T0, "phase": "warmup", "concurrency": concurrency, "step": 0},
                         {"t_s": MEASURED_AT, "phase": "measured", "concurrency": concurrency, "step": 0}],
            "stopped_s": STOP}
    record = {"profile": profile, "concurrency": concurrency, "repeat": 1, "duration_s": STOP - MEASURED_AT}
    return Run(None, record, pd.DataFrame(samples), pd.DataFrame(requests), pd.DataFrame(),
               windows=measured_spans(load, any_level=True))


def request(rid: str, sent: float, endpoint: str = "chat", chunks: int = 4, ok: bool = True, phase: str = "measured"):
    return {"run_id": "r", "worker_id": "w", "request_id": rid, "endpoint": endpoint, "sent_at_s": sent, "phase": phase,
            "ttft_ms": None if endpoint == "embeddings" else 10.0, "e2e_ms": 50.0 if ok else None,
            "completion_tokens": 0 if endpoint == "embeddings" else chunks, "content_chunks": chunks, "prompt_tokens": 8,
            "error": None if ok else "HTTP 500", "kind": "ok" if ok else "http_5xx"}


def sample(rid: str, metric: str, value: float, t: float, phase: str = "measured"):
    return {"run_id": "r", "worker_id": "w", "request_id": rid, "metric": metric, "value_ms": value, "t_s": t,
            "tokens": 1, "phase": phase}


def summary_of(*runs: Run) -> pd.DataFrame:
    samples, requests, frame = runs_per_run(list(runs))
    return summarize(samples, requests, frame)


def reasoning_run(reasoning: list[float], answer: list[float], concurrency: int = 2, failed_gap: float = 9999.0) -> Run:
    requests = [request("a", MEASURED_AT + 1), request("bad", MEASURED_AT + 2, ok=False)]
    samples = [sample("a", "TTFT", 10.0, MEASURED_AT + 1.01), sample("a", "E2E", 50.0, MEASURED_AT + 1.05)]
    samples += [sample("a", ITL_REASONING, v, MEASURED_AT + 1.02) for v in reasoning]
    samples += [sample("a", ITL_ANSWER, v, MEASURED_AT + 1.03) for v in answer]
    samples += [sample("a", "ITL", v, MEASURED_AT + 1.02) for v in [*reasoning, 7.0, *answer]]
    samples += [sample("bad", ITL_REASONING, failed_gap, MEASURED_AT + 2.02)]  # a failed request's: left out
    return run(requests, samples, concurrency)


def test_itl_per_part_is_summarised_from_its_own_samples():
    reasoning, answer = [1.0, 2.0, 3.0, 4.0, 100.0], [10.0, 20.0, 30.0]
    [row] = summary_of(reasoning_run(reasoning, answer)).to_dict("records")
    for metric, values in ((ITL_REASONING, reasoning), (ITL_ANSWER, answer)):
        for q in (50, 95, 99):
            assert row[pct_col(metric, q)] == pytest.approx(float(np.percentile(values, q)))
        assert row[mean_col(metric)] == pytest.approx(float(np.mean(values)))
    assert row[pct_col("ITL", 50)] == pytest.approx(float(np.percentile([*reasoning, 7.0, *answer], 50)))


def test_each_level_gets_its_own_parts_and_a_level_without_them_gets_nan():
    plain = run([request("p", MEASURED_AT + 1)], [sample("p", "TTFT", 10.0, MEASURED_AT + 1.01),
                                                  sample("p", "ITL", 5.0, MEASURED_AT + 1.02),
                                                  sample("p", "E2E", 50.0, MEASURED_AT + 1.05)], concurrency=8)
    table = summary_of(reasoning_run([2.0, 4.0], [6.0, 8.0]), plain)
    assert list(table[SUMMARY.concurrency]) == [2, 8]
    assert list(table[mean_col(ITL_REASONING)].iloc[:1]) == [3.0] and np.isnan(table[mean_col(ITL_REASONING)].iloc[1])
    assert list(table[mean_col(ITL_ANSWER)].iloc[:1]) == [7.0]


def test_a_run_without_parts_keeps_the_fixed_columns():
    plain = run([request("p", MEASURED_AT + 1)], [sample("p", "TTFT", 10.0, MEASURED_AT + 1.01),
                                                  sample("p", "E2E", 50.0, MEASURED_AT + 1.05)])
    assert list(summary_of(plain).columns) == list(SUMMARY)


def test_with_part_itl_groups_by_extra_columns():
    samples = pd.DataFrame({"profile": ["p"] * 4, "request_rate": [0.0] * 4, "concurrency": [2] * 4,
                            "persona": ["x", "x", "y", "y"], "metric": [ITL_ANSWER] * 4,
                            "value_ms": [1.0, 3.0, 10.0, 30.0]})
    table = pd.DataFrame({"profile": ["p", "p"], "request_rate": [0.0, 0.0], "concurrency": [2, 2], "persona": ["x", "y"]})
    out = with_part_itl(table, samples, ("persona",))
    assert list(out[mean_col(ITL_ANSWER)]) == [2.0, 20.0] and pct_col(ITL_REASONING, 50) not in out


def test_inputs_per_s_counts_successful_embeddings_inputs_over_the_window():
    requests = [request(f"e{i}", MEASURED_AT + 0.5 * i, "embeddings", chunks=4) for i in range(10)]
    requests += [request("f", MEASURED_AT + 6, "embeddings", chunks=4, ok=False),  # failed: no inputs embedded
                 request("w", T0 + 0.1, "embeddings", chunks=4, phase="warmup")]  # warm-up: not measured
    samples = [sample(r["request_id"], "E2E", 50.0, r["sent_at_s"] + 0.05, r["phase"]) for r in requests if r["e2e_ms"]]
    [row] = summary_of(run(requests, samples)).to_dict("records")
    assert row[OPTIONAL_SUMMARY.inputs_per_s] == pytest.approx(10 * 4 / (STOP - MEASURED_AT))
    chat = run([request("p", MEASURED_AT + 1)], [sample("p", "TTFT", 10.0, MEASURED_AT + 1.01),
                                                 sample("p", "E2E", 50.0, MEASURED_AT + 1.05)])
    assert OPTIONAL_SUMMARY.inputs_per_s not in summary_of(chat)
