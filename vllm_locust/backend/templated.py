"""The ``openai`` client with its last request kept as a template: a user's client sends the same
request (method, path, headers, timeout) every time but for the body, and the SDK rebuilt it all.

Why: the SDK's ``_build_request`` parsed the URL three times and built five header objects for every
request, about 155 us of a short stream's 400 us of client CPU (issue 25). ``TemplatedOpenAI``
lets the SDK build a request, keeps its URL and headers, and reuses them for the next request whose
options differ only in the body bytes. The headers are still the SDK's own for every request
(``_build_headers``: auth, a refreshed API key, default and per-request headers): a request whose
headers differ from the template's is built by the SDK and becomes the template. JSON bodies,
files, query parameters, another timeout or base URL, and cookies go the SDK's whole way.
"""

from __future__ import annotations

import httpx2
import openai
from openai._models import FinalRequestOptions
from openai._types import NotGiven


class TemplatedOpenAI(openai.OpenAI):
    """``openai.OpenAI`` with one request template (a client per user: one request shape)."""

    _template: tuple | None = None  # (key, url, headers without Content-Length, extensions)
    templated_requests = 0  # requests built from the template (tests read it)

    @property
    def user_agent(self) -> str:
        """The SDK's own (it names the class): servers see ``OpenAI/Python <version>`` as before."""
        return super().user_agent.replace(type(self).__name__, openai.OpenAI.__name__, 1)

    def _template_key(self, options: FinalRequestOptions, retries_taken: int) -> tuple | None:
        """What a request's build depends on besides its body, or None when it is not a plain body
        post (the SDK builds those: JSON, files, query parameters, cookies)."""
        if (not isinstance(options.content, bytes) or options.json_data is not None or options.files is not None
                or options.extra_json is not None or options.params or self.default_query
                or self._auth_query(options.security) or self._client.cookies):
            return None
        headers = self._build_headers(options, retries_taken=retries_taken)
        timeout = self.timeout if isinstance(options.timeout, NotGiven) else options.timeout
        return (options.method, options.url, self.base_url, timeout,
                options.follow_redirects, headers.raw, self._client.headers.raw, self._client.base_url)

    def _build_request(self, options: FinalRequestOptions, *, retries_taken: int = 0) -> httpx2.Request:
        key = self._template_key(options, retries_taken)
        template = self._template
        if key is None or template is None or template[0] != key:
            request = super()._build_request(options, retries_taken=retries_taken)
            if key is not None:
                headers = httpx2.Headers(request.headers)
                headers.pop("content-length", None)  # the body's own, set again for each body
                self._template = (key, request.url, headers, dict(request.extensions))
            return request
        _, url, headers, extensions = template
        self.templated_requests += 1
        # A copy of the extensions: the request hook adds the wire stamp to each request's own.
        return httpx2.Request(options.method, url, headers=headers, content=options.content,
                              extensions=dict(extensions))
