"""Standard-library caches whose first fill stops the event loop, filled before the run measures.

- ``platform``: the ``openai`` SDK puts the OS in a header; the first lookup forks ``uname -p``,
  which under gevent yields, so hundreds of users starting together each forked (512 users: 3.4 s
  of blocked event loop before the first request). Filled at ``init``, it never forks again.
- ``inspect``'s module-by-file cache: Locust's ``Runner.stop`` calls ``inspect.stack()`` for a
  debug line, logged or not, and the first call walks every module in ``sys.modules`` (27 ms on the
  2-core VM). Every local run and every worker stops that way while its users finish their streams
  (``--stop-timeout``): one 45 ms stall at the run's end, every stream's next gap that long. It was
  the whole tail of the ITL's spread: at 50 streams, sd 1.40 ms with it, 0.20 ms without. Filled
  at ``init`` and again once the workload is built (the modules it imported), the stop finds it
  filled.
"""

from __future__ import annotations

import inspect
import platform


def warm_platform_cache() -> None:
    platform.platform()
    try:
        platform.freedesktop_os_release()
    except OSError:
        pass


def warm_inspect_cache() -> None:
    """What Locust's stop does first, done now: ``inspect.stack()`` maps every loaded module's file."""
    inspect.stack()
