"""``StreamTimer``, the one metrics calculation production runs, on a scripted clock.

The stream tests feed it as the user does: ``stream.consume`` reads ``(arrival_s, payload)`` pairs
and calls back for each content chunk, and the callback hands the instant to the timer.
"""

from __future__ import annotations

import json

from vllm_locust.core.metrics import ITL, TTFT, StreamTimer, tpot_ms
from vllm_locust.core.stream import consume


def _chunk(content=None, role=None, finish=None) -> bytes:
    delta = {**({"role": role} if role else {}), **({"content": content} if content is not None else {})}
    return json.dumps({"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}).encode()


def _timed(sent_s: float, script: list[tuple[float, bytes]]) -> tuple[StreamTimer, list[tuple[str, float]]]:
    """Run ``script`` through the production reader into a timer, as ``plugin/user.py`` wires them."""
    timer, fired = StreamTimer(sent_s), []
    consume(script, lambda _index, t, _tokens: fired.append(timer.content(t)))
    return timer, fired


def test_latency_minus_ttft_is_the_sum_of_gaps():
    timer = StreamTimer(10.0)
    fired = [timer.content(t) for t in (10.150, 10.165, 10.181, 10.200)]
    assert [m for m, _ in fired] == [TTFT, ITL, ITL, ITL], "first content chunk is TTFT, every later one an ITL"
    gaps = [v for m, v in fired if m == ITL]
    assert [round(g, 6) for g in gaps] == [15.0, 16.0, 19.0], "one ITL per gap between content chunks"
    measured = timer.finish(4)
    assert abs(measured.ttft_ms - 150.0) < 1e-9 and abs(fired[0][1] - 150.0) < 1e-9, "TTFT runs from send to first content"
    assert abs(measured.e2e_ms - 200.0) < 1e-9, "E2E ends at the last content chunk"
    assert abs(measured.e2e_ms - measured.ttft_ms - sum(gaps)) < 1e-9, "E2E - TTFT must equal the sum of ITLs"
    assert abs(measured.tpot_ms - 50.0 / 3) < 1e-9, "TPOT = (E2E - TTFT) / (tokens - 1): the first token is TTFT's"
    assert timer.chunks == 4 and timer.last_s == 10.200, "the timer counts content chunks and keeps the last instant"


def test_tpot_uses_the_servers_token_count_not_chunks():
    timer = StreamTimer(0.0)
    timer.content(0.1)
    timer.content(0.2)
    assert abs(timer.finish(5).tpot_ms - 25.0) < 1e-9, "(200-100)/(5-1) with usage tokens, not the 2 chunks"
    assert abs(timer.finish().tpot_ms - 100.0) < 1e-9, "without a token count the content chunks stand in"


def test_role_only_chunk_does_not_stop_the_ttft_clock():
    timer, fired = _timed(5.0, [(5.040, _chunk(role="assistant", content="")),
                                (5.150, _chunk("Hello")), (5.170, _chunk(" world")),
                                (5.175, _chunk(finish="stop")), (5.180, b"[DONE]")])
    assert fired[0] == (TTFT, fired[0][1]) and abs(fired[0][1] - 150.0) < 1e-9, \
        f"TTFT must run to the first content chunk, not the role-only one: {fired}"
    assert len(fired) == 2 and abs(fired[1][1] - 20.0) < 1e-9, f"one ITL between the two content chunks: {fired}"
    assert abs(timer.finish().e2e_ms - 170.0) < 1e-9, "the finish-only chunk after the last content does not move E2E"


def test_one_token_stream_has_ttft_and_e2e_but_no_itl_and_no_tpot():
    timer, fired = _timed(1.0, [(1.100, _chunk(role="assistant", content="")), (1.250, _chunk("x", finish="length"))])
    measured = timer.finish(1)
    assert [m for m, _ in fired] == [TTFT], "a single content chunk gives one TTFT and no ITL"
    assert abs(measured.ttft_ms - 250.0) < 1e-9 and measured.e2e_ms == measured.ttft_ms, "E2E == TTFT for one token"
    assert measured.tpot_ms is None and tpot_ms(100.0, 100.0, 1) is None, "TPOT is undefined for one output token"


def test_no_content_has_no_metrics():
    measured = StreamTimer(0.0).finish(0)
    assert (measured.ttft_ms, measured.e2e_ms, measured.tpot_ms) == (None, None, None), "nothing arrived: nothing measured"


def test_a_timers_finish_is_its_properties_and_tpot_ms():
    """``StreamTimer.finish`` computes in line what ``ttft_ms``, ``e2e_ms`` and ``tpot_ms`` give, to the bit."""
    import random

    from vllm_locust.core.metrics import StreamTimer, tpot_ms

    rng = random.Random(25)
    for _ in range(500):
        timer = StreamTimer(rng.uniform(0, 1e6))
        t = timer.sent_s
        for _ in range(rng.randint(1, 6)):
            t += rng.expovariate(50.0)
            timer.content(t)
        tokens = rng.choice([None, 0, 1, 2, 7, 1000])
        got = timer.finish(tokens)
        n = tokens if tokens is not None else timer.chunks
        assert (got.ttft_ms, got.e2e_ms) == (timer.ttft_ms, timer.e2e_ms)
        assert got.tpot_ms == tpot_ms(timer.e2e_ms, timer.ttft_ms, n)
