"""A child process that must not outlive its parent: the ``/metrics`` scrapers. Seen: after the
Locust process was SIGKILLed, its scraper child kept appending to ``metrics.csv`` for good.

Two signs that the parent is gone, either enough: a pipe from the parent (its write end is closed
by the kernel when the parent dies, however it dies: EOF here), and ``os.getppid()`` changing (the
orphan is adopted by init or a subreaper), checked every interval.
"""

from __future__ import annotations

import os
import threading


def watch_parent(stop: threading.Event, interval_s: float, pipe_fd: int | None = None) -> None:
    """Set ``stop`` when the parent dies: at EOF on ``pipe_fd`` (when given) or when ``getppid``
    changes (checked every ``interval_s``, at most every second)."""
    parent = os.getppid()

    def by_ppid() -> None:
        while not stop.wait(min(max(interval_s, 0.05), 1.0)):
            if os.getppid() != parent:
                stop.set()

    def by_pipe() -> None:
        try:
            while os.read(pipe_fd, 4096):
                pass
        except OSError:
            pass
        stop.set()

    threading.Thread(target=by_ppid, name="parent-ppid", daemon=True).start()
    if pipe_fd is not None:
        threading.Thread(target=by_pipe, name="parent-pipe", daemon=True).start()
