"""``TemplatedOpenAI.post_stream`` (issue 25): a request sent from the template is the request the
SDK's own ``post`` sends for the same arguments, byte for byte on the wire, and fails with the
SDK's own exceptions; anything that changes the request's shape goes the SDK's whole way."""

from __future__ import annotations

import json

import httpx2
import openai
import pytest

from vllm_locust.backend import bounds
from vllm_locust.backend.client import make_client
from vllm_locust.backend.endpoints import endpoint
from vllm_locust.backend.templated import TemplatedOpenAI, _Template
from vllm_locust.backend.transport import _request_bytes
from vllm_locust.backend.wire import WireClock, event_hooks
from vllm_locust.core.stream import StreamLimits, StreamResult

PATH = "/chat/completions"
SECURITY = {"bearer_auth": True}
SSE = b'data: {"choices":[{"index":0,"text":"a","finish_reason":"length"}]}\n\ndata: [DONE]\n\n'


def ok(_request: httpx2.Request | None = None) -> httpx2.Response:
    return httpx2.Response(200, headers={"content-type": "text/event-stream"}, stream=httpx2.ByteStream(SSE))


class Server:
    """A MockTransport handler: records every request, answers with ``reply(request)`` (a response,
    or it raises)."""

    def __init__(self, reply=ok):
        self.seen: list[httpx2.Request] = []
        self.reply = reply

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        request.read()
        self.seen.append(request)
        return self.reply(request)


def pair(server: Server, hooks: dict | None = None, **settings) -> tuple[TemplatedOpenAI, openai.OpenAI]:
    """The suite's client and the SDK's own, made alike, both answered by ``server``."""
    made = []
    for cls in (TemplatedOpenAI, openai.OpenAI):
        kwargs = dict(base_url="http://127.0.0.1:9/v1", api_key="sk-one", max_retries=0,
                      timeout=httpx2.Timeout(30.0, connect=5.0), default_headers=bounds.IDENTITY)
        kwargs.update(settings)
        http = httpx2.Client(transport=httpx2.MockTransport(server), follow_redirects=True, event_hooks=hooks or {})
        made.append(cls(**kwargs, http_client=http))
    return count_templated(made[0]), made[1]


def count_templated(client: TemplatedOpenAI) -> TemplatedOpenAI:
    """Count the client's sends from its template (``client.templated_sends``) by wrapping its
    ``send_templated`` on the instance: the package keeps no counter for tests."""
    real = client.send_templated
    client.templated_sends = 0

    def send_templated(request):
        client.templated_sends += 1
        return real(request)

    client.send_templated = send_templated
    return client


def sdk_post(client: openai.OpenAI, body, options: dict, path: str = PATH) -> httpx2.Response:
    return client.post(path, content=body, options=options, cast_to=httpx2.Response, stream=True)


def outcome(call):
    """The status of the response ``call`` returns, or the exception it raises."""
    try:
        response = call()
    except Exception as err:  # noqa: BLE001 - the exception is the outcome
        return err
    response.close()
    return response.status_code


def post_both(ours: TemplatedOpenAI, sdk: openai.OpenAI, server: Server, body: bytes, options: dict | None = None,
              path: str = PATH) -> tuple[bytes, bytes]:
    """The bytes each client puts on the wire for the same post."""
    options = {"security": SECURITY} if options is None else options
    ours.post_stream(path, body, options).close()
    sdk.post(path, content=body, options=options, cast_to=httpx2.Response, stream=True).close()
    return _request_bytes(server.seen[-2]), _request_bytes(server.seen[-1])


def test_later_posts_are_the_sdks_own_requests_with_their_own_bodies():
    server = Server()
    ours, sdk = pair(server)
    for body in (b'{"a":1}', b'{"b":22}', b"{}", b'{"c":"' + b"x" * 5000 + b'"}'):
        mine, theirs = post_both(ours, sdk, server, body)
        assert mine == theirs, "a different request on the wire"
        assert server.seen[-2].content == body and server.seen[-2].headers["content-length"] == str(len(body))
    assert ours.templated_sends == 3, "the template was not used for plain repeats"


