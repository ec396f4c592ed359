"""The wire clock's greenlet-local: the backend uses ``threading.local`` (no gevent import), which
must still keep one clock per greenlet under Locust's monkey-patching (``tests/conftest.py``)."""

from __future__ import annotations

import gevent
import httpx2

from vllm_locust.backend import wire


def test_each_greenlet_stamps_its_own_clock():
    clocks = [wire.WireClock() for _ in range(3)]
    seen = {}

    def send(i: int) -> None:
        with clocks[i].active():
            gevent.sleep(0)  # the others enter their own blocks meanwhile
            request = httpx2.Request("POST", "http://127.0.0.1/v1/completions")
            wire.on_request(request)
            seen[i] = request.extensions["trace"].__self__

    gevent.joinall([gevent.spawn(send, i) for i in range(3)])
    assert [seen[i] is clocks[i] for i in range(3)] == [True] * 3, "a greenlet's request was stamped on another's clock"
    request = httpx2.Request("POST", "http://127.0.0.1/v1/completions")
    wire.on_request(request)
    assert "trace" not in request.extensions, "outside an active block no clock may be attached"
