"""The ``openai`` client with its last streamed post kept as a template: a user's client sends the
same request (method, URL, headers, timeout) every time but for the body, and the SDK rebuilt it all.

Why: for a short stream, the SDK's ``post`` -> ``request`` around the send (two copies of the
options model, an idempotency key, ``_build_headers``, URL parsing, ``_process_response``) was about
a third of the client's CPU per request (issue 25). ``TemplatedOpenAI.post_stream`` is ``post(path,
content=..., options=..., cast_to=httpx2.Response, stream=True)``: the SDK builds and sends a user's
first request, and the request it built becomes the template; later posts with the same path and
options to the same client (same key, base URL, timeout, no cookies) send the template's URL and
headers with their own body through the client's httpx client, and map failures as the SDK's
``request`` does (``APITimeoutError``, ``APIConnectionError``, the status error of
``_make_status_error_from_response`` with the body read). Anything else goes the SDK's whole way:
another shape, a client with retries, an API-key provider, workload identity or a provider runtime,
default query parameters, a cookie the server set, options other than ``security``, ``headers``,
``params`` and ``timeout``, a body that is not bytes. A templated post does not write the SDK's debug
log lines (``OPENAI_LOG=debug`` shows a user's first request only).
"""

from __future__ import annotations

import copy

import httpx2
import openai
from openai._httpx2 import request_exceptions, status_exceptions, timeout_exceptions
from openai._models import FinalRequestOptions

from .httpsend import send_stream, sends_directly
from .transport import headers_of
from .wire import greenlet_local

# The options a template may be made for: the rest (``follow_redirects``, ``max_retries``, ...) change
# how the SDK sends, not only what it builds.
TEMPLATE_OPTIONS = frozenset({"security", "headers", "params", "timeout"})


class _Template:
    """A request the SDK built, and what it was built from."""

    __slots__ = ("path", "options", "api_key", "base_url", "timeout", "organization", "project", "method", "url",
                 "headers", "fields", "encoding", "extensions")

    def __init__(self, client: "TemplatedOpenAI", path: str, options: dict, request: httpx2.Request,
                 extensions: dict):
        """``extensions``: the request's as the SDK built them (before the request hook added its own)."""
        self.path, self.options = path, copy.deepcopy(options)  # the caller's dicts may change later
        self.api_key, self.base_url, self.timeout = client.api_key, client._base_url, client.timeout
        self.organization, self.project = client.organization, client.project  # in the SDK's default headers
        self.method, self.url = request.method, request.url
        headers = httpx2.Headers(request.headers, encoding=request.headers.encoding)
        headers.pop("content-length", None)  # the body's own, set again for each body
        self.headers, self.extensions = headers, extensions
        self.fields = tuple(headers._list)  # httpx's (name, lowered name, value) triples, the body's length left out
        self.encoding = headers.encoding

    @staticmethod
    def usable(request: httpx2.Request) -> bool:
        """A request whose body's length is its last header, where httpx puts it for a body of bytes."""
        raw = request.headers.raw
        return bool(raw) and raw[-1][0].lower() == b"content-length" and isinstance(request.stream, httpx2.ByteStream)

    def fits(self, client: "TemplatedOpenAI", path: str, content, options: dict) -> bool:
        """Whether a post of ``content`` to ``path`` with ``options`` is this template's request.
        An empty body goes the SDK's way: httpx puts its ``Content-Length: 0`` right after ``Host``."""
        return (self.path == path and type(content) is bytes and content and self.options == options
                and self.base_url is client._base_url and self.api_key == client.api_key
                and self.timeout is client.timeout and client.max_retries == 0 and not _has_cookies(client._client)
                and self.organization == client.organization and self.project == client.project)

    def request(self, content: bytes) -> httpx2.Request:
        """The template's request with this body: what ``httpx2.Request(method, url, headers=...,
        stream=httpx2.ByteStream(content), extensions=...)`` makes, its body read, made without the
        constructor's steps (each header normalised and the URL parsed again, for the same headers
        and URL each time): the template's URL (httpx's are immutable), its headers (``Host``
        included, the encoding known) with the body's ``Content-Length`` last, where httpx puts it
        (``usable``), and a copy of the extensions (the request hook adds the wire stamp to each
        request's own). ``tests/unit/test_templated_client.py`` holds it to the constructor's."""
        headers = headers_of([*self.fields, (b"Content-Length", b"content-length", b"%d" % len(content))],
                             self.encoding)
        request = _new_request(httpx2.Request)
        request.method, request.url, request.headers = self.method, self.url, headers
        request.extensions, request.stream = dict(self.extensions), httpx2.ByteStream(content)
        request._content = content  # read, as ``content=`` leaves it
        return request