def test_make_client_makes_a_templated_client():
    assert isinstance(make_client("http://127.0.0.1:9", "sk-one", 5.0, 30.0), TemplatedOpenAI)


@pytest.mark.parametrize("change", ["headers", "timeout", "path", "api_key", "base_url", "cookie"])
def test_a_post_of_another_shape_goes_the_sdks_way(change):
    server = Server()
    ours, sdk = pair(server)
    post_both(ours, sdk, server, b'{"a":1}')
    options = {"security": SECURITY}
    path = PATH
    if change == "headers":
        options = {"security": SECURITY, "headers": {"X-Tenant": "b"}}
    elif change == "timeout":
        options = {"security": SECURITY, "timeout": httpx2.Timeout(3.0)}
    elif change == "path":
        path = "/completions"
    elif change == "api_key":
        ours.api_key = sdk.api_key = "sk-two"
    elif change == "base_url":
        ours.base_url = sdk.base_url = "http://127.0.0.1:10/v2"
    elif change == "cookie":
        ours._client.cookies.set("session", "abc")
        sdk._client.cookies.set("session", "abc")
    mine, theirs = post_both(ours, sdk, server, b'{"z":0}', options, path)
    assert ours.templated_sends == 0, f"{change}: the old template was used"
    assert mine == theirs
    if change == "api_key":
        assert server.seen[-2].headers["authorization"] == "Bearer sk-two"
    mine, theirs = post_both(ours, sdk, server, b'{"y":1}', options, path)
    assert mine == theirs
    # the new shape is the template from now on; with a cookie jar, every post is the SDK's
    assert ours.templated_sends == (0 if change == "cookie" else 1)


def test_options_changed_by_the_caller_after_the_post_do_not_change_the_template():
    server = Server()
    ours, sdk = pair(server)
    headers = {"X-Tenant": "a"}
    ours.post_stream(PATH, b"{}", {"security": SECURITY, "headers": headers}).close()
    headers["X-Tenant"] = "b"
    mine, theirs = post_both(ours, sdk, server, b"{}", {"security": SECURITY, "headers": headers})
    assert mine == theirs and server.seen[-2].headers["x-tenant"] == "b"
    assert ours.templated_sends == 0


@pytest.mark.parametrize("settings", [{"max_retries": 1}, {"default_query": {"api-version": "1"}},
                                      {"api_key": lambda: "sk-from-a-provider"}])
def test_a_client_that_retries_adds_a_query_or_refreshes_its_key_goes_the_sdks_way(settings):
    server = Server()
    ours, sdk = pair(server, **settings)
    for body in (b'{"a":1}', b'{"b":2}'):
        mine, theirs = post_both(ours, sdk, server, body)
        assert mine == theirs
    assert ours.templated_sends == 0


def failure(call) -> BaseException:
    with pytest.raises(Exception) as caught:
        call().close()
    return caught.value


def status(code: int, headers: dict | None = None):
    body = json.dumps({"error": {"message": f"said {code}", "type": "x", "code": code}}).encode()
    return lambda _request: httpx2.Response(code, headers={"content-type": "application/json", **(headers or {})},
                                            stream=httpx2.ByteStream(body))


def raising(err: Exception):
    def reply(_request):
        raise err
    return reply


@pytest.mark.parametrize("reply", [status(400), status(401), status(404), status(422), status(429, {"retry-after": "3"}),
                                   status(500), status(503), raising(httpx2.ReadTimeout("slow")),
                                   raising(httpx2.ConnectError("refused")), raising(httpx2.RemoteProtocolError("bad"))],
                         ids=["400", "401", "404", "422", "429", "500", "503", "timeout", "connect", "protocol"])
