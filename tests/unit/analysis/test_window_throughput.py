"""Throughput counts what completed inside the measured window, whatever phase sent it.

Four closed-loop users, each request exactly 2 s and 100 tokens, back to back, staggered by 0.5 s;
warm-up 0-3 s, measured 3-13 s, the run stops at 13 s and cuts off what is still streaming. The
server completes 2 requests (200 tokens) a second all along. Counting only requests sent in the
window and finished before its end reads 1.6 (two request lengths short in a five-length window).
"""

import pandas as pd
import pytest

from analysis.goodput import parse_slo
from analysis.load import Run, measured_spans
from analysis.summary import per_run
from analysis.tidy import successful_samples, tidy_completions, tidy_requests, tidy_samples
from vllm_locust.core.schema import INTERRUPTED

T0, WARMUP_END, STOP = 1000.0, 1003.0, 1013.0


def closed_loop_run() -> Run:
    requests, samples = [], []
    for user in range(4):
        sent = T0 + 0.25 + 0.5 * user
        while sent < STOP:
            rid = f"u{user}:{sent - T0:.2f}"
            cut = sent + 2.0 > STOP
            ttft = 100.0 + 100.0 * (user == 3)  # user 3's first tokens come late: it misses a 150 ms SLO
            requests.append({"run_id": "r", "worker_id": "w", "request_id": rid, "sent_at_s": sent,
                             "phase": "warmup" if sent < WARMUP_END else "measured", "ttft_ms": ttft,
                             "e2e_ms": None if cut else 2000.0, "completion_tokens": None if cut else 100,
                             "content_chunks": 50 if cut else 100, "error": INTERRUPTED if cut else None,
                             "lateness_ms": None, "queue_ms": None})
            samples.append({"run_id": "r", "worker_id": "w", "request_id": rid, "metric": "TTFT", "value_ms": ttft,
                            "t_s": sent + ttft / 1000, "tokens": None,
                            "phase": "warmup" if sent < WARMUP_END else "measured"})
            sent += 2.0
    load = {"timeline": [{"t_s": T0, "phase": "warmup", "concurrency": 4, "step": 0},
                         {"t_s": WARMUP_END, "phase": "measured", "concurrency": 4, "step": 0}], "stopped_s": STOP}
    record = {"profile": "p", "concurrency": 4, "repeat": 1, "duration_s": STOP - WARMUP_END}
    return Run(None, record, pd.DataFrame(samples), pd.DataFrame(requests), pd.DataFrame(),
               windows=measured_spans(load, any_level=True))


def rates(runs, slo=None):
    samples, requests = tidy_samples(runs), tidy_requests(runs)
    samples = successful_samples(samples, requests)
    server = pd.DataFrame(columns=["run_key", "t_s", "name", "labels", "value"])
    durations = {r.run_key: r.record["duration_s"] for r in runs}
    return per_run(samples, requests, server, durations, slo=slo, completions=tidy_completions(runs)).iloc[0]


def test_the_window_is_the_load_records_measured_phase():
    assert closed_loop_run().windows == [(WARMUP_END, STOP)]


def test_throughput_is_what_completed_in_the_window():
    row = rates([closed_loop_run()])
    assert row["requests_per_s"] == pytest.approx(2.0)
    assert row["output_tokens_per_s"] == pytest.approx(200.0)


def test_goodput_is_the_throughput_times_the_share_that_met_the_slo():
    row = rates([closed_loop_run()], parse_slo("ttft:150"))
    # a quarter of the succeeded requests (user 3's) miss the SLO: goodput is three quarters of 2/s
    assert row["goodput_requests_per_s"] == pytest.approx(1.5)
    assert row["goodput_tokens_per_s"] == pytest.approx(150.0)


def test_a_run_without_a_window_keeps_its_requests_over_its_duration():
    run = closed_loop_run()
    run.windows = []
    row = rates([run])
    assert row["requests_per_s"] == pytest.approx(16 / 10.0)  # sent in the window, finished before its end
