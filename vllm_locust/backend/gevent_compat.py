"""gevent's socket internals the lean client reads for speed, in one place, checked against the
installed gevent.

Why: under Locust's monkey-patching a socket is gevent's, and gevent's own ``recv`` reads first and
waits after: between two chunks of a stream that read fails (EAGAIN), which gevent catches and
raises again, a syscall and an exception per chunk (issue 25). Waiting on the socket's read watcher
(``_wait(_read_event)``) and then reading its C socket (``_sock``) is one syscall per chunk; a
request that fits the socket's buffer is sent by the C socket in one call. ``VERIFIED``: the
installed gevent is one this was read against; on another (or a plain socket) every read is the
socket's public ``recv`` and every send its ``sendall``, with one warning line. This module imports
no gevent: it reads the attributes of the socket it is given.
"""

from __future__ import annotations

import errno
import logging
from importlib import metadata

logger = logging.getLogger(__name__)

TESTED = ("26.",)  # gevent releases whose sockets this was read against (pyproject bounds it)


def _installed() -> str:
    try:
        return metadata.version("gevent")
    except metadata.PackageNotFoundError:
        return ""


INSTALLED = _installed()
VERIFIED = INSTALLED.startswith(TESTED)
if INSTALLED and not VERIFIED:  # pragma: no cover - the pinned gevent is verified
    logger.warning("gevent %s is not the version this suite was verified with (%sx): the lean client reads its "
                   "sockets through their public recv", INSTALLED, TESTED[0])


def raw_socket(sock):
    """The C socket under a gevent socket (its non-blocking ``recv``/``send``), or None."""
    return getattr(sock, "_sock", None) if VERIFIED else None


def waiting_reader(sock) -> tuple:
    """``(wait, recv)`` for a gevent socket without a timeout: its wait for readability and the C
    socket's ``recv``; ``(None, None)`` for any other socket (read with its own blocking ``recv``)."""
    if not VERIFIED:
        return None, None
    wait, raw = getattr(sock, "_wait", None), getattr(sock, "_sock", None)
    if wait is None or raw is None or getattr(sock, "_read_event", None) is None or sock.gettimeout() is not None:
        return None, None
    return wait, raw.recv


def read_when_ready(sock, wait, raw_recv, size: int) -> bytes | None:
    """One read of ``sock`` with ``waiting_reader``'s pair: wait until it is readable, then read
    (None: woken with nothing to read); without the pair, the socket's own blocking ``recv``."""
    if wait is None:
        return sock.recv(size)
    event = sock._read_event  # once per chunk, in line
    if event is None:  # closed since (a response closed between two reads): gevent's own recv's EBADF
        raise OSError(errno.EBADF, "Bad file descriptor")
    wait(event)
    try:
        return raw_recv(size)
    except BlockingIOError:
        return None