def test_a_templated_post_fails_as_the_sdks_own_post(reply):
    server = Server()
    ours, sdk = pair(server)
    ours.post_stream(PATH, b"{}", {"security": SECURITY}).close()  # the template
    server.reply = reply
    mine = failure(lambda: ours.post_stream(PATH, b'{"a":1}', {"security": SECURITY}))
    theirs = failure(lambda: sdk.post(PATH, content=b'{"a":1}', options={"security": SECURITY},
                                      cast_to=httpx2.Response, stream=True))
    assert ours.templated_sends == 1
    assert type(mine) is type(theirs) and str(mine) == str(theirs)
    assert type(mine.__cause__) is type(theirs.__cause__)
    if isinstance(theirs, openai.APIStatusError):
        assert (mine.status_code, mine.body, dict(mine.response.headers)) == \
               (theirs.status_code, theirs.body, dict(theirs.response.headers))


def test_a_request_whose_length_is_not_its_last_header_is_no_template():
    body = httpx2.ByteStream(b"{}")
    assert _Template.usable(httpx2.Request("POST", "http://h/v1/x", headers=[("X-A", "1"), ("Content-Length", "2")],
                                           stream=body))
    assert not _Template.usable(httpx2.Request("POST", "http://h/v1/x", headers=[("Content-Length", "2"), ("X-A", "1")],
                                               stream=body))


def test_servers_still_see_the_sdks_user_agent():
    server = Server()
    ours, sdk = pair(server)
    post_both(ours, sdk, server, b"{}")
    post_both(ours, sdk, server, b"{}")
    assert server.seen[-2].headers["user-agent"] == f"OpenAI/Python {openai.__version__}"


def test_each_templated_request_has_its_own_extensions():
    server = Server()
    ours, _sdk = pair(server)
    for _ in range(3):
        ours.post_stream(PATH, b"{}", {"security": SECURITY}).close()
    server.seen[1].extensions["trace"] = object()  # the wire hook stamps each request's own
    assert "trace" not in server.seen[2].extensions
    assert ours._template is not None and "trace" not in ours._template.extensions


def test_a_users_streams_send_the_same_request_but_the_body_through_the_template():
    server = Server()
    client, _sdk = pair(server)
    api = endpoint("completions")
    for prompt in ("one", "two", "three"):
        result = api.stream(client, api.body("m", 1, prompt), lambda *a: None, StreamResult(), StreamLimits(1))
        assert result.content_chunks == 1
    assert client.templated_sends == 2
    seen = server.seen
    assert [json.loads(r.content)["prompt"] for r in seen] == ["one", "two", "three"]
    heads = [[(k, v) for k, v in r.headers.raw if k.lower() != b"content-length"] for r in seen]
    assert heads[0] == heads[1] == heads[2] and seen[0].url == seen[2].url


# Found by an adversarial review of the template (each failed before its fix):

def test_two_greenlets_posting_through_one_client_each_keep_their_own_request():
    """One post's options were paired with the other's request when a second greenlet's post was
    built while the first waited for its reply."""
    import gevent
    import gevent.event

    b_sent, a_done = gevent.event.Event(), gevent.event.Event()

    def reply(request):
        if request.headers.get("x-who") == "A" and not b_sent.is_set():
            b_sent.wait()  # A's answer comes after B was built and sent
        elif request.headers.get("x-who") == "B" and not a_done.is_set():
            b_sent.set()
            a_done.wait()  # B's answer comes after A's post returned
        return ok()

    server = Server(reply)
    ours, _sdk = pair(server)
    opts_a = {"security": SECURITY, "headers": {"X-Who": "A"}}
    opts_b = {"security": SECURITY, "headers": {"X-Who": "B"}}

    def a():
        ours.post_stream(PATH, b'{"a":1}', opts_a).close()
        a_done.set()

    gevent.joinall([gevent.spawn(a), gevent.spawn(lambda: ours.post_stream("/completions", b'{"b":1}', opts_b).close())],
                   raise_error=True)
    ours.post_stream(PATH, b'{"a":2}', opts_a).close()
    assert (server.seen[-1].url.path, server.seen[-1].headers["x-who"]) == ("/v1/chat/completions", "A")


