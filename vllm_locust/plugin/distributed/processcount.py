"""``--processes auto``: as many Locust processes as the run's streams need, on this host's cores.

On the lent host one process held 100 streams at a 10 ms ITL with the ITL's spread at 0.16-0.17 ms
and its loop lag p99 near 1 ms; 250 a process (1,000 streams over 4) kept each loop 75% busy and
its lag p99 at 8-13 ms (docs/benchmark.md, issue 41). So ``auto`` gives one process per
``STREAMS_PER_PROCESS`` streams of the run's largest level (``-u``, the largest ``--steps``, or an
open-loop run's ``--max-concurrency``), at most one fewer than the cores this process may run on
(the master and the OS keep one), and no fork at all where one process is enough. Where the streams
are not known when Locust starts (the web UI without ``-u``; a worker host), one per core but one.
A faster server (an ITL under 10 ms) sends more chunks a stream: the self-audit says when a run's
processes fell behind.
"""

from __future__ import annotations

import math
import os

AUTO = "auto"
AUTO_MARK = -2  # what the parser gives ``--processes auto`` until ``resolve`` replaces it
STREAMS_PER_PROCESS = 100
DECIDED: list[str] = []  # the line ``resolve`` said, for the plugin to log once logging is set up


def usable_cpus() -> int:
    """The cores this process may run on (``taskset`` narrows them), not the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def streams_of(options) -> int:
    """The most streams the run asks for at once; 0 when the options do not say."""
    from ..options import parse_steps

    most = int(getattr(options, "num_users", None) or 0)
    try:
        most = max([most, *parse_steps(getattr(options, "steps", "") or "")])
    except ValueError:
        pass  # a bad --steps is refused, with its flag, when the run starts
    if str(getattr(options, "request_rate", "") or ""):
        most = max(most, int(getattr(options, "max_concurrency", 0) or 0))
    return most


def process_count(streams: int, cpus: int) -> int | None:
    """How many processes to fork for ``streams`` on ``cpus`` cores; None: one, not forked."""
    room = max(1, cpus - 1)
    wanted = math.ceil(streams / STREAMS_PER_PROCESS) if streams > 0 else room
    count = min(wanted, room)
    return count if count > 1 else None


def converter(text: str) -> int:
    """``--processes``'s type: Locust's integer, or ``auto``."""
    return AUTO_MARK if str(text).strip().lower() == AUTO else int(text)


def resolve(options) -> None:
    """After parsing: ``--processes auto`` becomes a count (or no fork), and the line that says why."""
    if getattr(options, "processes", None) != AUTO_MARK:
        return
    streams, cpus = streams_of(options), usable_cpus()
    count = process_count(streams, cpus)
    options.processes = count
    what = f"{streams} streams" if streams else "streams not known at start"
    DECIDED[:] = [f"--processes auto: {count or 'one'} process{'es' if count else ''} for {what} "
                  f"({STREAMS_PER_PROCESS} a process, at most {max(1, cpus - 1)} on {cpus} usable cores)"]


def accept(parser) -> None:
    """For ``init_command_line_parser``: ``--processes`` takes ``auto``, resolved as the options are
    parsed (Locust forks right after it parses them, before any ``init`` listener runs)."""
    from .. import locust_compat

    if not locust_compat.accept_processes_auto(parser, converter):
        return
    parse = parser.parse_known_args

    def parse_known_args(*args, **kwargs):
        options, rest = parse(*args, **kwargs)
        resolve(options)
        return options, rest

    parser.parse_known_args = parse_known_args
