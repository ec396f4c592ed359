"""The web UI obeys its own page only: other sites' requests are refused and nothing is shared with them.

Seen (issue 21): a form on any web page, posted by the operator's own browser to Locust's
``/swarm`` with ``host=`` the attacker's server, started a run that sent the API key there;
cross-site POSTs set markers and reset the server's prefix cache; every answer carried
``Access-Control-Allow-Origin: <the caller's origin>`` (Locust calls ``CORS(app)``), so any page
could read ``/server-metrics``; and request bodies had no size limit. Listening on 127.0.0.1 does
not help: the request comes from the operator's browser.

``install`` wraps the Flask app's WSGI callable (so it sees every request before Flask reads the
body, and every response after flask_cors, whose after-request hook and exception wrappers run
after any hook this package could register):

- A state-changing request (any method but GET/HEAD/OPTIONS; Locust 2.47 changes state only by
  POST: ``/swarm``, ``/stop``, ``/stats/reset``, ``/user``) whose ``Origin`` (or, without one,
  ``Referer``) is not the UI's own host[:port] (the request's ``Host``) is refused with 403.
  ``Origin: null`` (sandboxed frames, ``file:`` pages, no-referrer policies) is refused too. A
  request with neither header is accepted: browsers send ``Origin`` on every cross-origin POST
  (and on same-origin ones), so only scripts and curl send neither.
- On a UI bound to loopback, a ``Host`` that is not a loopback name is refused for every method:
  otherwise a DNS-rebinding page (evil.example resolving to 127.0.0.1) would be same-origin.
- A body over ``MAX_BODY_BYTES`` is refused with 413 unread (and Flask's ``MAX_CONTENT_LENGTH``
  bounds chunked bodies that announce no length).
- No ``Access-Control-*`` header leaves: the UI serves its own page, which needs none.
"""

from __future__ import annotations

import ipaddress
import json
import logging
from urllib.parse import urlsplit

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024  # Locust's start form with every option filled in is a few KiB
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
LOOPBACK_NAMES = frozenset({"localhost", "localhost.", "::1"})
_logged: set = set()  # refusals already logged (once each: a hostile page may repeat them)
MAX_LOGGED = 100


def _host_port(netloc: str) -> tuple[str, str]:
    """``(host, port)`` of ``host[:port]``, lower case, brackets off IPv6, default ports (80, 443)
    dropped: a UI behind a TLS proxy sees ``Host: ui`` for ``Origin: https://ui``."""
    netloc = netloc.strip().lower()
    if netloc.startswith("["):
        host, _, rest = netloc[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    else:
        host, _, port = netloc.rpartition(":") if netloc.count(":") == 1 else (netloc, "", "")
    return host, "" if port in ("80", "443") else port


def is_loopback(host: str) -> bool:
    host = host.strip("[]").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_is_loopback(environ) -> bool:
    """Whether the request's ``Host`` names loopback (or it has none: not a browser). A listener
    bound to loopback refuses any other: a DNS-rebinding page (evil.example resolving to 127.0.0.1)
    reaches it as its own origin."""
    host = environ.get("HTTP_HOST")
    if host is None:
        return True
    try:
        name = urlsplit("//" + host.strip()).hostname or ""
    except ValueError:
        return False
    return is_loopback(name)


def source_of(environ) -> str | None:
    """The origin a browser names for the page that made the request: ``Origin``, else the
    ``Referer``'s scheme://host[:port]; None when the request has neither (a script)."""
    origin = environ.get("HTTP_ORIGIN")
    if origin is not None:
        return origin.strip()
    referer = environ.get("HTTP_REFERER")
    if referer is None:
        return None
    parts = urlsplit(referer.strip())
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else "null"


def refusal(environ, bound_host: str) -> tuple[int, str] | None:
    """Why this request must not reach Locust or the suite (status, one line), or None."""
    method = environ.get("REQUEST_METHOD", "GET").upper()
    own = environ.get("HTTP_HOST") or f"{environ.get('SERVER_NAME', '')}:{environ.get('SERVER_PORT', '')}"
    own_host, own_port = _host_port(own)
    if is_loopback(bound_host) and not is_loopback(own_host):
        return 403, (f"Host {own!r} is not a loopback name: this web UI listens on {bound_host} only "
                     "(open it as http://127.0.0.1:PORT or http://localhost:PORT)")
    if method not in SAFE_METHODS:
        source = source_of(environ)
        if source is not None:
            parts = urlsplit(source)
            if source == "null" or not parts.netloc or _host_port(parts.netloc) != (own_host, own_port):
                return 403, (f"{method} {environ.get('PATH_INFO', '')} from {source!r} refused: only this web UI's "
                             f"own page ({own}) may change its state")
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 400, "bad Content-Length"
    if length > MAX_BODY_BYTES:
        return 413, f"request body of {length} bytes refused: at most {MAX_BODY_BYTES} bytes"
    return None


def log_once(status: int, message: str, environ) -> None:
    key = (status, environ.get("HTTP_ORIGIN") or environ.get("HTTP_REFERER") or environ.get("HTTP_HOST"))
    if key not in _logged and len(_logged) < MAX_LOGGED:
        _logged.add(key)
        logger.warning("web UI: %s (logged once per origin)", message)


class Guard:
    """WSGI middleware around the Flask app (see the module's docstring)."""

    def __init__(self, app, bound_host: str):
        self.app, self.bound_host = app, bound_host

    def __call__(self, environ, start_response):
        refused = refusal(environ, self.bound_host)
        if refused is not None:
            status, message = refused
            log_once(status, message, environ)
            body = json.dumps({"success": False, "message": message}).encode()
            reason = {400: "Bad Request", 403: "Forbidden", 413: "Content Too Large"}[status]
            start_response(f"{status} {reason}", [("Content-Type", "application/json"),
                                                  ("Content-Length", str(len(body)))])
            return [body]

        def start_without_cors(status, headers, exc_info=None):
            kept = [(name, value) for name, value in headers if not name.lower().startswith("access-control-")]
            return start_response(status, kept, exc_info) if exc_info else start_response(status, kept)

        return self.app(environ, start_without_cors)


def install(web_ui) -> None:
    """Guard Locust's web UI app (its routes and the suite's); once, however often called."""
    app = web_ui.app
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_BYTES
    if not isinstance(app.wsgi_app, Guard):
        app.wsgi_app = Guard(app.wsgi_app, str(getattr(web_ui, "host", "") or ""))