def test_the_first_requests_wire_stamp_is_not_part_of_the_template():
    server = Server()
    ours, _sdk = pair(server, hooks=event_hooks())
    with WireClock(yield_before_send=False).active():
        ours.post_stream(PATH, b"{}", {"security": SECURITY}).close()
    ours.post_stream(PATH, b"{}", {"security": SECURITY}).close()  # no clock: the SDK's request carries no trace
    assert ours.templated_sends == 1 and "trace" not in server.seen[-1].extensions


def test_options_that_change_how_the_sdk_sends_are_never_templated():
    """``follow_redirects`` and ``max_retries`` are the SDK's to apply: a templated post ignored them."""
    def reply(request):
        return ok() if request.url.path.endswith("/moved") else httpx2.Response(
            307, headers={"location": "http://127.0.0.1:9/v1/moved"})

    server = Server(reply)
    ours, sdk = pair(server)
    opts = {"security": SECURITY, "follow_redirects": False}
    mine = [outcome(lambda: ours.post_stream(PATH, b"{}", opts)) for _ in range(2)]
    theirs = outcome(lambda: sdk_post(sdk, b"{}", opts))
    assert [type(m) for m in mine] == [type(theirs)] * 2 and isinstance(theirs, openai.APIStatusError)

    calls = []

    def busy_every_other(_request):
        calls.append(1)
        return ok() if len(calls) % 2 == 0 else httpx2.Response(503, headers={"retry-after-ms": "1"},
                                                                stream=httpx2.ByteStream(b"{}"))

    ours, _sdk = pair(Server(busy_every_other))
    opts = {"security": SECURITY, "max_retries": 1}
    assert [outcome(lambda: ours.post_stream(PATH, b"{}", opts)) for _ in range(2)] == [200, 200]
    assert ours.templated_sends == 0


@pytest.mark.parametrize("change", ["max_retries", "organization", "project"])
def test_client_settings_changed_after_the_template_are_the_sdks_again(change):
    calls = []

    def reply(_request):
        calls.append(1)
        return httpx2.Response(503, stream=httpx2.ByteStream(b"{}")) if len(calls) == 2 else ok()

    server = Server(reply if change == "max_retries" else ok)
    ours, sdk = pair(server)
    ours.post_stream(PATH, b"{}", {"security": SECURITY}).close()
    if change == "max_retries":
        ours.max_retries = 1  # the SDK retries the 503
        assert outcome(lambda: ours.post_stream(PATH, b"{}", {"security": SECURITY})) == 200
        return
    setattr(ours, change, "x-1")
    setattr(sdk, change, "x-1")
    mine, theirs = post_both(ours, sdk, server, b"{}")
    assert mine == theirs and server.seen[-2].headers[f"openai-{change}"] == "x-1"


@pytest.mark.parametrize("body", ['{"p":"\u00e9"}', b""], ids=["str", "empty"])
def test_a_body_the_template_cannot_send_goes_the_sdks_way(body):
    """A ``str`` body had its characters counted as its length; an empty body's ``Content-Length: 0``
    goes right after ``Host`` in httpx's request, last in the template's."""
    server = Server()
    ours, sdk = pair(server)
    ours.post_stream(PATH, b"{}", {"security": SECURITY}).close()
    mine, theirs = post_both(ours, sdk, server, body)
    assert mine == theirs


# -- httpx's send in one function (``httpsend``) -----------------------------------------------------

def test_templated_posts_do_not_go_through_httpx_send(monkeypatch):
    """A templated post is sent by ``httpsend.send_stream``, not ``httpx2.Client.send`` (its auth
    flow, nested methods and cookie extraction per request); the SDK's first post still is."""
    sent = []  # httpx's send starts an auth flow per request, its first step
    real = httpx2.Auth.sync_auth_flow
    monkeypatch.setattr(httpx2.Auth, "sync_auth_flow", lambda self, request: sent.append(1) or real(self, request))
    server = Server()
    ours, _sdk = pair(server)
    for _ in range(3):
        ours.post_stream(PATH, b'{"a":1}', {"security": SECURITY}).close()
    assert ours.templated_sends == 2 and len(server.seen) == 3
    assert len(sent) == 1, f"httpx's send called {len(sent)} times for 1 SDK post and 2 templated ones"


