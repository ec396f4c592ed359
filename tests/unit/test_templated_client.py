"""``TemplatedOpenAI`` (issue 25): a request built from the template is the request the SDK itself
builds for the same options, byte for byte on the wire; anything that changes the request's shape
is built by the SDK."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest
from openai._models import FinalRequestOptions

from vllm_locust.backend.client import make_client
from vllm_locust.backend.endpoints import endpoint
from vllm_locust.backend.templated import TemplatedOpenAI
from vllm_locust.backend.transport import _request_bytes
from vllm_locust.core.stream import StreamLimits, StreamResult


def options(body: bytes = b'{"a":1}', **fields) -> FinalRequestOptions:
    return FinalRequestOptions.construct(method="post", url="/chat/completions", content=body,
                                         security={"bearer_auth": True}, **fields)


def sdk_built(client: openai.OpenAI, opts: FinalRequestOptions) -> httpx2.Request:
    """What the SDK's own ``_build_request`` makes of the same options (no template)."""
    return openai.OpenAI._build_request(client, opts)


def same_request(a: httpx2.Request, b: httpx2.Request) -> None:
    assert _request_bytes(a) == _request_bytes(b), "a different request on the wire"
    assert a.headers.raw == b.headers.raw and str(a.url) == str(b.url)
    assert a.extensions == b.extensions


@pytest.fixture
def client() -> TemplatedOpenAI:
    made = make_client("http://127.0.0.1:9", "sk-one", 5.0, 30.0)
    assert isinstance(made, TemplatedOpenAI)
    return made


def test_later_requests_are_the_sdks_own_requests_with_their_own_bodies(client):
    first = client._build_request(options(b'{"a":1}'))
    assert client.templated_requests == 0
    for body in (b'{"b":22}', b"{}", b'{"c":"' + b"x" * 5000 + b'"}'):
        built = client._build_request(options(body))
        same_request(built, sdk_built(client, options(body)))
        assert built.content == body and built.headers["content-length"] == str(len(body))
    assert client.templated_requests == 3, "the template was not used for plain repeats"
    assert first.headers["content-length"] == "7"


@pytest.mark.parametrize("change", ["headers", "timeout", "api_key", "base_url", "retry", "cookie"])
def test_a_request_of_another_shape_is_built_by_the_sdk(client, change):
    client._build_request(options())
    retries = 0
    opts = options(b'{"z":0}')
    if change == "headers":
        opts = options(b'{"z":0}', headers={"X-Tenant": "b"})
    elif change == "timeout":
        opts = options(b'{"z":0}', timeout=httpx2.Timeout(3.0))
    elif change == "api_key":
        client.api_key = "sk-two"
    elif change == "base_url":
        client.base_url = "http://127.0.0.1:10/v2"
    elif change == "retry":
        retries = 1
    elif change == "cookie":
        client._client.cookies.set("session", "abc")
    built = client._build_request(opts, retries_taken=retries)
    assert client.templated_requests == 0, f"{change}: the old template was used"
    same_request(built, openai.OpenAI._build_request(client, opts, retries_taken=retries))
    if change != "cookie":  # the new shape is the template from now on
        again = client._build_request(options(b'{"y":1}', **({"headers": {"X-Tenant": "b"}} if change == "headers" else
                                                            {"timeout": httpx2.Timeout(3.0)} if change == "timeout" else {})),
                                      retries_taken=retries)
        assert client.templated_requests == 1
        assert json.loads(again.content) == {"y": 1}
    for header, value in (("authorization", "Bearer sk-two" if change == "api_key" else "Bearer sk-one"),):
        assert built.headers[header] == value


def test_json_bodies_and_query_parameters_go_the_sdks_whole_way(client):
    client._build_request(options())
    for opts in (FinalRequestOptions.construct(method="post", url="/chat/completions", json_data={"a": 1}),
                 options(params={"q": "1"})):
        same_request(client._build_request(opts), sdk_built(client, opts))
    assert client.templated_requests == 0


def test_servers_still_see_the_sdks_user_agent(client):
    request = client._build_request(options())
    assert request.headers["user-agent"] == f"OpenAI/Python {openai.__version__}"


def test_each_templated_request_has_its_own_extensions(client):
    client._build_request(options())
    a, b = client._build_request(options()), client._build_request(options())
    a.extensions["trace"] = object()  # the wire hook stamps each request's own
    assert "trace" not in b.extensions and "trace" not in client._build_request(options()).extensions


def test_a_users_streams_send_the_same_request_but_the_body_through_the_template():
    seen = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        text = 'data: {"choices":[{"index":0,"text":"a","finish_reason":"length"}]}\n\ndata: [DONE]\n\n'
        return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=httpx2.ByteStream(text.encode()))

    client = TemplatedOpenAI(base_url="http://127.0.0.1:9/v1", api_key="sk-test", max_retries=0,
                             http_client=httpx2.Client(transport=httpx2.MockTransport(handler)))
    api = endpoint("completions")
    for prompt in ("one", "two", "three"):
        result = api.stream(client, api.body("m", 1, prompt), lambda *a: None, StreamResult(), StreamLimits(1))
        assert result.content_chunks == 1
    assert client.templated_requests == 2
    assert [json.loads(r.content)["prompt"] for r in seen] == ["one", "two", "three"]
    heads = [[(k, v) for k, v in r.headers.raw if k.lower() != b"content-length"] for r in seen]
    assert heads[0] == heads[1] == heads[2] and seen[0].url == seen[2].url
