"""The wire clock travels with each request (``StreamClient.send(request, clock)``): no greenlet-local,
no hook that must find it. Each user's requests are stamped on its own clock, after the one yield
that lets a wave's setups finish first."""

from __future__ import annotations

import gevent

from vllm_locust.backend import wire
from vllm_locust.backend.apiclient import make_client
from vllm_locust.backend.endpoints import endpoint
from vllm_locust.core.stream import StreamLimits, StreamResult


def test_sending_yields_once_then_stamps():
    clock, order = wire.WireClock(), []
    other = gevent.spawn(order.append, "the other greenlet ran")
    clock.sending()
    order.append("stamped")
    assert order == ["the other greenlet ran", "stamped"] and clock.yielded and not clock.waiting_to_send
    assert clock.sent_perf_s > 0 and clock.sent_at_s > 0
    other.join()


def test_without_the_yield_the_stamp_is_taken_at_once():
    clock, order = wire.WireClock(yield_before_send=False), []
    other = gevent.spawn(order.append, "the other greenlet ran")
    clock.sending()
    order.append("stamped")
    assert order == ["stamped"], "no yield before the stamp"
    other.join()


def test_each_users_requests_are_stamped_on_its_own_clock(fake_server):
    """Three users sending at once, each with its own client and clock: each clock holds its own
    request's send (between the user's call and its first chunk), whatever the others do."""
    fake_server.configure(ttft_ms=20, itl_ms=1, tokens=2)
    api = endpoint("chat")
    clocks = [wire.WireClock() for _ in range(3)]
    firsts = {}

    def user(i: int) -> None:
        client = make_client(fake_server.url, "", 5.0, 5.0)
        clocks[i].on_request_started()
        called = clocks[i].sent_perf_s

        def on_content(index, t, tokens):
            firsts.setdefault(i, t)

        api.stream(client, api.body("fake-model", 2, [{"role": "user", "content": "hi"}]), on_content,
                   StreamResult(), StreamLimits(2), clocks[i])
        assert called < clocks[i].sent_perf_s < firsts[i], i

    gevent.joinall([gevent.spawn(user, i) for i in range(3)], raise_error=True)
    assert len({c.sent_perf_s for c in clocks}) == 3
