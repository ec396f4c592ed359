"""The user's clock against the mock server in its own process: real SDK, real sockets, known truth."""

import gc
import time

import gevent
import pytest

from tests.unit.test_user import ITL_MS, TTFT_MS, by_name, make_env
from vllm_locust.plugin.user import ChatStreamUser
from vllm_locust.plugin.workload import settle_heap

# Run alone (tests/parallel.py): the client's timing against an exact-timing mock, to the millisecond.
pytestmark = pytest.mark.timing


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_ttft_and_every_itl_within_1ms_of_server_truth(fake_server, tmp_path, endpoint):
    fake_server.configure(ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    env, fired = make_env(fake_server.url, tmp_path, endpoint=endpoint)
    user = ChatStreamUser(env)
    user.on_start()
    user.stream_completion()  # opens the connection and warms the SDK's parsers, as a warm-up does
    fake_server.configure(ttft_ms=TTFT_MS, itl_ms=ITL_MS)
    fired.clear()
    lags_ms: list[float] = []
    # What a run does once its workload is built (``Workload.build_all``): what is alive is frozen
    # out of later collections. Without it a full collection walked this pytest process's heap
    # (a thousand tests' worth) mid-stream: one ~86 ms stall, 9 of 75 gaps a whole token late,
    # while the probe's p95 stayed at 0.27 ms (seen twice, on clean clones).
    settle_heap()
    probe = gevent.spawn(loop_lag_probe, lags_ms)
    try:
        for _ in range(5):
            user.stream_completion()
    finally:
        probe.kill()
        gc.unfreeze()
    # The machine's own lateness while the requests ran, as the suite's self-audit measures it: a
    # 1 ms sleep that wakes late means every stamp taken then is late by as much, client or not.
    lags_ms.sort()
    lag_median, lag_p95 = lags_ms[len(lags_ms) // 2], lags_ms[int(len(lags_ms) * 0.95)]
    log = [r for r in fake_server.log() if r["sends"]]
    assert len(log) == 5, "the server saw every request"
    ttfts, itls = by_name(fired, "TTFT"), by_name(fired, "ITL")
    assert len(ttfts) == 5 and len(itls) == 5 * 15, "one TTFT per request, one ITL per gap (16 tokens -> 15)"
    ttft_errors, itl_errors = [], []
    for i, record in enumerate(log):
        truth_ttft = (record["sends"][0] - record["recv"]) * 1000
        ttft_errors.append(abs(ttfts[i]["response_time"] - truth_ttft))
        # Causality, which holds however busy the machine: the client cannot see the first token
        # before the server handed it to the socket, nor before the script's TTFT had passed (the
        # server's sleep only overshoots). How far after is the medians' business below: a single
        # request on a loaded machine read 45.36 ms for a 40 ms script, the server's sleep late.
        assert ttfts[i]["response_time"] >= truth_ttft - 0.05, f"TTFT {ttfts[i]['response_time']:.3f} ms before the server sent ({truth_ttft:.3f})"
        assert truth_ttft >= TTFT_MS - 0.05, f"the server sent its first token after {truth_ttft:.3f} ms, before its script's {TTFT_MS}"
        truth_gaps = [(b - a) * 1000 for a, b in zip(record["sends"], record["sends"][1:])]
        measured = [e["response_time"] for e in itls[15 * i:15 * (i + 1)]]
        itl_errors += [abs(m - t) for m, t in zip(measured, truth_gaps)]
    # The truth is the server's own instants: request line in, bytes handed to the socket. A TTFT
    # also holds two loopback deliveries with a wake-up each (0.2-0.8 ms apiece on a 2-core VM,
    # measured in docs/benchmark.md); an ITL holds the difference of two. Hence the medians.
    ttft_errors.sort()
    itl_errors.sort()
    # Bounds: this machine's quiet figures plus the loop lag the probe measured meanwhile (a busy
    # 2-core CI machine, with two other processes on its cores, put 5 of 75 gaps 3.9-4.5 ms off).
    lag = f"(loop lag median {lag_median:.2f} ms, p95 {lag_p95:.2f} ms)"
    assert ttft_errors[2] < 1.5 + lag_median, f"median TTFT error {ttft_errors[2]:.3f} ms {lag} (all: {ttft_errors})"
    median_itl = itl_errors[len(itl_errors) // 2]
    assert median_itl < 1.0 + lag_median, f"median ITL error {median_itl:.3f} ms {lag}"
    # Not the single worst: one wake-up delayed by another process on a shared 2-core machine
    # (CI) is the machine's, and failed this now and then; a client error shows in many gaps. A
    # stall the probe saw (this process stopped: another process on its core, a collection) makes
    # one gap long and the gaps it held back short: each is allowed its gaps, by its measured length
    # (seen: one ~86 ms stall while a pandas job ran beside, 9 of 75 gaps off, the probe's p95 0.27 ms).
    stalls = [x for x in lags_ms if x > 3.0]
    allowed = len(itl_errors) // 20 + sum(int(x // ITL_MS) + 2 for x in stalls)
    off = sum(e > 3.0 + lag_p95 for e in itl_errors)
    assert off <= allowed, f"{off} of {len(itl_errors)} ITL errors over {3.0 + lag_p95:.2f} ms {lag}, stalls {stalls}: {itl_errors[-5:]}"
    assert itl_errors[-1] <= 3.0 + lag_p95 + max(stalls, default=0.0) + ITL_MS, f"worst ITL error {itl_errors[-1]:.2f} ms {lag}, stalls {stalls}"
    e2e, tpot = by_name(fired, "E2E"), by_name(fired, "TPOT")
    assert [e["response_length"] for e in e2e] == [16] * 5, "E2E carries usage.completion_tokens"
    for i in range(5):
        gaps = sum(e["response_time"] for e in itls[15 * i:15 * (i + 1)])
        assert abs(e2e[i]["response_time"] - ttfts[i]["response_time"] - gaps) < 1e-3, "E2E - TTFT == sum(ITL)"
        assert abs(tpot[i]["response_time"] - gaps / 15) < 1e-3, "TPOT = (E2E - TTFT) / (tokens - 1)"
    assert all(e["exception"] is None for e in fired), "no failures on a clean stream"
    assert all(e["request_type"] == endpoint for e in fired)


def loop_lag_probe(lags_ms: list[float]) -> None:
    """Sleep 1 ms over and over and keep how late each wake-up was (ms)."""
    while True:
        asked = time.perf_counter()
        gevent.sleep(0.001)
        lags_ms.append(max(0.0, (time.perf_counter() - asked) * 1000 - 1.0))
