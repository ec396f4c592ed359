"""``backend/httpx_compat.py``: a Headers' triples as httpx2 keeps them, and the same from its public
``raw`` on an httpx2 the suite was not verified with."""

from __future__ import annotations

import httpx2

from vllm_locust.backend import httpx_compat
from vllm_locust.backend.bounds import guard_response

HEADERS = [("Content-Type", "text/event-stream"), ("X-Twice", "a"), ("x-twice", "b"), ("Content-Encoding", "gzip")]


def public_triples(headers: httpx2.Headers) -> list:
    return [(name, name.lower(), value) for name, value in headers.raw]


def test_the_triples_are_the_headers_in_order_with_lowered_names(monkeypatch):
    headers = httpx2.Headers(HEADERS)
    assert httpx_compat.VERIFIED
    assert list(httpx_compat.header_triples(headers)) == public_triples(headers)
    monkeypatch.setattr(httpx_compat, "VERIFIED", False)
    assert httpx_compat.header_triples(headers) == public_triples(headers), "the public path gives the same"


def test_a_refused_encoding_is_refused_on_either_path(monkeypatch):
    for verified in (True, False):
        monkeypatch.setattr(httpx_compat, "VERIFIED", verified)
        request = httpx2.Request("POST", "http://127.0.0.1:9/v1/chat/completions")
        response = httpx2.Response(200, headers=HEADERS, request=request)
        try:
            guard_response(response)
        except httpx2.RemoteProtocolError as err:
            assert "gzip" in str(err)
        else:
            raise AssertionError(f"gzip accepted (verified={verified})")
