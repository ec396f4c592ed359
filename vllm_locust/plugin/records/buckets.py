"""Locust's live statistics, fine enough for ITL and TTFT: buckets of relative precision.

Locust keeps each stats entry as a histogram keyed by ``locust.stats.bucket_response_time``, which
rounds to whole milliseconds below 100 ms and to 10 ms above (an ITL of 0.3 ms showed as 0, a TTFT
of 104 ms as 100). Locust documents that function as the one to replace for custom bucketing.
``install()`` does that (every process runs it from the plugin's init, so the master and every
worker agree), keeping three significant digits at every magnitude: each bucket within 0.5
percent of the values in it. Locust clamps the median into the run's [min, max] but no other
percentile, so a bucket just below the minimum put p95 under the median (median 100.24, p95 100);
``install()`` clamps every percentile the same way, so p50 <= p95 <= p99 always. Its ``--csv``
writer casts percentiles to ``int``; ``install()`` makes it keep three decimals, so the CSV shows
what the histogram holds. The analysis never uses these buckets: it reads raw samples.
``requests_only_total`` makes Locust's total count requests (E2E), not every ITL gap.
"""

from __future__ import annotations

import logging
import math
import sys
import traceback

import locust.log
import locust.stats
from locust.exception import InterruptTaskSet, RescheduleTask, RescheduleTaskImmediately, StopTest, StopUser

from ...core.schema import E2E
from .. import locust_compat

SIGNIFICANT_DIGITS = 3  # buckets of 0.1 to 1 percent of their value: 900 keys per decade at most

LOCUST_BUCKET = locust.stats.bucket_response_time
LOCUST_PERCENTILE = locust.stats.StatsEntry.get_response_time_percentile
LOCUST_CURRENT_PERCENTILE = locust.stats.StatsEntry.get_current_response_time_percentile
LOCUST_LOG = locust.stats.StatsEntry.log


def fine_bucket(response_time: float) -> float:
    """``response_time`` (ms) to 3 significant digits: 0.0123, 5.43, 104, 12300 (an int from
    1,000 ms up); the bucket is within 0.5 percent of every value in it."""
    if not (response_time > 0 and math.isfinite(response_time)):
        return response_time
    digits = SIGNIFICANT_DIGITS - 1 - math.floor(math.log10(response_time))
    if 0 < digits < 300:
        # The nearest float to the rounded decimal, as ``round(response_time, digits)`` gives it, in
        # half its time (once per ITL gap): an integer over a power of ten is correctly rounded.
        scale = 10.0 ** digits
        return round(response_time * scale) / scale
    bucket = round(response_time, digits)
    return int(bucket) if digits <= 0 else bucket


log = locust_compat.stats_entry_log(fine_bucket)  # ``StatsEntry.log`` fused (None: Locust's own stays)


def _clamped(self, value):
    """``value`` within this entry's [min, max], as Locust does for the median only."""
    if value is None:
        return value
    if value > self.max_response_time:
        return self.max_response_time
    if self.min_response_time is not None and value < self.min_response_time:
        return self.min_response_time
    return value


def percentile(self, percent: float):
    """``StatsEntry.get_response_time_percentile`` clamped like the median: never below p50."""
    return _clamped(self, LOCUST_PERCENTILE(self, percent))


def current_percentile(self, percent: float):
    """``StatsEntry.get_current_response_time_percentile`` (the charts' window), clamped the same."""
    return _clamped(self, LOCUST_CURRENT_PERCENTILE(self, percent))


def requests_only_total(stats) -> None:
    """Make Locust's total (the web UI's header RPS, the "Aggregated" rows) count requests, not
    samples: only ``E2E``, one per request, reaches it. Every ITL gap is an event of its own, so
    the header read "RPS 647" at 7 requests/s and the aggregate percentiles were mostly ITLs. The
    per-metric rows (TTFT, ITL, TPOT, E2E) are unchanged. A master's total is the sum of its
    workers' totals, so each process installs this."""
    def log_request(method: str, name: str, response_time, content_length) -> None:
        if name == E2E:
            stats.total.log(response_time, content_length)
        stats.entries[(name, method)].log(response_time, content_length)

    stats.log_request = log_request


