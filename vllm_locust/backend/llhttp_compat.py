"""geventhttpclient's llhttp parser, fed without its Python wrapper, in one place, checked against
the installed geventhttpclient.

Why: ``HTTPResponse.feed`` (Python) only mends a HEAD response's trailing bytes before it calls
the C parser's ``feed``; a body is never a HEAD's, so the lean client's body reads call the C
``feed`` itself (one Python call less per chunk). ``VERIFIED``: the installed geventhttpclient is
one this was read against; on another every feed is the public ``HTTPResponse.feed``.
"""

from __future__ import annotations

import logging

import geventhttpclient

logger = logging.getLogger(__name__)

TESTED = ("2.6.",)  # geventhttpclient releases this was read against (pyproject bounds it)
VERIFIED = str(getattr(geventhttpclient, "__version__", "")).startswith(TESTED)
_C_FEED = None
if VERIFIED:
    try:
        from geventhttpclient._parser import HTTPResponseParser

        _C_FEED = HTTPResponseParser.feed
    except (ImportError, AttributeError):  # pragma: no cover - the verified release has it
        VERIFIED = False
if not VERIFIED:  # pragma: no cover - the pinned geventhttpclient is verified
    logger.warning("geventhttpclient %s is not the version this suite was verified with (%sx): the lean client "
                   "feeds its parser through the public HTTPResponse.feed",
                   getattr(geventhttpclient, "__version__", "?"), TESTED[0])


def body_feed(parser):
    """``parser.feed`` for a response body's bytes: the C parser's own when verified."""
    return _C_FEED.__get__(parser) if _C_FEED is not None else parser.feed
