"""httpx2's internals the backend reads outside the wire client, in one place: a ``Headers``' own
``(name, lowered name, value)`` triples, which answer "is there a Content-Encoding" in C without
httpx's per-name lookup (about 150 bytecodes a response, issue 25). ``VERIFIED``: the installed
httpx2 is one this was read against; on another the triples are built from the public ``raw``.
"""

from __future__ import annotations

import logging

import httpx2

logger = logging.getLogger(__name__)

TESTED = ("2.16.",)  # httpx2 releases whose Headers this was read against (pyproject bounds it)
VERIFIED = httpx2.__version__.startswith(TESTED)
if not VERIFIED:  # pragma: no cover - the pinned httpx2 is verified
    logger.warning("httpx2 %s is not the version this suite was verified with (%sx): headers are read through "
                   "its public API", httpx2.__version__, TESTED[0])


def header_triples(headers: httpx2.Headers) -> list[tuple[bytes, bytes, bytes]]:
    """``(name, lowered name, value)`` of each header in order, as bytes."""
    if VERIFIED:
        return headers._list
    return [(name, name.lower(), value) for name, value in headers.raw]
