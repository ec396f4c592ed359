"""One spelling of a server's address: ``--host``, ``--metrics-url`` and ``--paired-host`` may be
given as ``http://h:p/v1`` (the OpenAI base URL people copy); the suite's own routes (``/metrics``,
``/reset_prefix_cache``, ``/version``) live at the server's root, and the client adds ``/v1``."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit


def normalize_host(host: str | None) -> str:
    """``http://h:p/v1/`` -> ``http://h:p``: surrounding spaces, trailing slashes and one trailing
    ``/v1`` removed; any other path (a proxy's prefix) is kept."""
    host = (host or "").strip().rstrip("/")
    if host.endswith("/v1"):
        host = host[: -len("/v1")].rstrip("/")
    return host


def is_loopback_url(url: str) -> bool:
    """Whether ``url``'s host is this machine's loopback (``localhost``, 127.0.0.0/8, ``::1``)."""
    try:
        host = (urlsplit(normalize_host(url)).hostname or "").lower()
    except ValueError:
        return False
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
