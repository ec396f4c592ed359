"""The wire clock's greenlet-local: the backend uses ``threading.local`` (no gevent import), which
must still keep one clock per greenlet under Locust's monkey-patching (``tests/conftest.py``)."""

from __future__ import annotations

import gevent
import httpx2
import pytest

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


# -- the hot request: the SDK's public ``post`` with the body serialised once (issue 25) -------------

import json  # noqa: E402

import openai  # noqa: E402
import pytest  # noqa: E402

from vllm_locust.backend.client import classify, retry_after_s  # noqa: E402
from vllm_locust.backend.endpoints import endpoint, wire_request  # noqa: E402
from vllm_locust.core.outcome import Outcome  # noqa: E402
from vllm_locust.core.stream import StreamLimits, StreamResult  # noqa: E402


class Reads(httpx2.SyncByteStream):
    def __init__(self, reads):
        self.reads = reads

    def __iter__(self):
        yield from self.reads


def sdk_client(handler) -> openai.OpenAI:
    return openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-test", max_retries=0,
                         http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))


def test_wire_request_sends_what_create_would():
    body = endpoint("chat").body("m", 8, [{"role": "user", "content": "hi"}], continuous_usage=True, ignore_eos=True)
    body["extra_headers"] = {"X-Tenant": "a"}
    content, options = wire_request(body)
    assert json.loads(content) == {"model": "m", "max_tokens": 8, "stream": True, "ignore_eos": True,
                                   "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                                   "messages": [{"role": "user", "content": "hi"}]}, "extra_body merged, SDK keys out"
    assert options["headers"] == {"X-Tenant": "a"} and options["security"] == {"bearer_auth": True}
    plain, options = wire_request(endpoint("completions").body("m", 4, "hi"))
    assert json.loads(plain)["prompt"] == "hi" and set(options) == {"security"}


def test_a_stream_goes_through_the_sdk_with_auth_headers_and_the_serialised_body():
    seen = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        events = [{"choices": [{"index": 0, "text": "a", "finish_reason": None}]},
                  {"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}]
        text = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=Reads([text.encode()]))

    body = endpoint("completions").body("m", 2, "hi", ignore_eos=True)
    body["extra_headers"] = {"X-Tenant": "a"}
    result = endpoint("completions").stream(sdk_client(handler), body, lambda *a: None, StreamResult(),
                                            StreamLimits(2))
    assert result.content_chunks == 2 and result.finish_reason == "length"
    [request] = seen
    assert request.url.path == "/v1/completions" and request.method == "POST"
    assert request.headers["authorization"] == "Bearer sk-test" and request.headers["x-tenant"] == "a"
    assert request.headers["content-type"] == "application/json"
    assert json.loads(request.content) == {"model": "m", "max_tokens": 2, "stream": True, "prompt": "hi",
                                           "stream_options": {"include_usage": True}, "ignore_eos": True}


@pytest.mark.parametrize("status, error_type, kind", [(429, openai.RateLimitError, Outcome.HTTP_429),
                                                      (400, openai.BadRequestError, Outcome.HTTP_4XX),
                                                      (503, openai.InternalServerError, Outcome.HTTP_5XX)])
def test_http_errors_are_still_the_sdks_status_errors_with_their_body(status, error_type, kind):
    def handler(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, headers={"retry-after": "3"}, json={"error": {"message": f"no {status}"}})

    with pytest.raises(error_type) as caught:
        endpoint("chat").stream(sdk_client(handler), endpoint("chat").body("m", 2, []), lambda *a: None,
                                StreamResult(), StreamLimits(2))
    failure = classify(caught.value)
    assert isinstance(caught.value, openai.APIStatusError) and caught.value.body == {"message": f"no {status}"}
    assert failure.kind is kind and f"HTTP {status}: no {status}" in failure.message
    assert retry_after_s(caught.value) == (3.0 if status == 429 else None)


def test_a_clock_stamps_only_requests_sent_inside_its_block():
    clock = wire.WireClock()
    with pytest.raises(RuntimeError):
        with clock.active():
            inside = httpx2.Request("POST", "http://127.0.0.1:9/v1/x")
            wire.on_request(inside)
            raise RuntimeError("the request failed")
    after = httpx2.Request("POST", "http://127.0.0.1:9/v1/x")
    wire.on_request(after)
    assert inside.extensions["trace"] == clock.trace and "trace" not in after.extensions


def test_wire_request_takes_every_mix_of_sdk_arguments_apart():
    """Every subset of ``create``'s SDK-only arguments: the body keeps its fields in order without
    them, ``extra_body`` merged last (overriding), and the options carry exactly the ones given."""
    import itertools

    from vllm_locust.backend.endpoints import SDK_ONLY

    values = {"extra_body": {"ignore_eos": True, "max_tokens": 3}, "extra_headers": {"X-Tenant": "a"},
              "extra_query": {"q": "1"}, "timeout": 7.5}
    option_of = {"extra_headers": "headers", "extra_query": "params", "timeout": "timeout"}
    for n in range(len(SDK_ONLY) + 1):
        for keys in itertools.permutations(SDK_ONLY, n):
            body = endpoint("chat").body("m", 8, [{"role": "user", "content": "hi"}])
            for key in keys:
                body[key] = values[key]
            content, options = wire_request(body)
            expected = {k: v for k, v in body.items() if k not in SDK_ONLY} | (values["extra_body"] if "extra_body" in keys else {})
            assert list(json.loads(content).items()) == list(expected.items()), keys
            assert options == {"security": {"bearer_auth": True}} | {option_of[k]: values[k] for k in keys if k in option_of}, keys
