"""A closed-loop wave (issue 25): requests that become ready in the same instant finish their setup
first and then go out back to back; no send waits behind another request's setup."""

from __future__ import annotations

import time

import gevent
import gevent.event

from vllm_locust.backend import apiclient
from vllm_locust.backend.apiclient import make_client
from vllm_locust.backend.endpoints import endpoint
from vllm_locust.backend.wire import WireClock
from vllm_locust.core.stream import StreamLimits, StreamResult

USERS = 8


def wave(fake_server, monkeypatch, **clock) -> tuple[list[float], list[float]]:
    """Each user's instant its request was made (``ApiClient.open``'s part done) and its send stamp."""
    fake_server.configure(ttft_ms=1.0, itl_ms=1.0, tokens=2)
    built: dict[int, float] = {}
    made = apiclient.PreparedRequest

    def timed(route, headers, body, timeouts):
        request = made(route, headers, body, timeouts)
        built[id(headers)] = time.perf_counter()  # each user's client has its own header tuple
        return request

    monkeypatch.setattr(apiclient, "PreparedRequest", timed)
    api, go = endpoint("chat"), gevent.event.Event()
    clients = [make_client(fake_server.url, "", 5.0, 30.0) for _ in range(USERS)]
    clocks = [WireClock(**clock) for _ in range(USERS)]

    def send(i: int) -> None:
        result = api.stream(clients[i], api.body("fake-model", 2, [{"role": "user", "content": "hi"}]),
                            lambda *a: None, StreamResult(), StreamLimits(2), clocks[i])
        assert result.content_chunks == 2

    def user(i: int) -> None:
        send(i)  # opens the user's keep-alive connection (a connect yields on its own)
        go.wait()
        send(i)

    users = [gevent.spawn(user, i) for i in range(USERS)]
    while any(c.sent_perf_s == 0 for c in clocks):
        gevent.sleep(0.01)
    gevent.sleep(0.05)  # every user is waiting for the wave
    built.clear()
    go.set()  # the wave: every user ready in the same instant
    gevent.joinall(users, raise_error=True)
    assert len(built) == USERS
    return [built[id(c.headers)] for c in clients], [c.sent_perf_s for c in clocks]


def test_a_waves_requests_are_all_built_before_the_first_goes_out(fake_server, monkeypatch):
    built, sent = wave(fake_server, monkeypatch)
    assert max(built) < min(sent), "a send waited behind another request's setup"
    assert all(b < s for b, s in zip(built, sent))


def test_without_the_yield_each_send_follows_its_own_setup(fake_server, monkeypatch):
    """The control: the test above can fail (one user's send comes before the next one's setup)."""
    built, sent = wave(fake_server, monkeypatch, yield_before_send=False)
    assert not max(built) < min(sent)
