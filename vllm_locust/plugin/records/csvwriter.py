"""Locust's ``--csv`` writer stopped before Locust closes its files, with the final stats in them.

``locust.main`` spawns ``StatsCSVFileWriter.stats_writer`` (a pass each second, then a
cooperative sleep) and never stops it: its shutdown fires ``quitting`` and ``quit``, closes the
files and exits. With ``--processes`` the master's exit handler (``kill_workers``) then sleeps
0.1 s cooperatively, and a writer whose second was up by then (shutdown work that held the loop
makes it overdue) wrote to a closed file: ``CRITICAL ... Unhandled exception in greenlet
StatsCSVFileWriter.stats_writer: ValueError: I/O operation on closed file``, after the exit code
was chosen (0). That order is Locust's, so it is worked around here. ``install`` notes each
writer's greenlet; at ``quitting`` it is killed (asleep between passes, it never stops mid-row)
and a pass written, so nothing writes after the files close; at ``quit`` one more pass writes
the final stats (a master's last worker reports arrive in ``quitting``'s 0.5 s wait, after the
writer's last pass). Not with ``--json``/``--json-file``: Locust writes those just before
``quit`` with ``get_stripped_report``, which empties every entry (not the total), so the pass of
``quitting`` stays.
"""

from __future__ import annotations

import logging
import weakref

import gevent
import locust.stats

from .. import locust_compat

logger = logging.getLogger(__name__)

LOCUST_STATS_WRITER = locust.stats.StatsCSVFileWriter.stats_writer
_RUNNING: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # writer -> the greenlet running its loop
_installed: "weakref.WeakSet" = weakref.WeakSet()  # environments whose writer stops at quit


def stats_writer(self) -> None:
    """``StatsCSVFileWriter.stats_writer``, noting the greenlet that runs it."""
    current = gevent.getcurrent()
    if isinstance(current, gevent.Greenlet):
        _RUNNING[self] = current
    return LOCUST_STATS_WRITER(self)


def install(environment) -> None:
    """At ``init`` (before ``locust.main`` spawns the writer): note writers' greenlets, stop this
    environment's at ``quitting`` and write its final pass at ``quit``. Idempotent."""
    locust.stats.StatsCSVFileWriter.stats_writer = stats_writer
    if environment in _installed:
        return
    _installed.add(environment)
    environment.events.quitting.add_listener(lambda **_kwargs: stop(environment))
    environment.events.quit.add_listener(lambda **_kwargs: stop(environment, final=True))


def stop(environment, final: bool = False) -> None:
    """Kill ``environment``'s writer greenlets (a pass during the kill is overwritten next), then
    write a pass: the stats so far, or at ``final`` the last ones unless JSON output emptied them."""
    options = environment.parsed_options
    emptied = options is not None and (getattr(options, "json", False) or bool(getattr(options, "json_file", None)))
    for writer, greenlet in list(_RUNNING.items()):
        if writer.environment is not environment:
            continue
        greenlet.kill(block=True, timeout=5)  # dead already at quit: returns at once, no yield
        if final:
            del _RUNNING[writer]
            if emptied:
                continue
        try:
            write_pass(writer)
        except (ValueError, OSError, AttributeError) as err:  # closed already, disk full, another Locust
            logger.warning("--csv %s: the final stats were not written: %s", writer.base_filepath, err)


def write_pass(writer) -> None:
    """One pass of ``stats_writer``'s loop (``locust_compat.csv_writer_pass``)."""
    locust_compat.csv_writer_pass(writer)