_new_request = object.__new__


def _has_cookies(http: httpx2.Client) -> bool:
    """``bool(http.cookies)``; a jar that never held a cookie (its domains' dict is empty: the
    standard library's ``CookieJar``) answers without iterating (two generators per request)."""
    return bool(getattr(http._cookies.jar, "_cookies", True)) and bool(http.cookies)


class TemplatedOpenAI(openai.OpenAI):
    """``openai.OpenAI`` with one request template (a client per user: one request shape)."""

    _template: _Template | None = None

    @property
    def user_agent(self) -> str:
        """The SDK's own (it names the class): servers see ``OpenAI/Python <version>`` as before."""
        return super().user_agent.replace(type(self).__name__, openai.OpenAI.__name__, 1)

    def _build_request(self, options: FinalRequestOptions, *, retries_taken: int = 0) -> httpx2.Request:
        """The SDK's; the request and its extensions as built are kept for this greenlet's post (two
        greenlets posting through one client each keep their own)."""
        request = super()._build_request(options, retries_taken=retries_taken)
        greenlet_local().built = (self, request, dict(request.extensions))
        return request

    def _plain(self) -> bool:
        """A client whose request the SDK builds the same way each time from the same options."""
        return (self.max_retries == 0 and not self.default_query and self._api_key_provider is None
                and self._provider_runtime is None and self._workload_identity_auth is None)

    def post_stream(self, path: str, content: bytes, options: dict) -> httpx2.Response:
        """``post(path, content=content, options=options, cast_to=httpx2.Response, stream=True)``."""
        template = self._template
        if template is None or not template.fits(self, path, content, options):
            return self._post_and_keep(path, content, options)
        return self.send_templated(template.request(content))

    def _post_and_keep(self, path: str, content: bytes, options: dict) -> httpx2.Response:
        """The SDK's whole way; the request it builds is the template from now on (when it can be)."""
        self._template = None
        local = greenlet_local()
        local.built = None
        try:
            return self.post(path, content=content, options=options, cast_to=httpx2.Response, stream=True)
        finally:
            built, local.built = local.built, None
            if (built is not None and built[0] is self and type(content) is bytes and options.keys() <= TEMPLATE_OPTIONS
                    and _Template.usable(built[1]) and self._plain() and not self._client.cookies):
                self._template = _Template(self, path, options, built[1], built[2])

    def send_templated(self, request: httpx2.Request) -> httpx2.Response:
        """Send through the client's httpx client (its hooks, redirects and cookie jar; ``httpsend``'s
        one function for httpx's ``send`` where it can) and fail as the SDK's ``request`` does with no
        retries left."""
        http = self._client
        try:
            if sends_directly(http, request.url):
                response = send_stream(http, request)
            else:
                response = http.send(request, stream=True)
        except timeout_exceptions() as err:
            raise openai.APITimeoutError(request=request) from err
        except openai.OpenAIError:
            raise
        except request_exceptions() as err:
            raise openai.APIConnectionError(request=request) from err
        if 200 <= response.status_code <= 299:  # ``raise_for_status``'s success, without its lookups
            return response
        try:
            response.raise_for_status()
        except status_exceptions() as err:  # 4xx and 5xx
            if not err.response.is_closed:
                err.response.read()
            raise self._make_status_error_from_response(err.response) from None
        return response