_RUNNER_LISTENER = ("locust.runners", "Runner.__init__.<locals>.on_request")
_RUNNER_LISTENER_NAMES = ("stats", "log_request", "log_error")  # what its body looks up (Locust 2.47)
_FIRE = (None, None)
_checked: list = [None, None, False]  # the last (listener, environment) asked about, and the answer


def _runners_own(handler, environment) -> bool:
    """Whether ``handler`` is Locust 2.47's ``on_request`` of a runner of ``environment``: by its
    name, the names its body looks up and the runner it closes over (another environment sharing
    these events logs into its own stats)."""
    if (getattr(handler, "__module__", None), getattr(handler, "__qualname__", None)) != _RUNNER_LISTENER:
        return False
    code, cells = getattr(handler, "__code__", None), getattr(handler, "__closure__", None) or ()
    if code is None or code.co_names != _RUNNER_LISTENER_NAMES or code.co_freevars != ("self",) or len(cells) != 1:
        return False
    try:
        runner = cells[0].cell_contents
    except ValueError:  # an empty cell
        return False
    return getattr(runner, "environment", None) is environment


def sample_log(environment) -> tuple:
    """``(environment.stats.log_request, the request event's listener list)`` when that list's only
    listener is Locust's runner's own ``on_request`` (Locust 2.47: for a sample without an exception
    it calls just that), else ``(None, None)``. A sample logged through it skips the event's
    dispatch: the handler list copied, the keyword arguments packed and unpacked, two calls (about a
    seventh of a short request's steps, issue 25). The report checks the list's length per sample:
    any other listener (a locustfile's, a plugin's), added at any time, gets every sample from then
    on. A raising ``log_request`` is treated as the event treats a raising listener (``listener_failed``)."""
    handlers = locust_compat.listeners(environment.events.request)
    if handlers is None or len(handlers) != 1:
        return _FIRE
    handler = handlers[0]
    checked = _checked
    if handler is not checked[0] or environment is not checked[1]:
        checked[:] = handler, environment, _runners_own(handler, environment)
    return (environment.stats.log_request, handlers) if checked[2] else _FIRE


def listener_failed() -> None:
    """What ``EventHook.fire`` does when a listener raises, called from the ``except`` block of the
    direct path (``sample_log``): Locust's own control-flow exceptions go on; any other is logged
    with its traceback and marks the run as having had an unhandled exception (exit code 2)."""
    if isinstance(sys.exc_info()[1], _GOES_ON):
        raise  # noqa: PLE0704 - the exception being handled by the caller
    logging.error("Uncaught exception in event handler: \n%s", traceback.format_exc())
    locust.log.unhandled_greenlet_exception = True


_GOES_ON = (StopUser, StopTest, RescheduleTask, RescheduleTaskImmediately, InterruptTaskSet)


def install() -> None:
    """Patch ``locust.stats`` for this process (idempotent); ``uninstall`` puts Locust's back."""
    locust.stats.bucket_response_time = fine_bucket
    locust.stats.StatsEntry.log = log if log is not None else LOCUST_LOG
    locust.stats.StatsEntry.get_response_time_percentile = percentile
    locust.stats.StatsEntry.get_current_response_time_percentile = current_percentile
    locust_compat.percentile_fields(fine=True)


def uninstall() -> None:
    locust.stats.bucket_response_time = LOCUST_BUCKET
    locust.stats.StatsEntry.log = LOCUST_LOG
    locust.stats.StatsEntry.get_response_time_percentile = LOCUST_PERCENTILE
    locust.stats.StatsEntry.get_current_response_time_percentile = LOCUST_CURRENT_PERCENTILE
    locust_compat.percentile_fields(fine=False)