def redirecting(request: httpx2.Request) -> httpx2.Response:
    if request.url.path.endswith("/completions") and "moved" not in request.url.path:
        return httpx2.Response(307, headers={"location": "/v1/moved/completions"})
    return ok()


@pytest.mark.parametrize("follow", [True, False])
def test_a_templated_post_redirected_ends_as_the_sdks_own(follow):
    server = Server()
    ours, sdk = pair(server)
    for client in (ours, sdk):
        client._client.follow_redirects = follow
    ours.post_stream(PATH, b"{}", {"security": SECURITY}).close()  # the template
    server.reply = redirecting
    seen = len(server.seen)
    results = []
    for call in (lambda: ours.post_stream(PATH, b'{"a":1}', {"security": SECURITY}), lambda: sdk_post(sdk, b'{"a":1}', {"security": SECURITY})):
        try:
            response = call()
        except openai.APIStatusError as err:  # a 307 not followed: the SDK's status error
            response = err.response
        results.append((response.status_code, str(response.url), [h.status_code for h in response.history],
                        str(response.next_request.url) if response.next_request else None,
                        response.read() if response.status_code == 200 else b""))
        response.close()
    assert ours.templated_sends == 1
    assert results[0] == results[1]
    ours_seen, sdk_seen = server.seen[seen:seen + (len(server.seen) - seen) // 2], server.seen[seen + (len(server.seen) - seen) // 2:]
    assert [_request_bytes(r) for r in ours_seen] == [_request_bytes(r) for r in sdk_seen]


def test_a_cookie_a_templated_response_sets_is_kept_as_httpx_keeps_it():
    server = Server()
    ours, sdk = pair(server)
    ours.post_stream(PATH, b"{}", {"security": SECURITY}).close()  # the template
    server.reply = lambda _r: httpx2.Response(200, headers={"content-type": "text/event-stream", "set-cookie": "s=1; Path=/"},
                                              stream=httpx2.ByteStream(SSE))
    ours.post_stream(PATH, b'{"a":1}', {"security": SECURITY}).close()
    sdk_post(sdk, b'{"a":1}', {"security": SECURITY}).close()
    assert ours.templated_sends == 1
    assert dict(ours._client.cookies) == dict(sdk._client.cookies) == {"s": "1"}
    mine, theirs = post_both(ours, sdk, server, b'{"b":2}')  # the cookie goes back: the SDK's way again
    assert mine == theirs and b"cookie: s=1" in mine.lower() and ours.templated_sends == 1


def test_hooks_log_line_and_a_closed_client_are_httpx_sends(caplog):
    import logging

    calls = []
    hooks = {"request": [lambda r: calls.append(("request", r.url.path))],
             "response": [lambda r: calls.append(("response", r.status_code, r.request.url.path))]}
    server = Server()
    ours, sdk = pair(server, hooks)
    ours.post_stream(PATH, b"{}", {"security": SECURITY}).close()
    with caplog.at_level(logging.INFO, logger="httpx2"):
        calls.clear()
        ours.post_stream(PATH, b'{"a":1}', {"security": SECURITY}).close()
        mine = (list(calls), [r.getMessage() for r in caplog.records])
        calls.clear()
        caplog.clear()
        sdk_post(sdk, b'{"a":1}', {"security": SECURITY}).close()
        theirs = (list(calls), [r.getMessage() for r in caplog.records])
    assert ours.templated_sends == 1 and mine == theirs and mine[1]
    response = ours.post_stream(PATH, b'{"a":1}', {"security": SECURITY})
    with pytest.raises(RuntimeError, match="elapsed"):  # set when the stream closes (httpx's BoundSyncStream)
        response.elapsed
    response.close()
    assert response.elapsed is not None
    ours._client.close()
    sdk._client.close()
    assert str(failure(lambda: ours.post_stream(PATH, b'{"a":1}', {"security": SECURITY}))) == \
        str(failure(lambda: sdk_post(sdk, b'{"a":1}', {"security": SECURITY})))


def test_an_instrumented_httpx_send_sees_every_templated_post(monkeypatch):
    """An instrumentation that wraps ``httpx2.Client.send`` (tracing, metrics) at any time still sees
    each request: the one-function send is only for httpx's own methods."""
    server = Server()
    ours, _sdk = pair(server)
    ours.post_stream(PATH, b'{"a":1}', {"security": SECURITY}).close()  # the template, before the wrap
    sent = []
    real = httpx2.Client.send
    monkeypatch.setattr(httpx2.Client, "send", lambda self, *a, **kw: sent.append(1) or real(self, *a, **kw))
    for _ in range(2):
        ours.post_stream(PATH, b'{"a":1}', {"security": SECURITY}).close()
    assert ours.templated_sends == 2 and len(sent) == 2


def test_a_send_wrapped_on_the_client_itself_sees_every_templated_post():
    """A ``send`` set on one client (a spy, ``mock.patch.object``, one client's instrumentation) is
    called for every post, as it was before the one-function send (it saw 1 of 3)."""
    server = Server()
    ours, _sdk = pair(server)
    http = ours._client
    sent = []
    real = http.send
    http.send = lambda *a, **kw: sent.append(1) or real(*a, **kw)
    for _ in range(3):
        ours.post_stream(PATH, b'{"a":1}', {"security": SECURITY}).close()
    assert ours.templated_sends == 2 and len(sent) == 3


# -- the template's request without httpx's constructor (issue 25, sixth part) ----------------------

def test_a_templated_request_is_what_httpxs_constructor_makes():
    """``_Template.request`` sets a request's attributes without ``httpx2.Request.__init__``: the
    same attributes, method, URL, headers (their encoding, ``Content-Length`` last), body and a copy
    of the extensions as the constructor with ``stream=`` and the body read."""
    server = Server()
    ours, _sdk = pair(server)
    ours.post_stream(PATH, b'{"a":1}', {"security": SECURITY}).close()
    template = ours._template
    for body in (b'{"b":2}', b"x" * 70000):
        made = template.request(body)
        headers = httpx2.Headers(template.headers, encoding=template.headers.encoding)
        headers["Content-Length"] = str(len(body))
        stock = httpx2.Request(template.method, template.url, headers=headers, stream=httpx2.ByteStream(body),
                               extensions=dict(template.extensions))
        stock.read()
        assert sorted(vars(made)) == sorted(vars(stock))
        assert (made.method, made.url, made.headers.raw, made.headers.encoding, made.content, made.extensions) == (
            stock.method, stock.url, stock.headers.raw, stock.headers.encoding, stock.content, stock.extensions)
        assert made.headers.raw[-1] == (b"Content-Length", str(len(body)).encode())
        assert made.extensions is not template.extensions and list(made.stream) == [body]
    first, second = template.request(b"1"), template.request(b"22")
    first.headers["X-Hook"] = "one"  # a request hook's change stays on its own request
    assert "x-hook" not in second.headers and "x-hook" not in template.headers


def test_a_jar_that_held_cookies_is_asked_as_httpx_asks_it():
    """``_has_cookies`` answers an empty jar without iterating it; a jar that held a cookie (emptied
    since, its domain's dict left behind) is asked the long way and templates again once empty."""
    from vllm_locust.backend.templated import _has_cookies

    http = httpx2.Client()
    assert not _has_cookies(http)
    http.cookies.set("k", "v", domain="example.org")
    assert _has_cookies(http)
    http.cookies.delete("k", domain="example.org")
    assert http.cookies.jar._cookies and not _has_cookies(http)  # a domain left, no cookie: none
