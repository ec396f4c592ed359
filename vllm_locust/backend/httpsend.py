"""``httpx2.Client.send(request, stream=True)`` in one function, for a client without auth.

Why: for a templated post (``templated.py``) httpx's ``send`` was a third of the time between the
SDK's part and the transport (issue 25): an auth-flow generator, three nested methods, a context
manager, and the cookie jar's extraction (a urllib request built and a lock taken) for a response
that sets no cookie. ``send_stream`` does the same steps in the same order: the timeout extension,
request hooks, the mounted transport, httpx's error naming the request, the response's request,
stream (``BoundSyncStream``: ``elapsed``), cookies (extracted when the response sets one), default
encoding and log line, response hooks, then a redirect: followed by httpx's own loop
(``_send_handling_redirects``, this response as its history) or left as ``next_request``.
``sends_directly`` says when that is all ``send`` would do: httpx's own methods, no auth, an open
client; anything else goes through ``client.send``.
"""

from __future__ import annotations

import logging
import time
from contextlib import suppress

import httpx2
from httpx2._client import BoundSyncStream, ClientState, logger as httpx_logger

from .bounds import lowered_name
from .httpx_compat import header_triples

_METHODS = ("send", "_send_handling_auth", "_send_handling_redirects", "_send_single_request", "_build_request_auth",
            "_transport_for_url", "_set_timeout")
_HTTPX = tuple(getattr(httpx2.Client, name) for name in _METHODS)
_INSTANCE_FREE = frozenset(_METHODS).isdisjoint
# The cookie jar's headers and the redirect statuses (``Response.has_redirect_location``'s), checked
# on httpx's lowered header names and on the status number before httpx's own lookups.
_COOKIE_HEADERS = frozenset({b"set-cookie", b"set-cookie2"})
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})


def sends_directly(client, url: httpx2.URL) -> bool:
    """Whether ``client.send(request, stream=True)`` for a request to ``url`` is ``send_stream``'s
    steps: an httpx client with httpx's own sending methods, on its class and not replaced on the client
    itself (looked up each time: an instrumentation may wrap them at any time), no auth (the client's,
    or user info in ``url``: ``BasicAuth``), open, with redirects allowed."""
    if (not isinstance(client, httpx2.Client) or client._auth is not None or client._state is ClientState.CLOSED
            or not _INSTANCE_FREE(vars(client))):  # a method set on this client (a spy, one client's wrapper)
        return False
    cls = type(client)
    send, auth, redirects, single, build_auth, transport_for, set_timeout = _HTTPX
    return (cls.send is send and cls._send_handling_auth is auth and cls._send_handling_redirects is redirects
            and cls._send_single_request is single and cls._build_request_auth is build_auth
            and cls._transport_for_url is transport_for and cls._set_timeout is set_timeout
            and client.max_redirects >= 0 and not url.userinfo)


def send_stream(client: httpx2.Client, request: httpx2.Request) -> httpx2.Response:
    """``client.send(request, stream=True)`` for a client and request ``sends_directly`` allows."""
    client._state = ClientState.OPENED
    if "timeout" not in request.extensions:
        client._set_timeout(request)
    for hook in client._event_hooks["request"]:
        hook(request)
    transport = client._transport_for_url(request.url)
    start = time.perf_counter()
    try:
        response = transport.handle_request(request)
    except httpx2.RequestError as err:
        err.request = request  # what httpx's ``request_context`` does
        raise
    response.request = request
    response.stream = BoundSyncStream(response.stream, start=start)
    if not _COOKIE_HEADERS.isdisjoint(map(lowered_name, header_triples(response.headers))):  # nothing else is extracted
        client.cookies.extract_cookies(response)
    response.default_encoding = client._default_encoding
    if httpx_logger.isEnabledFor(logging.INFO):
        httpx_logger.info('HTTP Request: %s %s "%s %d %s"', request.method, request.url, response.http_version,
                          response.status_code, response.reason_phrase)
    try:
        for hook in client._event_hooks["response"]:
            hook(response)
        response.history = []
        if response.status_code not in _REDIRECT_STATUSES or not response.has_redirect_location:
            return response
        if client.follow_redirects:
            redirect = client._build_redirect_request(request, response)
            response.read()
            return client._send_handling_redirects(redirect, follow_redirects=True, history=[response])
        with suppress(httpx2.RemoteProtocolError):
            response.next_request = client._build_redirect_request(request, response)
        return response
    except BaseException:
        response.close()
        raise
